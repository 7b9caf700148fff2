//! Log capture for the tests that check what lockrt logs: a `tracing` subscriber writing every
//! event, with its spans, into a buffer the test reads.
//!
//! Also included on its own (`#[path = "support/logs.rs"]`) by binaries that do not use the
//! rest of `support`.

#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::Level;

/// A log writer appending to a shared buffer: every clone writes to the same one.
#[derive(Clone, Default)]
pub struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl LogBuf {
    /// Everything written so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A subscriber that writes every event at `level` or above, with its spans and without
/// colours, to the returned buffer.
pub fn capture(level: Level) -> (LogBuf, impl tracing::Subscriber + Send + Sync + 'static) {
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (buf, subscriber)
}

/// Runs `f` on a runtime of its own with a subscriber (up to `DEBUG`) that writes every event,
/// with its spans, to a buffer; what it wrote.
pub fn logged(f: impl AsyncFnOnce()) -> String {
    let (buf, subscriber) = capture(Level::DEBUG);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || rt.block_on(f()));
    String::from_utf8(buf.bytes()).unwrap()
}
