-- (lock.lua comes first: `rid`, `owns`, `take_lock`, the queue, the state, `hand_over`.)
-- Releases lock KEYS[1] if owner token ARGV[2] holds it; otherwise only drops ARGV[2] from
-- the waiter queue (a waiter that gave up: a holder is never queued) and tells whether this
-- token's own release already happened (see `not_holder`). KEYS[2..7] and ARGV[4] (the
-- state's retention): as in acquire.lua. ARGV[6]: the holder's fence (counter units, '' when
-- not known: an abandoned acquisition's).
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
-- The release is recorded in the lock's state (`record_release`): a retried release whose
-- first try's reply was lost finds it and answers 3; a lease that ended otherwise was marked,
-- and "not the holder" is then a loss.
-- ARGV[5]: '' a holder's release; 'a' the release of an abandoned acquisition (its
-- compensation): the token is marked abandoned whether or not it held the lock, and the
-- acquire scripts refuse it from then on, so a request of it still in the network takes
-- nothing when it lands; 'b' a rollback (an unacknowledged acquire that goes on with the same
-- token): nothing recorded; 'k<ms>' `min_hold`: the holder keeps the lock (and its owner key)
-- for <ms> more instead of releasing it now, recorded as released, so a retry whose first
-- try's reply was lost is a success, not a loss. No hand-over: nobody may take the lock before
-- then, and no later request of the token changes it (see `kept_by`).
-- Never deletes another owner's lock. Returns {rid, n}: n = 0 if ARGV[2] did not hold the
-- lock, 1 if it was released, 2 if it was released and handed to a waiter, 3 if this token's
-- release had already happened.
local token = ARGV[2]
local mode = ARGV[5] or ''
local cur = redis.call('GET', KEYS[1])
if not owns(cur, token) then
  return not_holder(token, false, false)
end
local fence = string.sub(cur, 34)
if ARGV[6] ~= '' and fence ~= ARGV[6] and not forced then
  -- Taken again by this token after its lease ended (a request of it held up in the network):
  -- nobody runs under it. It goes, and the lease this release is for was lost.
  redis.call('DEL', KEYS[1], KEYS[5])
  mark(token, 'l', ARGV[6])
  local granted, stale = hand_over(ARGV[3], ARGV[4], token, nil, 0)
  if granted == 0 and stale then redis.pcall('PUBLISH', ARGV[3], 'r') end
  return {rid, 0}
end
local keep = tonumber(string.match(mode, '^k(%d+)$'))
if keep then
  -- The kept lock is no longer this token's: its value's token becomes `kept_by`, so a renewal
  -- (or hand-off check) of the token that lands after this release, on another connection,
  -- finds it not its own and changes nothing. A retry of this release finds it recorded.
  redis.call('SET', KEYS[1], kept_by(token) .. string.sub(cur, 33), 'PX', keep)
  redis.pcall('PEXPIRE', KEYS[5], keep)
  record_release(token, fence)
  return {rid, 1}
end
redis.call('DEL', KEYS[1], KEYS[5])
if forced then
  -- force.lua marked the token; the state keeps naming it, so its loss stays known.
elseif mode == 'b' then
  redis.call('HDEL', KEYS[2], 'x')
else
  record_release(token, fence)
  if mode == 'a' then mark(token, 'a', fence) end
end

local granted, stale = hand_over(ARGV[3], ARGV[4], token, nil, 0)
if granted > 0 then return {rid, 2} end
if stale then redis.pcall('PUBLISH', ARGV[3], 'r') end
return {rid, 1}
