-- Shared by acquire.lua, release.lua and renew.lua: prepended to each when it is built.
-- Every script takes a request id in ARGV[1] and returns it as the first element of its reply,
-- so a client can tell a reply that belongs to another request (a dropped or shifted reply on a
-- pipelined connection) from its own.
local rid = ARGV[1]

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
  return type(cur) == 'string' and string.sub(cur, 1, 32) == token
end

-- A holder's identity as the client sent it ("<service>|<host>|<pid>|<instance id>"), cut to
-- 256 bytes so the owner key's size is bounded whatever a client sends; '?' when unknown.
local function owner_text(owner)
  if type(owner) ~= 'string' or owner == '' then return '?' end
  return string.sub(owner, 1, 256)
end

-- Gives lock KEYS[1] to `holder` for `lease` ms with the next fence from counter KEYS[2];
-- returns the fence and its decimal text. A live counter increments; a new one starts at the
-- server time in µs, above any fence an expired counter can have issued (it grew by at most
-- one per acquisition). The counter's lifetime is one rule for every script: `retention` ms,
-- and never less than twice the lease, so it outlives the lock it fences.
--
-- With KEYS[5] (`{lock}:owner`), the holder's identity goes beside the lock with the same PTTL:
-- "<acquired-at server ms>|<owner>", where `owner` is the client's text (see `owner_text`).
local function take_lock(holder, lease, retention, owner)
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    fence = now_us()
    local life = math.max(tonumber(retention), 2 * tonumber(lease))
    redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', string.format('%.0f', life))
  end
  -- '%.0f': plain concatenation would print a 16-digit fence as 1.79e+15 and lose digits.
  local text = string.format('%.0f', fence)
  redis.call('SET', KEYS[1], holder .. ':' .. text, 'PX', lease)
  if KEYS[5] then
    redis.call('SET', KEYS[5], string.format('%.0f', now_ms()) .. '|' .. owner_text(owner), 'PX', lease)
  end
  return fence, text
end

