-- claim.lua: the map sweeper's replacement for a lost batch trigger, for a
-- map's forward pass and for each of its rollback generations alike. It
-- claims exactly the next batch, by the same compare-and-set on the absolute
-- offset a settle uses, and only when every claimed position has settled,
-- positions remain and (forward) the map has not failed.
-- KEYS[1] meta    P:{map:<id>}:meta      or P:{map:<id>}:rb:<gen>:meta
-- KEYS[2] offset  P:{map:<id>}:offset    or P:{map:<id>}:rb:<gen>:offset
-- KEYS[3] failed  P:{map:<id>}:failed    (forward only: a rollback passes 2 keys)
-- ARGV[1] the offset the sweeper read
-- Returns {from, to}, or {-1, -1} when nothing was claimed.
local offset = tonumber(redis.call('GET', KEYS[2]) or '-1')
if offset ~= tonumber(ARGV[1]) or (KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1) then
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
