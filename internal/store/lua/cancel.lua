-- cancel.lua: ask the process executing a run to cancel it, only while the
-- run is live. A finished run's state carries its retention (a TTL), or, for
-- one a person must look at, no TTL and fin = 1; a request stored after the
-- terminal write (which deletes any) would never be acted on.
-- The request is the state's field cx, which the fenced write (write.lua)
-- reads and a terminal write deletes: no key of its own, which Redis Cluster
-- would find on neither side of a slot being moved.
-- KEYS[1] run state hash  P:{run:<id>}:ctx
-- KEYS[2] the request key of goreactor before 0.1.0's cluster work,
--         P:{run:<id>}:cancel: set too (for an hour at most), so that a
--         process of that version executing the run during a rolling deploy
--         sees the request
-- Returns 1 when the request was stored, 0 when the run is finished or gone.
if redis.call('PTTL', KEYS[1]) ~= -1 or redis.call('HGET', KEYS[1], 'fin') == '1' then
  return 0
end
redis.call('HSET', KEYS[1], 'cx', '1')
redis.call('SET', KEYS[2], '1', 'PX', 3600000)
return 1
