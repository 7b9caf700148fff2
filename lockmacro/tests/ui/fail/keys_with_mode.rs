use lockrt::distributed_lock;

#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], mode = "read")]
async fn balance(from: u64, to: u64) -> Result<(), lockrt::LockError> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
