//! Compile tests for `#[distributed_lock]`, in two halves:
//!
//! - `tests/ui/pass/*.rs` (here): every supported fn shape compiles, warning- and clippy-free,
//!   and runs. They are modules of this test crate rather than trybuild cases so that they
//!   share its already-built dependencies instead of building a copy of their own.
//! - `lockmacro/tests/ui/fail/*.rs`: every mistake gets the reviewed diagnostic in its
//!   `.stderr` file, checked by trybuild from `lockmacro/tests/ui.rs`, whose few dependencies
//!   are all it has to build.
//!
//! `cargo test --workspace --test ui` runs both. After changing a diagnostic on purpose:
//! `TRYBUILD=overwrite cargo test --workspace --test ui`, then review the diff.

#[path = "ui/pass/axum_handler.rs"]
mod axum_handler;
#[path = "ui/pass/bodies.rs"]
mod bodies;
#[path = "ui/pass/durations.rs"]
mod durations;
#[path = "ui/pass/free_fns.rs"]
mod free_fns;
#[path = "ui/pass/generics.rs"]
mod generics;
#[path = "ui/pass/lock_kinds.rs"]
mod lock_kinds;
#[path = "ui/pass/methods.rs"]
mod methods;
#[path = "ui/pass/multi_keys.rs"]
mod multi_keys;

/// One test, so the process-wide default locker (used by the cases without `locker = ...`) is
/// installed once and not swapped by a test running in parallel.
#[tokio::test(flavor = "current_thread")]
async fn every_supported_shape_compiles_and_runs() {
    let locker = lockrt::Locker::in_memory();
    lockrt::set_default(locker.clone());
    free_fns::run(&locker).await;
    generics::run(&locker).await;
    methods::run(&locker).await;
    bodies::run(&locker).await;
    durations::run(&locker).await;
    axum_handler::run(&locker).await;
    multi_keys::run(&locker).await;
    lock_kinds::run(&locker).await;
}
