use lockrt::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{id}", mode = read)]
async fn deduct(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
