use async_trait::async_trait;
use lockrt::{LockError, distributed_lock};

#[async_trait]
trait Refunds {
    async fn refund(&self, order: u64) -> Result<u64, LockError>;
}

struct Shop;

#[async_trait]
impl Refunds for Shop {
    #[distributed_lock(key = "refund:{order}")]
    async fn refund(&self, order: u64) -> Result<u64, LockError> {
        Ok(order)
    }
}

fn main() {}
