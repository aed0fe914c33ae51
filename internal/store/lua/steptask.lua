-- steptask.lua: the record of a step that runs as its own task
-- (StepConfig.Task), kept in its owner run's hash P:{run:<owner>}:tasks.
-- Every field of one dispatch is prefixed by its token ("<tok>:"):
--   next   the attempt number whose task may run (1 at dispatch)
--   lease  "<holder>|<expiry ms>" while an attempt runs
--   out    the step's outcome, encoded by the engine (opaque here)
--   stop   "1" once a rollback asked the step to stop
--   tries  attempts begun (interrupted ones included)
--   int    attempts whose holder died (its lease lapsed unsettled)
-- The time is the server's (TIME), so no two workers' clocks meet here.
-- KEYS[1] the tasks hash
-- ARGV[1] mode, ARGV[2] token
-- begin  ARGV[3] attempt, ARGV[4] holder, ARGV[5] lease ms.
--        {'settled'} | {'stop'} | {'stale', next} | {'busy', ms left} |
--        {'ok', tries, interrupted count}
-- renew  ARGV[3] holder, ARGV[4] lease ms. {'ok', stop 0|1} | {'lost'}
-- settle ARGV[3] holder ("" for none: refused while a live lease is held),
--        ARGV[4] outcome. {'ok'} | {'settled'} | {'lost'} | {'busy', ms left}
-- retry  ARGV[3] holder, ARGV[4] the next attempt. {'ok'} | {'settled'} | {'lost'}
-- stop   {'settled'} | {'running', ms left} | {'dead'} | {'idle'}
-- look   {outcome or '', next, tries, 'none' | 'live' | 'dead', stop 0|1}
local mode, tok = ARGV[1], ARGV[2]
local key = KEYS[1]
local function f(name) return tok .. ':' .. name end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- lease returns the holder and the ms left of the current lease (nil when
-- there is none).
local function lease()
  local l = redis.call('HGET', key, f('lease'))
  if not l then return nil, 0 end
  local sep = string.find(l, '|', 1, true)
  return string.sub(l, 1, sep - 1), tonumber(string.sub(l, sep + 1)) - now
end

if mode == 'begin' then
  if redis.call('HEXISTS', key, f('out')) == 1 then return {'settled'} end
  if redis.call('HEXISTS', key, f('stop')) == 1 then return {'stop'} end
  local next = tonumber(redis.call('HGET', key, f('next')) or '1')
  if tonumber(ARGV[3]) ~= next then return {'stale', next} end
  local holder, left = lease()
  if holder and holder ~= ARGV[4] and left > 0 then return {'busy', left} end
  local int = tonumber(redis.call('HGET', key, f('int')) or '0')
  if holder and holder ~= ARGV[4] then
    int = redis.call('HINCRBY', key, f('int'), 1)
  end
  redis.call('HSET', key, f('lease'), ARGV[4] .. '|' .. (now + tonumber(ARGV[5])))
  local tries = redis.call('HINCRBY', key, f('tries'), 1)
  return {'ok', tries, int}
elseif mode == 'renew' then
  local holder = lease()
  if holder ~= ARGV[3] then return {'lost'} end
  redis.call('HSET', key, f('lease'), ARGV[3] .. '|' .. (now + tonumber(ARGV[4])))
  return {'ok', redis.call('HEXISTS', key, f('stop'))}
elseif mode == 'settle' or mode == 'retry' then
  if redis.call('HEXISTS', key, f('out')) == 1 then return {'settled'} end
  local holder, left = lease()
  if ARGV[3] == '' then
    if holder and left > 0 then return {'busy', left} end
  elseif holder ~= ARGV[3] then
    return {'lost'}
  end
  if mode == 'settle' then
    redis.call('HSET', key, f('out'), ARGV[4])
  else
    redis.call('HSET', key, f('next'), ARGV[4])
  end
  redis.call('HDEL', key, f('lease'))
  return {'ok'}
elseif mode == 'stop' then
  redis.call('HSET', key, f('stop'), '1')
  if redis.call('HEXISTS', key, f('out')) == 1 then return {'settled'} end
  local holder, left = lease()
  if holder and left > 0 then return {'running', left} end
  if holder then return {'dead'} end
  return {'idle'}
end
if mode == 'look' then
  local holder, left = lease()
  local l = 'none'
  if holder then
    l = 'dead'
    if left > 0 then l = 'live' end
  end
  return {redis.call('HGET', key, f('out')) or '', redis.call('HGET', key, f('next')) or '1',
    redis.call('HGET', key, f('tries')) or '0', l, redis.call('HEXISTS', key, f('stop'))}
end
return redis.error_reply('steptask.lua: unknown mode ' .. tostring(mode))
