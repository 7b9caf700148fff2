//! The in-memory backend's read shares, permits and waiter queue, with the Redis scripts'
//! rules: a writer waits for the readers and for every live waiter queued before it; a reader
//! enters unless a writer holds the lock or a live writer is queued before it; a semaphore's
//! caller takes a free permit unless as many live waiters as there are free permits are queued
//! before it. Callers queue only when they may wait, and their place lapses unless refreshed
//! by their next attempt (a waiter that died holds nobody up for long).

use std::time::Duration;

use tokio::time::Instant;

use super::super::contract::Token;
use crate::options::LockKind;

/// One read share or permit.
pub(super) struct Share {
    pub(super) token: Token,
    pub(super) fence: u64,
    pub(super) expires: Instant,
    pub(super) owner: Box<str>,
}

/// The shares of one key, and what they are (readers, or a semaphore of n).
pub(super) struct Shared {
    pub(super) kind: LockKind,
    pub(super) shares: Vec<Share>,
}

impl Shared {
    /// Drops lapsed shares; how many are live.
    pub(super) fn live(&mut self, now: Instant) -> usize {
        self.shares.retain(|s| s.expires > now);
        self.shares.len()
    }

    /// Time until the first live share ends.
    pub(super) fn first_end(&self, now: Instant) -> Option<Duration> {
        self.shares.iter().map(|s| s.expires - now).min()
    }
}

/// A queued waiter, and what it asked for.
struct Place {
    token: Token,
    kind: LockKind,
    until: Instant,
}

/// The waiters of one key in arrival order.
#[derive(Default)]
pub(super) struct Queue(Vec<Place>);

impl Queue {
    /// Queues `token` (or refreshes its place) for `register`.
    pub(super) fn join(&mut self, token: &Token, kind: LockKind, register: Duration, now: Instant) {
        match self.0.iter_mut().find(|p| p.token == *token) {
            Some(p) => p.until = now + register,
            None => self.0.push(Place {
                token: *token,
                kind,
                until: now + register,
            }),
        }
    }

    /// What the longest live waiter asked for (lapsed places are dropped).
    pub(super) fn first_kind(&mut self, now: Instant) -> Option<LockKind> {
        self.0.retain(|p| p.until > now);
        self.0.first().map(|p| p.kind)
    }

    /// Takes `token` out of the queue: whether it was queued.
    pub(super) fn leave(&mut self, token: &Token) -> bool {
        let before = self.0.len();
        self.0.retain(|p| p.token != *token);
        self.0.len() < before
    }

    pub(super) fn len(&self) -> u64 {
        self.0.len() as u64
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the queue lets `token` in now (lapsed places are dropped): a writer
    /// (`room == None`) when nobody live is ahead; a reader when no live writer is; a
    /// semaphore's caller when fewer than `room` live waiters are.
    pub(super) fn lets_in(
        &mut self,
        token: &Token,
        kind: LockKind,
        room: Option<usize>,
        now: Instant,
    ) -> bool {
        self.0.retain(|p| p.until > now);
        let ahead = self.0.iter().take_while(|p| p.token != *token);
        match (room, kind) {
            (Some(room), _) => ahead.count() < room,
            (None, LockKind::Read) => ahead.filter(|p| p.kind != LockKind::Read).count() == 0,
            (None, _) => ahead.count() == 0,
        }
    }
}
