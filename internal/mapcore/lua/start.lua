-- start.lua: create a map's metadata and claim its first batch, once.
-- KEYS[1] map meta    P:{map:<id>}:meta
-- KEYS[2] map offset  P:{map:<id>}:offset
-- ARGV[1] total            ARGV[2] batch size (inline maps: total)
-- ARGV[3] atomic (1|0)     ARGV[4] owner run id      ARGV[5] owner reactor
-- ARGV[6] element reactor  ARGV[7] step path         ARGV[8] encoded shared inputs
-- ARGV[9] element input name   ARGV[10] fan-out (1|0)   ARGV[11] paged source (1|0)
-- ARGV[12] owner's trace id (inherited by the element runs)
-- ARGV[13] sensitive owner (1|0: the element runs are sensitive runs)
-- ARGV[14] element definition's fingerprint  ARGV[15] owner definition's fingerprint
-- ARGV[16] the map's incarnation (random: a task of an earlier map under the same
--          id is told apart by it)
-- The map is created with layout 2: its element runs' keys share its slot
-- (internal/keys.ElemState), which its element scripts and the retention walk
-- read from this field (a map without it keeps each element in its own slot).
-- Returns {1, offset} when this call created the map (and claimed
-- [0, offset)), {0, offset} when it existed: a re-entered owner never claims
-- twice.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
redis.call('HSET', KEYS[1], 'total', ARGV[1], 'batch_size', ARGV[2], 'atomic', ARGV[3],
  'owner', ARGV[4], 'owner_reactor', ARGV[5], 'element', ARGV[6], 'step', ARGV[7],
  'with', ARGV[8], 'input', ARGV[9], 'fanout', ARGV[10], 'paged', ARGV[11], 'trace', ARGV[12],
  'sensitive', ARGV[13], 'element_def', ARGV[14], 'owner_def', ARGV[15], 'settled', 0, 'failures', 0,
  'inc', ARGV[16], 'layout', 2)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], 'touched', now)
local first = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]))
redis.call('SET', KEYS[2], first)
return {1, first}
