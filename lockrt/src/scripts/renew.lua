-- (lock.lua comes first: `rid`, `now_ms`, `owns`.)
-- Renews a batch of leases in one round trip. For lock i (1..n): KEYS[i] is the lock,
-- ARGV[1 + i] the owner token, ARGV[1 + n + i] the new lease in ms. Only the owner may extend.
-- KEYS[n + i] (optional, when #KEYS is 2n): lock i's owner key, given the same new PTTL.
-- ARGV[2 + 2n] (optional, a batch of one only): the check of a local hand-off, the place of
-- the holder the lease was passed to in its process. The owner key then names that holder:
-- "<server ms>|<owner>|<place>", `owner` the first four fields of the record it had.
-- Each key is read with pcall: a key someone overwrote with another type (WRONGTYPE) is
-- "not held" for its own lease only, and never aborts the batch.
-- Returns {rid, r1, ..., rn}: ri = 1 renewed, 0 no longer held by that token.
local n = math.floor((#ARGV - 1) / 2)
local owners = #KEYS == 2 * n
local passed = n == 1 and ARGV[4]
local out = {rid}
for i = 1, n do
  local cur = redis.pcall('GET', KEYS[i])
  if owns(cur, ARGV[1 + i]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[1 + n + i])
    if owners then
      local rec = passed and redis.pcall('GET', KEYS[n + i])
      local who = type(rec) == 'string' and string.match(rec, '^%d+|([^|]*|[^|]*|[^|]*|[^|]*)')
      if who then
        redis.call('SET', KEYS[n + i], string.format('%.0f', now_ms()) .. '|' .. who .. '|' .. passed,
          'PX', ARGV[1 + n + i])
      else
        redis.pcall('PEXPIRE', KEYS[n + i], ARGV[1 + n + i])
      end
    end
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
return out
