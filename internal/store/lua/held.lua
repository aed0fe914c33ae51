-- What one map element still holds after its rollbacks, and the map's
-- totals, kept in one hash of the map's slot.
-- KEYS[1] the map's held hash, KEYS[2] the map's meta
-- ARGV[1] the element's index, ARGV[2..4] waiting, left applied, failed
-- Returns the map's totals {waiting, left applied, failed}. The element's
-- field is overwritten (the latest truth wins, so a repeat is harmless) and
-- the totals move by the difference. A map whose meta is gone (expired with
-- its tree) holds nothing: the hash goes too. The hash takes the meta's
-- expiry, so it never outlives the map.
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
  return {0, 0, 0}
end
local field = ARGV[1]
local w, l, f = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ow, ol, of = 0, 0, 0
local old = redis.call('HGET', KEYS[1], field)
if old then
  local a, b, c = string.match(old, '^(%d+):(%d+):(%d+)$')
  ow, ol, of = tonumber(a), tonumber(b), tonumber(c)
end
if w + l + f == 0 then
  redis.call('HDEL', KEYS[1], field)
else
  redis.call('HSET', KEYS[1], field, w .. ':' .. l .. ':' .. f)
end
local tw = redis.call('HINCRBY', KEYS[1], '#w', w - ow)
local tl = redis.call('HINCRBY', KEYS[1], '#l', l - ol)
local tf = redis.call('HINCRBY', KEYS[1], '#f', f - of)
if tw + tl + tf == 0 and redis.call('HLEN', KEYS[1]) == 3 then
  redis.call('DEL', KEYS[1])
  return {0, 0, 0}
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
return {tw, tl, tf}
