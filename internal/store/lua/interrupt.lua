-- interrupt.lua: the record of the interrupt a run waits on, kept in the
-- run's own state hash (so it expires with the run and needs no key of its
-- own), and the compare-and-set between the payloads that arrive for it, its
-- timeout and its cancel. The process executing the run (holding its lock)
-- opens, reads, adopts, refuses and closes; anyone continues, without the
-- lock: a payload that arrives while the run is held is recorded, never lost.
-- Fields of KEYS[1] (P:{run:<id>}:ctx, beside the fenced write's d, v, at...):
--   iw   the path of the interrupt step waited on ("approve", "book/approve")
--   ii   its instance: a run's pauses are numbered, so a later pause at the
--        same step is another interrupt
--   ia   how many payloads it accepts; in how many it holds
--   is   w waiting, d adopted by the run, t timed out, c closed (cancelled)
--   idl  the deadline, server time in ms (0: none)
--   ip<k> it<k> iby<k>  payload k (1-based): its bytes, server time, sender
--   irf irt  the last payload the run refused: why, and when
--   if   how many times the interrupt filled up (its continue wake-ups' ids)
--   ih:<path>  when the first payload of that step's adopted interrupt came
--              (what a duplicate continue is told)
-- Modes (ARGV[1]); the lock-holding ones take KEYS[2] = the run's lock and
-- ARGV[2] = its token, and return {-1} when the caller does not hold it.
--   open ARGV[3] path, ARGV[4] instance, ARGV[5] accepts, ARGV[6] timeout ms:
--        records a new interrupt (the one on record stays if it is this one).
--        Returns {1 new | 0 kept, in, is, idl, now}.
--   read ARGV[3] path, ARGV[4] instance: the record, and the timeout's side
--        of the compare-and-set: waiting, short of payloads and past its
--        deadline becomes timed out (as a continue past it does). Returns {0, in, ia, is, idl, now,
--        p1, t1, by1, p2, ...} or {-2} when another interrupt is on record.
--   adopt ARGV[3] path, ARGV[4] instance: the run took the payloads (d).
--   refuse ARGV[3] path, ARGV[4] instance, ARGV[5] k, ARGV[6] why: payload k
--        goes, the later ones move down. Returns {0, in}.
--   close ARGV[3] path, ARGV[4] instance: a waiting interrupt is closed
--        (the run is cancelled or rolls back). Returns {0}.
--   continue (no lock; KEYS[2] = the run's audit stream) ARGV[2] path,
--        ARGV[3] instance ('' : whichever is on record), ARGV[4] payload,
--        ARGV[5] sender, ARGV[6] audit cap, ARGV[7] payload digest, ARGV[8]
--        trace id. Returns {'ok', in, ia, now, instance, fills}, {'already', t},
--        {'timedout', idl}, {'closed'}, {'notpaused'}, {'finished'}, {'gone'}.
local mode = ARGV[1]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)

if mode == 'continue' then
  if redis.call('HEXISTS', KEYS[1], 'd') == 0 then
    return {'gone'}
  end
  if redis.call('HGET', KEYS[1], 'fin') == '1' or redis.call('PTTL', KEYS[1]) ~= -1 then
    -- a duplicate of a payload the run took is told so, finished or not
    local h = redis.call('HGET', KEYS[1], 'ih:' .. ARGV[2])
    if h then
      return {'already', h}
    end
    return {'finished'}
  end
  local r = redis.call('HMGET', KEYS[1], 'iw', 'ii', 'ia', 'in', 'is', 'idl', 'it1')
  if r[1] ~= ARGV[2] or (ARGV[3] ~= '' and r[2] ~= ARGV[3]) then
    local h = redis.call('HGET', KEYS[1], 'ih:' .. ARGV[2])
    if h then
      return {'already', h}
    end
    return {'notpaused'}
  end
  if r[5] == 't' then
    return {'timedout', r[6]}
  elseif r[5] == 'c' then
    return {'closed'}
  end
  local n, a = tonumber(r[4]), tonumber(r[3])
  if r[5] == 'd' or n >= a then
    return {'already', r[7]}
  end
  -- the continue's side of the compare-and-set with the timeout: past the
  -- deadline (server time) a payload is late, whether or not the timer has
  -- fired yet, and the interrupt is timed out here and now
  local dl = tonumber(r[6] or '0')
  if dl > 0 and now >= dl then
    redis.call('HSET', KEYS[1], 'is', 't')
    return {'timedout', r[6]}
  end
  n = n + 1
  local k = tostring(n)
  redis.call('HSET', KEYS[1], 'ip' .. k, ARGV[4], 'it' .. k, now, 'iby' .. k, ARGV[5], 'in', n)
  local e = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'k', 'continued', 'trace', ARGV[8], 'step', ARGV[2],
    'attempt', k, 'msg', ARGV[7], 'ts', tostring(now)}
  if ARGV[5] ~= '' then
    e[#e + 1] = 'op'
    e[#e + 1] = ARGV[5]
  end
  redis.call(unpack(e))
  -- if counts the times the interrupt filled up (a refused payload empties
  -- a place again): the wake-up of each fill has an id of its own, never one
  -- a delivery still active holds
  local fills = 0
  if n == a then
    fills = redis.call('HINCRBY', KEYS[1], 'if', 1)
  end
  return {'ok', n, a, now, tonumber(r[2]), fills}
end

if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return {-1}
end
local r = redis.call('HMGET', KEYS[1], 'iw', 'ii', 'ia', 'in', 'is', 'idl')
local same = r[1] == ARGV[3] and r[2] == ARGV[4]

if mode == 'open' then
  if same then
    return {0, tonumber(r[4]), r[5], tonumber(r[6]), now}
  end
  local old = tonumber(r[4] or '0')
  for k = 1, old do
    redis.call('HDEL', KEYS[1], 'ip' .. k, 'it' .. k, 'iby' .. k)
  end
  redis.call('HDEL', KEYS[1], 'irf', 'irt', 'if')
  local dl = 0
  if tonumber(ARGV[6]) > 0 then
    dl = now + tonumber(ARGV[6])
  end
  redis.call('HSET', KEYS[1], 'iw', ARGV[3], 'ii', ARGV[4], 'ia', ARGV[5], 'in', 0, 'is', 'w', 'idl', dl)
  return {1, 0, 'w', dl, now}
end

if not same then
  return {-2}
end
local n, a, st, dl = tonumber(r[4]), tonumber(r[3]), r[5], tonumber(r[6])

if mode == 'read' then
  if st == 'w' and n < a and dl > 0 and now >= dl then
    st = 't'
    redis.call('HSET', KEYS[1], 'is', 't')
  end
  local out = {0, n, a, st, dl, now}
  for k = 1, n do
    local p = redis.call('HMGET', KEYS[1], 'ip' .. k, 'it' .. k, 'iby' .. k)
    out[#out + 1] = p[1]
    out[#out + 1] = p[2]
    out[#out + 1] = p[3] or ''
  end
  return out
elseif mode == 'adopt' then
  redis.call('HSET', KEYS[1], 'is', 'd', 'ih:' .. ARGV[3], redis.call('HGET', KEYS[1], 'it1') or now)
  return {0}
elseif mode == 'refuse' then
  local k = tonumber(ARGV[5])
  if k >= 1 and k <= n then
    for j = k, n - 1 do
      local p = redis.call('HMGET', KEYS[1], 'ip' .. (j + 1), 'it' .. (j + 1), 'iby' .. (j + 1))
      redis.call('HSET', KEYS[1], 'ip' .. j, p[1], 'it' .. j, p[2], 'iby' .. j, p[3] or '')
    end
    redis.call('HDEL', KEYS[1], 'ip' .. n, 'it' .. n, 'iby' .. n)
    n = n - 1
    redis.call('HSET', KEYS[1], 'in', n, 'irf', ARGV[6], 'irt', now)
  end
  return {0, n}
elseif mode == 'close' then
  if st == 'w' then
    redis.call('HSET', KEYS[1], 'is', 'c')
  end
  return {0}
end
return redis.error_reply('interrupt.lua: unknown mode ' .. tostring(mode))
