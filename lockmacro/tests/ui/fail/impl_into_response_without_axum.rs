use lockrt::distributed_lock;

// Stands for axum's trait: the macro knows it by name.
trait IntoResponse {}
impl IntoResponse for u64 {}

#[distributed_lock(key = "stock:{id}")]
async fn deduct(id: u64) -> impl IntoResponse {
    id
}

fn main() {}
