-- (lock.lua comes first; release.lua follows this.)
-- Force-unlock: whoever holds KEYS[1] (KEYS and ARGV as in release.lua, ARGV[2] empty) is
-- released exactly as its own release would: the owner key goes, the lock is handed to the
-- longest live waiter and the hand-over published. The holder's token is published on the
-- revoke channel `{<prefix>}:revoke`, the last argument, which the holder's locker listens to
-- while it holds anything: it declares the lease lost at once. Published before release.lua's
-- part runs, which is the same instant for everyone else (a script is atomic); denied (an ACL
-- without that channel) or unheard, the holder's next renewal finds the lock not its own.
-- A lock that is not held changes nothing ({rid, 0}).
do
  local held = redis.call('GET', KEYS[1])
  if type(held) ~= 'string' or #held < 33 then return {rid, 0} end
  ARGV[2] = string.sub(held, 1, 32)
  local revoke = ARGV[#ARGV]
  if #ARGV > 2 and string.sub(revoke, -8) == '}:revoke' then
    redis.pcall('PUBLISH', revoke, ARGV[2])
  end
end
