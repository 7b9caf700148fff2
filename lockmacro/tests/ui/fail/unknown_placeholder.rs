use lockrt::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{item_di}")]
async fn deduct(item_id: u64, qty: u32) -> Result<u64, LockError> {
    Ok(item_id + u64::from(qty))
}

fn main() {}
