-- (lock.lua comes first: `rid`, `now_ms`, `owns`, `take_lock`, the queue and the
-- shared holders.)
-- Takes lock KEYS[1] (the exclusive lock, which is also the write lock of a read-write lock)
-- for owner token ARGV[2] (32 hex chars) with a lease of ARGV[3] ms.
-- KEYS[2]: the lock's state: its fencing counter and how its latest leases ended (lifetime
-- ARGV[4] ms, see `next_fence`).
-- KEYS[3], KEYS[4]: the lock's waiter queue (see `enqueue`), so that a release hands the lock
-- straight to the longest waiter, waiters of different processes are served in order, and a
-- grant can say how long after that waiter's latest attempt it came.
-- KEYS[5]: the owner key `{lock}:owner`; ARGV[7] the acquirer's identity, kept there (see
-- `take_lock`) and, while it waits, in KEYS[4] under field "o:<token>" for a hand-over.
-- KEYS[6], KEYS[7]: the shared holders (readers exclude a writer; a semaphore's key is not a
-- lock).
-- ARGV[5] > 0: on failure, queue ARGV[2] (or refresh its place) for that many ms; the lease
-- it is granted on release is ARGV[6] ms.
-- The lock's value is "<token>:<fence>": a retry of an acquire whose reply was lost, or a
-- waiter that missed its grant message, finds its own token, gets the same fence back and a
-- fresh lease of ARGV[3] ms.
-- Returns {rid, 1, fence} when ARGV[2] holds the lock now; {rid, 0, pttl, counter} when
-- another owner holds it (readers: the time to the first reader's lease end); {rid, 0, -3,
-- counter} when the lock is free but promised to an earlier waiter; {rid, 0, -4, counter} when
-- ARGV[2] is barred (see below); {rid, 0, -5, counter} when the lock is
-- free but the queue's head is not known yet (64 lapsed registrations were dropped and more
-- may follow: ask again at once); {rid, 0, -6, counter, kind} when the key is in use as a
-- semaphore ('s<n>', see `conflicting`). `counter` is the fencing counter's value, -1 when it
-- does not exist: a grant to ARGV[2] with a fence not above a known counter is stale (its
-- lease ran out before this call, or this call would have found ARGV[2] holding the lock),
-- and with the counter unknown a grant must be confirmed by another call.
-- ARGV[2] is refused ({rid, 0, -4, counter}) when the lock's state bars it (see `state_of`:
-- its acquisition was abandoned, it was released or found lost, or force-unlocked): a
-- request of it that reaches Redis only after that (held up in the network) takes neither the
-- lock nor a queue place.
-- The uncontended path (free, nobody queued, no reader) makes only EXISTS, HMGET, HSET,
-- PEXPIRE and two SETs.
local token = ARGV[2]

-- Released, abandoned or lost: a token is used for one acquisition only, so a request of it
-- that lands after its release (held up in the network) must take nothing.
local st = state_of(token)
if st.barred then
  return {rid, 0, -4, st.n or -1}
end

if redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6]) == 0 then
  return {rid, 1, (take_lock(token, ARGV[3], ARGV[4], ARGV[7], nil, st))}
end

local refusal = refused('x')
if refusal then return refusal end
if redis.call('EXISTS', KEYS[6]) == 1 and live_shared() > 0 then
  enqueue()
  return {rid, 0, shared_pttl(), counter()}
end

local cur = redis.call('GET', KEYS[1])
if cur then
  if owns(cur, token) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    redis.call('PEXPIRE', KEYS[5], ARGV[3])
    return {rid, 1, tonumber(string.sub(cur, 34))}
  end
  enqueue()
  return {rid, 0, redis.call('PTTL', KEYS[1]), counter()}
end

-- Free. The longest live waiter has precedence (a reader at the head too: readers queued
-- before this writer go first); lapsed registrations are dropped, at most 64 per call. The
-- lock is taken only once the head is known: after 64 lapsed ones the caller asks again (a
-- newcomer must not pass a live waiter queued behind many dead ones).
local known = false
for _ = 1, 64 do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head or head == token then
    known = true
    break
  end
  if registration(head) then
    enqueue()
    return {rid, 0, -3, counter()}
  end
  unqueue(head)
end
if not known then
  enqueue()
  return {rid, 0, -5, counter()}
end
unqueue(token)
return {rid, 1, (take_lock(token, ARGV[3], ARGV[4], ARGV[7], nil, st))}
