-- (lock.lua comes first: `rid`, the queue and the shared holders.)
-- Takes a share of key KEYS[1] for owner token ARGV[2]: ARGV[8] = 'r' a read share of its
-- read-write lock, 's<n>' a permit of its semaphore of n. KEYS and ARGV otherwise as in
-- acquire.lua (KEYS[1] the write lock, KEYS[2] the lock's state, KEYS[6], KEYS[7] the shared
-- holders).
-- A reader enters when no writer holds the lock and no live writer is queued ahead of it (so
-- a waiting writer holds back later readers and is never starved); a semaphore's caller when a
-- permit is free and fewer live waiters than free permits are queued ahead of it (FIFO).
-- Each share has its own lease and a fence from the key's counter.
-- Returns as acquire.lua: {rid, 1, fence}; {rid, 0, pttl, counter} busy; {rid, 0, -3, counter}
-- owed to earlier waiters; {rid, 0, -4, counter} abandoned; {rid, 0, -5, counter} ask again;
-- {rid, 0, -6, counter, found} when the key is in use as another kind: 'x' a lock, 'r' a
-- read-write lock, 's<m>' a semaphore of m.
local token, want = ARGV[2], ARGV[8]
local sem = string.sub(want, 1, 1) == 's'

local st = state_of(token)
if st.barred then
  return {rid, 0, -4, counter()}
end
local refusal = refused(want)
if refusal then return refusal end

-- Ours already: a retry whose first reply was lost, or a grant being confirmed.
if extend_share(token, ARGV[3], now_ms()) then
  local rec = redis.call('HGET', KEYS[7], token) or ''
  return {rid, 1, tonumber(string.match(rec, '^(%d+)')) or 0}
end

local held = live_shared()
local room
if sem then
  room = tonumber(string.sub(want, 2)) - held
  if room <= 0 then
    enqueue()
    return {rid, 0, shared_pttl(), counter()}
  end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  enqueue()
  return {rid, 0, redis.call('PTTL', KEYS[1]), counter()}
end

-- Whether the queue lets ARGV[2] in: readers wait behind any live writer queued before them,
-- a semaphore's caller behind `room` live waiters. Lapsed registrations met on the way are
-- dropped (64 at most: then the answer is not known yet, nil).
local function owed()
  local ahead, dropped = 0, 0
  local queued = redis.call('ZRANGE', KEYS[3], 0, 255)
  for _, t in ipairs(queued) do
    if t == token then return true end
    if registration(t) then
      if sem then
        ahead = ahead + 1
        if ahead >= room then return false end
      elseif redis.call('HGET', KEYS[4], 'k:' .. t) ~= 'r' then
        return false
      end
    else
      unqueue(t)
      dropped = dropped + 1
      if dropped >= 64 then return nil end
    end
  end
  -- Not queued among the first 256: in only when the whole queue was seen.
  return #queued < 256
end

local ok = owed()
if ok == nil then
  enqueue()
  return {rid, 0, -5, counter()}
end
if not ok then
  enqueue()
  return {rid, 0, -3, counter()}
end
unqueue(token)
return {rid, 1, (take_shared(token, ARGV[3], ARGV[4], ARGV[7], want, st))}
