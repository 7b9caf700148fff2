//! Declarative distributed locks for async Rust.
//!
//! Put `#[distributed_lock]` on an `async fn` and it becomes a critical section guarded by a
//! Redis lock: acquired before the body runs, renewed by a watchdog while it runs, released on
//! every exit path (return, `?`, panic, cancellation).
//!
//! ```no_run
//! use lockrt::{distributed_lock, LockError, Locker};
//!
//! #[derive(Debug)]
//! enum AppError { Lock(LockError), OutOfStock }
//! impl From<LockError> for AppError {
//!     fn from(e: LockError) -> Self { AppError::Lock(e) }
//! }
//!
//! #[distributed_lock(key = "stock:{id}", ttl = "30s", wait = "5s")]
//! async fn deduct_stock(id: u64, qty: u32) -> Result<u32, AppError> {
//!     // runs only while this process holds lock:stock:<id>
//!     # let _ = (id, qty);
//!     Ok(99)
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! lockrt::set_default(Locker::connect("redis://127.0.0.1:6379/").await?);
//! let left = deduct_stock(1, 1).await;
//! # let _ = left; Ok(()) }
//! ```
//!
//! # The runtime without the attribute
//!
//! [`Locker`] is the handle: [`Locker::run`] holds a lock around a future (what the attribute
//! expands to), [`Locker::acquire`] returns a [`LockGuard`] you release yourself (or drop).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
//! use lockrt::{LockOptions, Locker};
//! use std::time::Duration;
//!
//! let locker = Locker::in_memory(); // or Locker::connect("redis://...").await?
//! let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Duration::from_secs(1));
//!
//! let guard = locker.acquire("invoice:42", opts).await?;
//! let fence = guard.fence(); // hand this to storage that should reject stale writers
//! guard.release().await?;
//!
//! let total = locker.run("invoice:42", opts, async { 40 + 2 }).await?;
//! assert_eq!(total, 42);
//! # let _ = fence; Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - The body never runs without the lock: failing to acquire returns
//!   [`LockError::Timeout`] (or `Backend` when Redis is unreachable) and skips the body.
//! - The lease is renewed every ttl/3 while held; the holder keeps a local deadline on a
//!   monotonic clock and declares the lock lost when a renewal says "not yours" or the deadline
//!   passes without a successful renewal, even when Redis is unreachable. `run` then drops the
//!   body and returns [`LockError::Lost`] (or continues, with [`OnLost::Continue`]).
//! - Release is owner-checked (it never deletes another owner's lock), completes before `run`
//!   returns normally, and runs in the background within milliseconds after a panic or a
//!   cancellation.
//! - Fair: a release hands the lock straight to the longest waiter across all processes
//!   (inside the release script), so waiters don't race and holders can't barge back in.
//! - Reentrant within a task: a nested `run` (or annotated fn) on the same locker and key
//!   runs directly; tasks spawned inside the body are other owners.
//! - [`LockGuard::fence`] is strictly increasing per key across holders, also after expiry.
//!
//! # Fencing, and when a TTL lock is not enough
//!
//! A process can pause (GC, swap, a stopped VM) past its lease without knowing it, and a
//! failover to a replica that had not yet received the lock loses it. Where a double writer
//! would corrupt data, pass [`LockGuard::fence`] (or [`HeldLock::fence`] from
//! [`current_lock`]) to the storage and have it reject a fence lower than the last one it saw.
//! Fences come from `max(last + 1, Redis server time in µs)`, so they keep increasing after a
//! key's counter was dropped for idleness; after a failover they are only as good as the
//! replica's copy and clock.

mod backend;
mod error;
mod guard;
mod key;
mod lease;
mod locker;
mod options;
mod wait;

#[cfg(feature = "testing")]
pub mod testing;

#[doc(hidden)]
pub mod __private;

pub use error::{BackendError, FromLockError, LockError};
pub use guard::{HeldLock, LockGuard};
pub use locker::{Locker, LockerBuilder, LockerStats, current_lock, default_locker, set_default};
pub use options::{LockOptions, OnLost, Wait};

pub use lockmacro::distributed_lock;
