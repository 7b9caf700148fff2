-- Shared by acquire.lua, release.lua and renew.lua: prepended to each when it is built.

-- The server time, read at most once per script call and only by the branches that need it.
local clock
local function now_us()
  if not clock then clock = redis.call('TIME') end
  return tonumber(clock[1]) * 1000000 + tonumber(clock[2])
end
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- Whether lock value `cur` ("<token>:<fence>", or false for no key) belongs to owner `token`.
local function owns(cur, token)
  return cur and string.sub(cur, 1, 32) == token
end

-- Gives lock KEYS[1] to `holder` for `lease` ms with the next fence from counter KEYS[2]
-- (lifetime ARGV[3] ms); returns the fence and its decimal text. A live counter increments;
-- a new one starts at the server time in µs, above any fence an expired counter can have
-- issued (it grew by at most one per acquisition).
local function take_lock(holder, lease)
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    fence = now_us()
    redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  end
  -- '%.0f': plain concatenation would print a 16-digit fence as 1.79e+15 and lose digits.
  local text = string.format('%.0f', fence)
  redis.call('SET', KEYS[1], holder .. ':' .. text, 'PX', lease)
  return fence, text
end

