-- touch_if.lua: move an active-index entry to a new score only if it still
-- has the score the sweeper read, so that a writer that re-indexed the run
-- meanwhile (a paused run continued, cancelled or timed out: its status
-- write re-scores the entry) keeps its entry where it put it. The run
-- sweeper touches a waiting paused run far ahead (to its deadline, or
-- RunConfig.PausedRecheck away); overwriting a fresh writer's score with
-- that would hide a live run from the sweeper as long. Single key, so it
-- runs on any cluster node that owns the index.
-- KEYS[1] the active index P:idx:active
-- ARGV[1] member (a run id)
-- ARGV[2] the score the caller read (as Redis formats it: ZSCORE's reply)
-- ARGV[3] the new score
-- Returns 1 when moved, 0 when the entry is gone or its score changed.
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) == tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
  return 1
end
return 0
