//! An axum handler: extractor patterns, `locker = state.locker`, a response type that carries
//! lock failures.
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lockrt::{FromLockError, LockError, Locker, distributed_lock};

#[derive(Clone)]
struct AppState {
    locker: Locker,
}

enum Reply {
    Done(u64),
    Busy,
}

impl FromLockError for Reply {
    fn from_lock_error(_: LockError) -> Self {
        Reply::Busy
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Done(n) => Json(n).into_response(),
            Reply::Busy => StatusCode::CONFLICT.into_response(),
        }
    }
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn deduct(State(state): State<AppState>, Path(id): Path<u64>) -> Reply {
    Reply::Done(id)
}

fn main() {
    let state = AppState { locker: Locker::in_memory() };
    let _app: Router = Router::new().route("/items/{id}/deduct", post(deduct)).with_state(state);
}
