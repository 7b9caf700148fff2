//! `ttl`, `wait` and `max_hold` as checked literals and as `Duration` expressions (a constant,
//! a method call on a parameter, a field of `self`), evaluated inside the fn.
use lockrt::{LockError, Locker, distributed_lock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(10);

struct Config {
    wait: Duration,
}

impl Config {
    fn wait(&self) -> Duration {
        self.wait
    }
}

#[distributed_lock(key = "lit", locker = locker, ttl = "2s", wait = "100ms", max_hold = "10m")]
async fn literals(locker: &Locker) -> Result<u8, LockError> {
    Ok(1)
}

#[distributed_lock(key = "expr", locker = locker, ttl = TTL, wait = cfg.wait(),
                   max_hold = Duration::from_secs(600))]
async fn expressions(locker: &Locker, cfg: &Config) -> Result<u8, LockError> {
    Ok(2)
}

struct Job {
    locker: Locker,
    max_hold: Duration,
}

impl Job {
    #[distributed_lock(key = "job", locker = self.locker, max_hold = self.max_hold,
                       wait = "0s")]
    async fn run_once(&self) -> Result<u8, LockError> {
        Ok(3)
    }
}

pub(crate) async fn run(locker: &Locker) {
    assert_eq!(literals(locker).await.unwrap(), 1);
    let cfg = Config {
        wait: Duration::from_millis(50),
    };
    assert_eq!(expressions(locker, &cfg).await.unwrap(), 2);
    let job = Job {
        locker: locker.clone(),
        max_hold: Duration::from_secs(60),
    };
    assert_eq!(job.run_once().await.unwrap(), 3);
}
