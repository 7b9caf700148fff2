//! Free fns: every argument, both placeholder forms, field paths, patterns, escapes, `?`, and
//! keys that stay apart when values contain the separator.
use lockrt::{LockError, Locker, distributed_lock};
use std::sync::Arc;

struct Order {
    id: u64,
    line: (u32, u32),
}

#[distributed_lock(key = "stock:<id>", ttl = "30s", wait = "5s")]
async fn mission_form(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

/// Docs and attributes stay on the fn.
#[distributed_lock(
    key = "order:{order.id}:{order.line.0}",
    ttl = "1m30s",
    wait = "forever"
)]
#[must_use = "the result says whether the lock was taken"]
pub(crate) async fn field_paths(order: &Order) -> Result<u32, LockError> {
    Ok(order.line.1)
}

#[distributed_lock(key = "pair:{a}-{b}:{{literal}}<<x", wait = "0s", watchdog = false)]
async fn tuple_pattern((a, b): (u32, u32)) -> Result<u32, LockError> {
    Ok(a + b)
}

#[distributed_lock(key = "o:{id}", locker = locker, on_lost = "continue", crate = ::lockrt)]
async fn struct_pattern(Order { id, .. }: Order, locker: &Locker) -> Result<u64, LockError> {
    if id == 0 {
        return Err(LockError::Config("zero".into()));
    }
    Ok(id)
}

#[distributed_lock(key = "arc", locker = locker, ttl = "500ms", on_lost = "cancel")]
async fn arc_locker(locker: Arc<Locker>) -> Result<(), LockError> {
    let _ = &locker;
    Ok(())
}

#[derive(Debug)]
enum AppError {
    Lock,
    Parse,
}
impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError::Lock
    }
}
impl From<std::num::ParseIntError> for AppError {
    fn from(_: std::num::ParseIntError) -> Self {
        AppError::Parse
    }
}

#[distributed_lock(key = "parse:{text}")]
async fn question_mark(text: String) -> Result<u32, AppError> {
    let n: u32 = text.parse()?;
    Ok(n)
}

/// `("a:b", "c")` and `("a", "b:c")` are different locks, held at once.
#[distributed_lock(key = "two:{a}:{b}", wait = "0s")]
async fn two_parts(a: &str, b: &str, inner: Option<(&str, &str)>) -> Result<String, LockError> {
    if let Some((a, b)) = inner {
        Box::pin(two_parts(a, b, None)).await?;
    }
    Ok(lockrt::current_lock().unwrap().key().to_owned())
}

pub(crate) async fn run(locker: &Locker) {
    assert_eq!(mission_form(7).await.unwrap(), 7);
    let order = Order {
        id: 1,
        line: (2, 3),
    };
    assert_eq!(field_paths(&order).await.unwrap(), 3);
    assert_eq!(tuple_pattern((1, 2)).await.unwrap(), 3);
    assert_eq!(
        struct_pattern(
            Order {
                id: 5,
                line: (0, 0)
            },
            locker
        )
        .await
        .unwrap(),
        5
    );
    assert!(
        struct_pattern(
            Order {
                id: 0,
                line: (0, 0)
            },
            locker
        )
        .await
        .is_err()
    );
    arc_locker(Arc::new(locker.clone())).await.unwrap();
    assert_eq!(question_mark("12".into()).await.unwrap(), 12);
    assert!(matches!(
        question_mark("x".into()).await,
        Err(AppError::Parse)
    ));
    let key = two_parts("a:b", "c", Some(("a", "b:c"))).await.unwrap();
    assert_eq!(key, "two:a%3Ab:c");
    assert_eq!(two_parts("50%", "", None).await.unwrap(), "two:50%25:");
}
