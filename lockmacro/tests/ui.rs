//! The compile-fail half of the UI tests: every mistake in `tests/ui/fail/*.rs` gets the
//! reviewed diagnostic in its `.stderr` file. The pass half (every supported fn shape compiles
//! and runs) is the workspace's `tests/ui.rs`; `cargo test --workspace --test ui` runs both.
//!
//! They run from this crate because trybuild builds its own copy of the running crate's
//! dependencies: here `lockrt`, `async-trait` and trybuild, not the examples' web stack and the
//! benchmarks' crates. With compile-fail cases only, trybuild checks them all in one
//! `cargo check` rather than building them one by one.
//!
//! After changing a diagnostic on purpose: `TRYBUILD=overwrite cargo test --workspace --test
//! ui`, then review the diff of the `.stderr` files.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*.rs");
}
