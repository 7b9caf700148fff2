-- (lock.lua comes first; release.lua follows this.)
-- Force-unlock: whoever holds KEYS[1] (KEYS and ARGV as in release.lua, ARGV[2] empty) is
-- released exactly as its own release would: the owner key goes, the lock is handed to the
-- longest live waiter and the hand-over published. The holder's next renewal finds the lock
-- not its own and reports it lost. A lock that is not held changes nothing ({rid, 0}).
do
  local held = redis.call('GET', KEYS[1])
  if type(held) ~= 'string' or #held < 33 then return {rid, 0} end
  ARGV[2] = string.sub(held, 1, 32)
end
