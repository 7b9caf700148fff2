//! No configured secret reaches any output. For every generated URL shape (scheme × credential
//! place × malformed part, see `lockctl/tests/url_shapes`), the password appears neither in a
//! `LockerBuilder`'s or `LockerConfig`'s `Debug`, nor in the `build()` error's `Display` or
//! `Debug`, nor in any log line written while building, whether the URL is given to `url`,
//! `cluster`, `sentinel`, a `LockerConfig` or the environment. (lockctl's output is checked
//! over the same shapes in `lockctl/tests/secrets.rs`.)
//!
//! The `Debug` outputs are checked for every shape in the normal suite. Building (a failed
//! connection, ~35 ms with TLS) is checked for every seventh shape there and for all of them in
//! `chaos_every_url_shape_keeps_its_secret` (`cargo xtask chaos`).

#[path = "support/logs.rs"]
mod logs;
#[path = "../lockctl/tests/url_shapes/mod.rs"]
mod url_shapes;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lockrt::{Locker, LockerBuilder, LockerConfig};
use url_shapes::{Shape, leak, shapes};

/// Short timeouts: every shape points at a closed port or a missing socket anyway.
fn quick(b: LockerBuilder) -> LockerBuilder {
    b.connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
}

/// The builders for `url`: given to `url`, `cluster` and `sentinel`.
fn builders(url: &str) -> [(&'static str, LockerBuilder); 3] {
    [
        ("url", Locker::builder().url(url)),
        ("cluster", Locker::builder().cluster([url])),
        ("sentinel", Locker::builder().sentinel([url], "locks")),
    ]
}

/// The configurations naming `url`: `REDIS_URL`, `LOCKRT_URL`, a cluster seed, a sentinel.
fn configs(url: &str) -> [LockerConfig; 4] {
    let var = |name: &'static str| {
        LockerConfig::from_lookup(|n| (n == name).then(|| url.to_owned())).unwrap()
    };
    let mut cluster = LockerConfig::default();
    cluster.cluster = vec![url.to_owned()];
    let mut sentinel = LockerConfig::default();
    sentinel.sentinels = vec![url.to_owned()];
    sentinel.service = Some("locks".into());
    [var("REDIS_URL"), var("LOCKRT_URL"), cluster, sentinel]
}

/// The `Debug` outputs for `shape`, labelled: the builders', the configurations', and those
/// of the builders made from the configurations.
fn debug_outputs(shape: &Shape) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (how, b) in builders(&shape.url) {
        out.push((format!("{how}: builder Debug"), format!("{b:?}")));
        out.push((format!("{how}: builder alternate Debug"), format!("{b:#?}")));
    }
    for (i, c) in configs(&shape.url).into_iter().enumerate() {
        out.push((format!("config #{i}: Debug"), format!("{c:?}")));
        match LockerBuilder::from_config(c) {
            Ok(b) => out.push((format!("config #{i}: builder Debug"), format!("{b:?}"))),
            Err(e) => out.push((format!("config #{i}: error"), format!("{e} / {e:?}"))),
        }
    }
    out
}

/// The `Display`, `Debug` and alternate `Debug` of each builder's `build()` error.
async fn build_outputs(shape: &Shape) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (how, b) in builders(&shape.url) {
        match quick(b).build().await {
            Ok(_) => panic!("{}: built a locker on a closed port", shape.what),
            Err(e) => {
                out.push((format!("{how}: build error Display"), e.to_string()));
                out.push((format!("{how}: build error Debug"), format!("{e:?}")));
                out.push((
                    format!("{how}: build error alternate Debug"),
                    format!("{e:#?}"),
                ));
            }
        }
    }
    out
}

/// Checks every shape's `Debug` outputs, and the build errors and logs of those `build`
/// picks: the shapes that leaked, each with what showed the secret, and a log line that
/// showed one.
fn leaks(shapes: &[Shape], build: impl Fn(usize) -> bool) -> (Vec<String>, Option<String>) {
    let (buf, subscriber) = logs::capture(tracing::Level::TRACE);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let build = &build;
    let built: Vec<Vec<(String, String)>> = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(
            futures_util::stream::iter(shapes.iter().enumerate())
                .map(|(i, s)| async move {
                    if build(i) {
                        build_outputs(s).await
                    } else {
                        Vec::new()
                    }
                })
                .buffered(16)
                .collect(),
        )
    });
    let mut leaked = Vec::new();
    for (shape, built) in shapes.iter().zip(built) {
        let found: Vec<String> = debug_outputs(shape)
            .into_iter()
            .chain(built)
            .filter_map(|(what, text)| leak(&text).map(|piece| format!("{what}: …{piece}…")))
            .collect();
        if !found.is_empty() {
            leaked.push(format!(
                "{} ({}):\n    {}",
                shape.what,
                shape.url,
                found.join("\n    ")
            ));
        }
    }
    // Every secret holds the marker, and the shape's number follows it: a log line that shows
    // one says which shape leaked.
    let log = String::from_utf8_lossy(&buf.bytes()).into_owned();
    (leaked, leak(&log))
}

fn check(name: &str, build: impl Fn(usize) -> bool) {
    let shapes = shapes();
    let built = (0..shapes.len()).filter(|i| build(*i)).count();
    let start = Instant::now();
    let (leaked, logged) = leaks(&shapes, build);
    println!(
        "FIGURE {name}: {} of {} URL shapes leaked their secret (Debug of all, build errors of \
         {built}; {:.1} s); the logs {}",
        leaked.len(),
        shapes.len(),
        start.elapsed().as_secs_f64(),
        if logged.is_some() {
            "showed one"
        } else {
            "showed none"
        },
    );
    assert!(
        leaked.is_empty() && logged.is_none(),
        "{} of {} URL shapes leaked:\n{}\nlogs: {logged:?}",
        leaked.len(),
        shapes.len(),
        leaked.join("\n")
    );
}

#[test]
fn no_url_shape_shows_its_secret_in_debug_errors_or_logs() {
    check("secrets_library", |i| i % 7 == 0);
}

#[test]
#[ignore = "slow (~1 min): every shape's build errors; run by `cargo xtask chaos`"]
fn chaos_every_url_shape_keeps_its_secret() {
    check("secrets_library_all", |_| true);
}

/// `redis+sentinel://h/locks?password=S` names the service `locks`: the query is not part of
/// the service name (which every error and `Debug` output shows).
#[test]
fn a_sentinel_url_query_is_not_the_service_name() {
    for url in [
        "redis+sentinel://127.0.0.1:1/locks?password=sEkr3T",
        "redis+sentinel://127.0.0.1:1/locks?user=app&pass=sEkr3T",
        "redis+sentinel://127.0.0.1:1,127.0.0.1:2/locks#frag",
        "rediss+sentinel://:sEkr3T@127.0.0.1:1/locks?protocol=resp3",
        "redis+sentinel://:sEkr3T/sEkr3T@127.0.0.1:1/locks",
    ] {
        let shown = format!("{:?}", Locker::builder().url(url));
        assert!(
            shown.contains(r#"sentinel service \"locks\" via"#),
            "{url}: {shown}"
        );
        assert!(leak(&shown).is_none(), "{url}: {shown}");
    }
}

mod secrets_exotic {
    //! Passwords with `@`, `%40`, `#`, `:`, spaces, unicode, given in every place a URL can carry
    //! one, for url / cluster / sentinel / redis+sentinel / redis+cluster: no output (builder and
    //! config Debug, build error Display/Debug) may show them.

    use std::time::Duration;

    use lockrt::{Locker, LockerBuilder};

    use super::logs;

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
}
