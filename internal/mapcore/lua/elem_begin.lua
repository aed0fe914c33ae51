-- elem_begin.lua: take a fan-out map element's lock and create its run, or
-- load it, after checking in the same script that the map
-- still takes the element: the job reads no map metadata of its own (its
-- task carries the immutable part). The element's keys share the map's slot.
-- KEYS[1] element state  P:{map:<id>}:el:<i>:ctx  (fields d = data, v = version)
-- KEYS[2] element lock   P:{map:<id>}:el:<i>:lock
-- KEYS[3] map meta       P:{map:<id>}:meta
-- KEYS[4] map offset     P:{map:<id>}:offset
-- KEYS[5] map failed     P:{map:<id>}:failed
-- ARGV[1] lock token of the caller
-- ARGV[2] encoded state to store when the element is new
-- ARGV[3] element index
-- ARGV[4] the map's incarnation as the task knows it (meta field inc)
-- ARGV[5] lock expiry in ms: the script takes the lock (SET NX PX), which the
--         caller then adopts (internal/lock.Adopt); on a refusal below the
--         caller releases it
-- Returns {-1}               someone else holds the lock
--         {1, 1}             created, version 1
--         {0, version, data} the element existed: its current state
--         {-4}               the map is gone (expired, or never started)
--         {-5}               a task of an earlier map under the same id (another
--                            incarnation)
--         {-6}               the map failed (or was stopped): the position settles
--                            stopped instead of running
--         {-7}               the map's owner has finished: nothing runs or settles
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[5]) then
  return {-1}
end
local cur = redis.call('HMGET', KEYS[1], 'v', 'd')
if cur[1] then
  -- A resume or a late duplicate (rare): the checks a fresh element needs
  -- cost nothing on the common path.
  if redis.call('PTTL', KEYS[3]) > 0 then
    return {-7}
  end
  if redis.call('EXISTS', KEYS[5]) == 1 then
    return {-6}
  end
  return {0, tonumber(cur[1]), cur[2]}
end
local m = redis.call('HMGET', KEYS[3], 'total', 'inc')
if not m[1] then
  return {-4}
end
-- Only a claim dispatches a task that carries the map's incarnation
-- (mapstep's dispatch, after the start script or a settle claimed its
-- batch), so a matching incarnation means a claimed position: the offset
-- (KEYS[4]) is read only by the old path.
if (m[2] or '') ~= ARGV[4] then
  return {-5}
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {-6}
end
redis.call('HSET', KEYS[1], 'd', ARGV[2], 'v', 1)
return {1, 1}
