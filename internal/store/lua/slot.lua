-- slot.lua: a counting semaphore with leases, for a concurrency limit (a
-- lock is one of one slot). One sorted set per limit and key,
-- P:{lim:<name>:<key>}: members are the holders, scores the server time
-- (ms) their lease ends. A holder that dies is reclaimed when its lease
-- ends: every acquire first drops the expired ones. Single key, so one
-- slot of a Redis Cluster; the server's clock for every lease.
-- KEYS[1] the semaphore
-- KEYS[2] its waiters, P:{lim:<name>:<key>}:w (acquire only): who found it
--         full lately (a run and step, scored by the server ms of its last
--         try), for the dashboard; at most 100, gone a minute after the
--         last refusal, and a waiter leaves it when it gets a slot
-- A run's own limits (held from its first step to its end) park their
-- holder while the run waits with no process (paused, parked on a map,
-- waiting at a checkpoint): its score is then PARKED, which no lease end
-- reaches, and the set loses its expiry while such a holder is in it (the
-- run's terminal write releases it; a run is live until then).
-- ARGV[1] mode: acquire | renew | release | park
-- acquire ARGV[2] holder, ARGV[3] slots (N), ARGV[4] lease ms, ARGV[5] the
--         waiter the holder is ("<run>|<step>"). Returns
--         {1, holders} when held (a holder that holds already renews), or
--         {0, holders, ms until the earliest lease ends}.
-- renew   ARGV[2] holder, ARGV[3] lease ms. {1} while held, {0} once lost.
-- release ARGV[2] holder. {1} if it held, else {0}.
-- park    ARGV[2] holder. {1} if it held (now parked), else {0}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local mode = ARGV[1]
local PARKED = 1000000000000000

-- expiry: the set lives as long as its longest lease, for ever while a
-- parked holder is in it.
local function expiry(key)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #top == 0 then
    return
  end
  local last = tonumber(top[2])
  if last >= PARKED then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, math.max(1, last - now))
  end
end
if mode == 'acquire' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local lease = tonumber(ARGV[4])
  if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
    expiry(KEYS[1])
    return {1, redis.call('ZCARD', KEYS[1])}
  end
  local n = redis.call('ZCARD', KEYS[1])
  if n < tonumber(ARGV[3]) then
    redis.call('ZREM', KEYS[2], ARGV[5])
    redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
    expiry(KEYS[1])
    return {1, n + 1}
  end
  redis.call('ZADD', KEYS[2], now, ARGV[5])
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -101)
  redis.call('PEXPIRE', KEYS[2], 60000)
  local first = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
  if first >= PARKED then
    first = now -- held by runs that wait: no lease end to tell
  end
  return {0, n, math.max(0, first - now)}
elseif mode == 'renew' then
  if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    return {0}
  end
  local lease = tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[2])
  expiry(KEYS[1])
  return {1}
elseif mode == 'release' then
  local n = redis.call('ZREM', KEYS[1], ARGV[2])
  expiry(KEYS[1])
  return {n}
elseif mode == 'park' then
  if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    return {0}
  end
  redis.call('ZADD', KEYS[1], 'XX', PARKED, ARGV[2])
  redis.call('PERSIST', KEYS[1])
  return {1}
end
return redis.error_reply('slot.lua: unknown mode ' .. tostring(mode))
