-- (lock.lua comes first: `rid`, `owns`, `extend_share`.)
-- Renews a batch of leases in one round trip. For lease i (1..n): KEYS[i] is the lock,
-- KEYS[n + i] its owner key, ARGV[1 + i] "<owner token>:<fence>" (the fence in counter units the
-- lease was taken with), ARGV[1 + n + i] the new lease in ms. Only the owner's lease may be
-- extended: the token and the fence must both match (a lock its token took again after the
-- lease ended, a request of it held up in the network, is another lease). A shared lease (a
-- read share or a permit) is sent as 's<token>:<fence>', with KEYS[i] the key's shared
-- holders and KEYS[n + i] their records (see `keep_shared`); it is renewed while its expiry is
-- still in the future.
-- ARGV[2 + 2n] (optional, a batch of one only): the check of a local hand-off, the place of
-- the holder the lease was passed to in its process. The owner key then names that holder:
-- "<client ms>|<owner>|<place>" (the time as this host's clock, shown only), `owner` the first four fields of the record it had.
-- Each key is read with pcall: a key someone overwrote with another type (WRONGTYPE) is
-- "not held" for its own lease only, and never aborts the batch.
-- KEYS[2n + i]: the lock's state, where a token no longer holding tells a forced unlock
-- (force.lua marks it 'f').
-- Returns {rid, r1, ..., rn}: ri = 1 renewed, 0 no longer held by that token, 2 no longer held
-- because an operator force-unlocked it.
local n = #KEYS / 3
local passed = n == 1 and ARGV[4]

-- Shared lease i of token `t`.
local function renew_shared(i, t, c, lease)
  local rec = redis.pcall('HGET', KEYS[n + i], t)
  if type(rec) ~= 'string' or string.match(rec, '^(%d+)') ~= c then return 0 end
  local now = anchored_ms(KEYS[n + i])
  return now and extend_share(t, lease, now, KEYS[i], KEYS[n + i]) and 1 or 0
end

-- Exclusive lease i of token `t`.
local function renew_lock(i, t, c, lease)
  local cur = redis.pcall('GET', KEYS[i])
  if not owns(cur, t) or string.sub(cur, 34) ~= c then return 0 end
  redis.call('PEXPIRE', KEYS[i], lease)
  local rec = passed and redis.pcall('GET', KEYS[n + i])
  local who = type(rec) == 'string' and string.match(rec, '^%d+|([^|]*|[^|]*|[^|]*|[^|]*)')
  if who then
    redis.call('SET', KEYS[n + i], string.format('%.0f', client_ms()) .. '|' .. who .. '|' .. passed,
      'PX', lease)
  else
    redis.pcall('PEXPIRE', KEYS[n + i], lease)
  end
  return 1
end

local out = {rid}
for i = 1, n do
  local share, t, c = string.match(ARGV[1 + i], '^(s?)(%x+):(%d+)$')
  local lease = ARGV[1 + n + i]
  if not t then
    out[i + 1] = 0
  elseif share == 's' then
    out[i + 1] = renew_shared(i, t, c, lease)
  else
    out[i + 1] = renew_lock(i, t, c, lease)
  end
  if out[i + 1] == 0 then
    local m = redis.pcall('HGET', KEYS[2 * n + i], 'm:' .. t)
    if type(m) == 'string' and string.sub(m, 1, 1) == 'f' then out[i + 1] = 2 end
  end
end
return out
