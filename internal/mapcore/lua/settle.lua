-- settle.lua: record one position's outcome outside an element's own write
-- (an inline element, a legacy task, a rollback position with nothing to
-- undo), by batch.lua's settle, for the forward pass or a rollback
-- generation.
-- KEYS[1] meta       P:{map:<id>}:meta            | P:{map:<id>}:rb:<gen>:meta
-- KEYS[2] offset     P:{map:<id>}:offset          | P:{map:<id>}:rb:<gen>:offset
-- KEYS[3] results    P:{map:<id>}:results         | P:{map:<id>}:rb:<gen>:results
-- KEYS[4] forward: the map's failed flag P:{map:<id>}:failed;
--         rollback: the owner's hand-off flag P:{map:<id>}:rb:<gen>:handed_off
-- KEYS[5] signal     P:{map:<id>}:owner_signalled | P:{map:<id>}:rb:<gen>:signalled
-- KEYS[6] states     P:{map:<id>}:states (both directions: the dashboard's
--         element states, batch.lua's noteState)
-- ARGV[1] position   ARGV[2] encoded outcome   ARGV[3] 1 if it is a failure
-- ARGV[4] 'f' (forward) or 'r' (rollback)
-- ARGV[5] rollback: the outcome's name, counted in the meta
-- Returns {stored, from, to, signal}: stored 0 means a duplicate (another
-- delivery settled this position first) or a position never claimed, and
-- nothing else happened; [from, to] is the batch this settle claimed (-1, -1
-- for none); signal 1 means this settle must enqueue the owner's resume.
local pos = tonumber(ARGV[1])
-- A position that was never claimed (a stray task) settles nothing.
local claimed = tonumber(redis.call('GET', KEYS[2]) or '0')
if pos >= claimed then
  return {0, -1, -1, 0}
end
local m = redis.call('HMGET', KEYS[1], 'total', 'batch_size', 'atomic')
local t = redis.call('TIME')
local d = {meta = KEYS[1], offset = KEYS[2], results = KEYS[3], signal = KEYS[5], states = KEYS[6],
  pos = pos, field = ARGV[1], enc = ARGV[2], fail = ARGV[3] == '1', atomic = m[3] == '1',
  total = tonumber(m[1]), b = tonumber(m[2]), now = t[1] * 1000 + math.floor(t[2] / 1000), claimed = claimed}
if ARGV[4] == 'r' then
  d.gate, d.count = KEYS[4], ARGV[5]
else
  d.stop = KEYS[4]
end
local stored, from, to, signal = settle(d)
return {stored, from, to, signal}
