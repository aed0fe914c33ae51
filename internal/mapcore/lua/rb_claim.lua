-- rb_claim.lua: claim.lua for a map rollback (one generation): claim the
-- next batch of rollback positions when every claimed one has settled and
-- the trigger's claim is missing.
-- KEYS[1] rollback meta    P:{map:<id>}:rb:<gen>:meta
-- KEYS[2] rollback offset  P:{map:<id>}:rb:<gen>:offset
-- ARGV[1] the offset the sweeper read
-- Returns {from, to}, or {-1, -1} when nothing was claimed.
local offset = tonumber(redis.call('GET', KEYS[2]) or '-1')
if offset ~= tonumber(ARGV[1]) then
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
