//! Generic fns, where-clauses, `impl Trait` arguments and returns, `dyn` returns, lifetimes.
use lockrt::{LockError, Locker, distributed_lock};
use std::fmt::Display;

#[distributed_lock(key = "item:{id}", locker = locker.as_ref())]
async fn generic<K, L>(id: K, locker: L) -> Result<String, LockError>
where
    K: Display + Send + Sync,
    L: AsRef<Locker> + Send,
{
    let _ = locker.as_ref();
    Ok(id.to_string())
}

struct Wrap(Locker);
impl AsRef<Locker> for Wrap {
    fn as_ref(&self) -> &Locker {
        &self.0
    }
}

#[distributed_lock(key = "name:{name}")]
async fn impl_arg(name: impl Display + Send) -> Result<impl Display, LockError> {
    Ok(format!("hello {name}"))
}

/// The body checks against the declared type, so `Box::new(id)` coerces to the trait object.
#[distributed_lock(key = "dyn:{id}")]
async fn dyn_return(id: u64) -> Result<Box<dyn Display + Send>, LockError> {
    Ok(Box::new(id))
}

#[distributed_lock(key = "dyn-early:{id}")]
async fn dyn_early_return(id: u64) -> Result<Box<dyn Display + Send>, LockError> {
    if id == 0 {
        return Ok(Box::new("zero"));
    }
    Ok(Box::new(id))
}

#[distributed_lock(key = "borrow:{name}")]
async fn lifetimes<'a, 'b: 'a>(name: &'a str, other: &'b str) -> Result<&'a str, LockError> {
    Ok(if other.is_empty() { name } else { other })
}

#[distributed_lock(key = "elided:{name}")]
async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

pub(crate) async fn run(locker: &Locker) {
    assert_eq!(generic(3u8, Wrap(locker.clone())).await.unwrap(), "3");
    assert_eq!(impl_arg("x").await.unwrap().to_string(), "hello x");
    assert_eq!(dyn_return(4).await.unwrap().to_string(), "4");
    assert_eq!(dyn_early_return(0).await.unwrap().to_string(), "zero");
    assert_eq!(lifetimes("a", "").await.unwrap(), "a");
    assert_eq!(elided("e").await.unwrap(), "e");
}
