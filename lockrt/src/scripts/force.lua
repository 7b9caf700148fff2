-- (lock.lua comes first; release.lua follows this.)
-- Force-unlock: whoever holds KEYS[1] (KEYS and ARGV as in release.lua, ARGV[2] empty) is
-- released exactly as its own release would: the owner key goes, the lock is handed to the
-- longest live waiter and the hand-over published. The holder's token is published on the
-- revoke channel, the last argument (`{<prefix>}:revoke`, or `<prefix>revoke:{<n>}` in the
-- lock's slot when sharded), which the holder's locker listens to while it holds a lock
-- there: it declares the lease lost at once. Published before release.lua's
-- part runs, which is the same instant for everyone else (a script is atomic); denied (an ACL
-- without that channel) or unheard, the holder's next renewal finds the lock not its own.
-- A key held by readers or a semaphore's holders loses all of them, each revoked the same
-- way, and the queue's head gets the key. A lock that is not held changes nothing ({rid, 0}).
-- Each revoked token is marked lost in the lock's state (lock.lua's `mark`, code 'f', which
-- a renewal that missed the revoke message reports as a forced unlock): an acquire of it
-- still held up in the network would otherwise take the lock back when it lands, and the
-- revoked holder's renewals would find it their own again; and a retry of its release reports
-- the loss.
do
  forced = true
  local revoke = ARGV[#ARGV]
  local heard = #ARGV > 6 and (string.sub(revoke, -8) == '}:revoke'
    or string.find(revoke, 'revoke:{', 1, true) ~= nil)
  local held = redis.call('GET', KEYS[1])
  if type(held) ~= 'string' or #held < 33 then
    if redis.call('EXISTS', KEYS[6]) == 0 or live_shared() == 0 then return {rid, 0} end
    local kind = redis.call('HGET', KEYS[7], 'kind')
    for _, t in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
      if heard then redis.pcall('PUBLISH', revoke, t) end
      mark(t, 'f', string.match(redis.call('HGET', KEYS[7], t) or '', '^(%d+)'))
      redis.call('HDEL', KEYS[2], 'h:' .. t)
    end
    redis.call('DEL', KEYS[6], KEYS[7])
    local sem = kind and string.sub(kind, 1, 1) == 's' and kind or nil
    local room = sem and tonumber(string.sub(kind, 2)) or 0
    local granted, stale = hand_over(ARGV[3], ARGV[4], '', sem, room)
    if granted == 0 and stale then redis.pcall('PUBLISH', ARGV[3], 'r') end
    return {rid, granted > 0 and 2 or 1}
  end
  ARGV[2] = string.sub(held, 1, 32)
  if heard then redis.pcall('PUBLISH', revoke, ARGV[2]) end
  mark(ARGV[2], 'f', string.sub(held, 34))
end
