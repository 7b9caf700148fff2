-- (lock.lua comes first: `rid`, `now_ms`.)
-- Reads one lock for inspection, writes nothing. KEYS[1] the lock, KEYS[2] its owner key,
-- KEYS[3], KEYS[4] its waiter queue and details (as in acquire.lua).
-- Returns {rid, value, pttl, owner, live waiters}: value "<token>:<fence>" or "" when the lock
-- is free, owner "" when there is no owner key.
-- Waiters are counted among the first 1000 queued, only those whose registration is live.
local cur = redis.call('GET', KEYS[1]) or ''
local pttl = redis.call('PTTL', KEYS[1])
local owner = redis.call('GET', KEYS[2]) or ''
local live = 0
local heads = redis.call('ZRANGE', KEYS[3], 0, 999)
for _, head in ipairs(heads) do
  local info = redis.call('HGET', KEYS[4], head)
  local expiry = info and tonumber(string.match(info, '^(%d+)'))
  if expiry and expiry > now_ms() then live = live + 1 end
end
return {rid, cur, pttl, owner, live}
