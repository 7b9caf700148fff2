//! The attribute without `locker = ...` uses the process-wide default. In a file of its own: the
//! default is global to the test binary.

use lockrt::testing::RedisServer;
use lockrt::{LockError, Locker, distributed_lock};

#[distributed_lock(key = "job:{name}", wait = "0s")]
async fn nightly(name: &str) -> Result<String, LockError> {
    Ok(lockrt::current_lock().unwrap().key().to_owned())
}

#[tokio::test]
async fn without_a_default_it_is_no_default_locker_then_the_default_is_used() {
    // Before `set_default`: a clear error, and the body does not run.
    let err = nightly("report").await.unwrap_err();
    assert!(matches!(err, LockError::NoDefaultLocker), "{err:?}");
    assert!(err.to_string().contains("set_default"), "{err}");

    let server = RedisServer::start().unwrap();
    let locker = Locker::connect(&server.url()).await.unwrap();
    lockrt::set_default(locker.clone());
    assert_eq!(nightly("report").await.unwrap(), "job:report");

    // The default is a real lock: busy while another owner holds it.
    let other = Locker::connect(&server.url()).await.unwrap();
    let guard = other
        .acquire("job:report", Default::default())
        .await
        .unwrap();
    assert!(nightly("report").await.unwrap_err().is_timeout());
    guard.release().await.unwrap();
}
