-- time.lua: the Redis server's clock, read on the node that holds a run.
-- KEYS[1] the run's state key (not read: it routes the call to the run's slot,
--         so every reading of a run's clock comes from the node its writes use)
-- Returns the server time in Unix ms.
local t = redis.call('TIME')
return t[1] * 1000 + math.floor(t[2] / 1000)
