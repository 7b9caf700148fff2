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
//! Fences come from `max(last + 1, Redis server time in 10 µs units since 2020)` (times 32
//! for the local hand-off places), so they keep increasing after a key's counter was dropped
//! for idleness or lost with the server's data and stay below 2^53, exact in a double (Lua,
//! JavaScript, JSON), until about 2109; after a failover they are only as good as the
//! replica's copy and clock.

mod acquire;
mod backend;
mod builder;
mod cleanup;
mod config;
mod context;
mod error;
mod guard;
mod handoff;
mod inspect;
mod job;
mod key;
mod kind;
mod lease;
mod locker;
mod metrics;
mod monitor;
mod multi;
mod options;
mod owner;
mod redact;
mod renewal;
mod retry;
mod section;
mod wait;
#[cfg(feature = "axum")]
pub mod web;

#[cfg(feature = "testing")]
pub mod testing;

#[doc(hidden)]
pub mod __private;

pub use builder::LockerBuilder;
pub use config::LockerConfig;
pub use context::{current_lock, default_locker, set_default};
pub use error::{BackendError, FromLockError, LockError, LossCause};
pub use guard::{HeldLock, LockGuard};
pub use inspect::{LockInfo, MAX_LISTED, ShareInfo};
pub use job::{JobHandle, JobRun, JobStatus, Schedule, Stop, every, spawn_every};
pub use locker::{Locker, LockerStats};
pub use multi::MultiGuard;
pub use options::{LockKind, LockOptions, OnLost, Wait};
pub use owner::Holder;
pub use section::Checked;

/// Turns an `async fn` into a critical section guarded by a distributed lock.
///
/// ```
/// use lockrt::{distributed_lock, LockError, Locker};
///
/// #[distributed_lock(key = "stock:<id>", ttl = "30s", wait = "5s")]
/// async fn deduct(id: u64, qty: u32) -> Result<u32, LockError> {
///     // Only one caller at a time, across every process sharing the Redis, gets here for
///     // one `id`; the lease is renewed every 10 s while this body runs.
///     Ok(100 - qty)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// lockrt::set_default(Locker::in_memory()); // in production: Locker::connect("redis://...")
/// assert_eq!(deduct(7, 1).await?, 99);
/// # Ok(()) }
/// ```
///
/// # Arguments
///
/// | argument | meaning | default |
/// |---|---|---|
/// | `key = "..."` | the lock's name, a template (below); required unless `keys` is given | |
/// | `keys = ["..", ".."]` | several locks, all or none ([`Locker::run_all`]) | |
/// | `ttl = "30s"` | lease length: `"500ms"`, `"30s"`, `"1m30s"`; at least 30 ms | the locker's, 30 s |
/// | `wait = "5s"` | longest wait for a busy lock; `"0s"` = one attempt, `"forever"` = no limit | the locker's, 10 s |
/// | `max_hold = "10m"` | longest time the lock may be held: then the watchdog stops and the body is told it lost the lock (as `on_lost` says) | the locker's, none |
/// | `min_hold = "1s"` | shortest time the lock stays taken: a release sooner keeps it until then, owner-checked (ShedLock's `lockAtLeastFor`); for a job once per tick across instances use [`every`] instead, which neither skips nor repeats a tick | none |
/// | `locker = EXPR` | where the lock lives: a `Locker`, `&Locker` or `Arc<Locker>`, evaluated inside the fn | [`set_default`]'s |
/// | `watchdog = bool` | `true`: renew every ttl/3 while the body runs; `false`: a fixed lease of `ttl` | `true` |
/// | `on_lost = "..."` | `"cancel"`: drop the body and return [`LockError::Lost`]; `"continue"`: log at WARN and finish | `"cancel"` |
/// | `mode = "read"` / `"write"` | the read share or the write side (the exclusive lock) of the key's read-write lock ([`LockOptions::read`]) | `"write"` |
/// | `permits = N` | a semaphore of `N` leased permits on the key ([`LockOptions::permits`]) | |
/// | `crate = path` | where to find `lockrt` when it is re-exported under another name | `::lockrt` |
///
/// Each argument becomes one call on [`LockOptions`] (`ttl = "30s"` is
/// `.ttl(Duration::from_millis(30000))`). A duration written as a string literal is checked at
/// compile time: `ttl = "0s"`, `ttl = "30 sec"`, `max_hold = "0s"` or `wait = "soon"` are
/// compile errors on the literal, as are unknown or repeated arguments.
///
/// `ttl`, `wait` and `max_hold` also take any expression of type [`Duration`]: a constant, or a
/// value read from configuration. Like `locker`, it is evaluated inside the fn, before the body
/// runs, so it may use the parameters; it is not checked at compile time (the runtime raises a
/// ttl below 30 ms to 30 ms).
///
/// ```
/// use lockrt::{distributed_lock, LockError, Locker};
/// use std::time::Duration;
///
/// const TTL: Duration = Duration::from_secs(10);
///
/// struct Jobs { locker: Locker, patience: Duration }
///
/// impl Jobs {
///     #[distributed_lock(key = "job:{name}", locker = self.locker, ttl = TTL,
///                        wait = self.patience, max_hold = "10m")]
///     async fn run_once(&self, name: &str) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let jobs = Jobs { locker: Locker::in_memory(), patience: Duration::ZERO };
/// jobs.run_once("nightly").await?;
/// # Ok(()) }
/// ```
///
/// [`Duration`]: std::time::Duration
///
/// ## Key templates
///
/// `{name}` or `<name>` inserts the [`Display`](std::fmt::Display) of a parameter; field paths
/// (`{order.id}`, `{pair.0}`, `{self.tenant}`) and bindings inside patterns
/// (`Path(id): Path<u64>`, `(a, b): (u32, u32)`) work too. `{{`, `}}` and `<<` are literal
/// `{`, `}` and `<`. A name that is not a parameter is a compile error listing the ones that
/// are.
///
/// Different arguments never render the same key. Inside each value, `%` and the first
/// character of the text that follows the placeholder in the template are percent-encoded
/// (`%25`, `%3A`, one `%XX` per UTF-8 byte), so a value can't contain the text that ends it:
/// with `key = "order:{a}:{b}"`, `("a:b", "c")` renders `order:a%3Ab:c` and `("a", "b:c")`
/// renders `order:a:b:c` (a value at the end of the template has only its `%` encoded). For
/// the same reason two placeholders need text between them (`"{a}{b}"` is a compile error:
/// write `"{a}:{b}"`), and that text must not start with `%`. Values without `%` or the
/// separator render as they are. The locker then applies its key hygiene to the whole key
/// (prefix `lock:`, `{`, `}` and `%` percent-encoded in the Redis name, so no key can forge a
/// Redis Cluster hash tag).
///
/// ```
/// use lockrt::{distributed_lock, LockError, Locker};
/// use std::sync::Arc;
///
/// struct Order { id: u64, shop: String }
///
/// struct Refunds { locker: Arc<Locker>, region: &'static str }
///
/// impl Refunds {
///     // `locker = self.locker`: the lock lives where this service's locker points.
///     #[distributed_lock(key = "refund:{self.region}:{order.shop}:{order.id}",
///                        locker = self.locker, ttl = "10s", wait = "0s")]
///     async fn refund(&self, order: &Order) -> Result<String, LockError> {
///         Ok(lockrt::current_lock().unwrap().key().to_owned())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let svc = Refunds { locker: Arc::new(Locker::in_memory()), region: "eu" };
/// let order = Order { id: 9, shop: "acme".into() };
/// assert_eq!(svc.refund(&order).await?, "refund:eu:acme:9");
/// let order = Order { id: 9, shop: "ac:me".into() };
/// assert_eq!(svc.refund(&order).await?, "refund:eu:ac%3Ame:9");
/// # Ok(()) }
/// ```
///
/// ## Return type
///
/// The fn's output must implement [`FromLockError`], so a lock failure can be returned instead
/// of running the body: any `Result<T, E>` with `E: From<LockError>` does. Implement it for
/// your own types, e.g. a response of your own that maps a busy lock to `409 Conflict` (with
/// the `axum` feature, axum's own return types already do: see the `web` module):
///
/// ```
/// use lockrt::{distributed_lock, FromLockError, LockError, Locker};
///
/// #[derive(Debug, PartialEq)]
/// enum Reply { Done(u32), Busy }
///
/// impl FromLockError for Reply {
///     fn from_lock_error(_: LockError) -> Self { Reply::Busy }
/// }
///
/// #[distributed_lock(key = "report", locker = locker, wait = "0s")]
/// async fn build_report(locker: &Locker) -> Reply {
///     Reply::Done(1)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let locker = Locker::in_memory();
/// let held = locker.acquire("report", Default::default()).await?;
/// assert_eq!(build_report(&locker).await, Reply::Busy);
/// held.release().await?;
/// assert_eq!(build_report(&locker).await, Reply::Done(1));
/// # Ok(()) }
/// ```
///
/// # Guarantees
///
/// - **The body never runs without the lock.** Timeout, an unreachable Redis or a missing
///   default locker come back as the fn's error value; the body is skipped.
/// - **Released on every exit path**: return, `?`, early `return`, panic (which keeps
///   propagating), and cancellation (the future dropped by `tokio::time::timeout`, `select!`,
///   a closed HTTP connection, `abort()`). After a normal return the release has completed;
///   after a panic or cancellation it runs in the background within milliseconds.
/// - **Loss**: when the lease is lost (taken over, deleted, or Redis unreachable until the
///   local deadline), the body is dropped at its next `.await` and the fn returns `Lost`,
///   unless `on_lost = "continue"`.
/// - **Reentrant within a task**: an annotated fn called from inside a critical section of
///   the same locker and key in the same task runs without acquiring again; the lock is
///   released when the outermost section ends. Tasks spawned inside are other owners and wait.
///
/// # What it expands to
///
/// The signature, attributes, docs and visibility stay as written; only the body changes.
/// `#[distributed_lock(key = "stock:{id}", ttl = "30s")]` on
/// `async fn deduct(id: u64) -> Result<u32, AppError> { BODY }` expands to (pretty-printed by
/// the `expansion_of_the_documented_example` test of `lockmacro`, which checks this text):
///
/// ```text
/// async fn deduct(id: u64) -> Result<u32, AppError> {
///     let __lockrt_locker: ::core::result::Result<
///         ::lockrt::__private::Locker,
///         ::lockrt::__private::LockError,
///     > = ::lockrt::__private::default_locker();
///     let __lockrt_key: ::std::string::String = ::std::format!(
///         "stock:{}", ::lockrt::__private::KeyPart(& id, '%')
///     );
///     let __lockrt_options: ::lockrt::__private::LockOptions = ::lockrt::__private::LockOptions::new()
///         .site(::core::concat!(::core::module_path!(), "::", "deduct"))
///         .ttl(::core::time::Duration::from_millis(30000u64));
///     let __lockrt_body = async move {
///         #[allow(
///             unreachable_code,
///             clippy::diverging_sub_expression,
///             clippy::empty_loop,
///             clippy::let_unit_value,
///             clippy::needless_return
///         )]
///         if false {
///             let __lockrt_return: Result<u32, AppError> = loop {};
///             return __lockrt_return;
///         }
///         BODY
///     };
///     ::lockrt::__private::run(
///             __lockrt_locker,
///             __lockrt_key,
///             __lockrt_options,
///             { __lockrt_body },
///             ::lockrt::__private::FromLockError::from_lock_error,
///         )
///         .await
/// }
/// ```
///
/// - The locker, key and options are evaluated first, before the body takes the parameters by
///   move, so they may borrow them. Each given argument is one builder call; the others keep
///   the locker's defaults. `KeyPart(&id, '%')` writes `id`'s `Display` with the escaping
///   described under key templates (here only `%`: nothing follows `{id}`).
/// - The `if false { .. }` never runs: its `return` makes the async block check against the
///   declared return type, exactly as the fn body would (so `Ok(Box::new(x))` coerces to
///   `Result<Box<dyn Trait>, _>`). `impl Trait` in the return type is written `_` there.
/// - `return` and `?` in `BODY` leave the async block, not the lock. Inner attributes
///   (`#![allow(..)]`) stay first in the body. The `__lockrt_*` locals are hygienic: the body
///   can't see them, and a parameter may have the same name.
/// - `run` is [`Locker::run`] plus the conversion of a lock failure through [`FromLockError`]:
///   the same round trips as calling `Locker::run` by hand, and no allocation beyond the key.
///   The conversion carries the span of the return type, so a type that can't carry a lock
///   failure is reported there, once.
/// - `-> impl IntoResponse` (feature `axum`): the body is `respond(__lockrt_body)`, which
///   turns its value into an axum `Response`, and the conversion is `LockError`'s
///   `IntoResponse` (the `web` module: 409 busy, 503 unavailable, 500 lost).
///
/// `#[async_trait]` methods are refused with a compile error (the attribute would see
/// `async_trait`'s boxed future): use a native `async fn` in the trait, or `Locker::run`.
pub use lockmacro::distributed_lock;
