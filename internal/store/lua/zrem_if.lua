-- zrem_if.lua: remove an index entry only if it is unchanged since it was
-- read, so a writer that re-indexed the member meanwhile (an undo or a resume
-- making a finished run live again) keeps its entry. Single key, so it runs
-- on any cluster node that owns the index.
-- KEYS[1] a sorted-set index (P:idx:active, P:idx:maps, P:idx:status:<s>, P:idx:runs,
--         P:idx:needs_human, ...)
-- ARGV[1] member
-- ARGV[2] the score the caller read (as Redis formats it: ZSCORE's reply)
-- Returns 1 when removed, 0 when the entry is gone or its score changed.
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
