//! An axum handler: extractor patterns, `locker = state.locker`, a response type that carries
//! lock failures. `post(deduct)` only compiles if the locked fn is still a `Handler` (its future
//! `Send`, its arguments extractors).
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
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
            Reply::Done(n) => n.to_string().into_response(),
            Reply::Busy => StatusCode::CONFLICT.into_response(),
        }
    }
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn deduct(State(state): State<AppState>, Path(id): Path<u64>) -> Reply {
    Reply::Done(id)
}

pub(crate) async fn run(locker: &Locker) {
    let state = AppState {
        locker: locker.clone(),
    };
    let _app: Router = Router::new()
        .route("/items/{id}/deduct", post(deduct))
        .with_state(state.clone());
    let held = locker.acquire("stock:3", Default::default()).await.unwrap();
    let busy = deduct(State(state.clone()), Path(3)).await.into_response();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    held.release().await.unwrap();
    let done = deduct(State(state), Path(3)).await.into_response();
    assert_eq!(done.status(), StatusCode::OK);
}
