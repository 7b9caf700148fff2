//! Methods: `&self`, `&mut self`, `self`, `{self.field}`, `locker = self.locker`, native async
//! fn in a trait impl.
use lockrt::{LockError, Locker, distributed_lock};
use std::sync::Arc;

struct Accounts {
    locker: Locker,
    tenant: String,
    balance: i64,
}

impl Accounts {
    #[distributed_lock(key = "acct:{self.tenant}:{user}", locker = self.locker)]
    async fn read(&self, user: u32) -> Result<i64, LockError> {
        let _ = user;
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:{self.tenant}", locker = self.locker, ttl = "10s")]
    pub(crate) async fn add(&mut self, amount: i64) -> Result<i64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:{self.tenant}", locker = self.locker.clone())]
    async fn close(self) -> Result<i64, LockError> {
        Ok(self.balance)
    }
}

trait Refunds {
    async fn refund(&self, order: u64) -> Result<u64, LockError>;
}

struct Shop {
    locker: Arc<Locker>,
}

impl Refunds for Shop {
    #[distributed_lock(key = "refund:{order}", locker = self.locker)]
    async fn refund(&self, order: u64) -> Result<u64, LockError> {
        Ok(order)
    }
}

pub(crate) async fn run(locker: &Locker) {
    let mut a = Accounts {
        locker: locker.clone(),
        tenant: "t1".into(),
        balance: 5,
    };
    assert_eq!(a.read(1).await.unwrap(), 5);
    assert_eq!(a.add(2).await.unwrap(), 7);
    assert_eq!(a.close().await.unwrap(), 7);
    let shop = Shop {
        locker: Arc::new(locker.clone()),
    };
    assert_eq!(shop.refund(9).await.unwrap(), 9);
}
