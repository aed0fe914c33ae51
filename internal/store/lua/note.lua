-- note.lua: append an entry that no state change carries to a run's audit
-- stream (an operator's request, with who asked and why), keeping the
-- stream's lifetime the run's.
-- KEYS[1] the audit stream   P:{run:<id>}:audit, or the map's for an element
-- KEYS[2] the run's state    P:{run:<id>}:ctx (same slot)
-- ARGV[1] the stream's cap (XADD MAXLEN ~)
-- ARGV[2..] the entry's field/value pairs; the script adds ts, the server's
--         time in ms, as the fenced write does
-- The stream takes the state's time to live: a finished run's entries go
-- with it, and a live run's stream stays until its terminal write expires it.
-- Returns the entry's id, or false when the run has no state (nothing is
-- appended: an entry must not outlive, or precede, its run).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
  return false
end
local t = redis.call('TIME')
local args = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*'}
for i = 2, #ARGV do
  args[#args + 1] = ARGV[i]
end
args[#args + 1] = 'ts'
args[#args + 1] = tostring(t[1] * 1000 + math.floor(t[2] / 1000))
local id = redis.call(unpack(args))
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return id
