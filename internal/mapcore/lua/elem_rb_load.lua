-- elem_rb_load.lua: take a map element's lock and load its run for its rollback
-- job, after checking in the same script that the job's
-- rollback generation is current and has claimed its position: the job reads
-- nothing else first (its task carries the map's immutable metadata and the
-- element's forward outcome).
-- KEYS[1] element state    P:{map:<id>}:el:<i>:ctx
-- KEYS[2] element lock     P:{map:<id>}:el:<i>:lock
-- KEYS[3] map meta         P:{map:<id>}:meta
-- KEYS[4] rollback meta    P:{map:<id>}:rb:<gen>:meta
-- KEYS[5] rollback offset  P:{map:<id>}:rb:<gen>:offset
-- ARGV[1] lock token of the caller   ARGV[2] generation   ARGV[3] position
-- ARGV[4] the rollback's total as the task knows it (unused here; see below)
-- ARGV[5] the map's incarnation as the task knows it
-- ARGV[6] lock expiry in ms: the script takes the lock (SET NX PX), which the
--         caller then adopts (internal/lock.Adopt); on a refusal below the
--         caller releases it
-- Returns {version, data}  the element's state
--         {-1}             someone else holds the lock
--         {-3}             the element has no run
--         {-4}             the map or its rollback is gone
--         {-5}             a task of an earlier map under the same id
--         {-8}             a newer generation superseded this one
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[6]) then
  return {-1}
end
-- rb_start.lua sets rbgen with the generation's meta; the map's incarnation
-- tells a task of an earlier map under the same id. Only a claim dispatches
-- a task that carries them (mapstep's dispatchRollback), so the position is
-- claimed: the rollback's keys (KEYS[4], KEYS[5]) are read only by the old path.
local m = redis.call('HMGET', KEYS[3], 'rbgen', 'inc')
if (m[2] or '') ~= ARGV[5] then
  return {-5}
end
if not m[1] then
  return {-4}
end
if tonumber(m[1]) > tonumber(ARGV[2]) then
  return {-8}
end
local cur = redis.call('HMGET', KEYS[1], 'v', 'd')
if not cur[1] then
  return {-3}
end
return {tonumber(cur[1]), cur[2]}
