//! `lockrt::testing::FaultProxy` against a real redis-server, one mode per test, with plain
//! redis-rs connections: what each control does to open and new connections, at whole-reply
//! granularity. Synchronous tests: the proxy runs on a thread of its own.

use std::time::{Duration, Instant};

use lockrt::testing::{Direction, FaultProxy, RedisServer};
use redis::{Connection, Value};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn setup() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    (server, proxy)
}

/// A connection through the proxy that gives up on a reply after `read_timeout`.
fn connect(proxy: &FaultProxy, read_timeout: Duration) -> redis::RedisResult<Connection> {
    let conn = redis::Client::open(proxy.url())?.get_connection_with_timeout(ms(1_000))?;
    conn.set_read_timeout(Some(read_timeout))?;
    Ok(conn)
}

fn direct(server: &RedisServer) -> Connection {
    let conn = server.client().get_connection().expect("direct connection");
    conn.set_read_timeout(Some(ms(2_000))).unwrap();
    conn
}

fn ping(conn: &mut Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(conn)
}

fn send(conn: &mut Connection, cmd: &redis::Cmd) {
    conn.send_packed_command(&cmd.get_packed_command())
        .expect("send");
}

fn echo(s: &str) -> redis::Cmd {
    let mut c = redis::cmd("ECHO");
    c.arg(s);
    c
}

fn text(v: Value) -> String {
    redis::from_redis_value(v).expect("a string reply")
}

#[test]
fn pass_forwards_and_counts_requests_replies_and_connections() {
    let (_server, proxy) = setup();
    let mut conn = connect(&proxy, ms(2_000)).unwrap();
    let before = proxy.counters();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut conn)
        .unwrap();
    let v: String = redis::cmd("GET").arg("k").query(&mut conn).unwrap();
    assert_eq!(v, "v");
    let c = proxy.counters();
    assert_eq!((c.accepted, c.open), (1, 1), "{c:?}");
    assert_eq!(c.to_server - before.to_server, 2, "{c:?}");
    assert_eq!(c.to_client - before.to_client, 2, "{c:?}");
    assert_eq!((c.discarded, c.replies_dropped, c.resets), (0, 0, 0));
}

#[test]
fn blackhole_forwards_nothing_either_way_on_old_and_new_connections_until_pass() {
    let (server, proxy) = setup();
    let mut old = connect(&proxy, ms(300)).unwrap();
    proxy.blackhole();
    // The request is swallowed: the server never runs it, the client never hears back.
    let err = redis::cmd("SET")
        .arg("bh")
        .arg(1)
        .query::<()>(&mut old)
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let exists: bool = redis::cmd("EXISTS")
        .arg("bh")
        .query(&mut direct(&server))
        .unwrap();
    assert!(!exists, "a blackholed request reached the server");
    // A new connection is accepted but its handshake goes unanswered.
    assert!(connect(&proxy, ms(300)).is_err());
    let c = proxy.counters();
    assert!(c.discarded >= 2, "{c:?}");
    assert_eq!(
        c.to_server, 2,
        "only the first handshake went through: {c:?}"
    );
    proxy.pass();
    assert_eq!(
        ping(&mut connect(&proxy, ms(2_000)).unwrap()).unwrap(),
        "PONG"
    );
}

#[test]
fn reset_all_resets_open_connections_and_new_ones_work() {
    let (_server, proxy) = setup();
    let mut a = connect(&proxy, ms(2_000)).unwrap();
    let mut b = connect(&proxy, ms(2_000)).unwrap();
    assert_eq!(proxy.reset_all(), 2);
    proxy
        .wait_until_blocking(ms(2_000), |c| c.resets == 2 && c.open == 0)
        .expect("both connections reset");
    for conn in [&mut a, &mut b] {
        let err = ping(conn).unwrap_err();
        assert!(err.is_connection_dropped() || err.is_io_error(), "{err:?}");
    }
    assert_eq!(
        ping(&mut connect(&proxy, ms(2_000)).unwrap()).unwrap(),
        "PONG"
    );
}

#[test]
fn delay_holds_requests_and_replies_back_in_order() {
    let (_server, proxy) = setup();
    let mut conn = connect(&proxy, ms(3_000)).unwrap();
    proxy.delay(Direction::ToClient, ms(200));
    let t = Instant::now();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    assert!(t.elapsed() >= ms(200), "{:?}", t.elapsed());
    proxy.delay(Direction::ToClient, Duration::ZERO);
    proxy.delay(Direction::ToServer, ms(150));
    // Pipelined requests keep their order under the delay.
    let t = Instant::now();
    for s in ["one", "two", "three"] {
        send(&mut conn, &echo(s));
    }
    let got: Vec<String> = (0..3)
        .map(|_| text(conn.recv_response().unwrap()))
        .collect();
    assert_eq!(got, ["one", "two", "three"]);
    assert!(t.elapsed() >= ms(150), "{:?}", t.elapsed());
    proxy.pass();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn drop_replies_discards_whole_replies_and_keeps_the_connection_up() {
    let (_server, proxy) = setup();
    let mut conn = connect(&proxy, ms(2_000)).unwrap();
    // A large reply arrives in many reads; it must vanish whole, and the next one intact.
    let big = "x".repeat(200_000);
    let _: () = redis::cmd("SET")
        .arg("big")
        .arg(&big)
        .query(&mut conn)
        .unwrap();
    proxy.drop_replies(2);
    let mut get_big = redis::cmd("GET");
    get_big.arg("big");
    send(&mut conn, &get_big);
    send(&mut conn, &echo("a"));
    send(&mut conn, &echo("b"));
    send(&mut conn, &get_big);
    // The first two replies never arrive: the client reads the third as the answer to its
    // first request. This is what a lost reply does to a pipelined connection.
    assert_eq!(text(conn.recv_response().unwrap()), "b");
    assert_eq!(text(conn.recv_response().unwrap()), big);
    let c = proxy.counters();
    assert_eq!((c.replies_dropped, c.open, c.resets), (2, 1, 0), "{c:?}");
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
}

#[test]
fn half_open_existing_connections_stall_and_new_ones_pass() {
    let (_server, proxy) = setup();
    let mut old = connect(&proxy, ms(300)).unwrap();
    assert_eq!(proxy.stall_existing(), 1);
    let err = ping(&mut old).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let mut new = connect(&proxy, ms(2_000)).unwrap();
    assert_eq!(ping(&mut new).unwrap(), "PONG");
    // A half-open connection does not heal; it stays open until someone resets it.
    proxy.pass();
    let mut old = old;
    send(&mut old, &echo("still there?"));
    assert!(old.recv_response().unwrap_err().is_timeout());
    assert_eq!(proxy.counters().open, 2);
    assert_eq!(ping(&mut new).unwrap(), "PONG");
}

#[test]
fn reset_before_the_request_is_forwarded_never_runs_it() {
    let (server, proxy) = setup();
    let mut conn = connect(&proxy, ms(2_000)).unwrap();
    proxy.reset_on_next(Direction::ToServer);
    let err = redis::cmd("SET")
        .arg("before")
        .arg(1)
        .query::<()>(&mut conn)
        .unwrap_err();
    assert!(err.is_connection_dropped() || err.is_io_error(), "{err:?}");
    let exists: bool = redis::cmd("EXISTS")
        .arg("before")
        .query(&mut direct(&server))
        .unwrap();
    assert!(!exists, "the request reached the server");
    assert_eq!(proxy.counters().resets, 1);
}

#[test]
fn reset_after_the_request_is_forwarded_runs_it_but_loses_the_reply() {
    let (server, proxy) = setup();
    let mut conn = connect(&proxy, ms(2_000)).unwrap();
    proxy.reset_on_next(Direction::ToClient);
    let err = redis::cmd("SET")
        .arg("after")
        .arg(1)
        .query::<()>(&mut conn)
        .unwrap_err();
    assert!(err.is_connection_dropped() || err.is_io_error(), "{err:?}");
    let v: i64 = redis::cmd("GET")
        .arg("after")
        .query(&mut direct(&server))
        .unwrap();
    assert_eq!(v, 1, "the request did not reach the server");
    assert_eq!(proxy.counters().resets, 1);
}

#[test]
fn refuse_new_fails_new_connections_and_spares_open_ones() {
    let (_server, proxy) = setup();
    let mut open = connect(&proxy, ms(2_000)).unwrap();
    proxy.refuse_new(true);
    assert!(
        connect(&proxy, ms(500))
            .and_then(|mut c| ping(&mut c))
            .is_err()
    );
    assert_eq!(ping(&mut open).unwrap(), "PONG");
    assert!(proxy.counters().refused >= 1);
    proxy.refuse_new(false);
    assert_eq!(
        ping(&mut connect(&proxy, ms(2_000)).unwrap()).unwrap(),
        "PONG"
    );
}

#[test]
fn pubsub_messages_count_as_replies() {
    let (server, proxy) = setup();
    let mut sub = connect(&proxy, ms(2_000)).unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("ch").unwrap();
    proxy.drop_replies(1);
    let mut publisher = direct(&server);
    for m in ["first", "second"] {
        let n: i64 = redis::cmd("PUBLISH")
            .arg("ch")
            .arg(m)
            .query(&mut publisher)
            .unwrap();
        assert_eq!(n, 1);
    }
    let msg: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(msg, "second");
    assert_eq!(proxy.counters().replies_dropped, 1);
}

#[test]
fn upstream_down_resets_the_client_and_counts_it() {
    let (mut server, proxy) = setup();
    server.kill();
    assert!(connect(&proxy, ms(1_000)).is_err());
    assert_eq!(proxy.counters().upstream_failures, 1);
    server.restart().unwrap();
    assert_eq!(
        ping(&mut connect(&proxy, ms(2_000)).unwrap()).unwrap(),
        "PONG"
    );
}

#[test]
fn dropping_the_proxy_closes_its_connections_and_its_port() {
    let (_server, proxy) = setup();
    let addr = proxy.addr();
    let mut conn = connect(&proxy, ms(2_000)).unwrap();
    drop(proxy);
    assert!(ping(&mut conn).is_err());
    assert!(std::net::TcpStream::connect_timeout(&addr, ms(500)).is_err());
}
