//! Passwords with `@`, `%40`, `#`, `:`, spaces, unicode, given in every place a URL can carry
//! one, for url / cluster / sentinel / redis+sentinel / redis+cluster: no output (builder and
//! config Debug, build error Display/Debug) may show them.

use std::time::Duration;

use lockrt::{Locker, LockerBuilder};

#[path = "support/logs.rs"]
mod logs;

const MARK: &str = "Zq9X";

fn passwords() -> Vec<(&'static str, String)> {
    vec![
        ("at", format!("{MARK}@w0rd")),
        ("two ats", format!("a@{MARK}@b")),
        ("pct40", format!("{MARK}%40w0rd")),
        ("pct-encoded marker", "%5Aq9X".to_owned()), // %5A = 'Z'
        ("hash", format!("{MARK}#w0rd")),
        ("colon", format!("{MARK}:w0rd")),
        ("unicode", format!("pä{MARK}wörd")),
        ("pct unicode", format!("p%C3%A4{MARK}")),
        ("space", format!("{MARK} w0rd")),
        ("plus", format!("{MARK}+w0rd")),
        ("amp", format!("{MARK}&db=1")),
        ("question", format!("{MARK}?x")),
        ("slash", format!("{MARK}/x")),
        ("comma", format!("{MARK},127.0.0.1:1")),
        ("percent alone", format!("{MARK}%zz")),
        ("backslash", format!("{MARK}\\x")),
        ("brackets", format!("[{MARK}]")),
    ]
}

fn urls(pw: &str) -> Vec<(String, String)> {
    vec![
        ("userinfo".into(), format!("redis://app:{pw}@127.0.0.1:1/")),
        (
            "userinfo no user".into(),
            format!("redis://:{pw}@127.0.0.1:1/0"),
        ),
        (
            "query password".into(),
            format!("redis://127.0.0.1:1/?password={pw}"),
        ),
        (
            "query pass unix".into(),
            format!("redis+unix:///nonexistent.sock?pass={pw}"),
        ),
        (
            "sentinel url".into(),
            format!("redis+sentinel://:{pw}@127.0.0.1:1,127.0.0.1:2/locks"),
        ),
        (
            "sentinel url query".into(),
            format!("redis+sentinel://127.0.0.1:1/locks?password={pw}"),
        ),
        (
            "cluster url".into(),
            format!("redis+cluster://u:{pw}@127.0.0.1:1,127.0.0.1:2/"),
        ),
        ("rediss".into(), format!("rediss://u:{pw}@127.0.0.1:1/")),
        ("no scheme".into(), format!(":{pw}@127.0.0.1:1")),
    ]
}

fn leaked(text: &str) -> bool {
    text.contains(MARK) || text.contains("%5Aq9X") || text.contains("q9X")
}

fn quick(b: LockerBuilder) -> LockerBuilder {
    b.connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exotic_passwords_never_leak() {
    let (buf, subscriber) = logs::capture(tracing::Level::TRACE);
    let _g = tracing::subscriber::set_default(subscriber);
    let mut leaks = Vec::new();
    let mut n = 0;
    for (pname, pw) in passwords() {
        for (uname, url) in urls(&pw) {
            let builders: Vec<(&str, LockerBuilder)> = vec![
                ("url", Locker::builder().url(&url)),
                ("cluster", Locker::builder().cluster([url.clone()])),
                (
                    "sentinel",
                    Locker::builder().sentinel([url.clone()], "locks"),
                ),
                (
                    "master auth",
                    Locker::builder()
                        .sentinel(["redis://127.0.0.1:1/"], "locks")
                        .sentinel_master_auth("app", pw.clone()),
                ),
            ];
            for (how, b) in builders {
                n += 1;
                let dbg = format!("{b:?} {b:#?}");
                if leaked(&dbg) {
                    leaks.push(format!("{pname}/{uname}/{how}: Debug: {dbg}"));
                }
                match quick(b).build().await {
                    Ok(_) => leaks.push(format!("{pname}/{uname}/{how}: built?!")),
                    Err(e) => {
                        let t = format!("{e} || {e:?} || {e:#?}");
                        if leaked(&t) {
                            leaks.push(format!("{pname}/{uname}/{how}: error: {t}"));
                        }
                    }
                }
            }
            let cfg =
                lockrt::LockerConfig::from_lookup(|k| (k == "LOCKRT_URL").then(|| url.clone()));
            match cfg {
                Ok(c) => {
                    let t = format!("{c:?}");
                    if leaked(&t) {
                        leaks.push(format!("{pname}/{uname}/config Debug: {t}"));
                    }
                }
                Err(e) => {
                    let t = format!("{e} {e:?}");
                    if leaked(&t) {
                        leaks.push(format!("{pname}/{uname}/config error: {t}"));
                    }
                }
            }
        }
    }
    let log = String::from_utf8_lossy(&buf.bytes()).into_owned();
    let log_leaks: Vec<&str> = log.lines().filter(|l| leaked(l)).collect();
    println!(
        "FIGURE secrets_exotic: {} of {n} builds leaked; {} log lines leaked",
        leaks.len(),
        log_leaks.len()
    );
    for l in leaks.iter().take(30) {
        println!("LEAK {l}");
    }
    for l in log_leaks.iter().take(10) {
        println!("LOGLEAK {l}");
    }
    assert!(leaks.is_empty() && log_leaks.is_empty());
}
