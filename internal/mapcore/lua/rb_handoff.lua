-- rb_handoff.lua: the owner's half of the two-flag handshake, run after the
-- owner saved its hand-off: mark handed_off, then resume the owner itself if
-- every job already settled (and nobody claimed the signal).
-- KEYS[1] handed_off        P:{map:<id>}:rb:<gen>:handed_off
-- KEYS[2] rollback meta     P:{map:<id>}:rb:<gen>:meta
-- KEYS[3] rollback offset   P:{map:<id>}:rb:<gen>:offset
-- KEYS[4] signalled         P:{map:<id>}:rb:<gen>:signalled
-- Returns 1 when the caller must enqueue the owner's resume, else 0.
redis.call('SET', KEYS[1], '1')
local m = redis.call('HMGET', KEYS[2], 'total', 'settled')
local total, settled = tonumber(m[1]), tonumber(m[2])
local offset = tonumber(redis.call('GET', KEYS[3]) or '0')
if settled >= offset and offset >= total then
  if redis.call('SET', KEYS[4], '1', 'NX') then
    return 1
  end
end
return 0
