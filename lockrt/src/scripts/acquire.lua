-- (lock.lua comes first: `now_us`, `now_ms`, `owns`, `take_lock`.)
-- Takes lock KEYS[1] for owner token ARGV[1] (32 hex chars) with a lease of ARGV[2] ms.
-- KEYS[2]: the lock's fencing counter, created with a lifetime of ARGV[3] ms.
-- KEYS[3], KEYS[4]: the lock's waiter queue (zset token -> arrival) and waiter details
-- (hash token -> "<registration expiry ms>:<grant lease ms>"), so that a release hands the
-- lock straight to the longest waiter and waiters of different processes are served in order.
-- ARGV[4] > 0: on failure, queue ARGV[1] (or refresh its place) for that many ms; the lease
-- it is granted on release is ARGV[5] ms.
-- The lock's value is "<token>:<fence>": a retry of an acquire whose reply was lost, or a
-- waiter that missed its grant message, finds its own token and gets the same fence back.
-- Returns {1, fence} when ARGV[1] holds the lock now; {0, pttl, counter} when another owner
-- holds it; {0, -3, counter} when the lock is free but promised to an earlier waiter. `counter`
-- is the fencing counter's value: a grant to ARGV[1] with a fence not above it is stale (its
-- lease ran out before this call, or this call would have found ARGV[1] holding the lock).
-- The uncontended path (free, nobody queued) makes only EXISTS, INCR and SET: every other
-- call, TIME included, is made only when its branch needs it.
local token = ARGV[1]

if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  return {1, (take_lock(token, ARGV[2]))}
end

local function counter()
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end

local function enqueue()
  local reg = tonumber(ARGV[4])
  if reg <= 0 then return end
  if not redis.call('ZSCORE', KEYS[3], token) then
    redis.call('ZADD', KEYS[3], now_us(), token)
  end
  redis.call('HSET', KEYS[4], token, string.format('%.0f', now_ms() + reg) .. ':' .. ARGV[5])
  redis.call('PEXPIRE', KEYS[3], reg * 2)
  redis.call('PEXPIRE', KEYS[4], reg * 2)
end

local cur = redis.call('GET', KEYS[1])
if cur then
  if owns(cur, token) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(string.sub(cur, 34))}
  end
  enqueue()
  return {0, redis.call('PTTL', KEYS[1]), counter()}
end

-- Free. The longest live waiter has precedence; stale registrations are dropped.
local queued = false
for _ = 1, 64 do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then break end
  queued = true
  local info = redis.call('HGET', KEYS[4], head)
  local expiry = info and tonumber(string.match(info, '^(%d+)'))
  if expiry and expiry > now_ms() then
    if head ~= token then
      enqueue()
      return {0, -3, counter()}
    end
    break
  end
  redis.call('ZREM', KEYS[3], head)
  redis.call('HDEL', KEYS[4], head)
end
if queued then
  redis.call('ZREM', KEYS[3], token)
  redis.call('HDEL', KEYS[4], token)
end

return {1, (take_lock(token, ARGV[2]))}
