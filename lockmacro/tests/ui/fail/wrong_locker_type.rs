use lockrt::{LockError, distributed_lock};

struct State {
    locker: String,
}

#[distributed_lock(key = "stock:{id}", locker = state.locker)]
async fn deduct(state: &State, id: u64) -> Result<u64, LockError> {
    let _ = &state.locker;
    Ok(id)
}

fn main() {}
