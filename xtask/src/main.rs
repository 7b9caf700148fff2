//! `cargo xtask demo` runs the flash-sale demo; `cargo xtask test` runs the whole test suite;
//! `cargo xtask chaos` runs the slow chaos and fault cases that `test` leaves out (the tests
//! named `chaos_*`, ignored in a normal run; RELIABILITY.md lists them with their figures).
//! All first make sure `redis-server` is installed (with apt-get on Debian/Ubuntu, as root or
//! through sudo), because the demo and the tests start throwaway Redis servers of their own.
//! With `REDIS_URL` set, the demo uses that server instead and needs no local install.

use std::process::{Command, ExitCode};
use std::time::Instant;

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
        "setup" => ensure_redis_server(),
        _ => {
            eprintln!(
                "usage:\n  cargo xtask demo [ARGS]    run examples/seckill.rs (ARGS go to the demo)\n  \
                 cargo xtask test [ARGS]    run every test (ARGS go to cargo test)\n  \
                 cargo xtask chaos [ARGS]   run the slow chaos and fault tests, one at a time \
                 (ARGS go to the test harness, e.g. a narrower name filter)\n  \
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

fn test(args: &[String]) -> Result<(), String> {
    ensure_redis_server()?;
    cargo(&["test", "--workspace"], args)
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
    eprintln!(
        "xtask chaos: {} in {:.0} s",
        if result.is_ok() { "passed" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    result
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
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
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

fn ensure_redis_server() -> Result<(), String> {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    if has(&bin, "--version") {
        return Ok(());
    }
    if !has("apt-get", "--version") {
        return Err(
            "redis-server is not installed and apt-get is not available: install Redis \
                    (e.g. `brew install redis`) or set REDIS_SERVER_BIN to its path"
                .into(),
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
        return Err(
            "redis-server is not installed; run `apt-get install -y redis-server` as root".into(),
        );
    };
    eprintln!("xtask: installing redis-server with apt-get");
    for step in [
        &["apt-get", "update", "-qq"][..],
        &["apt-get", "install", "-y", "-qq", "redis-server"][..],
    ] {
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
    use super::{chaos_filter, demo_args};

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
    fn demo_takes_its_arguments_with_or_without_a_separator() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(demo_args(&v(&["--", "--no-lock"])), v(&["--no-lock"]));
        assert_eq!(demo_args(&v(&["--no-lock"])), v(&["--no-lock"]));
        assert!(demo_args(&v(&[])).is_empty());
    }
}
