-- (lock.lua comes first: `rid`, `owns`, `take_lock`, the queue, `hand_over`.)
-- Releases lock KEYS[1] if owner token ARGV[2] holds it; otherwise only drops ARGV[2] from
-- the waiter queue (a waiter that gave up: a holder is never queued). KEYS[2..7] and ARGV[4]
-- (the fencing counter's retention): as in acquire.lua.
-- If live waiters are queued, the lock goes straight to the longest one with the lease it
-- registered, or to the run of readers at the head of the queue (see `hand_over`, which
-- publishes each grant on channel ARGV[3]); "r" is published when lapsed registrations were
-- dropped instead (also when more may remain: the waiters' own attempts drop the rest). With
-- nobody queued nothing is published: every waiter joins the queue in the same script call
-- that finds the lock busy, so an empty queue means no waiter to wake (one whose registration
-- went stale still retries on its own timer).
-- PUBLISH may be denied (an ACL without channel rights): the release and hand-over have
-- happened by then and stand; waiters fall back to their timed retry.
-- KEYS[5]: the owner key, deleted with the lock.
-- KEYS[8] (optional, never with force.lua): `{lock}:done:<token>`, the proof that this token's
-- own release happened, kept ARGV[5] ms. A retried release whose first try's reply was lost
-- finds it and answers 3; without it, "not the holder" may mean expired, force-unlocked or a
-- server restarted without its data, and another owner may have run: that is a loss.
-- ARGV[6] = 'a': the release of an abandoned acquisition (its compensation). KEYS[8] is then set
-- to 'a' whether or not the token held the lock, and acquire.lua refuses the token from then
-- on: a request of it still in the network takes nothing when it lands. A release that finds
-- the lock not its own marks the token the same way ('l', no proof; see `not_holder`).
-- ARGV[6] = 'k<ms>': `min_hold`; the holder keeps the lock (and its owner key) for <ms> more
-- instead of releasing it now, and leaves the same proof (kept at least that long), so a
-- retry whose first try's reply was lost is a success, not a loss. No hand-over: nobody may
-- take the lock before then, and no later request of the token changes it (see `kept_by`).
-- Never deletes another owner's lock. Returns {rid, n}: n = 0 if ARGV[2] did not hold the
-- lock, 1 if it was released, 2 if it was released and handed to a waiter, 3 if this token's
-- release had already happened (the marker of KEYS[8]).
local token = ARGV[2]
local abandon = KEYS[8] and ARGV[6] == 'a'
local cur = redis.call('GET', KEYS[1])
if not owns(cur, token) then
  return not_holder(token, abandon)
end
local keep = tonumber(string.match(ARGV[6] or '', '^k(%d+)$'))
if keep then
  -- The kept lock is no longer this token's: its value's token becomes `kept_by`, so a renewal
  -- (or hand-off check) of the token that lands after this release, on another connection,
  -- finds it not its own and changes nothing. A retry of this release finds the proof.
  redis.call('SET', KEYS[1], kept_by(token) .. string.sub(cur, 33), 'PX', keep)
  redis.pcall('PEXPIRE', KEYS[5], keep)
  if KEYS[8] then
    redis.call('SET', KEYS[8], '1', 'PX', string.format('%.0f', math.max(keep, tonumber(ARGV[5]))))
  end
  return {rid, 1}
end
redis.call('DEL', KEYS[1], KEYS[5])
if KEYS[8] then redis.call('SET', KEYS[8], abandon and 'a' or '1', 'PX', ARGV[5]) end

local granted, stale = hand_over(ARGV[3], ARGV[4], token, nil, 0)
if granted > 0 then return {rid, 2} end
if stale then redis.pcall('PUBLISH', ARGV[3], 'r') end
return {rid, 1}
