-- (lock.lua comes first: `rid`, `owns`.)
-- Renews a batch of leases in one round trip. For lock i (1..n): KEYS[i] is the lock,
-- ARGV[1 + i] the owner token, ARGV[1 + n + i] the new lease in ms. Only the owner may extend.
-- KEYS[n + i] (optional, when #KEYS is 2n): lock i's owner key, given the same new PTTL.
-- Each key is read with pcall: a key someone overwrote with another type (WRONGTYPE) is
-- "not held" for its own lease only, and never aborts the batch.
-- Returns {rid, r1, ..., rn}: ri = 1 renewed, 0 no longer held by that token.
local n = (#ARGV - 1) / 2
local owners = #KEYS == 2 * n
local out = {rid}
for i = 1, n do
  local cur = redis.pcall('GET', KEYS[i])
  if owns(cur, ARGV[1 + i]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[1 + n + i])
    if owners then redis.pcall('PEXPIRE', KEYS[n + i], ARGV[1 + n + i]) end
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
return out
