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

/// Runs `body` under the lock and folds lock failures into the fn's return type with
/// `on_error` (`FromLockError::from_lock_error`, or [`from_lock_error_response`]). The
/// conversion is an argument rather than a bound here so that a return type that can't carry
/// a lock failure is reported once, on that argument, and not again at the `.await`.
#[inline]
pub async fn run<F>(
    locker: Result<Locker, LockError>,
    key: String,
    opts: LockOptions,
    body: F,
    on_error: fn(LockError) -> F::Output,
) -> F::Output
where
    F: Future,
{
    match locker {
        Ok(l) => l.run(key, opts, body).await.unwrap_or_else(on_error),
        Err(e) => on_error(e),
    }
}

/// [`run`] for `keys = [...]`: all of them or none ([`Locker::run_all`]).
#[inline]
pub async fn run_all<F>(
    locker: Result<Locker, LockError>,
    keys: Vec<String>,
    opts: LockOptions,
    body: F,
    on_error: fn(LockError) -> F::Output,
) -> F::Output
where
    F: Future,
{
    match locker {
        Ok(l) => l.run_all(keys, opts, body).await.unwrap_or_else(on_error),
        Err(e) => on_error(e),
    }
}

/// The body of a fn declared `-> impl IntoResponse`, turned into an axum `Response` (which
/// a lock failure can become; the body's own type is hidden behind the `impl`).
#[cfg(feature = "axum")]
#[inline]
pub fn respond<F>(body: F) -> Respond<F> {
    Respond { body }
}

#[cfg(feature = "axum")]
pin_project_lite::pin_project! {
    /// [`respond`]'s future. The `IntoResponse` bound sits on its `Future` impl only, so a
    /// body of another type is one error (where `run` needs a future), not one per use.
    pub struct Respond<F> {
        #[pin]
        body: F,
    }
}

#[cfg(feature = "axum")]
impl<F> Future for Respond<F>
where
    F: Future,
    F::Output: axum_core::response::IntoResponse,
{
    type Output = axum_core::response::Response;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.project()
            .body
            .poll(cx)
            .map(axum_core::response::IntoResponse::into_response)
    }
}

/// Without the `axum` feature the body stays as it is, and [`from_lock_error_response`]
/// reports the missing feature.
#[cfg(not(feature = "axum"))]
#[inline]
pub fn respond<F: Future>(body: F) -> F {
    body
}

/// A lock failure as the response of a fn declared `-> impl IntoResponse`.
#[cfg(feature = "axum")]
#[inline]
pub fn from_lock_error_response(e: LockError) -> axum_core::response::Response {
    axum_core::response::IntoResponse::into_response(e)
}

/// Never callable: no type implements [`AxumFeatureNeeded`], so this only names the fix.
#[cfg(not(feature = "axum"))]
#[inline]
pub fn from_lock_error_response<T: AxumFeatureNeeded>(e: LockError) -> T {
    T::from_lock_error(e)
}

/// Implemented by no type: the bound that fails, with the fix as its message, when a fn
/// declared `-> impl IntoResponse` is locked without the `axum` feature.
#[cfg(not(feature = "axum"))]
#[diagnostic::on_unimplemented(
    message = "a `#[distributed_lock]` fn returning `impl IntoResponse` needs lockrt's `axum` feature",
    label = "a lock failure can't become this hidden type",
    note = "enable it in Cargo.toml: `lockrt = {{ version = \"0.1\", features = [\"axum\"] }}` (a lock failure then answers 409, 503 or 500)"
)]
pub trait AxumFeatureNeeded {
    /// Unreachable: there are no impls.
    fn from_lock_error(e: LockError) -> Self;
}
