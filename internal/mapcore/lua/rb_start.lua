-- rb_start.lua: create a map rollback (one generation) and claim its first
-- batch, once, and make it the map's current generation. The total is fixed
-- here: a second start finds the first.
-- KEYS[1] rollback meta    P:{map:<id>}:rb:<gen>:meta
-- KEYS[2] rollback offset  P:{map:<id>}:rb:<gen>:offset
-- KEYS[3] map meta         P:{map:<id>}:meta (its rbgen field: the current
--                          generation, read by workers, sweepers, readers
--                          and the retention walk)
-- ARGV[1] total (the forward positions claimed, capped at the map's size; or
--         the length of the work list)
-- ARGV[2] batch size       ARGV[3] start time (ms)
-- ARGV[4] generation       ARGV[5] 1 when the positions come from the
--                          generation's work list (P:{map:<id>}:rb:<gen>:work)
-- ARGV[6] the server time (ms) at which the owner's rollback judges undo
--         windows (0: none); every element of the generation judges by it
-- Returns {1, offset} when this call created the rollback and claimed
-- [0, offset), {0, offset} when it existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
redis.call('HSET', KEYS[1], 'total', ARGV[1], 'batch_size', ARGV[2], 'started_at', ARGV[3],
  'settled', 0, 'failed', 0, 'gen', ARGV[4], 'work', ARGV[5], 'wa', ARGV[6] or '0')
redis.call('HSET', KEYS[3], 'rbgen', ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], 'touched', now)
local first = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]))
redis.call('SET', KEYS[2], first)
return {1, first}
