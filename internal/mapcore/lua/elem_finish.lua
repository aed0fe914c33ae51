-- elem_finish.lua: a fan-out map element's terminal write and its map's
-- settle, in one script (the element's keys share the map's slot), for an
-- element run (forward) and for an element rollback job alike. The write is
-- fenced as internal/store's write.lua fences it (lock token and the version
-- read; a resend finds its own nonce); the settle is batch.lua's, and lands
-- only with the write.
-- KEYS[1] element state  P:{map:<id>}:el:<i>:ctx
-- KEYS[2] element lock   P:{map:<id>}:el:<i>:lock
-- KEYS[3] map audit      P:{map:<id>}:audit (the map's elements share it)
-- KEYS[4] meta           P:{map:<id>}:meta            | P:{map:<id>}:rb:<gen>:meta
-- KEYS[5] offset         P:{map:<id>}:offset          | P:{map:<id>}:rb:<gen>:offset
-- KEYS[6] results        P:{map:<id>}:results         | P:{map:<id>}:rb:<gen>:results
-- KEYS[7] forward: the map's failed flag P:{map:<id>}:failed;
--         rollback: the owner's hand-off flag P:{map:<id>}:rb:<gen>:handed_off
-- KEYS[8] signal         P:{map:<id>}:owner_signalled | P:{map:<id>}:rb:<gen>:signalled
-- KEYS[9] states         P:{map:<id>}:states (both directions: the dashboard's
--         element states, batch.lua's noteState)
-- ARGV[1] lock token     ARGV[2] version the caller read   ARGV[3] encoded state
-- ARGV[4] 1 when the element waits for a person (its state is made persistent), else 0
-- ARGV[5] nonce naming this write (random per call, the same on a resend)
-- ARGV[6] the audit stream's cap (XADD MAXLEN ~)
-- ARGV[7] position (the element's index forward, its rollback position back)
-- ARGV[8] encoded outcome  ARGV[9] 1 if the outcome is a failure
-- ARGV[10] total         ARGV[11] batch size      ARGV[12] atomic (1|0; forward)
-- ARGV[13] 'f' (forward) or 'r' (rollback)   ARGV[14] rollback: the outcome's name
-- ARGV[15] n, the number of audit entries, then n entries, each as m (its number
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
-- The settle. The position was claimed when the element was created
-- (elem_begin.lua) or its rollback job dispatched, and a claim is never
-- undone, so no stray check is needed.
local d = {meta = KEYS[4], offset = KEYS[5], results = KEYS[6], signal = KEYS[8], states = KEYS[9],
  pos = tonumber(ARGV[7]), field = ARGV[7], enc = ARGV[8], fail = ARGV[9] == '1', atomic = ARGV[12] == '1',
  total = tonumber(ARGV[10]), b = tonumber(ARGV[11]), now = now}
if ARGV[13] == 'r' then
  d.gate, d.count = KEYS[7], ARGV[14]
else
  d.stop = KEYS[7]
end
local stored, from, to, signal = settle(d)
local nextv = cur + 1
redis.call('HSET', KEYS[1], 'd', ARGV[3], 'v', nextv, 'n', ARGV[5], 'at', now, 'fin', '1',
  'sr', stored .. ',' .. from .. ',' .. to .. ',' .. signal)
if ARGV[4] == '1' then
  redis.call('PERSIST', KEYS[1])
end
local n = tonumber(ARGV[15] or '0')
local j = 16
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
