-- corr.lua: a correlation id's claim, P:{corr:<id>}, naming the interrupt
-- that waits for it as "<run>\t<step path>\t<instance>". It lives in a slot
-- of its own, apart from the run: claiming is a protocol (claim, record the
-- interrupt with the run, release on failure), and this script is its
-- single-slot half.
-- KEYS[1] the claim
-- ARGV[1] mode: claim | swap | release | retire
-- claim   ARGV[2] holder, ARGV[3] ttl ms (0: none). Returns {1} when taken
--         (or already this holder's), else {0, the current holder}.
-- swap    ARGV[2] holder, ARGV[3] ttl ms, ARGV[4] the stale holder read:
--         taken only if the claim still names it. Returns as claim.
-- release ARGV[2] holder: deleted if it still names the holder. {1} or {0}.
-- retire  ARGV[2] holder, ARGV[3] ttl ms: the interrupt took its payload;
--         the claim stays that long, naming it, so that a late duplicate
--         is told "already continued". {1} or {0}.
local mode = ARGV[1]
local cur = redis.call('GET', KEYS[1])
local function take()
  if tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  else
    redis.call('SET', KEYS[1], ARGV[2])
  end
  return {1}
end
if mode == 'claim' then
  if not cur or cur == ARGV[2] then
    return take()
  end
  return {0, cur}
elseif mode == 'swap' then
  if not cur or cur == ARGV[4] or cur == ARGV[2] then
    return take()
  end
  return {0, cur}
elseif mode == 'release' then
  if cur == ARGV[2] then
    redis.call('DEL', KEYS[1])
    return {1}
  end
  return {0}
elseif mode == 'retire' then
  if cur == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1}
  end
  return {0}
end
return redis.error_reply('corr.lua: unknown mode ' .. tostring(mode))
