use lockrt::distributed_lock;

#[distributed_lock(key = "stock:{id}")]
async fn deduct(id: u64) -> u64 {
    id
}

fn main() {}
