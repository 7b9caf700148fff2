//! Axum handlers: extractor patterns, `locker = state.locker`, a response type of its own that
//! carries lock failures, and (feature `axum`) the return types axum users write first:
//! `impl IntoResponse`, `Response`, `Result<T, (StatusCode, String)>`, `Result<T, StatusCode>`,
//! `Result<T, Response>`. A route only compiles if the locked fn is still a `Handler` (its
//! future `Send`, its arguments extractors).
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
            Reply::Done(n) => n.to_string().into_response(),
            Reply::Busy => StatusCode::CONFLICT.into_response(),
        }
    }
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn deduct(State(state): State<AppState>, Path(id): Path<u64>) -> Reply {
    Reply::Done(id)
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn opaque(State(state): State<AppState>, Path(id): Path<u64>) -> impl IntoResponse {
    if id == 0 {
        return (StatusCode::NOT_FOUND, "no such item").into_response();
    }
    (StatusCode::CREATED, Json(id)).into_response()
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn opaque_tuple(State(state): State<AppState>, Path(id): Path<u64>) -> impl IntoResponse {
    (StatusCode::CREATED, Json(id))
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn response(State(state): State<AppState>, Path(id): Path<u64>) -> Response {
    Json(id).into_response()
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn text_error(
    State(state): State<AppState>,
    Path(id): Path<u64>,
) -> Result<Json<u64>, (StatusCode, String)> {
    if id == 0 {
        return Err((StatusCode::NOT_FOUND, "no such item".to_owned()));
    }
    Ok(Json(id))
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn status_error(
    State(state): State<AppState>,
    Path(id): Path<u64>,
) -> Result<Json<u64>, StatusCode> {
    Ok(Json(id))
}

#[distributed_lock(key = "stock:{id}", locker = state.locker, wait = "0s")]
async fn response_error(
    State(state): State<AppState>,
    Path(id): Path<u64>,
) -> Result<Json<u64>, Response> {
    Ok(Json(id))
}

/// Each handler's answer with `stock:3` held elsewhere, then free.
async fn busy_then_done<F, R>(locker: &Locker, handler: impl Fn() -> F) -> (Response, Response)
where
    F: Future<Output = R>,
    R: IntoResponse,
{
    // Held by another task: within this one, the handler would find it held by itself.
    let (held_tx, held) = tokio::sync::oneshot::channel();
    let (done, done_rx) = tokio::sync::oneshot::channel::<()>();
    let other = locker.clone();
    let holder = tokio::spawn(async move {
        let guard = other.acquire("stock:3", Default::default()).await.unwrap();
        held_tx.send(()).unwrap();
        let _ = done_rx.await;
        guard.release().await.unwrap();
    });
    held.await.unwrap();
    let busy = handler().await.into_response();
    done.send(()).unwrap();
    holder.await.unwrap();
    (busy, handler().await.into_response())
}

pub(crate) async fn run(locker: &Locker) {
    let state = AppState {
        locker: locker.clone(),
    };
    let _app: Router = Router::new()
        .route("/a/{id}", post(deduct))
        .route("/b/{id}", post(opaque))
        .route("/c/{id}", post(opaque_tuple))
        .route("/d/{id}", post(response))
        .route("/e/{id}", post(text_error))
        .route("/f/{id}", post(status_error))
        .route("/g/{id}", post(response_error))
        .with_state(state.clone());
    let s = || State(state.clone());
    let answers = [
        busy_then_done(locker, || deduct(s(), Path(3))).await,
        busy_then_done(locker, || opaque(s(), Path(3))).await,
        busy_then_done(locker, || opaque_tuple(s(), Path(3))).await,
        busy_then_done(locker, || response(s(), Path(3))).await,
        busy_then_done(locker, || text_error(s(), Path(3))).await,
        busy_then_done(locker, || status_error(s(), Path(3))).await,
        busy_then_done(locker, || response_error(s(), Path(3))).await,
    ];
    for (i, (busy, done)) in answers.iter().enumerate() {
        assert_eq!(busy.status(), StatusCode::CONFLICT, "handler {i} when busy");
        assert!(done.status().is_success(), "handler {i} when free");
    }
    let not_found = opaque(s(), Path(0)).await.into_response();
    assert_eq!(not_found.status(), StatusCode::NOT_FOUND);
}
