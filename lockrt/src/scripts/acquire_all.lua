-- (lock.lua comes first: `rid`, `take_lock`.)
-- Takes several locks of one cluster slot in one call, all or none: only when every one is
-- free with nobody queued and no reader or permit holder, as acquire.lua's uncontended path
-- finds it; otherwise nothing changes and the caller takes them one by one (and waits).
-- Lock i (1..n) has the 7 keys of acquire.lua at KEYS[7(i-1)+1 .. 7i];
-- ARGV[2] the lease in ms, ARGV[3] the fencing counter's retention, ARGV[4] the acquirer's
-- identity, ARGV[4 + i] lock i's owner token.
-- Returns {rid, 1, fence1, ..., fencen} when taken, {rid, 0} when not.
local n = #KEYS / 7
local function keys_of(i)
  local K = {}
  for j = 1, 7 do K[j] = KEYS[7 * (i - 1) + j] end
  return K
end
local states = {}
for i = 1, n do
  local K = keys_of(i)
  if redis.call('EXISTS', K[1], K[3], K[6]) ~= 0 then return {rid, 0} end
  states[i] = state_of(ARGV[4 + i], K)
  -- A barred token: the one-by-one path gets its refusal.
  if states[i].barred then return {rid, 0} end
end
local out = {rid, 1}
for i = 1, n do
  out[i + 2] = (take_lock(ARGV[4 + i], ARGV[2], ARGV[3], ARGV[4], keys_of(i), states[i]))
end
return out
