-- (lock.lua comes first: `rid`, `now_ms`, `owns`, `take_lock`.)
-- Releases lock KEYS[1] if owner token ARGV[2] holds it; otherwise only drops ARGV[2] from
-- the waiter queue (a waiter that gave up: a holder is never queued). KEYS[2..4] and ARGV[4]
-- (the fencing counter's retention): as in acquire.lua.
-- If live waiters are queued, the lock goes straight to the longest one, with the lease it
-- registered, and "g:<token>:<fence>:<µs>" is published on channel ARGV[3], <µs> the server
-- time since that waiter's latest attempt (absent for a registration without it), so the
-- waiter can count its lease from when it was granted; otherwise "r" when stale registrations
-- were dropped (also when more may remain: the waiters' own attempts drop the rest). With
-- nobody queued nothing is published: every waiter joins the queue in the same script call
-- that finds the lock busy, so an empty queue means no waiter to wake (one whose registration
-- went stale still retries on its own timer).
-- PUBLISH may be denied (an ACL without channel rights): the release and hand-over have
-- happened by then and stand; waiters fall back to their timed retry.
-- KEYS[5] (optional): the owner key, deleted with the lock; a hand-over writes the waiter's
-- identity (field "o:<token>" of KEYS[4]) there.
-- KEYS[6] (optional, never with force.lua): `{lock}:done:<token>`, the proof that this token's
-- own release happened, kept ARGV[5] ms. A retried release whose first try's reply was lost
-- finds it and answers 3; without it, "not the holder" may mean expired, force-unlocked or a
-- server restarted without its data, and another owner may have run: that is a loss.
-- ARGV[6] = 'a': the release of an abandoned acquisition (its compensation). KEYS[6] is then set
-- to 'a' whether or not the token held the lock, and acquire.lua refuses the token from then
-- on: a request of it still in the network takes nothing when it lands.
-- ARGV[6] = 'k<ms>': `min_hold`; the holder keeps the lock (and its owner key) for <ms> more
-- instead of releasing it now, and leaves the same proof (kept at least that long), so a
-- retry whose first try's reply was lost is a success, not a loss. No hand-over: nobody may
-- take the lock before then.
-- Never deletes another owner's lock. Returns {rid, n}: n = 0 if ARGV[2] did not hold the
-- lock, 1 if it was released, 2 if it was released and handed to a waiter, 3 if this token's
-- release had already happened (the marker of KEYS[6]).
local token = ARGV[2]
local abandon = KEYS[6] and ARGV[6] == 'a'
local cur = redis.call('GET', KEYS[1])
if not owns(cur, token) then
  -- Not the holder: a waiter that gave up, or a late release. Only its queue place goes.
  redis.call('ZREM', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token, 'o:' .. token)
  local proof = KEYS[6] and redis.call('EXISTS', KEYS[6]) == 1
  if abandon then redis.call('SET', KEYS[6], 'a', 'PX', ARGV[5]) end
  if proof then return {rid, 3} end
  return {rid, 0}
end
local keep = tonumber(string.match(ARGV[6] or '', '^k(%d+)$'))
if keep then
  redis.call('PEXPIRE', KEYS[1], keep)
  if KEYS[5] then redis.pcall('PEXPIRE', KEYS[5], keep) end
  if KEYS[6] then
    redis.call('SET', KEYS[6], '1', 'PX', string.format('%.0f', math.max(keep, tonumber(ARGV[5]))))
  end
  return {rid, 1}
end
redis.call('DEL', KEYS[1])
if KEYS[5] then redis.call('DEL', KEYS[5]) end
if KEYS[6] then redis.call('SET', KEYS[6], abandon and 'a' or '1', 'PX', ARGV[5]) end

local queued = false
for _ = 1, 64 do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then break end
  queued = true
  local info = redis.call('HGET', KEYS[4], head)
  local who = redis.call('HGET', KEYS[4], 'o:' .. head)
  redis.call('ZREM', KEYS[3], head)
  redis.call('HDEL', KEYS[4], head, 'o:' .. head)
  local expiry, lease, at = string.match(info or '', '^(%d+):(%d+):?(%d*)$')
  -- A holder leaves the queue when it takes the lock; never hand the lock back to it.
  if head ~= token and expiry and tonumber(expiry) > now_ms() then
    local _, f = take_lock(head, lease, ARGV[4], who)
    local msg = 'g:' .. head .. ':' .. f
    if at ~= '' then
      msg = msg .. ':' .. string.format('%.0f', math.max(0, now_us() - tonumber(at)))
    end
    redis.pcall('PUBLISH', ARGV[3], msg)
    return {rid, 2}
  end
end
if queued then redis.pcall('PUBLISH', ARGV[3], 'r') end
return {rid, 1}
