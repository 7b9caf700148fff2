-- (lock.lua comes first: `owns`.)
-- Renews a batch of leases in one round trip. For lock i (1..n): KEYS[i] is the lock,
-- ARGV[i] the owner token, ARGV[n + i] the new lease in ms. Only the owner may extend.
-- Returns one entry per lock: 1 renewed, 0 no longer held by that token.
local n = #KEYS
local out = {}
for i = 1, n do
  local cur = redis.call('GET', KEYS[i])
  if owns(cur, ARGV[i]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
