//! Lock failures as HTTP answers (feature `axum`): [`LockError`] is an axum response, and the
//! return types axum handlers are written with carry one, so a locked handler needs no glue.
//!
//! | failure | status | body |
//! |---|---|---|
//! | busy for the whole `wait` ([`LockError::Timeout`]) | 409 | `{"error":"lock_busy","retry":true}` |
//! | lock server unreachable or failing ([`LockError::Backend`]) | 503, `Retry-After: 1` | `{"error":"lock_unavailable","retry":true}` |
//! | the locker is shutting down ([`LockError::ShutDown`]) | 503, `Retry-After: 1` | `{"error":"shutting_down","retry":true}` |
//! | lost mid-section ([`LockError::Lost`]) | 500 | `{"error":"lock_lost","retry":false}` |
//! | a mistake in the service (no default locker, bad key or settings) | 500 | `{"error":"lock_error","retry":false}` |
//!
//! `retry: true` means the section never ran, so the same request may be sent again; after
//! `lock_lost` it may have run in part. The body never holds the key (it is built from the
//! request and may carry user data) nor server details: the log has those.

use axum_core::body::Body;
use axum_core::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};

use crate::error::{FromLockError, LockError};

/// What a client is told about one failure.
struct Answer {
    status: StatusCode,
    code: &'static str,
    retry: bool,
    /// For the plain-text forms (`(StatusCode, String)`).
    text: &'static str,
}

fn answer(e: &LockError) -> Answer {
    let (status, code, retry, text) = match e {
        LockError::Timeout { .. } => (
            StatusCode::CONFLICT,
            "lock_busy",
            true,
            "busy: another request is working on this; retry shortly",
        ),
        LockError::Backend(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "lock_unavailable",
            true,
            "temporarily unavailable; retry shortly",
        ),
        LockError::ShutDown => (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            true,
            "this instance is shutting down; retry shortly",
        ),
        LockError::Lost { .. } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "lock_lost",
            false,
            "interrupted: the request may have taken effect in part",
        ),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "lock_error",
            false,
            "internal error",
        ),
    };
    Answer {
        status,
        code,
        retry,
        text,
    }
}

/// Says in the log what the client is not told: at DEBUG what the runtime has logged already
/// (a busy lock, an unreachable server, a loss, shutdown), at ERROR a mistake in the service.
fn log(e: &LockError) {
    match e {
        LockError::Timeout { .. }
        | LockError::Backend(_)
        | LockError::ShutDown
        | LockError::Lost { .. } => tracing::debug!(error = %e, "lock failure answered"),
        _ => tracing::error!(error = %e, "lock failure answered"),
    }
}

/// Answers with the status and the small JSON body of the table in the [module docs](self).
///
/// ```
/// use axum_core::response::IntoResponse;
/// use lockrt::LockError;
///
/// let busy = LockError::Timeout { key: "order:7".into(), waited: std::time::Duration::ZERO };
/// let res = busy.into_response();
/// assert_eq!(res.status(), http::StatusCode::CONFLICT);
/// ```
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        log(&self);
        let a = answer(&self);
        // Only fixed words go in: nothing to escape.
        let json = format!(r#"{{"error":"{}","retry":{}}}"#, a.code, a.retry);
        let mut res = Response::new(Body::from(json));
        *res.status_mut() = a.status;
        let headers = res.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if a.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}

/// A handler returning `Response` can be locked: a lock failure becomes
/// [`LockError::into_response`](IntoResponse::into_response).
impl FromLockError for Response {
    fn from_lock_error(err: LockError) -> Self {
        err.into_response()
    }
}

/// `Result<T, Response>` handlers: the error is the JSON answer.
impl From<LockError> for Response {
    fn from(err: LockError) -> Self {
        err.into_response()
    }
}

/// `Result<T, (StatusCode, String)>` handlers: the status of the table and a short sentence
/// (no key, no server details).
///
/// ```
/// use lockrt::LockError;
///
/// let (status, text) = <(http::StatusCode, String)>::from(LockError::ShutDown);
/// assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
/// assert!(text.contains("retry"));
/// ```
impl From<LockError> for (StatusCode, String) {
    fn from(err: LockError) -> Self {
        log(&err);
        let a = answer(&err);
        (a.status, a.text.to_owned())
    }
}

/// `Result<T, StatusCode>` handlers: the status of the table alone.
impl From<LockError> for StatusCode {
    fn from(err: LockError) -> Self {
        log(&err);
        answer(&err).status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BackendError;
    use std::time::Duration;

    fn failures() -> Vec<LockError> {
        vec![
            LockError::Timeout {
                key: "user:<script>".into(),
                waited: Duration::ZERO,
            },
            LockError::Backend(BackendError::new("10.0.0.9:6379", "connection refused")),
            LockError::ShutDown,
            LockError::Lost {
                key: "user:<script>".into(),
                cause: crate::error::LossCause::Expired,
            },
            LockError::NoDefaultLocker,
        ]
    }

    #[test]
    fn each_failure_has_its_status_and_nothing_of_the_key_or_server_leaks() {
        let want = [409, 503, 503, 500, 500];
        for (e, want) in failures().into_iter().zip(want) {
            let (status, text) = <(StatusCode, String)>::from(e.clone());
            assert_eq!(status.as_u16(), want, "{e}");
            assert_eq!(StatusCode::from(e.clone()).as_u16(), want);
            let res = e.into_response();
            assert_eq!(res.status().as_u16(), want);
            assert_eq!(
                res.headers().get(RETRY_AFTER).is_some(),
                want == 503,
                "Retry-After only with 503"
            );
            assert!(!text.contains("script") && !text.contains("10.0.0.9"));
        }
    }
}
