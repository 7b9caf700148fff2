use lockrt::{LockError, distributed_lock};

// Only rustc's own error, once, where the typo is: the attribute still expands.
#[distributed_lock(key = "stock:{id}")]
async fn deduct(id: u64) -> Result<u64, LockError> {
    let x = id +;
    Ok(x)
}

fn main() {}
