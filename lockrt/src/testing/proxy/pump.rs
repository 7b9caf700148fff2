//! The proxy's thread: the accept loop, one task per connection that cuts both directions
//! into RESP frames, judges each frame against the faults in force, and forwards it when due.
//! It reads the faults and counts the traffic in the shared state. Every task lives on the
//! proxy's own runtime, so dropping the handle, which ends that runtime, ends them all.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::resp::{RespSplitter, Side};
use super::state::{Conn, Direction, Shared};

/// Longest time the proxy waits for the upstream server to accept a connection.
const UPSTREAM_CONNECT: Duration = Duration::from_secs(1);
/// Read buffer per direction and connection.
const READ_BUF: usize = 16 * 1024;

/// Runs the proxy's accept loop on a thread and runtime of its own (so it keeps forwarding
/// when the test's runtime is blocked or paused), reporting the bound address on `ready` and
/// its end on `done`.
pub(super) fn serve_on_own_thread(
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    ready: std::sync::mpsc::Sender<io::Result<SocketAddr>>,
    done: std::sync::mpsc::Sender<()>,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("lockrt-fault-proxy".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(listener.local_addr());
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = accept_loop(listener, shared) => {}
                }
            });
            // Dropping the runtime drops every connection task and closes its sockets.
            drop(rt);
            let _ = done.send(());
        })?;
    Ok(())
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // EMFILE and the like: back off briefly rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.count(|c| c.accepted += 1);
        if shared.faults().refuse {
            shared.count(|c| c.refused += 1);
            abort(&client);
            continue;
        }
        next_id += 1;
        let conn = Arc::new(Conn::default());
        let id = next_id;
        let shared = shared.clone();
        tokio::spawn(async move {
            let Ok(Ok(upstream)) =
                tokio::time::timeout(UPSTREAM_CONNECT, TcpStream::connect(shared.upstream)).await
            else {
                shared.count(|c| c.upstream_failures += 1);
                abort(&client);
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            shared.conns().insert(id, conn.clone());
            shared.count(|c| c.open += 1);
            let reset = serve(&client, &upstream, &shared, &conn).await;
            shared.conns().remove(&id);
            if reset {
                abort(&client);
                abort(&upstream);
                shared.count(|c| c.resets += 1);
            }
            shared.count(|c| c.open -= 1);
        });
    }
}

/// Makes dropping `s` send RST instead of FIN.
fn abort(s: &TcpStream) {
    // A zero linger never blocks the thread (the deprecation is about non-zero values).
    #[allow(deprecated)]
    let _ = s.set_linger(Some(Duration::ZERO));
}

/// Forwards both directions until either side has closed and its last frames are written
/// (false), or the connection is to be reset (true).
async fn serve(client: &TcpStream, upstream: &TcpStream, shared: &Shared, conn: &Conn) -> bool {
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let requests = async {
        tokio::join!(
            read_side(client, Direction::ToServer, up_tx, shared, conn),
            write_side(upstream, Direction::ToServer, up_rx, shared, conn),
        )
    };
    let replies = async {
        tokio::join!(
            read_side(upstream, Direction::ToClient, down_tx, shared, conn),
            write_side(client, Direction::ToClient, down_rx, shared, conn),
        )
    };
    tokio::select! {
        () = conn.reset.cancelled() => true,
        _ = requests => conn.reset.is_cancelled(),
        _ = replies => conn.reset.is_cancelled(),
    }
}

/// What to do with one frame read from one side.
enum Verdict {
    Forward(Instant),
    Discard,
    DropReply,
    Reset,
}

fn judge(dir: Direction, shared: &Shared, conn: &Conn) -> Verdict {
    let mut f = shared.faults();
    if f.blackhole || conn.stalled.load(Ordering::SeqCst) {
        return Verdict::Discard;
    }
    match dir {
        Direction::ToServer if f.reset_next_request > 0 => {
            f.reset_next_request -= 1;
            Verdict::Reset
        }
        Direction::ToClient if f.reset_next_reply > 0 => {
            f.reset_next_reply -= 1;
            Verdict::Reset
        }
        Direction::ToClient if f.drop_replies > 0 => {
            f.drop_replies -= 1;
            Verdict::DropReply
        }
        Direction::ToServer => Verdict::Forward(Instant::now() + f.delay_to_server),
        Direction::ToClient => Verdict::Forward(Instant::now() + f.delay_to_client),
    }
}

/// Reads one side, cuts frames, judges each, queues the forwarded ones with their due time
/// (and whether [`FaultProxy::hold_requests`](crate::testing::FaultProxy::hold_requests) holds them).
/// Returns at EOF, on an error, or when a frame asks for a reset.
async fn read_side(
    from: &TcpStream,
    dir: Direction,
    out: mpsc::UnboundedSender<(Instant, bool, Vec<u8>)>,
    shared: &Shared,
    conn: &Conn,
) {
    let side = match dir {
        Direction::ToServer => Side::Requests,
        Direction::ToClient => Side::Replies,
    };
    let mut splitter = RespSplitter::new(side);
    let mut raw = false;
    let mut buf = vec![0u8; READ_BUF];
    let mut frames = Vec::new();
    loop {
        if from.readable().await.is_err() {
            return;
        }
        let n = match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        frames.clear();
        if raw {
            frames.push(buf[..n].to_vec());
        } else if splitter.push(&buf[..n], &mut frames).is_err() {
            raw = true;
            shared.count(|c| c.unparsed += 1);
            frames.push(splitter.take_buffered());
        }
        for frame in frames.drain(..) {
            if dir == Direction::ToServer && !raw {
                hold_if_subscription(&frame, shared).await;
            }
            if dir == Direction::ToServer && !raw && is_subscribe(&frame) {
                conn.subscriber.store(true, Ordering::SeqCst);
            }
            match judge(dir, shared, conn) {
                Verdict::Forward(due) => {
                    let held = dir == Direction::ToServer && *conn.held.borrow();
                    if held {
                        shared.count(|c| c.requests_held += 1);
                    }
                    if out.send((due, held, frame)).is_err() {
                        return;
                    }
                }
                Verdict::Discard => shared.count(|c| c.discarded += 1),
                Verdict::DropReply => shared.count(|c| c.replies_dropped += 1),
                Verdict::Reset => {
                    conn.reset.cancel();
                    return;
                }
            }
        }
    }
}

/// Whether a request frame (`*N\r\n$L\r\n<command>\r\n...`) is a subscription command.
fn is_subscribe(frame: &[u8]) -> bool {
    let mut lines = frame.splitn(4, |&b| b == b'\n');
    let (Some(_), Some(_), Some(name)) = (lines.next(), lines.next(), lines.next()) else {
        return false;
    };
    let name = name.strip_suffix(b"\r").unwrap_or(name);
    [b"SUBSCRIBE".as_slice(), b"PSUBSCRIBE", b"SSUBSCRIBE"]
        .iter()
        .any(|c| name.eq_ignore_ascii_case(c))
}

/// Waits while [`FaultProxy::hold_subscriptions`](crate::testing::FaultProxy::hold_subscriptions) is on, when `frame` is a subscription.
async fn hold_if_subscription(frame: &[u8], shared: &Shared) {
    if !*shared.hold.borrow() || !is_subscribe(frame) {
        return;
    }
    shared.count(|c| c.subscriptions_held += 1);
    let mut hold = shared.hold.subscribe();
    // Ends with the proxy too: its runtime drops this task.
    let _ = hold.wait_for(|on| !*on).await;
}

/// Writes queued frames to one side when they are due, unless by then the connection is
/// blackholed or stalled. Returns when the reading side is done and its frames are written,
/// or a write fails.
async fn write_side(
    to: &TcpStream,
    dir: Direction,
    mut queue: mpsc::UnboundedReceiver<(Instant, bool, Vec<u8>)>,
    shared: &Shared,
    conn: &Conn,
) {
    while let Some((due, held, frame)) = queue.recv().await {
        tokio::time::sleep_until(due).await;
        if held {
            // Ends with the proxy too: its runtime drops this task.
            let _ = conn.held.subscribe().wait_for(|on| !*on).await;
        }
        if shared.faults().blackhole || conn.stalled.load(Ordering::SeqCst) {
            shared.count(|c| c.discarded += 1);
            continue;
        }
        // Counted before the write: whoever can see the frame's effect sees it counted.
        shared.count(|c| match dir {
            Direction::ToServer => c.to_server += 1,
            Direction::ToClient => c.to_client += 1,
        });
        if write_all(to, &frame).await.is_err() {
            return;
        }
    }
}

async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
