-- (lock.lua comes first: `rid`, `now_ms`, `registration`.)
-- Reads one lock for inspection, writes nothing. KEYS as in acquire.lua (1 to 7).
-- Returns {rid, value, pttl, owner, live waiters, kind, shared...}: value "<token>:<fence>" or
-- "" when no writer holds the lock, owner "" when there is no owner key, kind 'r' or 's<n>'
-- when the key has shared holders ('' otherwise), then for each live shared holder (at most
-- 1000) its remaining lease in ms and its record "<fence>|<acquired-at ms>|<owner>".
-- Waiters are counted among the first 1000 queued, only those whose registration is live.
local cur = redis.call('GET', KEYS[1]) or ''
local pttl = redis.call('PTTL', KEYS[1])
local owner = redis.call('GET', KEYS[5]) or ''
local live = 0
for _, t in ipairs(redis.call('ZRANGE', KEYS[3], 0, 999)) do
  if registration(t) then live = live + 1 end
end
local out = {rid, cur, pttl, owner, live, redis.call('HGET', KEYS[7], 'kind') or ''}
local now = now_ms()
local shared = redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. string.format('%.0f', now), '+inf',
  'WITHSCORES', 'LIMIT', 0, 1000)
for i = 1, #shared, 2 do
  out[#out + 1] = math.floor(tonumber(shared[i + 1]) - now)
  out[#out + 1] = redis.call('HGET', KEYS[7], shared[i]) or ''
end
return out
