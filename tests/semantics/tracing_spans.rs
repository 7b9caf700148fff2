//! The `lock` span wraps acquisition and body, and a timeout is an event inside it, whichever
//! order `#[instrument]` and `#[distributed_lock]` are written in; the log reads well: plain
//! durations, the outcome as an event at its level, a busy `wait = 0s` attempt at DEBUG, and a
//! section ended by shutdown or a forced unlock says so.

use crate::support;

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
            .find(|l| l.contains("lock busy (wait 0s)"))
            .unwrap_or_else(|| panic!("{order}: no timeout event:\n{out}"));
        assert!(timeout.contains("DEBUG"), "{order}: {timeout}");
        assert!(timeout.contains("lock{key=\"job:7\""), "{order}: {timeout}");
    }
}

/// The line of `out` containing `needle`, or a panic that shows `out`.
fn line<'a>(out: &'a str, needle: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
}

#[test]
fn the_log_names_durations_outcomes_and_causes_plainly() {
    let redis = lockrt::testing::RedisServer::start().expect("redis-server");
    let url = redis.url();
    let mut errors = Vec::new();
    let out = logged(async || {
        let connect = async || Locker::builder().url(&url).build().await.unwrap();
        let (locker, other) = (connect().await, connect().await);
        let ms = std::time::Duration::from_millis;
        let opts = LockOptions::new().ttl(ms(10_000));

        locker.run("a", opts.wait(ms(0)), async {}).await.unwrap();

        // Busy: one attempt (DEBUG), then a real wait (INFO).
        let held = other.acquire("b", opts).await.unwrap();
        let once = locker.run("b", opts.wait(ms(0)), async {}).await;
        assert!(once.unwrap_err().is_timeout());
        let waited = locker.run("b", opts.wait(ms(50)), async {}).await;
        assert!(waited.unwrap_err().is_timeout());
        held.release().await.unwrap();

        // Force-unlocked by an operator mid-section.
        let (entered, inside) = tokio::sync::oneshot::channel();
        let section = locker.run("c", opts, async move {
            entered.send(()).unwrap();
            std::future::pending::<()>().await
        });
        let forced = async {
            inside.await.unwrap();
            assert!(other.force_unlock("c").await.unwrap());
        };
        let (res, ()) = tokio::join!(section, forced);
        errors.push(res.unwrap_err().to_string());

        // Ended by shutdown mid-section.
        let (entered, inside) = tokio::sync::oneshot::channel();
        let section = locker.run("d", opts, async move {
            entered.send(()).unwrap();
            std::future::pending::<()>().await
        });
        let stop = async {
            inside.await.unwrap();
            locker.shutdown().await;
        };
        let (res, ()) = tokio::join!(section, stop);
        errors.push(res.unwrap_err().to_string());
        other.shutdown().await;
    });
    eprintln!("{out}");

    let released = line(&out, "lock section ended key=\"a\" outcome=\"released\"");
    assert!(released.contains("DEBUG"), "{released}");
    assert!(
        released.contains("ttl=10s wait=0s"),
        "plain durations: {released}"
    );
    assert!(!out.contains("Some("), "Option debug output in the log");
    assert!(line(&out, "lock busy (wait 0s)").contains("DEBUG"));
    let elapsed = line(&out, "lock wait elapsed");
    assert!(
        elapsed.contains(" INFO ") && elapsed.contains("wait=50ms"),
        "{elapsed}"
    );

    // The loss is one WARN line, where it was found; the section's end says so at INFO.
    let forced = line(&out, "lock lost key=\"c\"");
    assert!(
        forced.contains(" WARN ") && forced.contains("force-unlocked"),
        "{forced}"
    );
    assert_eq!(out.matches(" WARN ").count(), 1, "one WARN line:\n{out}");
    let ended = line(&out, "lock section ended by the loss of its lock key=\"c\"");
    assert!(
        ended.contains(" INFO ") && ended.contains("cause=\"force_unlocked\""),
        "{ended}"
    );
    let shut = line(&out, "lock section ended by the locker's shutdown");
    assert!(shut.contains(" INFO "), "{shut}");
    assert!(
        !out.contains("reachability"),
        "no section here lost Redis:\n{out}"
    );

    assert!(errors[0].contains("force-unlocked"), "{}", errors[0]);
    assert!(errors[1].contains("shut down"), "{}", errors[1]);
    for e in &errors {
        assert!(!e.contains("reachability"), "{e}");
    }
}

#[distributed_lock(key = "cat:{tenant}", locker = locker, mode = "read")]
async fn read_section(locker: &Locker, tenant: &str) -> Result<(), LockError> {
    tracing::info!("reading");
    Ok(())
}

#[distributed_lock(key = "export:{tenant}", locker = locker, permits = 3)]
async fn permit_section(locker: &Locker, tenant: &str) -> Result<(), LockError> {
    tracing::info!("exporting");
    Ok(())
}

/// Read and permit sections name their kind in the span; a plain lock's span is unchanged.
#[test]
fn the_span_names_a_shared_kind() {
    let out = logged(async || {
        let locker = Locker::in_memory();
        read_section(&locker, "acme").await.unwrap();
        permit_section(&locker, "acme").await.unwrap();
        instrument_below(&locker, 1).await.unwrap();
    });
    assert!(line(&out, "reading").contains("kind=\"read\""), "{out}");
    assert!(
        line(&out, "exporting").contains("kind=\"permits\""),
        "{out}"
    );
    assert!(!line(&out, "inside the body").contains("kind="), "{out}");
}
