use lockrt::distributed_lock;

#[distributed_lock(key = "x")]
struct NotAFn;

fn main() {}
