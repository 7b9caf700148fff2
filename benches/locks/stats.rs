//! Statistics: percentiles of latency samples, the per-round figures every workload adds to
//! and the median over rounds every row prints ([`Figures`]), and timed sequences of
//! operations ([`Seq`]). Pure bookkeeping: nothing here talks to Redis or prints.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use crate::Res;

/// Nearest-rank percentile of a sorted slice (`p` in 0..=1).
pub(crate) fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A duration in microseconds.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per-round figures, keyed by (workload, implementation, metric); medians at the end.
#[derive(Default)]
pub(crate) struct Figures {
    rounds: HashMap<(String, String, String), Vec<f64>>,
}

impl Figures {
    /// Adds one round's value.
    pub(crate) fn add(&mut self, workload: &str, imp: &str, metric: &str, v: f64) {
        self.rounds
            .entry((workload.into(), imp.into(), metric.into()))
            .or_default()
            .push(v);
    }

    /// The median over rounds (NaN when never measured).
    pub(crate) fn get(&self, workload: &str, imp: &str, metric: &str) -> f64 {
        self.rounds
            .get(&(workload.into(), imp.into(), metric.into()))
            .map_or(f64::NAN, |v| median(v.clone()))
    }

    /// The largest value over rounds (NaN when never measured).
    pub(crate) fn max(&self, workload: &str, imp: &str, metric: &str) -> f64 {
        self.rounds
            .get(&(workload.into(), imp.into(), metric.into()))
            .and_then(|v| v.iter().copied().max_by(f64::total_cmp))
            .unwrap_or(f64::NAN)
    }
}

/// Latencies of sequential operations and the time they took in all, gathered over chunks.
#[derive(Default)]
pub(crate) struct Seq {
    lat: Vec<Duration>,
    total: Duration,
}

impl Seq {
    /// Runs `n` more operations one after another, timing each.
    pub(crate) async fn run<F, Fut>(&mut self, n: usize, mut op: F) -> Res<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Res<()>>,
    {
        let start = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            op().await?;
            self.lat.push(t.elapsed());
        }
        self.total += start.elapsed();
        Ok(())
    }

    /// (p50 µs, p99 µs, operations per second).
    pub(crate) fn summary(mut self) -> (f64, f64, f64) {
        self.lat.sort();
        (
            us(pct(&self.lat, 0.50)),
            us(pct(&self.lat, 0.99)),
            self.lat.len() as f64 / self.total.as_secs_f64(),
        )
    }
}
