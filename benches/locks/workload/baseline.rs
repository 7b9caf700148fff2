//! Workload 0, the baseline round trip: `PING` back to back, and after 50 ms of idleness
//! (what a hand-off starts from: an idle client, server and waiter). Plain `redis`, no lock.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::stats::{Figures, pct, us};
use crate::table::{Table, Unit};

const BASELINE: &str = "0 baseline";

/// `n` `PING` round trips, each after `idle` of sleep (none when zero), sorted.
async fn pings(conn: &mut ConnectionManager, n: usize, idle: Duration) -> Res<Vec<Duration>> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        if !idle.is_zero() {
            tokio::time::sleep(idle).await;
        }
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times)
}

/// 1000 back-to-back and 10 idle `PING`s per round; round 0 is the warm-up.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 0: baseline round trip");
    let mut conn = env.manager().await?;
    for round in 0..=cfg.rounds {
        let hot = pings(&mut conn, 1000, Duration::ZERO).await?;
        let idle = pings(&mut conn, 10, Duration::from_millis(50)).await?;
        if round > 0 {
            figs.add(BASELINE, "PING", "hot p50", us(pct(&hot, 0.5)));
            figs.add(BASELINE, "PING", "idle p50", us(pct(&idle, 0.5)));
        }
    }
    Ok(())
}

/// Both round trips; the idle one as a ratio of the back-to-back one.
pub(crate) fn report(figs: &Figures, t: &mut Table) {
    let imp = "plain redis";
    let hot = figs.get(BASELINE, "PING", "hot p50");
    t.row(BASELINE, imp, "PING RTT p50, back to back", hot, Unit::Us);
    let idle = figs.get(BASELINE, "PING", "idle p50");
    t.row(
        BASELINE,
        imp,
        "PING RTT p50, after 50 ms idle",
        idle,
        Unit::Us,
    )
    .ratio(idle / hot, "of back to back");
}
