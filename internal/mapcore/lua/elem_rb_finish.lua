-- elem_rb_finish.lua: a map element's terminal rollback write and its
-- rollback outcome, in one script (the element's keys share the map's slot):
-- the write fenced as internal/store's write.lua fences it, the outcome
-- recorded by rb_settle.lua's protocol (first writer wins, the trigger's
-- claim, the job's half of the two-flag handshake).
-- KEYS[1] element state     P:{map:<id>}:el:<i>:ctx
-- KEYS[2] element lock      P:{map:<id>}:el:<i>:lock
-- KEYS[3] map audit         P:{map:<id>}:audit
-- KEYS[4] rollback meta     P:{map:<id>}:rb:<gen>:meta
-- KEYS[5] rollback offset   P:{map:<id>}:rb:<gen>:offset
-- KEYS[6] rollback results  P:{map:<id>}:rb:<gen>:results
-- KEYS[7] handed_off        P:{map:<id>}:rb:<gen>:handed_off
-- KEYS[8] signalled         P:{map:<id>}:rb:<gen>:signalled
-- ARGV[1] lock token   ARGV[2] version read   ARGV[3] encoded state
-- ARGV[4] 1 when the element waits for a person (its state is made persistent)
-- ARGV[5] nonce        ARGV[6] the audit stream's cap
-- ARGV[7] position     ARGV[8] encoded outcome   ARGV[9] outcome name
-- ARGV[10] 1 if the outcome is a failure          ARGV[11] rollback total
-- ARGV[12] batch size  ARGV[13] n audit entries, then the entries (write.lua's format)
-- Returns as elem_finish.lua: {version, 0, at, stored, from, to, signal}, {-1}, {-2, version}.
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
-- The position was claimed when the job loaded the element
-- (elem_rb_load.lua), and a claim is never undone.
local p = tonumber(ARGV[7])
local stored, from, to, signal = 0, -1, -1, 0
if redis.call('HSETNX', KEYS[6], ARGV[7], ARGV[8]) == 1 then
  stored = 1
  local total, b = tonumber(ARGV[11]), tonumber(ARGV[12])
  local settled = redis.call('HINCRBY', KEYS[4], 'settled', 1)
  redis.call('HSET', KEYS[4], 'touched', now)
  redis.call('HINCRBY', KEYS[4], 'n:' .. ARGV[9], 1)
  if ARGV[10] == '1' then
    redis.call('HINCRBY', KEYS[4], 'failed', 1)
  end
  local ahead = math.floor(b / 2)
  local trigger = (p + 1 + ahead) % b == 0
  -- Claims are whole batches: the offset is at least the end of p's batch
  -- (see elem_finish.lua).
  local batchEnd = math.min((math.floor(p / b) + 1) * b, total)
  local offset = nil
  if trigger or settled >= batchEnd then
    offset = tonumber(redis.call('GET', KEYS[5]) or '0')
  end
  if trigger and offset == p + 1 + ahead and offset < total then
    local nxt = math.min(offset + b, total)
    redis.call('SET', KEYS[5], nxt)
    from, to, offset = offset, nxt - 1, nxt
  end
  if offset and settled >= offset and offset >= total and redis.call('EXISTS', KEYS[7]) == 1 then
    if redis.call('SET', KEYS[8], '1', 'NX') then
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
