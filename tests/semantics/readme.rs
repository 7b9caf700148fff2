//! Every ```rust block of the README compiles: `build.rs` makes each one a module here (the
//! body of an async fn, never run), with this prelude for the names the README leaves to the
//! reader's application. A README example that stops compiling fails the test build.

// Stand-ins: only their names and types matter.
#[allow(dead_code)]
mod prelude {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::time::{Duration, SystemTime};

    pub(crate) use axum::Json;
    pub(crate) use axum::extract::{Path, State};
    pub(crate) use axum::http::StatusCode;
    pub(crate) use axum::response::IntoResponse;
    #[allow(unused_imports)] // what the README's examples may name
    pub(crate) use lockrt::{
        LockError, LockOptions, Locker, LockerBuilder, OnLost, Schedule, Stop, distributed_lock,
    };

    /// The application's error, as the README's first example has it.
    #[derive(Debug)]
    pub(crate) enum AppError {
        Lock(LockError),
        OutOfStock,
    }

    impl From<LockError> for AppError {
        fn from(e: LockError) -> Self {
            AppError::Lock(e)
        }
    }

    impl std::fmt::Display for AppError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }

    impl std::error::Error for AppError {}

    #[derive(Debug)]
    pub(crate) struct RefundError(LockError);

    impl From<LockError> for RefundError {
        fn from(e: LockError) -> Self {
            RefundError(e)
        }
    }

    pub(crate) struct Order {
        pub(crate) id: u64,
    }
    pub(crate) struct Receipt;
    pub(crate) struct Price;
    pub(crate) struct Url;

    pub(crate) struct Refunds {
        pub(crate) locker: Arc<Locker>,
        pub(crate) region: String,
    }

    #[derive(Clone)]
    pub(crate) struct App {
        pub(crate) locker: Locker,
    }

    #[derive(serde::Deserialize)]
    pub(crate) struct AppConfig {
        pub(crate) locks: lockrt::LockerConfig,
    }

    pub(crate) async fn read_stock(_: u64) -> Result<u32, AppError> {
        Ok(1)
    }
    pub(crate) async fn write_stock(_: u64, _: u32) -> Result<(), AppError> {
        Ok(())
    }
    pub(crate) async fn do_refund(_: &App, id: u64) -> u64 {
        id
    }
    pub(crate) async fn deduct() -> u32 {
        1
    }
    pub(crate) async fn work() -> Result<u32, LockError> {
        Ok(1)
    }
    pub(crate) async fn send_report(_: SystemTime) {}
    pub(crate) async fn clean_up(_: SystemTime) {}
    pub(crate) async fn nightly_report() -> Result<(), LockError> {
        Ok(())
    }
}

include!(concat!(env!("OUT_DIR"), "/readme_blocks.rs"));

/// Every ```rust block of the README was compiled above (the build script missed none), and
/// those that are not say why.
#[test]
fn every_readme_rust_block_is_compiled_or_says_why_not() {
    let readme = include_str!("../../README.md");
    let fences = |tag: &str| readme.lines().filter(|l| l.trim_end() == tag).count();
    assert_eq!(fences("```rust"), COMPILED);
    assert_eq!(fences("```rust,ignore"), IGNORED);
    const { assert!(COMPILED >= 12 && IGNORED <= 2) };
}
