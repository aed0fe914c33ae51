-- beat.lua: one heartbeat of a worker's lease. It keeps the worker's alive
-- key for another TTL and forgets the tasks the worker finished since its
-- last beat, each only if its entry is still the delivery that finished (a
-- later delivery of the same task id to this worker wrote a newer value,
-- which stays).
-- KEYS[1] the worker's alive key   P:{worker:<id>}:alive  (string, expires)
-- KEYS[2] the worker's task record P:{worker:<id>}:tasks  (hash task id -> "<seq> <queue>")
-- KEYS[3] the worker's name        P:{worker:<id>}:name   (string "<host>:<pid>", lives as long as the record)
-- ARGV[1] the alive key's TTL (ms)
-- ARGV[2] the worker's name, "<host>:<pid>" (the alive key's value too)
-- ARGV[3] the task record's TTL (ms): how long it outlives the worker
-- ARGV[4..] pairs of (task id, value) the worker finished
-- Returns the number of entries removed.
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
local removed = 0
for i = 4, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    removed = removed + redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return removed
