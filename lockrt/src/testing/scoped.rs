//! A default locker for one test's future: [`with_default`].

use std::future::Future;

use crate::locker::Locker;

/// Runs `fut` with `locker` as the default that `#[distributed_lock]` (without
/// `locker = ...`) and [`default_locker`](crate::default_locker) use, inside `fut` only and
/// ahead of any process-wide [`set_default`](crate::set_default). Tests running in parallel
/// in one process can each have their own default this way. The default belongs to the task
/// polling `fut`: tasks spawned inside it don't see it (wrap their futures too).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mine = lockrt::Locker::in_memory();
/// let held = lockrt::testing::with_default(mine.clone(), async {
///     let locker = lockrt::default_locker().unwrap();
///     let _guard = locker.acquire("job", lockrt::LockOptions::new()).await.unwrap();
///     mine.memory_pttl("job").is_some()
/// })
/// .await;
/// assert!(held);
/// # }
/// ```
pub async fn with_default<F: Future>(locker: Locker, fut: F) -> F::Output {
    crate::context::with_default(locker, fut).await
}
