use lockrt::{LockError, distributed_lock};

#[distributed_lock(ttl = "30s")]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
