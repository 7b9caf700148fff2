//! Bodies the attribute must leave valid: inner attributes, parameters named like the
//! expansion's locals, `return` in a unit fn, a body that never finishes normally.
use lockrt::{LockError, Locker, distributed_lock};

#[distributed_lock(key = "inner:{id}")]
async fn inner_attribute(id: u64) -> Result<u64, LockError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(id)
}

/// The expansion's locals are hygienic: these parameters neither clash with them nor see them.
#[distributed_lock(key = "hygiene:{__lockrt_key}:{__lockrt_body}", locker = __lockrt_locker)]
async fn named_like_locals(
    __lockrt_key: &str,
    __lockrt_body: u8,
    __lockrt_locker: &Locker,
    __lockrt_options: u16,
) -> Result<String, LockError> {
    let __lockrt_return = u32::from(__lockrt_options) + u32::from(__lockrt_body);
    Ok(format!("{__lockrt_key}{__lockrt_return}"))
}

struct Counter {
    locker: Locker,
    hits: u32,
}

impl Counter {
    /// An early `return` leaves the body, not the lock.
    #[distributed_lock(key = "count", locker = self.locker)]
    async fn hit(&mut self, skip: bool) -> Result<(), LockError> {
        if skip {
            return Ok(());
        }
        self.hits += 1;
        Ok(())
    }
}

pub(crate) async fn run(locker: &Locker) {
    assert_eq!(inner_attribute(3).await.unwrap(), 3);
    assert_eq!(named_like_locals("k", 1, locker, 2).await.unwrap(), "k3");
    let mut counter = Counter {
        locker: locker.clone(),
        hits: 0,
    };
    counter.hit(false).await.unwrap();
    counter.hit(true).await.unwrap();
    assert_eq!(counter.hits, 1);
}
