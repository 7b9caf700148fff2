//! `mode = "read"`, `mode = "write"` and `permits = N`: the kind of lock taken on the key,
//! alongside the other arguments, on free fns and a method.
use lockrt::{LockError, Locker, distributed_lock};

#[distributed_lock(key = "catalogue:{shop}", locker = locker, mode = "read")]
async fn read_catalogue(locker: &Locker, shop: &str) -> Result<usize, LockError> {
    Ok(shop.len())
}

#[distributed_lock(mode = "write", key = "catalogue:{shop}", locker = locker, wait = "1s")]
async fn write_catalogue(locker: &Locker, shop: &str, items: u32) -> Result<u32, LockError> {
    let _ = shop;
    Ok(items)
}

#[distributed_lock(key = "export:{tenant}", locker = locker, permits = 3, ttl = "10s")]
async fn export(locker: &Locker, tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

struct Reports {
    locker: Locker,
}

impl Reports {
    #[distributed_lock(key = "report:{name}", locker = self.locker, permits = 1u32,
                       wait = "0s")]
    async fn build(&self, name: &str) -> Result<String, LockError> {
        Ok(name.to_uppercase())
    }
}

pub(crate) async fn run(locker: &Locker) {
    assert_eq!(read_catalogue(locker, "acme").await.unwrap(), 4);
    assert_eq!(write_catalogue(locker, "acme", 7).await.unwrap(), 7);
    assert_eq!(read_catalogue(locker, "acme").await.unwrap(), 4);
    assert_eq!(export(locker, 9).await.unwrap(), 9);
    let reports = Reports {
        locker: locker.clone(),
    };
    assert_eq!(reports.build("daily").await.unwrap(), "DAILY");
}
