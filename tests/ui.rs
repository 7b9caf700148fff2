//! Compile tests for `#[distributed_lock]`: every supported fn shape compiles and runs, and
//! every mistake gets the reviewed diagnostic in `tests/ui/fail/*.stderr`.
//!
//! After changing a diagnostic on purpose: `TRYBUILD=overwrite cargo test --test ui`, then
//! review the diff of the `.stderr` files.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
