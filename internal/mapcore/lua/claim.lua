-- claim.lua: the map sweeper's replacement for a lost batch trigger. It
-- claims exactly the next batch, by the same compare-and-set on the absolute
-- offset a settle uses, and only when every claimed position has settled,
-- the map has not failed and positions remain.
-- KEYS[1] map meta     P:{map:<id>}:meta
-- KEYS[2] map offset   P:{map:<id>}:offset
-- KEYS[3] map failed   P:{map:<id>}:failed
-- ARGV[1] the offset the sweeper read
-- Returns {from, to}, or {-1, -1} when nothing was claimed.
local offset = tonumber(redis.call('GET', KEYS[2]) or '-1')
if offset ~= tonumber(ARGV[1]) or redis.call('EXISTS', KEYS[3]) == 1 then
  return {-1, -1}
end
local m = redis.call('HMGET', KEYS[1], 'total', 'batch_size', 'settled')
local total, b, settled = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
if total == nil or settled < offset or offset >= total then
  return {-1, -1}
end
local nxt = math.min(offset + b, total)
redis.call('SET', KEYS[2], nxt)
return {offset, nxt - 1}
