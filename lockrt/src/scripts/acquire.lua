-- Takes the lock KEYS[1] for owner token ARGV[1] (32 hex chars) with a lease of ARGV[2] ms.
-- KEYS[2] is the lock's fencing counter, kept ARGV[3] ms after its last use.
-- The lock's value is "<token>:<fence>", so a retry of an acquire whose reply was lost finds
-- its own token and gets the same fence back instead of a second, different lock.
-- Returns {1, fence} when ARGV[1] holds the lock now, {0, pttl} when another owner does.
local cur = redis.call('GET', KEYS[1])
if cur then
  if string.sub(cur, 1, 32) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(string.sub(cur, 34))}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
-- Fence = max(last + 1, server microseconds): strictly increasing while the counter lives,
-- and still increasing after an idle counter expired, as long as the server clock does not
-- step back by more than the retention.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if now > last then
  redis.call('SET', KEYS[2], string.format('%.0f', now - 1))
end
local fence = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
-- '%.0f': plain concatenation would print a 16-digit fence as 1.79e+15 and lose digits.
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%.0f', fence), 'PX', ARGV[2])
return {1, fence}
