-- Shared by acquire.lua, release.lua and renew.lua: prepended to each when it is built.
-- Every script takes a request id in ARGV[1] and returns it as the first element of its reply,
-- so a client can tell a reply that belongs to another request (a dropped or shifted reply on a
-- pipelined connection) from its own.
-- ARGV[1] is "<request id>:<client µs>": the client's clock (µs since the Unix epoch) as it
-- sent the request. The whole text is echoed.
local rid = ARGV[1]
-- Set by force.lua before release.lua's part runs: the release is a forced unlock's.
local forced = false

-- No script calls TIME (refused to scripts by some managed services). The server's clock is
-- read instead through expiry arithmetic, at most once per call: a declared key about to be
-- written anyway is set to expire at a fixed instant (`SET … PXAT`), and the server's time
-- is that instant minus its PTTL. `take_lock` reads it through the lock's owner key, which it
-- writes next; other paths through the scratch key `{tag}:now`, passed as the last key of the
-- calls that need it, taken off KEYS here and deleted after. Renewals pass no scratch key (a
-- key that does not exist in a slot being migrated would make the whole call TRYAGAIN): they
-- read the clock off the shared holders' records (see `anchored_ms`). The client's clock,
-- sent with the request id, is used only where a time is shown (the hand-off record).
local now_key = #KEYS > 0 and string.sub(KEYS[#KEYS], -5) == '}:now' and table.remove(KEYS)
local FAR_MS = 4102444800000 -- 2100-01-01

local clock
-- The server's time in ms, read through `key` (which the caller overwrites or deletes).
local function read_clock(key)
  if not clock then
    redis.call('SET', key, '1', 'PXAT', FAR_MS)
    clock = FAR_MS - redis.call('PTTL', key)
  end
  return clock
end
local function now_ms()
  if not clock then
    read_clock(now_key)
    redis.call('DEL', now_key)
  end
  return clock
end

local function client_ms()
  return math.floor((tonumber(string.match(rid, ':(%d+)$')) or 0) / 1000)
end

-- Whether lock value `cur` ("<token>:<fence>", or false for no key) belongs to owner `token`.
local function owns(cur, token)
  return type(cur) == 'string' and string.sub(cur, 1, 32) == token
end

-- The token a lock kept past its release (`min_hold`) is held by: `token` with its first hex
-- digit replaced by 'k', which no token has. Nothing of the token's owns the lock any more, so
-- no request of it changes the lock after its release; a forced unlock still finds it held.
local function kept_by(token)
  return 'k' .. string.sub(token, 2, 32)
end

-- A holder's identity as the client sent it ("<service>|<host>|<pid>|<instance id>"), cut to
-- 256 bytes so the owner key's size is bounded whatever a client sends; '?' when unknown.
local function owner_text(owner)
  if type(owner) ~= 'string' or owner == '' then return '?' end
  return string.sub(owner, 1, 256)
end

-- The fence clock: the server's time (read before, see `read_clock`) in units of 10 µs since
-- 2020-01-01, whole ms times 100. Times 32 (the local hand-off places, see FENCES_PER_COUNT),
-- every fence stays below 2^53, exact in a double (Lua, JavaScript, JSON parsers) until about
-- 2109.
local FENCE_EPOCH_MS = 1577836800000
local function fence_clock()
  return (clock - FENCE_EPOCH_MS) * 100
end

-- The lock's state, KEYS[2] (`{tag}:state`), a hash, one per lock whatever the release rate:
-- - 'n': the fencing counter; 'b': the first fence it gave since the state was created;
-- - 'x': the latest holder that took the lock (not a share) from Redis,
--   "<h|r><token>:<fence>", 'h' while held, 'r' once its own release (or `min_hold` keep) ran;
-- - 'r': the tokens of the latest 4 releases (locks and shares), 32 characters each;
-- - 'm:<token>': a token barred, "<code>:<fence>:<seq>": 'l' its lease ended without its own
--   release (found lost, or lapsed and seen so), 'f' the same by a forced unlock, 'a' its acquisition was abandoned
--   (fence 0 when it never held); 'ms' numbers them. At most MARKS are kept, oldest dropped
--   first (and 'b' raised above a dropped mark's fence, so no release is inferred from a
--   history that lost it);
-- - 'h:<token>': a live share (read share or permit) and its fence, from its take to its end
--   (its release, or its mark): a share whose records in KEYS[6]/KEYS[7] went without either
--   (deleted by someone else) is not inferred released (see `released`).
-- Every way a lease ends other than its own release marks its token, and a release is
-- recorded in 'x' / 'r', so a retried release tells "released by me" from "lost" from this
-- state alone (see `released`). It lives `retention` ms (at least twice the lease) after the
-- latest acquisition; with it gone (idle, or a server restarted without data) no release is
-- inferred: a retry finding nothing reports a loss.
local MARKS = 64
local RECENT = 4

-- The state fields an acquisition of `t` needs: counter, base, latest holder, and whether
-- `t` is barred (marked, or among the latest releases: a token is used for one acquisition).
local function state_of(t, K)
  K = K or KEYS
  local st = redis.call('HMGET', K[2], 'n', 'b', 'x', 'm:' .. t, 'r')
  return {n = tonumber(st[1]), b = st[2], x = st[3],
    barred = st[4] ~= false or string.find(st[5] or '', t, 1, true) ~= nil}
end

-- Keeps the state for `life` ms when it has no expiry yet (a write that created it).
local function keep_state(K, life)
  if redis.call('PTTL', K[2]) < 0 then redis.call('PEXPIRE', K[2], life) end
end

-- Marks token `t` barred (code 'l' or 'a', its fence or 0); an existing mark stays.
local function mark(t, code, fence, K)
  K = K or KEYS
  local field = 'm:' .. t
  if redis.call('HEXISTS', K[2], field) == 1 then return end
  local seq = redis.call('HINCRBY', K[2], 'ms', 1)
  redis.call('HSET', K[2], field, code .. ':' .. (tonumber(fence) or 0) .. ':' .. seq)
  keep_state(K, tonumber(ARGV[4]) or 86400000)
  if seq % 16 ~= 0 or redis.call('HLEN', K[2]) <= MARKS + 6 then return end
  -- Over the bound: the oldest half go.
  local all = redis.call('HGETALL', K[2])
  local marks = {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'm:' then
      local _, f, q = string.match(all[i + 1], '^(%a):(%d+):(%d+)$')
      marks[#marks + 1] = {all[i], tonumber(f) or 0, tonumber(q) or 0}
    end
  end
  table.sort(marks, function(p, q) return p[3] < q[3] end)
  local base = tonumber(redis.call('HGET', K[2], 'b'))
  for i = 1, #marks - MARKS / 2 do
    redis.call('HDEL', K[2], marks[i][1])
    if base and marks[i][2] >= base then base = marks[i][2] + 1 end
  end
  if base then redis.call('HSET', K[2], 'b', string.format('%.0f', base)) end
end

-- Records `t`'s own release among the latest ones (and as the latest holder's, `fence` given).
local function record_release(t, fence, K)
  K = K or KEYS
  local recent = redis.call('HGET', K[2], 'r') or ''
  recent = string.sub(t .. recent, 1, 32 * RECENT)
  local added
  if fence then
    added = redis.call('HSET', K[2], 'r', recent, 'x', 'r' .. t .. ':' .. fence)
  else
    added = redis.call('HSET', K[2], 'r', recent)
  end
  -- Every field new: this write created the state (it had expired, or the server lost it).
  if added == (fence and 2 or 1) then redis.call('PEXPIRE', K[2], tonumber(ARGV[4]) or 86400000) end
end

-- Whether token `t`'s lease (fence `f`, counter units; `share`: a read share or permit) ended
-- by its own release, as the state tells: among the latest releases; or never marked while a
-- later holder took the lock from Redis (for a share: while it is gone from the holders and
-- from the state's live shares), with `f` inside the state's history. Every other end of a
-- lease marks its token.
local function released(t, f, share)
  local st = redis.call('HMGET', KEYS[2], 'b', 'x', 'm:' .. t, 'r', 'h:' .. t)
  if st[3] or st[5] then return false end
  if string.find(st[4] or '', t, 1, true) then return true end
  local b, fence = tonumber(st[1]), tonumber(f)
  if not b or not fence or fence < b then return false end
  if share then return true end
  local x = st[2]
  if not x then return false end
  if string.sub(x, 2, 33) == t then return string.sub(x, 1, 1) == 'r' end
  return (tonumber(string.match(x, ':(%d+)$')) or 0) > fence
end

-- The next fence for `holder` (state `st` as `state_of` read it), written to the state with
-- what goes with it, and its decimal text: max(counter + 1, fence clock); the server's clock
-- must have been read. A new state (first use, expired, or lost with the server's data)
-- starts at the fence clock, above every fence the old one issued: those were at most the
-- clock of its last acquisition plus the acquisitions that came faster than one per 10 µs.
-- `holder`: the token taking the lock, recorded as the latest holder; or `share`: the token
-- taking a share, recorded as a live share. `K`: the keys of the lock (KEYS unless given).
local function next_fence(lease, retention, st, holder, K, share)
  K = K or KEYS
  -- A new state starts at the next whole ms: the clock is read in ms, and the old state's
  -- last fences may have been issued in this one.
  local fence = st.n and math.max(st.n + 1, fence_clock()) or fence_clock() + 100
  local life = math.max(tonumber(retention), 2 * tonumber(lease))
  -- '%.0f': plain concatenation would print a 16-digit fence as 1.79e+15 and lose digits.
  local text = string.format('%.0f', fence)
  local args = {'HSET', K[2], 'n', text}
  if not st.b then args[#args + 1] = 'b'; args[#args + 1] = text end
  if holder then args[#args + 1] = 'x'; args[#args + 1] = 'h' .. holder .. ':' .. text end
  if share then args[#args + 1] = 'h:' .. share; args[#args + 1] = text end
  -- (Lua 5.1 has `unpack`, 5.4 (Dragonfly) `table.unpack`.)
  redis.call((table.unpack or unpack)(args))
  redis.call('PEXPIRE', K[2], string.format('%.0f', life))
  return fence, text
end

-- Gives lock KEYS[1] to `holder` for `lease` ms with the next fence (see `next_fence`; `st`
-- the state as `state_of` read it, read here unless given); returns the fence and its text.
-- The lock is free here: a latest holder the state still says holds it lost its lease
-- without its release (it ran out), and is marked so.
--
-- KEYS[5] (`{lock}:owner`) gets the holder's identity beside the lock with the same PTTL:
-- "<acquired-at server ms>|<owner>", where `owner` is the client's text (see `owner_text`).
local function take_lock(holder, lease, retention, owner, K, st)
  K = K or KEYS
  st = st or state_of(holder, K)
  local x = st.x
  if x and string.sub(x, 1, 1) == 'h' and string.sub(x, 2, 33) ~= holder then
    mark(string.sub(x, 2, 33), 'l', string.match(x, ':(%d+)$'), K)
  end
  read_clock(K[5])
  local fence, text = next_fence(lease, retention, st, holder, K)
  redis.call('SET', K[1], holder .. ':' .. text, 'PX', lease)
  redis.call('SET', K[5], string.format('%.0f', clock) .. '|' .. owner_text(owner), 'PX', lease)
  return fence, text
end

-- Shared holders (readers, or the holders of a semaphore's permits). KEYS[6]: zset token ->
-- lease expiry (server ms); a holder is live while its expiry is in the future. KEYS[7]: hash,
-- field 'kind' ('r' readers, 's<n>' a semaphore of n permits), per holder
-- token -> "<fence>|<acquired-at ms>|<owner>", and '#': the absolute expiry (server ms) both
-- keys were given, so that the server's time is that minus the hash's PTTL (`anchored_ms`).
-- Both live SHARE_GRACE_MS past every lease in them (`keep_shared` only ever extends them),
-- so a share that lapsed unreleased is still found (and marked, see `live_shared`) by a
-- retry of its release within that time, and go when the last holder goes. `S`, `SI`: those two keys (KEYS[6], KEYS[7] unless given, see
-- renew.lua); `now`: the server's time.
local SHARE_GRACE_MS = 120000
local function keep_shared(lease, now, S, SI)
  S, SI = S or KEYS[6], SI or KEYS[7]
  local want = now + tonumber(lease) + SHARE_GRACE_MS
  local at = tonumber(redis.call('HGET', SI, '#'))
  if not at or at < want or redis.call('PTTL', SI) < 0 then
    local text = string.format('%.0f', want)
    redis.call('HSET', SI, '#', text)
    redis.call('PEXPIREAT', SI, text)
    redis.call('PEXPIREAT', S, text)
  end
end

-- The server's time read off shared records `SI` (see `keep_shared`), nil when they have no
-- anchor (gone, or written by someone else).
local function anchored_ms(SI)
  local at = tonumber(redis.pcall('HGET', SI, '#'))
  local left = redis.pcall('PTTL', SI)
  if not at or type(left) ~= 'number' or left < 0 then return nil end
  return at - left
end

-- Extends holder `t`'s share to `lease` ms from `now` (the server's time) if it is still live
-- (its expiry in the future): whether it was. `S`, `SI` as in `keep_shared`. Read with pcall:
-- a key someone overwrote with another type is "not held" for this share only.
local function extend_share(t, lease, now, S, SI)
  S = S or KEYS[6]
  local expiry = redis.pcall('ZSCORE', S, t)
  if type(expiry) ~= 'string' or tonumber(expiry) <= now then return false end
  redis.call('ZADD', S, 'XX', string.format('%.0f', now + tonumber(lease)), t)
  keep_shared(lease, now, S, SI)
  return true
end

-- Share `t`'s records go (KEYS[6], KEYS[7], and its live record in the state).
local function end_share(t)
  redis.call('ZREM', KEYS[6], t)
  redis.call('HDEL', KEYS[7], t)
  redis.call('HDEL', KEYS[2], 'h:' .. t)
end

-- Drops holders whose lease ran out (at most 1,024 per call, 64 at a time: more counts as
-- held, never as free) and returns how many remain.
local function live_shared()
  for _ = 1, 16 do
    local gone = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', string.format('%.0f', now_ms()),
      'LIMIT', 0, 64)
    for _, t in ipairs(gone) do
      -- Lapsed without its release: barred, so that no release of it is inferred.
      mark(t, 'l', string.match(redis.call('HGET', KEYS[7], t) or '', '^(%d+)'))
      end_share(t)
    end
    if #gone < 64 then break end
  end
  local n = redis.call('ZCARD', KEYS[6])
  if n == 0 then redis.call('DEL', KEYS[6], KEYS[7]) end
  return n
end

-- Time until the first shared lease runs out (ms), for a waiter's fallback timer.
local function shared_pttl()
  local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')[2]
  return math.max(1, (tonumber(first) or now_ms()) - now_ms())
end

-- Makes `holder` a shared holder of kind `kind` for `lease` ms with the next fence; returns the
-- fence and its text.
local function take_shared(holder, lease, retention, owner, kind, st)
  local now = string.format('%.0f', now_ms())
  local fence, text = next_fence(lease, retention, st or state_of(holder), nil, nil, holder)
  redis.call('ZADD', KEYS[6], string.format('%.0f', now_ms() + tonumber(lease)), holder)
  redis.call('HSET', KEYS[7], 'kind', kind, holder, text .. '|' .. now .. '|' .. owner_text(owner))
  keep_shared(lease, now_ms())
  return fence, text
end

-- The fencing counter's value, -1 when it does not exist.
local function counter()
  return tonumber(redis.pcall('HGET', KEYS[2], 'n')) or -1
end

-- The waiter queue: KEYS[3] zset token -> arrival, KEYS[4] hash token ->
-- "<registration expiry ms>:<grant lease ms>:<attempt ms>" (server ms), "o:<token>" its identity,
-- "k:<token>" what it asked for: 'r' a read share, 's<n>' a permit of a semaphore of n (absent:
-- the lock, or its write side).
-- Queues the caller (ARGV[2]) or refreshes its place, for ARGV[5] ms (0: does not queue); the
-- lease it is granted on release is ARGV[6] ms, its identity ARGV[7], its kind ARGV[8] (none
-- for the lock).
local function enqueue()
  local token, reg = ARGV[2], tonumber(ARGV[5])
  if reg <= 0 then return end
  if not redis.call('ZSCORE', KEYS[3], token) then
    -- Arrival order without a clock: one after the last one queued.
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', KEYS[3], (tonumber(last) or 0) + 1, token)
  end
  local expiry, at = string.format('%.0f', now_ms() + reg), string.format('%.0f', now_ms())
  redis.call('HSET', KEYS[4], token, expiry .. ':' .. ARGV[6] .. ':' .. at,
    'o:' .. token, owner_text(ARGV[7]))
  if ARGV[8] then redis.call('HSET', KEYS[4], 'k:' .. token, ARGV[8]) end
  redis.call('PEXPIRE', KEYS[3], reg * 2)
  redis.call('PEXPIRE', KEYS[4], reg * 2)
end

local function unqueue(t)
  redis.call('ZREM', KEYS[3], t)
  redis.call('HDEL', KEYS[4], t, 'o:' .. t, 'k:' .. t)
end

-- The release of `token` where it holds nothing (a waiter that gave up, or a late release):
-- only its queue place goes, and when it was a writer or a semaphore's waiter while shared
-- holders are there, the waiters it may have held back are told to retry ("r" on ARGV[3]).
-- Then, as ARGV[5] says: 'b' (a rollback) nothing more; 'a' (an abandoned acquisition's
-- compensation) the token is marked abandoned, and {rid, 3} when its release or a mark
-- came before; otherwise {rid, 3} when the state proves its own release happened (a retry
-- whose first try's reply was lost; `released`, ARGV[6] its fence, `share` its kind, `lapsed`:
-- its share was found run out), else the token is marked lost: no proof of a release, and
-- refused by the acquire scripts like any released token, so an attempt of it still in the
-- network takes nothing when it lands (a token is used for one acquisition only).
local function not_holder(token, share, lapsed)
  local reader = redis.call('HGET', KEYS[4], 'k:' .. token) == 'r'
  if redis.call('ZREM', KEYS[3], token) == 1 then
    redis.call('HDEL', KEYS[4], token, 'o:' .. token, 'k:' .. token)
    if not reader and redis.call('EXISTS', KEYS[6]) == 1 then
      redis.pcall('PUBLISH', ARGV[3], 'r')
    end
  end
  local mode = ARGV[5] or ''
  if mode == 'b' or forced then return {rid, 0} end
  if mode == 'a' then
    local before = state_of(token).barred
    mark(token, 'a', 0)
    return {rid, before and 3 or 0}
  end
  if lapsed then
    -- Marked here, and its record goes: the lease ran out before this release.
    mark(token, 'l', ARGV[6])
    end_share(token)
    return {rid, 0}
  end
  if released(token, ARGV[6], share) then return {rid, 3} end
  mark(token, 'l', ARGV[6])
  return {rid, 0}
end

-- Waiter `t`'s granted lease and latest attempt (server ms text, may be empty) while its registration
-- is live; nil when it lapsed or is missing.
local function registration(t)
  local info = redis.call('HGET', KEYS[4], t)
  local expiry, lease, at = string.match(info or '', '^(%d+):(%d+):?(%d*)$')
  if expiry and tonumber(expiry) > now_ms() then return lease, at end
  return nil
end

-- What the key is in use as, when that does not go with `want` (the caller's kind: 'x' the
-- lock or its write side, 'r' a read share, 's<n>' a permit of a semaphore of n): the shared
-- holders' kind, 'x' when the lock is held, else what the longest live waiter asked for (its
-- place came first; lapsed registrations ahead of it are dropped, 64 at most: '?' when it is
-- not known yet, ask again). A lock and its read shares go together; a semaphore only with
-- itself, of the same n. Returns the kind found on a conflict, nil otherwise.
local function conflicting(want)
  local kind = redis.call('HGET', KEYS[7], 'kind')
  -- Only live holders give the key a kind: the record outlives the shares whose leases ran out.
  if kind and live_shared() == 0 then kind = nil end
  if not kind and redis.call('EXISTS', KEYS[1]) == 1 then kind = 'x' end
  if not kind then
    for i = 1, 65 do
      local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
      if not head then break end
      if i == 65 then return '?' end
      if registration(head) then
        kind = redis.call('HGET', KEYS[4], 'k:' .. head) or 'x'
        break
      end
      unqueue(head)
    end
  end
  if not kind or kind == want then return nil end
  if string.sub(kind, 1, 1) == 's' or string.sub(want, 1, 1) == 's' then return kind end
  return nil
end

-- The reply refusing a caller of kind `want` (see `conflicting`): {rid, 0, -6, counter, kind}
-- when the key is in use as another kind, {rid, 0, -5, counter} (queued, ask again) when that
-- is not known yet; nil when the caller may go on.
local function refused(want)
  local found = conflicting(want)
  if found == '?' then
    enqueue()
    return {rid, 0, -5, counter()}
  end
  if found then return {rid, 0, -6, counter(), found} end
  return nil
end

-- Hands the free lock (or `room` free permits of semaphore `sem`, 's<n>') to the head of the
-- queue, skipping `skip` (the releasing token) and dropping lapsed registrations (at most 64
-- entries looked at): a writer at the head takes the lock alone; a run of readers at the head
-- shares it, up to the next writer; a semaphore's waiters take the free permits in order. Each
-- grant is published on `channel` as "g:<token>:<fence>:<µs>", <µs> the server time since
-- that waiter's latest attempt. Returns how many were granted and whether any registration
-- was dropped or the look ran out (waiters should then retry: "r" is published).
local function hand_over(channel, retention, skip, sem, room)
  local granted, stale = 0, false
  for _ = 1, 64 do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then return granted, stale end
    local lease, at = registration(head)
    local asked = redis.call('HGET', KEYS[4], 'k:' .. head)
    local reader = asked == 'r'
    -- Only what the waiter asked for: a permit of this semaphore, or the lock or a read
    -- share of it. Anything else is dropped from the queue and refused at its next attempt.
    local fits = (sem and asked == sem) or (not sem and (not asked or reader))
    if not lease or head == skip or not fits then
      unqueue(head)
      stale = true
    else
      if (sem and granted >= room) or (not sem and not reader and granted > 0) then
        return granted, stale
      end
      local who = redis.call('HGET', KEYS[4], 'o:' .. head)
      unqueue(head)
      local text
      if sem or reader then
        _, text = take_shared(head, lease, retention, who, sem or 'r')
      else
        _, text = take_lock(head, lease, retention, who)
      end
      local msg = 'g:' .. head .. ':' .. text
      if at ~= '' then
        -- In µs, and 1 ms short: the clock is read in whole ms, and a lease must not start
        -- later on the waiter's clock than it did here.
        msg = msg .. ':' .. string.format('%.0f', math.max(0, now_ms() - tonumber(at) - 1) * 1000)
      end
      redis.pcall('PUBLISH', channel, msg)
      granted = granted + 1
      if not sem and not reader then return granted, stale end
    end
  end
  return granted, true
end
