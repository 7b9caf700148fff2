//! Placeholder until the quick start lands.
fn main() {}
