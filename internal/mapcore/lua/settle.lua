-- settle.lua: record one element's outcome; claim the next batch on trigger;
-- claim the owner signal once the map has settled.
-- KEYS[1] map meta     P:{map:<id>}:meta
-- KEYS[2] map offset   P:{map:<id>}:offset
-- KEYS[3] map results  P:{map:<id>}:results
-- KEYS[4] map failed   P:{map:<id>}:failed
-- KEYS[5] owner signal P:{map:<id>}:owner_signalled
-- ARGV[1] element index
-- ARGV[2] encoded outcome
-- ARGV[3] 1 if the outcome is a failure, else 0
-- Returns {stored, from, to, signal}: stored 0 means a duplicate (another
-- delivery settled this index first) or a position never claimed, and
-- nothing else happened; [from, to]
-- is the batch this settle claimed (-1, -1 for none); signal 1 means this
-- settle must enqueue the owner's resume. Only the settle that stored a
-- result may claim or signal.
local i = tonumber(ARGV[1])
-- A position that was never claimed (a stray task) settles nothing.
if i >= tonumber(redis.call('GET', KEYS[2]) or '0') then
  return {0, -1, -1, 0}
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then
  return {0, -1, -1, 0}
end
local m = redis.call('HMGET', KEYS[1], 'total', 'batch_size', 'atomic')
local total, b = tonumber(m[1]), tonumber(m[2])
local settled = redis.call('HINCRBY', KEYS[1], 'settled', 1)
-- Progress time (server clock) for the map sweeper, which leaves a map
-- that settled something recently alone.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], 'touched', now)
if ARGV[3] == '1' then
  redis.call('HINCRBY', KEYS[1], 'failures', 1)
  if m[3] == '1' then
    redis.call('SET', KEYS[4], ARGV[1], 'NX')
  end
end
local failed = redis.call('EXISTS', KEYS[4]) == 1
local offset = tonumber(redis.call('GET', KEYS[2]) or '0')
local from, to = -1, -1
-- The trigger position of the current batch claims the next one, and only
-- by compare-and-set on the absolute offset: a duplicate trigger claims
-- nothing. The trigger sits half a batch before the batch's end (k*B-1-B/2),
-- so the next batch is queued while the rest of this one still runs and the
-- workers never idle at a batch boundary; one action still enqueues at most
-- B tasks, and at most B + B/2 claimed positions are unsettled.
local ahead = math.floor(b / 2)
if not failed and (i + 1 + ahead) % b == 0 and offset == i + 1 + ahead and offset < total then
  local nxt = math.min(offset + b, total)
  redis.call('SET', KEYS[2], nxt)
  from, to, offset = offset, nxt - 1, nxt
end
local signal = 0
if settled >= offset and (offset >= total or failed) then
  if redis.call('SET', KEYS[5], '1', 'NX') then
    signal = 1
  end
end
return {1, from, to, signal}
