//! The suite's build script: every ```rust block of README.md becomes a module of
//! `tests/semantics/readme.rs`, so the test build fails when a README example stops compiling.
//! A block marked ```rust,ignore is a sketch that is not meant to compile (a list of
//! alternatives); each must say why on the line before its fence (`<!-- not compiled: ... -->`).
//!
//! Each block is the body of an async fn that returns `Result<(), Box<dyn Error>>`, with a
//! prelude of the names the README uses (`AppError`, `Order`, ...) and the variables it
//! assumes (`locker`, `listener`, `app`, `app_config`) as the fn's parameters. Never run.

use std::fmt::Write as _;

fn main() {
    println!("cargo:rerun-if-changed=README.md");
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let mut out = String::new();
    let (mut compiled, mut ignored) = (0, 0);
    let mut lines = readme.lines().enumerate().peekable();
    let mut previous = "";
    while let Some((n, line)) = lines.next() {
        let fence = line.trim_end();
        if fence == "```rust,ignore" {
            assert!(
                previous.starts_with("<!-- not compiled:"),
                "README.md line {}: a ```rust,ignore block needs `<!-- not compiled: why -->` \
                 on the line before",
                n + 1
            );
            ignored += 1;
        }
        if fence == "```rust" {
            let mut body = String::new();
            for (_, l) in lines.by_ref() {
                if l.trim_end() == "```" {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            let line_no = n + 1;
            writeln!(
                out,
                "#[allow(unused, dead_code, unreachable_code, unnameable_test_items, \
                 clippy::all)]\n\
                 mod readme_line_{line_no} {{\n\
                 use super::prelude::*;\n\
                 pub(super) async fn block(\n\
                     locker: Locker,\n\
                     listener: tokio::net::TcpListener,\n\
                     app: axum::Router,\n\
                     app_config: AppConfig,\n\
                 ) -> Result<(), Box<dyn std::error::Error>> {{\n\
                 {body}\n\
                 Ok(())\n\
                 }}\n\
                 }}"
            )
            .unwrap();
            compiled += 1;
        }
        previous = line;
    }
    writeln!(out, "pub(crate) const COMPILED: usize = {compiled};").unwrap();
    writeln!(out, "pub(crate) const IGNORED: usize = {ignored};").unwrap();
    let dir = std::env::var("OUT_DIR").expect("OUT_DIR");
    std::fs::write(format!("{dir}/readme_blocks.rs"), out).expect("write the README blocks");
}
