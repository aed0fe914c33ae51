-- batch.lua: the batch protocol's settle, one implementation for a map's
-- forward pass and every generation of its rollback. It is prepended to
-- each script that settles a position (settle.lua, elem_finish.lua), so
-- what defines a settle is written once:
--   * first writer wins: the outcome is stored with HSETNX, and only the
--     settle that stored it counts, claims or signals;
--   * the trigger position of a batch, half a batch before its end
--     (k*B-1-B/2), claims the next batch by compare-and-set on the absolute
--     offset, so the next batch is queued while the rest of this one runs
--     and a duplicate trigger claims nothing; one action enqueues at most B;
--   * the owner's signal is claimed once (SET NX) when every claimed
--     position has settled and nothing more will be claimed.
-- The two directions differ only in their keys and three rules, passed in d:
--   forward:  d.stop is the map's failed flag (claims stop once it exists;
--             an atomic map's first failure sets it), failures count in
--             'failures', and the owner is signalled when the map settled
--             or stopped;
--   rollback: no stop flag, failures count in 'failed', each outcome name
--             counts in 'n:<name>', and the owner is signalled only once it
--             handed off (d.gate, the handshake's other flag, exists).
-- A stored outcome also sets its element's state in d.states (a GETRANGE and
-- a SETRANGE of its byte, see noteState), the dashboard's summary; a
-- duplicate stores nothing and sets nothing.
--
-- settle(d) with d = {meta, offset, results, stop, gate, signal, states (keys),
-- pos (and field, the same position as the results hash's field), enc, fail (bool), atomic (bool), count (outcome name or nil),
-- total, b, now, claimed (the offset when the caller read it)}
-- returns stored, from, to, signal.

-- mpFirst returns the value of the first key of the msgpack map enc when
-- that key is the one-letter string k and its value a short string or a
-- non-negative integer (mapstep's outcome starts with "s", its status, and
-- its rollback outcome with "i", the element's index, as internal/codec
-- encodes them), else nil.
local function mpFirst(enc, k)
  local b0, b1, t = string.byte(enc, 1), string.byte(enc, 2), string.byte(enc, 4)
  if not t or b0 < 0x80 or b0 > 0x8f or b1 ~= 0xa1 or string.sub(enc, 3, 3) ~= k then
    return nil
  end
  if t >= 0xa0 and t <= 0xbf then
    return string.sub(enc, 5, 4 + t - 0xa0)
  elseif t < 0x80 then
    return t
  end
  local width = ({[0xcc] = 1, [0xcd] = 2, [0xce] = 4, [0xcf] = 8})[t]
  if not width or #enc < 4 + width then
    return nil
  end
  local n = 0
  for j = 5, 4 + width do
    n = n * 256 + string.byte(enc, j)
  end
  return n
end

-- An element's state for the dashboard's summary, in P:{map:<id>}:states:
-- byte i is element i's, its high nibble the class of the forward outcome
-- (1 ok, halted or skipped; 2 failed; 3 any other status, stopped) and its
-- low nibble the class of its newest rollback outcome (1 undone; 2 failed;
-- 3 context_unavailable; 4 any other, not_needed: the forward state shows).
-- A later rollback generation overwrites an earlier one's nibble, and the
-- two nibbles are independent, so the order of a forward settle and a
-- rollback settle does not matter. internal/inspect reads the string only
-- when its counts of set nibbles equal the map's settled counters (an
-- outcome this could not parse, or one a process without this code stored,
-- leaves the nibble unset and the reader falls back to the results hashes).
local fwdClass = {ok = 1, halted = 1, skipped = 1, failed = 2}
local rbClass = {undone = 1, failed = 2, context_unavailable = 3}
-- setNibble sets the high (forward) or low (rollback) half of byte i of key
-- to v. GETRANGE and SETRANGE rather than BITFIELD: the embedded Redis the
-- demo falls back to (miniredis) has no BITFIELD; the bytes are the same.
local function setNibble(key, i, high, v)
  local cur = redis.call('GETRANGE', key, i, i)
  local b = 0
  if cur ~= '' then
    b = string.byte(cur)
  end
  local hi, lo = math.floor(b / 16), b % 16
  if high then hi = v else lo = v end
  redis.call('SETRANGE', key, i, string.char(hi * 16 + lo))
end

local function noteState(d)
  if d.count then
    local i = mpFirst(d.enc, 'i')
    if type(i) == 'number' and i >= 0 then
      setNibble(d.states, i, false, rbClass[d.count] or 4)
    end
    return
  end
  local s = mpFirst(d.enc, 's')
  if type(s) == 'string' and d.pos >= 0 and d.pos < d.total then
    setNibble(d.states, d.pos, true, fwdClass[s] or 3)
  end
end

local function settle(d)
  if redis.call('HSETNX', d.results, d.field, d.enc) == 0 then
    return 0, -1, -1, 0
  end
  noteState(d)
  local settled = redis.call('HINCRBY', d.meta, 'settled', 1)
  -- Progress time (server clock) for the map sweeper, which leaves a map
  -- that settled something recently alone.
  redis.call('HSET', d.meta, 'touched', d.now)
  if d.count then
    redis.call('HINCRBY', d.meta, 'n:' .. d.count, 1)
  end
  if d.fail then
    redis.call('HINCRBY', d.meta, d.stop and 'failures' or 'failed', 1)
    if d.stop and d.atomic then
      redis.call('SET', d.stop, d.field, 'NX')
    end
  end
  local total, b, pos = d.total, d.b, d.pos
  local ahead = math.floor(b / 2)
  local trigger = (pos + 1 + ahead) % b == 0
  -- Claims are whole batches, so the offset is at least the end of pos's
  -- batch: while fewer positions settled, the map cannot have settled, and
  -- only a trigger needs the offset.
  local offset = d.claimed
  if offset == nil and (trigger or settled >= math.min((math.floor(pos / b) + 1) * b, total)) then
    offset = tonumber(redis.call('GET', d.offset) or '0')
  end
  local stopped = nil -- read only when it decides something
  local function isStopped()
    if stopped == nil then
      stopped = d.stop ~= nil and redis.call('EXISTS', d.stop) == 1
    end
    return stopped
  end
  local from, to = -1, -1
  if trigger and offset == pos + 1 + ahead and offset < total and not isStopped() then
    local nxt = math.min(offset + b, total)
    redis.call('SET', d.offset, nxt)
    from, to, offset = offset, nxt - 1, nxt
  end
  local signal = 0
  if offset and settled >= offset and (offset >= total or isStopped())
      and (d.gate == nil or redis.call('EXISTS', d.gate) == 1)
      and redis.call('SET', d.signal, '1', 'NX') then
    signal = 1
  end
  return 1, from, to, signal
end

