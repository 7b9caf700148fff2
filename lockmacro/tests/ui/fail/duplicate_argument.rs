use lockrt::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{id}", wait = "1s", wait = "2s")]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
