//! `keys = [...]`: all of several locks or none, each key a template of its own.
use lockrt::{LockError, Locker, distributed_lock};

struct Transfer {
    from: u64,
    to: u64,
}

#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], locker = locker, wait = "1s")]
async fn transfer(
    locker: &Locker,
    from: u64,
    to: u64,
    cents: u64,
) -> Result<Vec<String>, LockError> {
    let _ = cents;
    let held = lockrt::current_lock().map(|h| h.key().to_owned());
    Ok(held.into_iter().collect())
}

#[distributed_lock(keys = ["acct:{t.from}", "acct:{t.to}", "ledger"], locker = locker)]
async fn by_fields(locker: &Locker, t: &Transfer) -> Result<u64, LockError> {
    Ok(t.from + t.to)
}

pub(crate) async fn run(locker: &Locker) {
    let held = transfer(locker, 2, 1, 100).await.unwrap();
    assert_eq!(
        held,
        ["acct:2"],
        "the last key in the canonical order is the current one"
    );
    assert_eq!(
        by_fields(locker, &Transfer { from: 1, to: 2 })
            .await
            .unwrap(),
        3
    );
    // The same key twice is one lock, not a wait for itself.
    assert!(transfer(locker, 5, 5, 1).await.is_ok());
}
