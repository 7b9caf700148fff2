//! The server version check: the scripts need Redis 5.0 or newer, and a server says which it
//! is to an ACL-restricted user too.

use redis::{RedisError, Value};

use super::connector::Conn;
use super::link::Link;
use crate::error::BackendError;

/// The oldest server the scripts run on (`TIME` after writes needs effect replication).
const MIN_VERSION: (u32, u32) = (5, 0);

/// Refuses servers older than the scripts need, with a command an ACL-restricted user
/// may run (`HELLO`; servers before 6.0 have no ACLs and answer `INFO`).
pub(crate) async fn check_version(conn: &mut Conn, link: &Link) -> Result<(), BackendError> {
    let hello: Result<Value, RedisError> = redis::cmd("HELLO").arg(2).query_async(conn).await;
    let version = match hello {
        Ok(v) => version_in_hello(&v),
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(conn)
                .await
                .map_err(|e| link.error(&e))?;
            version_in_info(&info)
        }
        Err(e) => return Err(link.error(&e)),
    };
    match version {
        Some(v) if v < MIN_VERSION => Err(BackendError::new(
            link.addr().to_owned(),
            format!(
                "Redis {}.{} is too old: lockrt's scripts need Redis {}.{} or newer",
                v.0, v.1, MIN_VERSION.0, MIN_VERSION.1
            ),
        )
        .permanent()),
        _ => Ok(()),
    }
}

/// `(major, minor)` from a `HELLO` reply (a map in RESP3, a flat list in RESP2).
fn version_in_hello(v: &Value) -> Option<(u32, u32)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let pairs: Vec<(Option<String>, Option<String>)> = match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), text(v))).collect(),
        Value::Array(a) => a
            .chunks(2)
            .map(|c| (text(&c[0]), c.get(1).and_then(text)))
            .collect(),
        _ => return None,
    };
    let version = pairs
        .into_iter()
        .find(|(k, _)| k.as_deref() == Some("version"))?
        .1?;
    parse_version(&version)
}

fn version_in_info(info: &str) -> Option<(u32, u32)> {
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))?;
    parse_version(line.trim())
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_hello_and_info() {
        let hello = Value::Array(vec![
            Value::BulkString(b"server".to_vec()),
            Value::BulkString(b"redis".to_vec()),
            Value::BulkString(b"version".to_vec()),
            Value::BulkString(b"7.0.15".to_vec()),
        ]);
        assert_eq!(version_in_hello(&hello), Some((7, 0)));
        assert_eq!(
            version_in_info("# Server\r\nredis_version:4.0.9\r\n"),
            Some((4, 0))
        );
        assert!((4, 0) < MIN_VERSION && (5, 0) >= MIN_VERSION);
    }
}
