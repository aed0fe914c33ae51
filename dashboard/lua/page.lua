-- page.lua: the next page of a listing index, newest first, after a cursor.
-- KEYS[1] -> P:idx:runs, P:idx:status:<s>, P:idx:reactor:<name> or
--            P:idx:rs:<name>:<s> (zset: member run id, score ms)
-- ARGV[1] -> n, the number of entries wanted
-- ARGV[2] -> the cursor's score ("" for the first page)
-- ARGV[3] -> the cursor's member
-- Returns a flat array {member, score, member, score, ...}. When the
-- cursor's entry is still in the index with its score, the entries right
-- after it by rank; otherwise (the run moved to another status, or was
-- trimmed) the entries from the cursor's score down, ties included, which
-- the caller filters (score < cursor, or equal score and member < cursor's).
local n = tonumber(ARGV[1])
if ARGV[2] == '' then
  return redis.call('ZREVRANGE', KEYS[1], 0, n - 1, 'WITHSCORES')
end
local s = redis.call('ZSCORE', KEYS[1], ARGV[3])
if s and tonumber(s) == tonumber(ARGV[2]) then
  local r = redis.call('ZREVRANK', KEYS[1], ARGV[3])
  return redis.call('ZREVRANGE', KEYS[1], r + 1, r + n, 'WITHSCORES')
end
local ties = redis.call('ZCOUNT', KEYS[1], ARGV[2], ARGV[2])
return redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], '-inf', 'WITHSCORES', 'LIMIT', 0, n + ties)
