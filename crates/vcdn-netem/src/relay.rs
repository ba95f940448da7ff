//! One relayed connection: connect to the target one emulated one-way
//! delay after the accept, then in each direction read → bottleneck link
//! → delay line → write.
//!
//! Each direction is a reader and a writer joined by a FIFO of
//! timestamped items. The reader takes queue budget before it reads (so
//! with the queue full it stops reading and TCP holds the sender back),
//! passes what it read through the shared link, stamps it and queues it;
//! the writer releases each item `delay` after its stamp. A FIN is an item
//! too, so it reaches the other side after the data before it, one delay
//! late; a reset or read error likewise, and then both sides are reset.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::ReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::spec::{chunk_bytes, Dir};
use crate::stats::Counters;
use crate::Shared;

/// Why a connection ended other than by a FIN each way.
#[derive(Clone, Copy)]
enum Closed {
    /// A peer reset (or a read failed); relayed after the delay.
    Reset(Dir),
    /// Writing to a peer failed (it is gone).
    WriteFailed(Dir),
    /// Nothing read or written for `idle_timeout`.
    Idle,
    /// The shim is stopping.
    Shutdown,
}

impl Closed {
    fn reason(self) -> &'static str {
        match self {
            Closed::Reset(Dir::Up) => "the client reset",
            Closed::Reset(Dir::Down) => "the target reset",
            Closed::WriteFailed(Dir::Up) => "writing to the target failed",
            Closed::WriteFailed(Dir::Down) => "writing to the client failed",
            Closed::Idle => "idle timeout",
            Closed::Shutdown => "the shim is stopping",
        }
    }
}

/// What the delay line carries, each with the instant it left the
/// bottleneck (was read, when uncapped).
enum Item {
    Data(Instant, Bytes),
    Fin(Instant),
    Reset(Instant),
}

impl Item {
    fn at(&self) -> Instant {
        match self {
            Item::Data(t, _) | Item::Fin(t) | Item::Reset(t) => *t,
        }
    }
}

/// Keeps the count of active connections right however the task ends.
pub(crate) struct Active(pub Arc<Shared>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.counters.active.fetch_sub(1, Relaxed);
    }
}

/// Relay `client` (accepted at `accepted`) to the target.
///
/// The kernel completed the client's handshake at once; the emulated one
/// costs a round trip: the target is connected one up-delay after the
/// accept (the SYN's trip), the client's first bytes are released to it no
/// earlier than one round trip after the accept plus the up-delay (as if
/// sent when the SYN-ACK arrived), and a failed connect resets the client
/// one down-delay after it failed.
pub(crate) async fn relay(
    mut client: TcpStream,
    peer: SocketAddr,
    active: Active,
    accepted: Instant,
) {
    let sh = &active.0;
    wait_until(accepted + sh.spec_now().delay_up).await;
    let target = sh.target;
    let mut server =
        match tokio::time::timeout(sh.limits.connect_timeout, TcpStream::connect(target)).await {
            Ok(Ok(s)) => s,
            failed => {
                sh.counters.connect_failures.fetch_add(1, Relaxed);
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                tracing::debug!(%peer, %target, %error, "netem: connect to target failed");
                wait_until(Instant::now() + sh.spec_now().delay_down).await;
                reset(&client);
                return;
            }
        };
    let handshake_done = Instant::now() + sh.spec_now().delay_down;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let conn = Conn {
        sh,
        start: Instant::now(),
        last: AtomicU64::new(0),
    };
    let outcome = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let both = async {
            tokio::try_join!(
                conn.direction(cr, sw, Dir::Up, Some(handshake_done)),
                conn.direction(sr, cw, Dir::Down, None),
            )
        };
        tokio::select! {
            r = both => r.map(|_| ()),
            why = conn.watchdog() => Err(why),
        }
    };
    match outcome {
        Ok(()) => tracing::debug!(%peer, "netem: connection closed"),
        Err(why) => {
            tracing::debug!(%peer, why = why.reason(), "netem: connection reset");
            reset(&client);
            reset(&server);
        }
    }
}

/// Close with a reset rather than a FIN when the socket is dropped.
fn reset(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

/// Sleep until `t` unless it has passed (no timer round trip then).
async fn wait_until(t: Instant) {
    if t > Instant::now() {
        tokio::time::sleep_until(t).await;
    }
}

/// One connection's state shared by its two directions.
struct Conn<'a> {
    sh: &'a Shared,
    start: Instant,
    /// Milliseconds from `start` to the last byte read or written.
    last: AtomicU64,
}

impl Conn<'_> {
    fn touch(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Relaxed);
    }

    /// Ends when the connection has been idle for `idle_timeout`.
    async fn watchdog(&self) -> Closed {
        loop {
            let due = self.start
                + Duration::from_millis(self.last.load(Relaxed))
                + self.sh.limits.idle_timeout;
            if Instant::now() >= due {
                return Closed::Idle;
            }
            tokio::time::sleep_until(due).await;
        }
    }

    /// Relay `src` → `dst` in direction `d` until a FIN has been passed on.
    /// `not_before` holds the first bytes until the emulated handshake.
    async fn direction<W: AsyncWrite + Unpin>(
        &self,
        src: ReadHalf<'_>,
        dst: W,
        d: Dir,
        not_before: Option<Instant>,
    ) -> Result<(), Closed> {
        let budget = Budget::new(self.sh, self.sh.spec_now().queue_limit(d));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::try_join!(
            self.read_side(src, tx, d, &budget),
            self.write_side(dst, rx, d, not_before, &budget),
        )
        .map(|_| ())
    }

    async fn read_side(
        &self,
        src: ReadHalf<'_>,
        tx: mpsc::UnboundedSender<Item>,
        d: Dir,
        budget: &Budget<'_>,
    ) -> Result<(), Closed> {
        loop {
            let chunk = chunk_bytes(self.sh.spec_now().rate_of(d)).min(budget.limit);
            if !budget.take(chunk).await {
                return Err(Closed::Shutdown);
            }
            let (read, piece) = read_piece(&src, chunk).await;
            let n = piece.len();
            budget.give(chunk - n);
            if n == 0 {
                let end = match read {
                    Ok(_) => Item::Fin(Instant::now()),
                    Err(_) => Item::Reset(Instant::now()),
                };
                let _ = tx.send(end);
                return Ok(());
            }
            self.touch();
            budget.queue(n);
            if self.sh.spec_now().rate_of(d).is_some() && !self.sh.link(d).pass(n).await {
                return Err(Closed::Shutdown);
            }
            if tx.send(Item::Data(Instant::now(), piece)).is_err() {
                // The writer ended with an error, which ends the connection.
                return Ok(());
            }
        }
    }

    async fn write_side<W: AsyncWrite + Unpin>(
        &self,
        mut dst: W,
        mut rx: mpsc::UnboundedReceiver<Item>,
        d: Dir,
        not_before: Option<Instant>,
        budget: &Budget<'_>,
    ) -> Result<(), Closed> {
        while let Some(item) = rx.recv().await {
            let sent = not_before.map_or(item.at(), |t| t.max(item.at()));
            // The delay is read again after each sleep, so a longer delay
            // set meanwhile holds the item longer.
            loop {
                let due = sent + self.sh.spec_now().delay_of(d);
                if Instant::now() >= due {
                    break;
                }
                tokio::time::sleep_until(due).await;
            }
            match item {
                Item::Data(_, b) => {
                    dst.write_all(&b)
                        .await
                        .map_err(|_| Closed::WriteFailed(d))?;
                    self.touch();
                    self.sh.counters.written(d, b.len());
                    budget.dequeue(b.len());
                    budget.give(b.len());
                }
                Item::Fin(_) => {
                    let _ = dst.shutdown().await;
                    return Ok(());
                }
                Item::Reset(_) => return Err(Closed::Reset(d)),
            }
        }
        Ok(())
    }
}

/// Read at most `chunk` bytes from `src` once it is readable (so an idle
/// connection holds no buffer). A short read is copied out of the chunk's
/// buffer, so what the delay line holds is at most twice what it counts.
/// Empty at end of input or on an error (returned).
async fn read_piece(src: &ReadHalf<'_>, chunk: usize) -> (std::io::Result<()>, Bytes) {
    loop {
        if let Err(e) = src.readable().await {
            return (Err(e), Bytes::new());
        }
        let mut buf = BytesMut::with_capacity(chunk);
        match src.try_read_buf(&mut (&mut buf).limit(chunk)) {
            Ok(n) if n < chunk / 2 => return (Ok(()), Bytes::copy_from_slice(&buf[..n])),
            Ok(_) => return (Ok(()), buf.freeze()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return (Err(e), Bytes::new()),
        }
    }
}

/// The bytes one connection direction may hold: its own queue limit and
/// the shim's memory limit, taken before a read and given back after the
/// write (or when the connection ends).
struct Budget<'a> {
    limit: usize,
    own: Semaphore,
    shared: &'a Semaphore,
    counters: &'a Counters,
    /// Permits taken from `shared` and not given back.
    held: AtomicUsize,
    /// Bytes read and not yet written.
    queued: AtomicUsize,
}

impl<'a> Budget<'a> {
    fn new(sh: &'a Shared, limit: usize) -> Budget<'a> {
        Budget {
            limit,
            own: Semaphore::new(limit),
            shared: &sh.memory,
            counters: &sh.counters,
            held: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
        }
    }

    /// Wait for room for `n` bytes. False if the shim is stopping.
    async fn take(&self, n: usize) -> bool {
        let n32 = n as u32;
        match self.own.acquire_many(n32).await {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        match self.shared.acquire_many(n32).await {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        self.held.fetch_add(n, Relaxed);
        true
    }

    fn give(&self, n: usize) {
        self.own.add_permits(n);
        self.shared.add_permits(n);
        self.held.fetch_sub(n, Relaxed);
    }

    fn queue(&self, n: usize) {
        let now = self.queued.fetch_add(n, Relaxed) + n;
        self.counters.queued.fetch_add(n as u64, Relaxed);
        self.counters.queue_peak.fetch_max(now as u64, Relaxed);
    }

    fn dequeue(&self, n: usize) {
        self.queued.fetch_sub(n, Relaxed);
        self.counters.queued.fetch_sub(n as u64, Relaxed);
    }
}

impl Drop for Budget<'_> {
    /// A connection that ends with bytes queued returns their memory.
    fn drop(&mut self) {
        self.shared.add_permits(*self.held.get_mut());
        let queued = *self.queued.get_mut();
        self.counters.queued.fetch_sub(queued as u64, Relaxed);
    }
}
