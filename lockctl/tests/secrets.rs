//! lockctl never prints a configured secret: for generated URL shapes (scheme × credential
//! place × malformed part, see `url_shapes`), given with `--url`, `LOCKCTL_URL` or
//! `REDIS_URL`, neither its stdout nor its stderr shows the password when it cannot connect.
//!
//! The normal suite runs every seventh shape, each through one of the three sources in turn;
//! `chaos_lockctl_every_url_shape_keeps_its_secret` (`cargo xtask chaos`) runs every shape
//! through all three.

mod url_shapes;

use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;

use url_shapes::{Shape, leak, shapes};

/// Where lockctl reads the URL from.
#[derive(Clone, Copy, Debug)]
enum Source {
    Flag,
    LockctlUrl,
    RedisUrl,
}

const SOURCES: [Source; 3] = [Source::Flag, Source::LockctlUrl, Source::RedisUrl];

/// `lockctl list` with `url` given through `source`.
fn lockctl(url: &str, source: Source) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    cmd.env_remove("LOCKCTL_URL").env_remove("REDIS_URL");
    match source {
        Source::Flag => cmd.arg("--url").arg(url),
        Source::LockctlUrl => cmd.env("LOCKCTL_URL", url),
        Source::RedisUrl => cmd.env("REDIS_URL", url),
    };
    cmd.arg("list").output().expect("run lockctl")
}

/// Runs lockctl for each `(shape, source)` on a few threads; what leaked, per run.
fn leaks(runs: &[(&Shape, Source)]) -> Vec<String> {
    let next = Mutex::new(runs.iter());
    let leaked = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while let Some((shape, source)) = {
                    let mut it = next.lock().unwrap();
                    it.next()
                } {
                    let out = lockctl(&shape.url, *source);
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    assert_eq!(
                        out.status.code(),
                        Some(2),
                        "{} via {source:?}: {stdout}{stderr}",
                        shape.what
                    );
                    assert!(stderr.contains("cannot connect"), "{stderr}");
                    if let Some(piece) = leak(&format!("{stdout}\n{stderr}")) {
                        leaked.lock().unwrap().push(format!(
                            "{} via {source:?} ({}): …{piece}…",
                            shape.what, shape.url
                        ));
                    }
                }
            });
        }
    });
    leaked.into_inner().unwrap()
}

fn check(name: &str, runs: &[(&Shape, Source)]) {
    let start = Instant::now();
    let leaked = leaks(runs);
    println!(
        "FIGURE {name}: {} of {} lockctl runs (URL shape and source) printed the secret ({:.1} s)",
        leaked.len(),
        runs.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        leaked.is_empty(),
        "{} of {} runs leaked:\n{}",
        leaked.len(),
        runs.len(),
        leaked.join("\n")
    );
}

#[test]
fn no_url_shape_shows_its_secret_in_lockctl_output() {
    let shapes = shapes();
    let runs: Vec<(&Shape, Source)> = shapes
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 == 0)
        .map(|(i, s)| (s, SOURCES[(i / 7) % SOURCES.len()]))
        .collect();
    check("secrets_lockctl", &runs);
}

#[test]
#[ignore = "slow (~1 min): every shape through every source; run by `cargo xtask chaos`"]
fn chaos_lockctl_every_url_shape_keeps_its_secret() {
    let shapes = shapes();
    let runs: Vec<(&Shape, Source)> = shapes
        .iter()
        .flat_map(|s| SOURCES.map(|source| (s, source)))
        .collect();
    check("secrets_lockctl_all", &runs);
}

/// The forms issue 16 names, each through each source.
#[test]
fn the_reported_urls_keep_their_secret() {
    let reported = [
        "redis://127.0.0.1:1/?password=sEkr3T",
        "redis://127.0.0.1:1/0?user=app&password=sEkr3T",
        "redis+unix:///nonexistent-lockrt-dir/x.sock?pass=sEkr3T",
        "unix:///nonexistent-lockrt-dir/x.sock?db=x&pass=sEkr3T",
        "redis+sentinel://127.0.0.1:1/locks?password=sEkr3T",
        "redis+sentinel://127.0.0.1:1/locks?user=app&pass=sEkr3T",
        "redis://user:sEkr3T@127.0.0.1:1/",
    ]
    .map(|url| Shape {
        url: url.to_owned(),
        secret: "sEkr3T".to_owned(),
        what: url.to_owned(),
    });
    let runs: Vec<(&Shape, Source)> = reported
        .iter()
        .flat_map(|s| SOURCES.map(|source| (s, source)))
        .collect();
    check("secrets_lockctl_reported", &runs);
}

/// A URL given in the wrong place (as the command, or as the value of an unknown option) is
/// quoted by the argument parser's error: lockctl hides it.
#[test]
fn a_misplaced_url_is_not_echoed_by_the_usage_error() {
    let secret = "Pw-misplaced-7731";
    let url = format!("redis://app:{secret}@127.0.0.1:1/");
    for args in [
        vec![url.clone(), "list".into()],
        vec!["list".into(), "--bogus".into(), url.clone()],
        vec!["show".into(), "k".into(), url.clone(), "extra".into()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(&args)
            .env_remove("LOCKCTL_URL")
            .env_remove("REDIS_URL")
            .output()
            .expect("run lockctl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} is a usage error");
        assert!(
            !text.contains(secret),
            "{args:?} printed the password:\n{text}"
        );
    }
}
