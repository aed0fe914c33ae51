-- create.lua: create a run's state unless it exists, under the caller's lock.
-- KEYS[1] run state hash  P:{run:<id>}:ctx   (fields d = data, v = version,
--                                            at = server time of the last write, ms)
-- KEYS[2] run lock        P:{run:<id>}:lock
-- ARGV[1] lock token of the caller
-- ARGV[2] encoded state to store when the run is new
-- ARGV[3] lock expiry in ms: the script takes the lock itself (SET NX PX),
--         saving the caller a round trip; '' or absent: the caller already
--         holds it
-- Returns {-1}               the caller does not hold the lock (or could not take it)
--         {1, 1}             created, version 1
--         {0, version, data} the run already existed: its current state
if ARGV[3] and ARGV[3] ~= '' then
  if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[3]) then
    return {-1}
  end
elseif redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {-1}
end
local cur = redis.call('HMGET', KEYS[1], 'v', 'd')
if cur[1] then
  return {0, tonumber(cur[1]), cur[2]}
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'd', ARGV[2], 'v', 1, 'at', t[1] * 1000 + math.floor(t[2] / 1000))
return {1, 1}
