//! Waiting for a busy lock: `wait` bounds, single attempts, and prompt hand-off on release.

use crate::support;

use std::time::Duration;

use lockrt::LockError;
use redis::AsyncCommands;
use support::{ms, opts};
use tokio::time::Instant;

both! {
    async fn wait_300ms_times_out_between_300_and_450ms(fx) {
        let holder = fx.locker().await;
        let waiter = fx.locker().await;
        let _guard = holder.acquire("busy", opts().ttl(ms(10_000))).await.unwrap();
        let start = Instant::now();
        let err = waiter.acquire("busy", opts().wait(ms(300))).await.unwrap_err();
        let took = start.elapsed();
        assert!(err.is_timeout(), "{err}");
        assert!(took >= ms(300) && took <= ms(450), "timed out after {took:?}");
        match err {
            LockError::Timeout { key, waited } => {
                assert_eq!(key, "busy");
                assert!(waited >= ms(300));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err_text_names_key_and_wait(&waiter.acquire("busy", opts().wait(ms(0))).await.unwrap_err()));
    }
}

fn err_text_names_key_and_wait(e: &LockError) -> bool {
    let s = e.to_string();
    s.contains("`busy`") && s.contains("wait")
}

both! {
    async fn try_acquire_returns_none_while_held_and_some_after(fx) {
        let a = fx.locker().await;
        let b = fx.locker().await;
        let g = a.acquire("k", opts()).await.unwrap();
        assert!(b.try_acquire("k", opts()).await.unwrap().is_none());
        g.release().await.unwrap();
        assert!(b.try_acquire("k", opts()).await.unwrap().is_some());
    }
}

/// `wait = 0` sends exactly one acquire script to Redis.
#[tokio::test]
async fn wait_zero_makes_exactly_one_attempt() {
    let fx = support::Fx::redis();
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let mut conn = fx.conn().await;
    // The holder's subscription to forced unlocks, and the check it runs once listening, are
    // not the waiter's: they are done before the count starts.
    let _warm = support::warm_up(&holder, &mut conn).await;
    let _g = holder.acquire("one", opts()).await.unwrap();
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = waiter
        .acquire("one", opts().wait(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    let stats = support::commandstats(&mut conn).await;
    let calls = |cmd: &str| support::calls(&stats, cmd);
    // One EVALSHA (or EVAL when the script had to be loaded), and no subscription.
    assert_eq!(calls("evalsha") + calls("eval"), 1, "{stats}");
    assert_eq!(calls("subscribe"), 0, "{stats}");
    let _: () = conn.set("unrelated", 1).await.unwrap();
}

both! {
    async fn waiter_acquires_promptly_after_release(fx) {
        let holder = fx.locker().await;
        let waiter = fx.locker().await;
        let mut handoffs = Vec::new();
        for round in 0..20u64 {
            let g = holder.acquire("handoff", opts()).await.unwrap();
            let w = waiter.clone();
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let waiting = tokio::spawn(async move {
                let _ = ready_tx.send(());
                let g = w.acquire("handoff", opts().wait(ms(10_000))).await.unwrap();
                let at = Instant::now();
                g.release().await.unwrap();
                at
            });
            ready_rx.await.unwrap();
            // Let the waiter reach its subscription at varying points.
            tokio::time::sleep(ms(5 + round % 5 * 3)).await;
            let released = Instant::now();
            g.release().await.unwrap();
            let acquired = waiting.await.unwrap();
            handoffs.push(acquired.saturating_duration_since(released));
        }
        handoffs.sort();
        let median = handoffs[handoffs.len() / 2];
        eprintln!("hand-off median {median:?}, max {:?}", handoffs.last().unwrap());
        assert!(median <= ms(20), "median hand-off {median:?}: {handoffs:?}");
    }
}

/// Callers of one locker get a busy lock in the order they asked for it.
async fn fifo(fx: support::Fx) {
    let locker = fx.locker().await;
    let g = locker.acquire("fifo", opts()).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (l, order) = (locker.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.acquire("fifo", opts().wait(ms(10_000))).await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // On a current-thread runtime the spawned task queues itself before yielding back.
        let start = Instant::now();
        while locker.stats().waiting < i + 1 {
            assert!(start.elapsed() < ms(5_000), "waiter {i} never queued");
            tokio::task::yield_now().await;
        }
    }
    g.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

#[tokio::test(flavor = "current_thread")]
async fn waiters_of_one_locker_are_served_in_arrival_order_redis() {
    fifo(support::Fx::redis()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn waiters_of_one_locker_are_served_in_arrival_order_memory() {
    fifo(support::Fx::memory()).await;
}

/// The subscriber connection is re-established and re-subscribed after it drops, so a
/// waiter still hears the release instead of sleeping until the holder's lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_survives_a_dropped_subscriber_connection() {
    let fx = support::Fx::redis();
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let mut conn = fx.conn().await;
    let g = holder
        .acquire("resub", opts().ttl(ms(20_000)))
        .await
        .unwrap();
    let w = tokio::spawn(async move {
        waiter
            .acquire("resub", opts().wait(ms(8_000)))
            .await
            .map(|g| g.fence())
    });
    support::until_subscribed(&mut conn, "resub", 1).await;
    support::until_listening_for_revocations(&mut conn, 1).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        killed, 2,
        "the waiter's subscriber and the holder's (forced unlocks)"
    );
    // Resubscribed on a new connection.
    support::until_subscribed(&mut conn, "resub", 1).await;
    let released = Instant::now();
    g.release().await.unwrap();
    let fence = w.await.unwrap().expect("waiter acquires after the release");
    assert!(fence > 0);
    assert!(
        released.elapsed() < ms(1_000),
        "hand-off took {:?}",
        released.elapsed()
    );
}

/// A subscriber connection that goes silent without closing (half-open: no FIN, no RST, the
/// server still counts it subscribed) is found by its keepalive `PING` and replaced, so the
/// waiter hears the release at once instead of from its fallback timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_survives_a_half_open_subscriber_connection() {
    let server = lockrt::testing::RedisServer::start().expect("redis-server");
    let proxy = lockrt::testing::FaultProxy::in_front_of(&server).expect("proxy");
    let holder = lockrt::Locker::connect(&server.url()).await.unwrap();
    let waiter = lockrt::Locker::builder()
        .url(proxy.url())
        .connect_timeout(ms(300))
        .response_timeout(ms(200))
        .build()
        .await
        .unwrap();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let g = holder
        .acquire("half", opts().ttl(ms(20_000)))
        .await
        .unwrap();
    // The holder's subscriber (forced unlocks) is not the one under test.
    support::until_listening_for_revocations(&mut conn, 1).await;
    let holders = subscribers(&mut conn).await;
    let w = tokio::spawn(async move {
        waiter
            .acquire("half", opts().wait(ms(10_000)))
            .await
            .map(|g| g.fence())
    });
    support::until_subscribed(&mut conn, "half", 1).await;
    // The waiter's attempt right after its subscription was confirmed: from then on the
    // confirmation is not in flight, so the stall below catches the subscriber idle. Scripts
    // that ran: the holder's acquire and its check once listening for revocations, the
    // waiter's first attempt and that one.
    support::settle(
        async || support::script_calls(&mut conn).await >= 4,
        "the waiter never attempted after subscribing",
    )
    .await;
    let waiters = async |conn: &mut redis::aio::MultiplexedConnection| -> Vec<u64> {
        let all = subscribers(conn).await;
        all.into_iter().filter(|id| !holders.contains(id)).collect()
    };
    let before = waiters(&mut conn).await;
    assert_eq!(before.len(), 1);
    let stalled = Instant::now();
    assert!(
        proxy.stall_existing() >= 2,
        "command and subscriber connections"
    );
    // Through the proxy the server sees the subscriber as its own connection: replaced
    // when another connection holds the subscription.
    // Expected after about 1.5 s (keepalive 1 s, PING timeout 0.5 s); a loaded machine may
    // take longer, so the bound is generous.
    loop {
        let now = waiters(&mut conn).await;
        if !now.is_empty() && !now.contains(&before[0]) {
            break;
        }
        assert!(!w.is_finished(), "the waiter ended before the release");
        assert!(
            stalled.elapsed() < ms(10_000),
            "the silent subscriber connection was never replaced"
        );
        tokio::time::sleep(ms(10)).await;
    }
    let replaced = stalled.elapsed();
    let released = Instant::now();
    g.release().await.unwrap();
    let fence = w.await.unwrap().expect("waiter acquires after the release");
    let handoff = released.elapsed();
    println!(
        "FIGURE half_open_subscriber: replaced {:.0} ms after the stall (keepalive 1 s), \
         hand-off {:.1} ms",
        replaced.as_secs_f64() * 1e3,
        handoff.as_secs_f64() * 1e3
    );
    assert!(fence > 0);
    // Heard on the new subscriber: milliseconds, or one response timeout (200 ms) more when
    // the waiter was retrying on its stalled command connection; its fallback timer is 1 s.
    assert!(handoff < ms(900), "hand-off took {handoff:?}");
}

/// Server-side ids of the connections subscribed to a channel.
async fn subscribers(conn: &mut redis::aio::MultiplexedConnection) -> Vec<u64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|l| l.contains(" sub=1 "))
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .collect()
}

/// Under steady contention a channel stays subscribed between waits (no `SUBSCRIBE` round
/// trip per wait), and is still unsubscribed soon after the waits stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_lingers_between_waits_then_goes() {
    let fx = support::Fx::redis();
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let mut conn = fx.conn().await;
    let subscribes = async |conn: &mut redis::aio::MultiplexedConnection| -> u64 {
        support::calls_of(conn, "subscribe").await
    };
    // Both lockers listen for revocations throughout (a lock each, held), so that only the
    // lock's own channel can add subscriptions below.
    let warm = [
        holder.acquire("warm:1", opts()).await.unwrap(),
        waiter.acquire("warm:2", opts()).await.unwrap(),
    ];
    support::settle(
        async || support::numsub(&mut conn, "{lock:}:revoke").await >= 2,
        "both lockers listen for revocations",
    )
    .await;
    let mut counts = Vec::new();
    for _ in 0..3 {
        let g = holder.acquire("linger", opts()).await.unwrap();
        let w = {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.acquire("linger", opts().wait(ms(5_000))).await })
        };
        // The waiter is queued in Redis once its first attempt failed.
        support::until_queued(&mut conn, "linger", 1).await;
        g.release().await.unwrap();
        w.await.unwrap().unwrap().release().await.unwrap();
        counts.push(subscribes(&mut conn).await);
    }
    assert!(counts[0] >= 1, "the first wait subscribed: {counts:?}");
    assert_eq!(
        counts[0], counts[2],
        "later waits subscribed again: {counts:?}"
    );
    support::until_subscribed(&mut conn, "linger", 0).await;
    for g in warm {
        g.release().await.unwrap();
    }
}
