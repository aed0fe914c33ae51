-- page.lua: the next page of a listing index, newest first, after a cursor,
-- within a score range.
-- KEYS[1] -> P:idx:runs, P:idx:status:<s>, P:idx:reactor:<name> or
--            P:idx:rs:<name>:<s> (zset: member run id, score ms)
-- ARGV[1] -> n, the number of entries wanted
-- ARGV[2] -> the cursor's score ("" for the first page)
-- ARGV[3] -> the cursor's member
-- ARGV[4] -> the highest score listed ("+inf", or ms: a time range's end)
-- ARGV[5] -> the lowest score listed ("-inf", or ms: a time range's start)
-- Returns a flat array {member, score, member, score, ...}, every score in
-- [ARGV[5], ARGV[4]]. When the cursor's entry is still in the index with
-- its score, the entries right after it by rank; otherwise (the run moved
-- to another status, or was trimmed) the entries from the cursor's score
-- down, ties included, which the caller filters (score < cursor, or equal
-- score and member < cursor's).
local n = tonumber(ARGV[1])
local hi, lo = ARGV[4], ARGV[5]
if ARGV[2] == '' then
  if hi == '+inf' and lo == '-inf' then
    return redis.call('ZREVRANGE', KEYS[1], 0, n - 1, 'WITHSCORES')
  end
  return redis.call('ZREVRANGEBYSCORE', KEYS[1], hi, lo, 'WITHSCORES', 'LIMIT', 0, n)
end
local s = redis.call('ZSCORE', KEYS[1], ARGV[3])
if s and tonumber(s) == tonumber(ARGV[2]) then
  local r = redis.call('ZREVRANK', KEYS[1], ARGV[3])
  local page = redis.call('ZREVRANGE', KEYS[1], r + 1, r + n, 'WITHSCORES')
  if lo == '-inf' then
    return page
  end
  -- Newest first: the entries below the range's start are at the end.
  local min = tonumber(lo)
  local out = {}
  for i = 1, #page, 2 do
    if tonumber(page[i + 1]) < min then
      break
    end
    out[#out + 1] = page[i]
    out[#out + 1] = page[i + 1]
  end
  return out
end
local ties = redis.call('ZCOUNT', KEYS[1], ARGV[2], ARGV[2])
return redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], lo, 'WITHSCORES', 'LIMIT', 0, n + ties)
