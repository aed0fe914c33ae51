-- rate.lua: rate limits over sliding windows, several at once, for one
-- limit and key: P:{rate:<name>:<key>}, a sorted set of the admissions of
-- the longest window, scored by the server time (ms) they were admitted at.
-- An admission is granted only if every window has room, and then counts
-- in all of them; a refusal records nothing. Single key; the server's
-- clock.
-- KEYS[1] the admissions
-- ARGV[1] a unique member for this admission
-- ARGV[2] n, then n pairs: limit, window ms
-- Returns {1} when admitted, else {0, ms until the fullest window has
-- room again}.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local n = tonumber(ARGV[2])
local longest = 0
local wait = 0
for i = 0, n - 1 do
  local limit, window = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  if window > longest then
    longest = window
  end
  local count = redis.call('ZCOUNT', KEYS[1], '(' .. (now - window), '+inf')
  if count >= limit then
    -- room comes back when the admission that fills the window ages out
    local at = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. (now - window), '+inf', 'WITHSCORES', 'LIMIT', count - limit, 1)
    wait = math.max(wait, tonumber(at[2]) + window - now)
  end
end
if wait > 0 then
  return {0, wait}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - longest)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], longest)
return {1}
