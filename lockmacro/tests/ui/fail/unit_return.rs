use lockrt::distributed_lock;

// A fn with no return type cannot tell its caller that the lock was not taken.
#[distributed_lock(key = "job")]
async fn nightly() {}

fn main() {}
