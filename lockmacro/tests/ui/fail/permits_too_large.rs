use lockrt::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{id}", permits = 4294967296)]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
