use lockrt::{LockError, distributed_lock};

const WAIT_MS: u64 = 500;

#[distributed_lock(key = "stock:{id}", wait = WAIT_MS)]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
