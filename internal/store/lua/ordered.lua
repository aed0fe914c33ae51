-- ordered.lua: a semaphore whose waiters get in in order: each waiter
-- takes a place in a queue, scored by its run's creation time (so runs go
-- in the order they were enqueued, among those that reached the step), and
-- a slot goes to the first places only. A waiter keeps its place by trying
-- again (each try stamps it); one not seen for a lease (its run died or
-- was cancelled) loses its place when it reaches the head, so it cannot
-- block the key for ever.
-- KEYS[1] the holders   P:{lim:<name>:<key>} (as slot.lua's)
-- KEYS[2] the queue     P:{lim:<name>:<key>}:q, member the waiter, score its place
-- KEYS[3] last seen     P:{lim:<name>:<key>}:qs, waiter -> server ms of its last try
-- ARGV[1] holder, ARGV[2] slots (N), ARGV[3] lease ms, ARGV[4] waiter, ARGV[5] place
-- Returns {1, holders} when held, else {0, holders, ms until the earliest
-- lease ends, the waiter's position in the queue (0-based)}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[3])
local PARKED = 1000000000000000 -- a parked holder's score (slot.lua)
-- expiry: as slot.lua's (as long as the longest lease; for ever while a
-- parked holder is in the set).
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
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  expiry(KEYS[1])
  return {1, redis.call('ZCARD', KEYS[1])}
end
redis.call('ZADD', KEYS[2], 'NX', ARGV[5], ARGV[4])
redis.call('HSET', KEYS[3], ARGV[4], now)
-- the head's places of waiters not seen for a lease go
while true do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #head == 0 or head[1] == ARGV[4] then
    break
  end
  local seen = tonumber(redis.call('HGET', KEYS[3], head[1]) or '0')
  if seen > now - lease then
    break
  end
  redis.call('ZREM', KEYS[2], head[1])
  redis.call('HDEL', KEYS[3], head[1])
end
local n = redis.call('ZCARD', KEYS[1])
local free = tonumber(ARGV[2]) - n
local pos = redis.call('ZRANK', KEYS[2], ARGV[4])
for _, k in ipairs({KEYS[2], KEYS[3]}) do
  if redis.call('PTTL', k) < lease * 4 then
    redis.call('PEXPIRE', k, lease * 4)
  end
end
if free > 0 and pos < free then
  redis.call('ZREM', KEYS[2], ARGV[4])
  redis.call('HDEL', KEYS[3], ARGV[4])
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  expiry(KEYS[1])
  return {1, n + 1}
end
local wait = 0
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first > 0 and tonumber(first[2]) < PARKED then
  wait = math.max(0, tonumber(first[2]) - now)
end
return {0, n, wait, pos}
