//! `cargo xtask demo` runs the flash-sale demo; `cargo xtask test` runs the whole test suite;
//! `cargo xtask chaos` runs the slow chaos and fault cases that `test` leaves out (the tests
//! named `chaos_*`, ignored in a normal run; RELIABILITY.md lists them with their figures).
//! `cargo xtask matrix` runs the conformance suite on each server of the README's
//! compatibility table, fetched at pinned versions (see `matrix.rs`).
//! All first make sure `redis-server` is installed (with apt-get on Debian/Ubuntu, as root or
//! through sudo), because the demo and the tests start throwaway Redis servers of their own.
//! With `REDIS_URL` set, the demo uses that server instead and needs no local install.

use std::process::{Command, ExitCode};
use std::time::Instant;

mod matrix;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match cmd {
        "demo" => demo(rest),
        "test" => test(rest),
        "chaos" => chaos(rest),
        "matrix" => matrix::run(rest),
        "features" => features(),
        "setup" => ensure_redis_server(),
        _ => {
            eprintln!(
                "usage:\n  cargo xtask demo [ARGS]    run examples/seckill.rs (ARGS go to the demo)\n  \
                 cargo xtask test [ARGS]    run every test (ARGS go to cargo test)\n  \
                 cargo xtask chaos [ARGS]   run the slow chaos and fault tests, one at a time \
                 (ARGS go to the test harness, e.g. a narrower name filter)\n  \
                 cargo xtask matrix [--only NAME] [--quick]   the conformance suite on each \
                 server of the README's compatibility table (fetched, pinned, cached)\n  \
                 cargo xtask features       check lockrt with each connection feature alone\n  \
                 cargo xtask setup          install redis-server if missing (what CI runs first)"
            );
            return if cmd == "help" {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// lockrt checked with each connection feature alone (they change cfg'd code paths; clippy
/// checks them all together, the UI tests build lockrt without features).
fn features() -> Result<(), String> {
    for feature in ["cluster", "sentinel", "tls"] {
        println!("-- lockrt with {feature} alone");
        cargo(
            &["check", "--quiet", "-p", "lockrt", "--no-default-features"],
            &["--features".to_owned(), feature.to_owned()],
        )?;
    }
    Ok(())
}

fn demo(args: &[String]) -> Result<(), String> {
    if std::env::var_os("REDIS_URL").is_none() {
        ensure_redis_server()?;
    }
    cargo(
        &["run", "--release", "--example", "seckill", "--"],
        demo_args(args),
    )
}

/// The demo's own arguments: `cargo xtask demo -- --no-lock` means the same as
/// `cargo xtask demo --no-lock`, so a leading `--` is not passed on.
fn demo_args(args: &[String]) -> &[String] {
    match args.split_first() {
        Some((first, rest)) if first == "--" => rest,
        _ => args,
    }
}

/// Every test: built once, then the doc tests, then the test binaries two at a time (most
/// of their time is spent waiting on servers and timers, so a 2-core machine runs two at
/// once in about half the time), each binary's output shown whole when it ends. The binaries
/// that load the machine or time it closely (`SOLO`) run one at a time, alone. With
/// arguments, `cargo test --workspace ARGS` as it is.
fn test(args: &[String]) -> Result<(), String> {
    ensure_redis_server()?;
    if !args.is_empty() {
        return cargo(&["test", "--workspace"], args);
    }
    let start = Instant::now();
    let binaries = test_binaries()?;
    cargo(&["test", "--workspace", "--doc"], &[])?;
    let (solo, paired): (Vec<_>, Vec<_>) = binaries.into_iter().partition(|b| b.solo());
    let mut failed = run_all(paired, 2);
    failed.extend(run_all(solo, 1));
    report("test", failed.is_empty(), start);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

/// Test binaries run alone: the UI tests compile crates (both cores busy), the chaos and
/// crossing tests judge timing under faults they inject.
const SOLO: [&str; 6] = [
    "ui",
    "crossings",
    "chaos_kinds",
    "chaos_schedule",
    "chaos_multi_key",
    "chaos_topology",
];

/// A built test binary and the package directory it runs in (as `cargo test` runs it).
struct TestBinary {
    name: String,
    exe: String,
    dir: String,
}

/// Test binaries that hold the modules of many test files (`tests/semantics/`,
/// `tests/topologies/`), and how many of their tests run at once: as many as a pair of
/// one-file binaries would run (two each), plus what the files' waits leave the cores.
const MERGED: [(&str, usize); 2] = [("semantics", 3), ("topologies", 3)];

impl TestBinary {
    fn solo(&self) -> bool {
        SOLO.contains(&self.name.as_str())
    }

    /// Harness arguments: the test threads of a merged binary, none for the others (the
    /// harness's default, one per core).
    fn harness_args(&self) -> Vec<String> {
        MERGED
            .iter()
            .find(|(name, _)| *name == self.name)
            .map(|(_, n)| vec![format!("--test-threads={n}")])
            .unwrap_or_default()
    }
}

/// Builds every test target (what `cargo test --workspace` builds) and lists the binaries,
/// from cargo's JSON messages.
fn test_binaries() -> Result<Vec<TestBinary>, String> {
    let cargo = cargo_program();
    let out = Command::new(&cargo)
        .args(["test", "--workspace", "--no-run"])
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run {cargo}: {e}"))?;
    if !out.status.success() {
        return Err(format!("building the tests failed ({})", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().filter_map(test_binary).collect())
}

/// The test binary a `compiler-artifact` message of cargo names, if any.
fn test_binary(line: &str) -> Option<TestBinary> {
    // Examples and binaries are built too (the tests run them), not as tests: only a test
    // profile's artifact is a test binary.
    let profile = &line[line.find(r#""profile":{"#)?..];
    let profile = &profile[..profile.find('}')?];
    if !line.contains(r#""reason":"compiler-artifact""#) || !profile.contains(r#""test":true"#) {
        return None;
    }
    let exe = json_str(line, "executable")?;
    let manifest = json_str(line, "manifest_path")?;
    let dir = std::path::Path::new(&manifest)
        .parent()?
        .display()
        .to_string();
    let name = json_str(line, "name")?;
    Some(TestBinary { name, exe, dir })
}

/// The string value of the first `"key":"…"` in `line` (cargo writes paths and names
/// without escapes here on the machines we run on; one with a backslash escape is skipped).
fn json_str(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!(r#""{key}":""#))? + key.len() + 4;
    let value = &line[at..at + line[at..].find('"')?];
    (!value.contains('\\')).then(|| value.to_owned())
}

/// Runs `binaries`, `at_once` at a time; each one's output printed when it ends. The names
/// of those that failed.
fn run_all(binaries: Vec<TestBinary>, at_once: usize) -> Vec<String> {
    let queue = std::sync::Mutex::new(binaries.into_iter());
    let failed = std::sync::Mutex::new(Vec::new());
    let print = std::sync::Mutex::new(());
    std::thread::scope(|s| {
        for _ in 0..at_once {
            s.spawn(|| {
                loop {
                    // Taken out first: the queue's lock must not be held while the binary runs.
                    let next = queue.lock().unwrap().next();
                    let Some(b) = next else { break };
                    let started = Instant::now();
                    let out = Command::new(&b.exe)
                        .args(b.harness_args())
                        .current_dir(&b.dir)
                        .env("CARGO_MANIFEST_DIR", &b.dir)
                        .output();
                    let _one_at_a_time = print.lock().unwrap();
                    println!(
                        "     Running {} ({:.1} s)",
                        b.exe,
                        started.elapsed().as_secs_f64()
                    );
                    let ok = match out {
                        Ok(o) => {
                            use std::io::Write as _;
                            let _ = std::io::stdout().write_all(&o.stdout);
                            let _ = std::io::stderr().write_all(&o.stderr);
                            o.status.success()
                        }
                        Err(e) => {
                            eprintln!("could not run {}: {e}", b.exe);
                            false
                        }
                    };
                    if !ok {
                        failed.lock().unwrap().push(b.name.clone());
                    }
                }
            });
        }
    });
    failed.into_inner().unwrap()
}

/// The chaos tier: every ignored test whose name contains `chaos` (the slow fault cases and
/// the long randomized schedule), one at a time so their timing is not skewed by each other,
/// with their `FIGURE` lines shown.
fn chaos(args: &[String]) -> Result<(), String> {
    ensure_redis_server()?;
    let start = Instant::now();
    let mut harness: Vec<String> = ["--ignored", "--test-threads=1", "--nocapture"]
        .map(String::from)
        .to_vec();
    harness.extend(chaos_filter(args));
    let result = cargo(&["test", "--workspace", "--tests", "--"], &harness);
    report("chaos", result.is_ok(), start);
    result
}

/// The closing line of `test` and `chaos`: how it went, and how long it took.
fn report(what: &str, passed: bool, start: Instant) {
    let how = if passed { "passed" } else { "FAILED" };
    eprintln!(
        "xtask {what}: {how} in {:.0} s",
        start.elapsed().as_secs_f64()
    );
}

/// The cargo that runs this xtask (`CARGO`), else the one on `PATH`.
fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Harness arguments for `chaos`: the caller's, with the name filter `chaos` unless they
/// gave a filter of their own (an argument that is neither an option nor `--skip`'s value).
fn chaos_filter(args: &[String]) -> Vec<String> {
    let mut has_filter = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--skip" {
            it.next();
        } else if !a.starts_with('-') {
            has_filter = true;
        }
    }
    let mut out = args.to_vec();
    if !has_filter {
        out.push("chaos".into());
    }
    out
}

fn cargo(base: &[&str], extra: &[String]) -> Result<(), String> {
    let cargo = cargo_program();
    let status = Command::new(&cargo)
        .args(base)
        .args(extra)
        .status()
        .map_err(|e| format!("could not run {cargo}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", base.join(" ")))
    }
}

fn has(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs `redis-server` when missing, and `curl` with it (the matrix fetches Debian's
/// Valkey packages with it; CI's Valkey step needs it), with apt-get as root or through sudo.
/// Only a missing `redis-server` is an error when nothing can be installed.
fn ensure_redis_server() -> Result<(), String> {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    let need_redis = !has(&bin, "--version");
    let mut packages: Vec<&str> = Vec::new();
    if need_redis {
        packages.push("redis-server");
    }
    if !has("curl", "--version") {
        packages.push("curl");
    }
    if packages.is_empty() {
        return Ok(());
    }
    let cannot = |why: &str| {
        if need_redis {
            Err(why.to_owned())
        } else {
            eprintln!("xtask: curl is not installed (the matrix's Debian packages need it): {why}");
            Ok(())
        }
    };
    if !has("apt-get", "--version") {
        return cannot(
            "redis-server is not installed and apt-get is not available: install Redis \
             (e.g. `brew install redis`) or set REDIS_SERVER_BIN to its path",
        );
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let sudo: &[&str] = if root {
        &[]
    } else if has("sudo", "--version") {
        &["sudo"]
    } else {
        return cannot(&format!(
            "run `apt-get install -y {}` as root",
            packages.join(" ")
        ));
    };
    eprintln!("xtask: installing {} with apt-get", packages.join(", "));
    let mut install = vec!["apt-get", "install", "-y", "-qq"];
    install.extend_from_slice(&packages);
    for step in [&["apt-get", "update", "-qq"][..], &install[..]] {
        let mut argv: Vec<&str> = sudo.to_vec();
        argv.extend_from_slice(step);
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("could not run {}: {e}", argv.join(" ")))?;
        if !status.success() {
            return Err(format!("`{}` failed ({status})", argv.join(" ")));
        }
    }
    if has(&bin, "--version") {
        Ok(())
    } else {
        Err("redis-server still not found after installing it".into())
    }
}

#[cfg(test)]
mod tests {
    use super::{chaos_filter, demo_args, test_binary};

    #[test]
    fn chaos_runs_the_chaos_tests_unless_given_a_filter() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(chaos_filter(&v(&[])), v(&["chaos"]));
        assert_eq!(
            chaos_filter(&v(&["--skip", "long"])),
            v(&["--skip", "long", "chaos"])
        );
        assert_eq!(
            chaos_filter(&v(&["chaos_schedule_long"])),
            v(&["chaos_schedule_long"])
        );
    }

    #[test]
    fn only_artifacts_of_the_test_profile_are_test_binaries() {
        let line = |kind: &str, test: bool| {
            format!(
                r#"{{"reason":"compiler-artifact","package_id":"p","manifest_path":"/w/lockrt/Cargo.toml","target":{{"kind":["{kind}"],"name":"watchdog","test":true}},"profile":{{"opt_level":"0","test":{test}}},"executable":"/w/target/debug/deps/watchdog-1"}}"#
            )
        };
        let b = test_binary(&line("test", true)).expect("a test binary");
        assert_eq!(
            (b.name.as_str(), b.exe.as_str()),
            ("watchdog", "/w/target/debug/deps/watchdog-1")
        );
        assert_eq!(b.dir, "/w/lockrt");
        assert!(test_binary(&line("bin", false)).is_none());
        assert!(test_binary(r#"{"reason":"build-finished","success":true}"#).is_none());
    }

    #[test]
    fn demo_takes_its_arguments_with_or_without_a_separator() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(demo_args(&v(&["--", "--no-lock"])), v(&["--no-lock"]));
        assert_eq!(demo_args(&v(&["--no-lock"])), v(&["--no-lock"]));
        assert!(demo_args(&v(&[])).is_empty());
    }
}
