-- rb_settle.lua: record one element rollback outcome (first writer wins),
-- claim the next batch on trigger, and resume the owner if the rollback has
-- settled and the owner has handed off (the job's half of the handshake).
-- KEYS[1] rollback meta     P:{map:<id>}:rb:<gen>:meta
-- KEYS[2] rollback offset   P:{map:<id>}:rb:<gen>:offset
-- KEYS[3] rollback results  P:{map:<id>}:rb:<gen>:results
-- KEYS[4] handed_off        P:{map:<id>}:rb:<gen>:handed_off
-- KEYS[5] signalled         P:{map:<id>}:rb:<gen>:signalled
-- ARGV[1] position          ARGV[2] encoded outcome
-- ARGV[3] outcome name (counted in meta)   ARGV[4] 1 if it is a failure
-- Returns {stored, from, to, signal} as settle.lua does.
local p = tonumber(ARGV[1])
if p >= tonumber(redis.call('GET', KEYS[2]) or '0') then
  return {0, -1, -1, 0}
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then
  return {0, -1, -1, 0}
end
local m = redis.call('HMGET', KEYS[1], 'total', 'batch_size')
local total, b = tonumber(m[1]), tonumber(m[2])
local settled = redis.call('HINCRBY', KEYS[1], 'settled', 1)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], 'touched', now)
redis.call('HINCRBY', KEYS[1], 'n:' .. ARGV[3], 1)
if ARGV[4] == '1' then
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
end
local offset = tonumber(redis.call('GET', KEYS[2]))
local from, to = -1, -1
-- The trigger sits half a batch before the batch's end, as in settle.lua.
local ahead = math.floor(b / 2)
if (p + 1 + ahead) % b == 0 and offset == p + 1 + ahead and offset < total then
  local nxt = math.min(offset + b, total)
  redis.call('SET', KEYS[2], nxt)
  from, to, offset = offset, nxt - 1, nxt
end
local signal = 0
if settled >= offset and offset >= total and redis.call('EXISTS', KEYS[4]) == 1 then
  if redis.call('SET', KEYS[5], '1', 'NX') then
    signal = 1
  end
end
return {1, from, to, signal}
