-- write.lua: the fenced write of a run's state. Every state write goes through
-- here: it lands only if the caller still holds the lock (token) and read the
-- version that is stored now, so a stale writer can never overwrite a run.
-- KEYS[1] run state hash  P:{run:<id>}:ctx  (a cancel request is its field cx)
-- KEYS[2] run lock        P:{run:<id>}:lock
-- KEYS[3] audit stream    P:{run:<id>}:audit (an element run's: its map's stream),
--         passed only by a write that appends to it or is terminal (it
--         expires the stream): every other write names only keys that
--         exist while the run is held, so that Redis Cluster refuses it
--         only while those two keys are split between the nodes of a slot
--         being moved, not for the whole move (a normally absent key is
--         never present on either side)
-- ARGV[1] lock token of the caller
-- ARGV[2] version the caller read
-- ARGV[3] encoded state
-- ARGV[4] retention in ms for a terminal write (0: not terminal, the state is made persistent;
--         -1: terminal, and the state never expires: a run a person must look at)
-- ARGV[5] 1 to release the lock in the same step (terminal write), else 0
-- ARGV[6] nonce naming this write (random per call, the same on a resend)
-- ARGV[7] shard channel announcing a terminal write, P:{run:<id>}:done ('' : none).
--         Not a key (nothing is stored), but it carries the run's hash tag:
--         a script may SPUBLISH only to a shard channel of its keys' slot.
-- ARGV[8] 1 to refuse the write while a cancel is requested (the terminal write
--         of a run that completed or halted: the request arrived during its last
--         step, and the run must roll back instead of finishing), else 0
-- ARGV[9] the audit stream's cap (XADD MAXLEN ~): the oldest entries go beyond it
-- ARGV[10] n, the number of audit entries to append, then n entries, each as
--         m (its number of fields) followed by m field/value pairs. Each entry
--         is appended (XADD, id '*': the server's time) with a field ts, the
--         server time of the write in ms, only when the write lands, so the
--         audit records exactly the state changes that were stored.
-- A terminal write expires the audit stream with the state; a non-terminal
-- write that appends makes it persistent (a run made live again by an undo).
-- Fields written: d (data), v (version), n (nonce), at (server time of the write, ms),
-- fin (1 after a terminal write, else 0).
-- A terminal write (ARGV[4] > 0) with a channel SPUBLISHes the new version on
-- it, so that Waits listening there load the run at once instead of polling.
-- Returns {-1}                 lock not held by the caller (lost or never held)
--         {-2, version}        version mismatch: the stored version
--         {-3}                 refused: ARGV[8] is 1 and a cancel is requested
--         {version, cancel, at} written; the new version, 1 if a cancel was requested,
--                              and the server time of the write (ms); a resend
--                              that finds its own write returns {version, cancel}
-- A write whose reply was lost and that the client sends again finds its own
-- nonce stored and succeeds again without writing, instead of reporting the
-- lock it released (terminal write) or the version it bumped as lost.
local last = redis.call('HMGET', KEYS[1], 'n', 'v', 'cx')
-- requested: 1 while a cancel request is stored (cancel.lua), else 0
local requested = 0
if last[3] then
  requested = 1
end
if last[1] == ARGV[6] then
  return {tonumber(last[2]), requested}
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {-1}
end
local cur = tonumber(last[2] or '0')
if cur ~= tonumber(ARGV[2]) then
  return {-2, cur}
end
-- cancelled: nil while unknown, else whether a cancel request is stored
local cancelled = nil
if ARGV[8] == '1' then
  if requested == 1 then
    return {-3}
  end
  cancelled = 0
end
local nextv = cur + 1
-- at: the Redis server's time of the write (ms), the one clock every
-- age-based decision (the run sweeper's staleness) reads.
local t = redis.call('TIME')
local at = t[1] * 1000 + math.floor(t[2] / 1000)
-- fin: 1 after a terminal write (the run is finished), 0 otherwise; what
-- cancel.lua reads for a finished run that never expires (ttl -1)
local fin = '0'
if tonumber(ARGV[4]) ~= 0 then
  fin = '1'
end
redis.call('HSET', KEYS[1], 'd', ARGV[3], 'v', nextv, 'n', ARGV[6], 'at', at, 'fin', fin)
local ttl = tonumber(ARGV[4])
if ttl ~= 0 then
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
  else
    redis.call('PERSIST', KEYS[1])
  end
  -- a finished run has no cancel to act on
  if requested == 1 then
    redis.call('HDEL', KEYS[1], 'cx')
  end
  cancelled = 0
else
  -- a live run never expires: an undo of a finished run must not lose its
  -- state to the retention the terminal write set
  redis.call('PERSIST', KEYS[1])
end
local n = tonumber(ARGV[10] or '0')
if n > 0 then
  local ms = tostring(t[1] * 1000 + math.floor(t[2] / 1000))
  local i = 11
  for _ = 1, n do
    local m = tonumber(ARGV[i])
    local args = {'XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*'}
    for j = i + 1, i + 2 * m do
      args[#args + 1] = ARGV[j]
    end
    args[#args + 1] = 'ts'
    args[#args + 1] = ms
    redis.call(unpack(args))
    i = i + 1 + 2 * m
  end
end
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[3], ttl)
elseif ttl < 0 or n > 0 then
  redis.call('PERSIST', KEYS[3])
end
if ARGV[5] == '1' then
  redis.call('DEL', KEYS[2])
end
if ttl ~= 0 and ARGV[7] ~= nil and ARGV[7] ~= '' then
  -- pcall: the write is done; a server without sharded pub/sub (Redis < 7)
  -- must not turn it into an error. Waits poll there instead.
  redis.pcall('SPUBLISH', ARGV[7], nextv)
end
if cancelled == nil then
  cancelled = requested
end
return {nextv, cancelled, at}
