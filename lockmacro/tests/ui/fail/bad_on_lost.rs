use lockrt::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{id}", on_lost = "retry")]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
