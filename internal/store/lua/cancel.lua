-- cancel.lua: ask the process executing a run to cancel it, only while the
-- run is live. A finished run's state carries its retention (a TTL), or, for
-- one a person must look at, no TTL and fin = 1; a cancel key set after the
-- terminal write (which deletes any) would never expire.
-- KEYS[1] run state hash  P:{run:<id>}:ctx
-- KEYS[2] cancel request  P:{run:<id>}:cancel
-- ARGV[1] ttl of the request in ms (0: until the run's terminal write deletes it)
-- Returns 1 when the request was stored, 0 when the run is finished or gone.
if redis.call('PTTL', KEYS[1]) ~= -1 or redis.call('HGET', KEYS[1], 'fin') == '1' then
  return 0
end
if tonumber(ARGV[1]) > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
else
  redis.call('SET', KEYS[2], '1')
end
return 1
