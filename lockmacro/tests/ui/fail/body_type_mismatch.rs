use lockrt::{LockError, distributed_lock};

// The body is checked against the declared return type, as in a plain `async fn`.
#[distributed_lock(key = "stock:{id}")]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok("not a number")
}

fn main() {}
