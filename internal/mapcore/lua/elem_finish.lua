-- elem_finish.lua: a fan-out map element's terminal write and its map's
-- settle, in one script (the element's keys share the map's slot). The write
-- is fenced as internal/store's write.lua fences it (lock token and the
-- version read; a resend finds its own nonce); the settle is settle.lua's
-- protocol (first writer wins, the trigger's compare-and-set claim, the owner
-- signal claimed once), and lands only with the write.
-- KEYS[1] element state  P:{map:<id>}:el:<i>:ctx
-- KEYS[2] element lock   P:{map:<id>}:el:<i>:lock
-- KEYS[3] map audit      P:{map:<id>}:audit (the map's elements share it)
-- KEYS[4] map meta       P:{map:<id>}:meta
-- KEYS[5] map offset     P:{map:<id>}:offset
-- KEYS[6] map results    P:{map:<id>}:results
-- KEYS[7] map failed     P:{map:<id>}:failed
-- KEYS[8] owner signal   P:{map:<id>}:owner_signalled
-- ARGV[1] lock token     ARGV[2] version the caller read   ARGV[3] encoded state
-- ARGV[4] 1 when the element waits for a person (its state is made persistent), else 0
-- ARGV[5] nonce naming this write (random per call, the same on a resend)
-- ARGV[6] the audit stream's cap (XADD MAXLEN ~)
-- ARGV[7] element index  ARGV[8] encoded outcome  ARGV[9] 1 if the outcome is a failure
-- ARGV[10] map total     ARGV[11] batch size      ARGV[12] atomic (1|0)
-- ARGV[13] n, the number of audit entries, then n entries, each as m (its number
--          of fields) followed by m field/value pairs (write.lua's format)
-- Returns {-1}            the caller does not hold the lock
--         {-2, version}   version mismatch: the stored version
--         {version, 0, at, stored, from, to, signal}  written; the settle's
--         {stored, from, to, signal} as settle.lua returns them (a resend that
--         finds its own write returns what the first send settled)
local last = redis.call('HMGET', KEYS[1], 'n', 'v', 'sr')
if last[1] == ARGV[5] then
  local r = {tonumber(last[2]), 0, 0}
  for x in string.gmatch(last[3] or '0,-1,-1,0', '[^,]+') do
    r[#r + 1] = tonumber(x)
  end
  return r
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {-1}
end
local cur = tonumber(last[2] or '0')
if cur ~= tonumber(ARGV[2]) then
  return {-2, cur}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- The settle (settle.lua). The position was claimed when the element was
-- created (elem_begin.lua), and a claim is never undone.
local i = tonumber(ARGV[7])
local stored, from, to, signal = 0, -1, -1, 0
if redis.call('HSETNX', KEYS[6], ARGV[7], ARGV[8]) == 1 then
  stored = 1
  local total, b = tonumber(ARGV[10]), tonumber(ARGV[11])
  local settled = redis.call('HINCRBY', KEYS[4], 'settled', 1)
  redis.call('HSET', KEYS[4], 'touched', now)
  local failed = nil -- read only when it decides something
  if ARGV[9] == '1' then
    redis.call('HINCRBY', KEYS[4], 'failures', 1)
    if ARGV[12] == '1' then
      redis.call('SET', KEYS[7], ARGV[7], 'NX')
    end
  end
  local ahead = math.floor(b / 2)
  local trigger = (i + 1 + ahead) % b == 0
  -- Claims are whole batches, so the offset is at least the end of i's
  -- batch: while fewer positions settled, the map cannot have settled, and
  -- only a trigger needs the offset.
  local batchEnd = math.min((math.floor(i / b) + 1) * b, total)
  local offset = nil
  if trigger or settled >= batchEnd then
    offset = tonumber(redis.call('GET', KEYS[5]) or '0')
  end
  if trigger and offset == i + 1 + ahead and offset < total then
    failed = redis.call('EXISTS', KEYS[7]) == 1
    if not failed then
      local nxt = math.min(offset + b, total)
      redis.call('SET', KEYS[5], nxt)
      from, to, offset = offset, nxt - 1, nxt
    end
  end
  if offset and settled >= offset then
    if failed == nil and offset < total then
      failed = redis.call('EXISTS', KEYS[7]) == 1
    end
    if (offset >= total or failed) and redis.call('SET', KEYS[8], '1', 'NX') then
      signal = 1
    end
  end
end
local nextv = cur + 1
redis.call('HSET', KEYS[1], 'd', ARGV[3], 'v', nextv, 'n', ARGV[5], 'at', now, 'fin', '1',
  'sr', stored .. ',' .. from .. ',' .. to .. ',' .. signal)
if ARGV[4] == '1' then
  redis.call('PERSIST', KEYS[1])
end
local n = tonumber(ARGV[13] or '0')
local j = 14
for _ = 1, n do
  local m = tonumber(ARGV[j])
  local args = {'XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*'}
  for k = j + 1, j + 2 * m do
    args[#args + 1] = ARGV[k]
  end
  args[#args + 1] = 'ts'
  args[#args + 1] = tostring(now)
  redis.call(unpack(args))
  j = j + 1 + 2 * m
end
redis.call('DEL', KEYS[2])
return {nextv, 0, now, stored, from, to, signal}
