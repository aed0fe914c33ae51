-- rb_locked.lua: note that a rollback position found its element locked,
-- say how long it has been waiting for that lock, and whether this is the
-- moment to warn an operator.
-- KEYS[1] rollback meta  P:{map:<id>}:rb:<gen>:meta
-- ARGV[1] position
-- ARGV[2] the wait (ms) past which an operator is warned, once per position
-- Returns {waited, warn}: the milliseconds since the position first found its
-- element locked (0 the first time), by the server's clock, so that every
-- process that waits for the position (inline owner, rollback jobs on any
-- worker, before and after a crash) measures one wait against one clock; and
-- 1 the first time waited reaches ARGV[2], else 0. It also counts the
-- attempts ('attempts:<pos>'), for inspection.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local field = 'locked:' .. ARGV[1]
redis.call('HSETNX', KEYS[1], field, now)
redis.call('HINCRBY', KEYS[1], 'attempts:' .. ARGV[1], 1)
local waited = now - tonumber(redis.call('HGET', KEYS[1], field))
local warn = 0
if waited >= tonumber(ARGV[2]) and redis.call('HSETNX', KEYS[1], 'warned:' .. ARGV[1], 1) == 1 then
  warn = 1
end
return {waited, warn}
