-- fair.lua: a semaphore of N slots shared by many keys (tenants), fair
-- among the keys that want it. Each key's share is N divided among the
-- keys holding a slot or waiting for one (at least one each). A key below
-- its share gets a free slot; a key at or above it gets one only while the
-- free slots outnumber what the waiting keys below their share still lack,
-- so a key that keeps thousands of attempts waiting cannot starve a key
-- that wants a few, and nothing stands idle while only one key wants it.
-- Every key of the limit is in one hash slot: P:{fair:<name>}.
-- KEYS[1] holders      P:{fair:<name>}, member the holder, score the
--                      server ms its lease ends
-- KEYS[2] holder keys  P:{fair:<name>}:hk, holder -> its key
-- KEYS[3] counts       P:{fair:<name>}:n, key -> holders it has
-- KEYS[4] waiters      P:{fair:<name>}:w, member a waiter ("<run>|<step>"),
--                      score the server ms of its last refusal; a waiter
--                      not refused again for ARGV[6] ms no longer counts,
--                      and one that gets a slot leaves
-- KEYS[5] waiter keys  P:{fair:<name>}:wk, waiter -> its key
-- KEYS[6] waiting      P:{fair:<name>}:wn, key -> waiters it has
-- ARGV[1] mode: acquire | renew | release
-- acquire ARGV[2] holder, ARGV[3] key, ARGV[4] N, ARGV[5] lease ms,
--         ARGV[6] waiting window ms, ARGV[7] the waiter the holder is.
--         Returns {1, holders} when held, else {0, holders, ms until the
--         earliest lease ends (0 while slots are free but kept for keys
--         below their share), the key's share}.
-- renew   ARGV[2] holder, ARGV[3] lease ms. {1} while held, {0} once lost.
-- release ARGV[2] holder. {1} if it held, else {0}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local mode = ARGV[1]

local function forget(holder)
  local k = redis.call('HGET', KEYS[2], holder)
  redis.call('HDEL', KEYS[2], holder)
  if k and redis.call('HINCRBY', KEYS[3], k, -1) <= 0 then
    redis.call('HDEL', KEYS[3], k)
  end
end

local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- unwait takes waiter off the waiters, if it is there.
local function unwait(waiter)
  if redis.call('ZREM', KEYS[4], waiter) == 0 then
    return
  end
  local k = redis.call('HGET', KEYS[5], waiter)
  redis.call('HDEL', KEYS[5], waiter)
  if k and redis.call('HINCRBY', KEYS[6], k, -1) <= 0 then
    redis.call('HDEL', KEYS[6], k)
  end
end

if mode == 'acquire' then
  local holder, key, n, lease, window, waiter = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
    forget(d)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZSCORE', KEYS[1], holder) then
    redis.call('ZADD', KEYS[1], now + lease, holder)
    keep(KEYS[1], lease)
    return {1, redis.call('ZCARD', KEYS[1])}
  end
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - window)) do
    unwait(w)
  end
  local total = redis.call('ZCARD', KEYS[1])
  local held, waits = {}, {}
  local active = 0
  local counts = redis.call('HGETALL', KEYS[3])
  for i = 1, #counts, 2 do
    held[counts[i]] = tonumber(counts[i + 1])
    active = active + 1
  end
  local waiting = redis.call('HGETALL', KEYS[6])
  for i = 1, #waiting, 2 do
    local k = waiting[i]
    waits[k] = tonumber(waiting[i + 1])
    if not held[k] then
      active = active + 1
    end
  end
  local mine = held[key] or 0
  if mine == 0 and not waits[key] then
    active = active + 1
  end
  local share = math.max(1, math.floor(n / active))
  local grant = false
  if total < n then
    if mine < share then
      grant = true
    else
      -- what the other waiting keys lack of their shares, as far as they
      -- have waiters to fill it
      local lacking = 0
      for k, w in pairs(waits) do
        if k ~= key then
          lacking = lacking + math.min(w, math.max(0, share - (held[k] or 0)))
        end
      end
      grant = n - total > lacking
    end
  end
  if grant then
    unwait(waiter)
    redis.call('ZADD', KEYS[1], now + lease, holder)
    redis.call('HSET', KEYS[2], holder, key)
    redis.call('HINCRBY', KEYS[3], key, 1)
    keep(KEYS[1], lease)
    keep(KEYS[2], lease)
    keep(KEYS[3], lease)
    return {1, total + 1}
  end
  if redis.call('ZADD', KEYS[4], now, waiter) == 1 then
    redis.call('HSET', KEYS[5], waiter, key)
    redis.call('HINCRBY', KEYS[6], key, 1)
  end
  for i = 4, 6 do
    redis.call('PEXPIRE', KEYS[i], window)
  end
  local wait = 0
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if total >= n and #first > 0 then
    wait = math.max(0, tonumber(first[2]) - now)
  end
  return {0, total, wait, share}
elseif mode == 'renew' then
  if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
    return {0}
  end
  local lease = tonumber(ARGV[3])
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[2])
  keep(KEYS[1], lease)
  keep(KEYS[2], lease)
  keep(KEYS[3], lease)
  return {1}
elseif mode == 'release' then
  if redis.call('ZREM', KEYS[1], ARGV[2]) == 1 then
    forget(ARGV[2])
    return {1}
  end
  return {0}
end
return redis.error_reply('fair.lua: unknown mode ' .. tostring(mode))
