-- (lock.lua comes first: `rid`, the queue, the shared holders, the state, `hand_over`.)
-- Releases the share (read share or permit) of owner token ARGV[2] on key KEYS[1]; otherwise
-- only drops ARGV[2] from the waiter queue. KEYS and ARGV as in release.lua (ARGV[5]: '' a
-- holder's release, 'a' an abandoned acquisition's compensation, 'b' a rollback; ARGV[6] the
-- share's fence).
-- The last reader out hands the lock to the head of the queue (a writer, or the readers queued
-- ahead of any writer); a permit goes to the longest waiter of the semaphore. Returns {rid, n}
-- as release.lua: 0 not a holder, 1 released, 2 released and handed over, 3 released before.
local token = ARGV[2]
local mode = ARGV[5] or ''
local kind = redis.call('HGET', KEYS[7], 'kind')
local expiry = redis.call('ZSCORE', KEYS[6], token)
if not expiry or tonumber(expiry) <= now_ms() then
  return not_holder(token, true, expiry ~= false and mode == '')
end
local rec = redis.call('HGET', KEYS[7], token) or ''
end_share(token)
local lost = ARGV[6] ~= '' and string.match(rec, '^(%d+)') ~= ARGV[6]
if lost then
  -- Taken again by this token after its lease ended (see release.lua): gone, and a loss.
  mark(token, 'l', ARGV[6])
elseif mode ~= 'b' then
  record_release(token)
  if mode == 'a' then mark(token, 'a', string.match(rec, '^(%d+)')) end
end

local held = live_shared()
local granted, stale = 0, false
if kind and string.sub(kind, 1, 1) == 's' then
  granted, stale = hand_over(ARGV[3], ARGV[4], token, kind, tonumber(string.sub(kind, 2)) - held)
elseif held == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  granted, stale = hand_over(ARGV[3], ARGV[4], token, nil, 0)
end
if lost then
  if granted == 0 and stale then redis.pcall('PUBLISH', ARGV[3], 'r') end
  return {rid, 0}
end
if granted > 0 then return {rid, 2} end
if stale then redis.pcall('PUBLISH', ARGV[3], 'r') end
return {rid, 1}
