-- place.lua: takes a waiter's place in an ordered semaphore's queue (see
-- ordered.lua) without trying for a slot: a run's place in an Ordered run
-- limit, taken when the run is enqueued. An existing place is kept; the
-- last-seen time is the server's, as ordered.lua stamps it.
-- KEYS[1] the queue     P:{lim:<name>:<key>}:q
-- KEYS[2] last seen     P:{lim:<name>:<key>}:qs
-- ARGV[1] waiter, ARGV[2] place, ARGV[3] how long the queue is kept (ms)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], now)
local keep = tonumber(ARGV[3])
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < keep then
    redis.call('PEXPIRE', k, keep)
  end
end
return 1
