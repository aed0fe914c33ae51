-- lease_seen.lua: watch an active task's asynq lease over the Redis server's
-- clock. asynq scores a lease with the extending worker's clock; comparing
-- that score with any other clock mistakes clock skew for death (or life).
-- Only whether the score changes is read: a live worker's heartbeat pushes it
-- every few seconds, a dead one's never again.
-- KEYS[1] the sweeper's observation of one task's lease
--         P:{sweeper}:lease:<queue>:<task id> (or :idle:, see tasks.go)
--         hash {s = the lease score seen, at = server time (ms) it was first
--         seen with that score}
-- ARGV[1] the lease score read now (as the sweeper formats it; compared as a string)
-- ARGV[2] dead-after (ms of server time)
-- ARGV[3] expiry of the observation (ms), refreshed on every call
-- Returns 0 when the score has been the same for at least ARGV[2] ms of server
--         time (the task's worker is dead), else the ms of server time until
--         a look could find it so (first seen now: ARGV[2]).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local cur = redis.call('HMGET', KEYS[1], 's', 'at')
if cur[1] == ARGV[1] and cur[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  local left = tonumber(ARGV[2]) - (now - tonumber(cur[2]))
  if left <= 0 then
    return 0
  end
  return left
end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return tonumber(ARGV[2])
