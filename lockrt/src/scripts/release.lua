-- Deletes the lock KEYS[1] only if owner token ARGV[1] holds it, then announces the release
-- on channel ARGV[2] so waiters retry at once. Returns 1 if released, 0 if not ours (already
-- expired, released, or taken over): never deletes another owner's lock.
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
