-- release.lua: delete a lock only while it holds the caller's token.
-- KEYS[1] the lock key
-- ARGV[1] the caller's token
-- Returns 1 deleted, 0 held by someone else, -1 no lock (expired or released)
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  return redis.call('DEL', KEYS[1])
elseif not v then
  return -1
end
return 0
