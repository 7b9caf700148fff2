//! The `lock` span wraps acquisition and body, and a timeout is an event inside it, whichever
//! order `#[instrument]` and `#[distributed_lock]` are written in.

mod support;

use lockrt::{LockError, LockOptions, Locker, distributed_lock};
use support::logs::logged;
use tracing::instrument;

#[instrument(skip(locker), err)]
#[distributed_lock(key = "job:{id}", locker = locker, wait = "0s")]
async fn instrument_above(locker: &Locker, id: u32) -> Result<u32, LockError> {
    tracing::info!("inside the body");
    Ok(id)
}

#[distributed_lock(key = "job:{id}", locker = locker, wait = "0s")]
#[instrument(skip(locker), err)]
async fn instrument_below(locker: &Locker, id: u32) -> Result<u32, LockError> {
    tracing::info!("inside the body");
    Ok(id)
}

#[test]
fn a_timeout_is_an_event_in_the_lock_span_in_both_orders() {
    for above in [true, false] {
        let out = logged(async || {
            let locker = Locker::in_memory();
            let other = locker.in_memory_peer().unwrap();
            let call = async |l: &Locker| {
                if above {
                    instrument_above(l, 7).await
                } else {
                    instrument_below(l, 7).await
                }
            };
            assert_eq!(call(&locker).await.unwrap(), 7);
            let held = other.acquire("job:7", LockOptions::new()).await.unwrap();
            assert!(call(&locker).await.unwrap_err().is_timeout());
            held.release().await.unwrap();
        });
        let order = if above { "above" } else { "below" };
        let body = out
            .lines()
            .find(|l| l.contains("inside the body"))
            .unwrap_or_else(|| panic!("{order}: no body event:\n{out}"));
        assert!(
            body.contains("lock{key=\"job:7\""),
            "{order}: body outside the lock span: {body}"
        );
        assert!(
            body.contains("fence="),
            "{order}: fence not recorded: {body}"
        );
        let timeout = out
            .lines()
            .find(|l| l.contains("lock wait elapsed"))
            .unwrap_or_else(|| panic!("{order}: no timeout event:\n{out}"));
        assert!(timeout.contains(" INFO "), "{order}: {timeout}");
        assert!(timeout.contains("lock{key=\"job:7\""), "{order}: {timeout}");
    }
}
