-- once.lua: a once-per-period guard: the first run that claims a key in a
-- period (aligned to the Unix epoch, on the Redis server's clock) holds it
-- until the period ends; any other run is told who holds it.
-- KEYS[1] P:{once:<name>:<key>}
-- ARGV[1] the claiming run, ARGV[2] the period in ms
-- Returns {1} when the run holds the period (now or already), else
-- {0, holder, ms until the period ends}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local period = tonumber(ARGV[2])
local start = now - (now % period)
local field = tostring(start)
local cur = redis.call('HGET', KEYS[1], field)
if cur == ARGV[1] then
  return {1}
end
if cur then
  return {0, cur, start + period - now}
end
-- a new period: the previous periods' claims go
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], field, ARGV[1])
redis.call('PEXPIRE', KEYS[1], start + period - now)
return {1}
