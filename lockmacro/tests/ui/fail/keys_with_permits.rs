use lockrt::distributed_lock;

#[distributed_lock(permits = 2, keys = ["acct:{from}", "acct:{to}"])]
async fn transfer(from: u64, to: u64) -> Result<(), lockrt::LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
