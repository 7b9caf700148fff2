//! What the `#[distributed_lock]` expansion calls. Not public API: names here may change in any
//! release. Kept tiny so the expansion costs nothing beyond a hand-written `Locker::run`.

use std::future::Future;

pub use crate::error::{FromLockError, LockError};
pub use crate::key::KeyPart;
pub use crate::locker::Locker;
pub use crate::options::{LockOptions, OnLost};

/// Anything `locker = EXPR` may evaluate to.
#[diagnostic::on_unimplemented(
    message = "`locker = ...` must be a `lockrt::Locker`, `&Locker` or `Arc<Locker>`, not `{Self}`",
    label = "this is not a locker",
    note = "pass the expression that holds your `Locker`, e.g. `locker = self.locker` or `locker = state.locker`"
)]
pub trait AsLocker {
    /// The locker behind the expression.
    fn __as_locker(&self) -> &Locker;
}

impl AsLocker for Locker {
    fn __as_locker(&self) -> &Locker {
        self
    }
}

impl<T: AsLocker + ?Sized> AsLocker for &T {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for &mut T {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for std::sync::Arc<T> {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for Box<T> {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

/// A clone of the locker behind `l` (an `Arc` bump, no allocation), so the body can take the
/// fn's parameters by move.
#[inline]
pub fn locker_of<L: AsLocker + ?Sized>(l: &L) -> Locker {
    l.__as_locker().clone()
}

/// The default locker, or `NoDefaultLocker`.
#[inline]
pub fn default_locker() -> Result<Locker, LockError> {
    crate::context::default_locker()
}

/// Runs `body` under the lock and folds lock failures into the fn's return type.
#[inline]
pub async fn run<F>(
    locker: Result<Locker, LockError>,
    key: String,
    opts: LockOptions,
    body: F,
) -> F::Output
where
    F: Future,
    F::Output: FromLockError,
{
    let locker = match locker {
        Ok(l) => l,
        Err(e) => return F::Output::from_lock_error(e),
    };
    match locker.run(key, opts, body).await {
        Ok(v) => v,
        Err(e) => F::Output::from_lock_error(e),
    }
}
