use lockrt::{LockError, distributed_lock};

#[distributed_lock(key = "order:{a}{b}")]
async fn touching(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(a + b)
}

#[distributed_lock(key = "order:{a}%{b}")]
async fn percent_after(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(a + b)
}

fn main() {}
