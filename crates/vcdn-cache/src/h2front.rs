//! The HTTP/2 front end: one cache, two front ends. A stream's header block
//! is decoded straight into the HTTP/1.1 request head the other front end
//! would have parsed (so every rule of the cache, and the strict parser's
//! checks and limits, apply unchanged), answered by [`Cache::at_once`] /
//! [`Cache::handle`], and the reply's HTTP/1.1 head is turned back into
//! HPACK fields.
//!
//! The protocol is `vcdn_http::h2`, our own sans-IO server connection
//! (not the `h2` crate: see docs/ARCHITECTURE.md for the measurements).
//! This module drives it on the connection's socket through
//! [`crate::wire`], as the HTTP/1.1 loop does, so h2c and h2 over TLS share
//! one path:
//! - one task per connection; one read gives many frames, and all the
//!   answers they make leave in one write (one batch of TLS records);
//! - a fresh hit is answered inline by [`Cache::at_once`], no task spawned,
//!   its body a slice of the stored bytes;
//! - only a stream that must wait (a miss, a request body, a streamed
//!   reply) gets a task of its own, which talks to the connection over a
//!   channel ([`Msg`]); its body pieces are bounded by a per-stream credit
//!   of `h2_max_send_buffer` bytes, and request body bytes go back to the
//!   client's windows as the task consumes them;
//! - an idle connection holds no buffers.
//!
//! Limits: the `h2_*` fields of [`CacheConfig`](crate::CacheConfig) (in the
//! protocol core: concurrency, windows, resets), `max_header_bytes` (a
//! larger list is answered 431), the header timeout until the preface, the
//! idle timeout (GOAWAY), the send timeout on the socket and on a stream
//! whose window stays shut (RST_STREAM CANCEL), and GOAWAY when the cache
//! drains.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::AbortHandle;
use vcdn_http::h2::{self as proto, Body, Connection, Event, Reason};
use vcdn_http::hpack::Encoder;
use vcdn_http::{parse_request, Limits, Method, RequestHead};

use crate::fetch::Piece;
use crate::interim;
use crate::metrics::{CacheStatus, HitTally};
use crate::panic;
use crate::proxy::{AtOnce, Cache};
use crate::reply::{error_reply, Reply, ReplyBody};
use crate::request_body::BodyClock;
use crate::upstream::{BodyPiece, BodyStream, RequestBody};
use crate::wire::{self, write_op, Wire};

/// A request body that has all arrived within this many bytes goes to the
/// handler whole; a larger one is streamed upstream as it arrives.
const INLINE_REQUEST_BODY: usize = 64 * 1024;
/// Pieces of a streamed request body in flight to the upstream.
const BODY_DEPTH: usize = 2;
/// The largest body piece a stream's task hands over at once, and the size
/// of a read from a file piece.
const SEND_CHUNK: usize = 64 * 1024;
/// Hit bodies up to this size are copied by `at_once` (the hot path);
/// larger ones go as slices of the stored bytes.
const INLINE_BODY: usize = 16 * 1024;
/// Frames gathered before they are written, even if more could go.
const SEND_BATCH: usize = 256 * 1024;
/// Bytes read from a plain socket at once.
const READ: usize = 16 * 1024;
/// After an early answer, what the client still sends on the stream is
/// read and dropped for this long, and at most this much, before the
/// stream is reset with NO_ERROR (RFC 9113 §8.1).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 << 20;
/// When the connection ends, what the client still sends is read and
/// dropped for this long (see `Front::close`).
const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// Fields of an HTTP/1.1 reply head that do not exist in HTTP/2.
const CONNECTION_SPECIFIC: [&[u8]; 5] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"upgrade",
];

/// Serve one HTTP/2 connection until it closes. `already_read` are bytes
/// read before the handoff (the preface, on h2c). The caller holds the
/// connection's [`ConnectionSlot`](crate::server::ConnectionSlot).
pub(crate) async fn serve(
    cache: Arc<Cache>,
    stream: AsyncFd<StdStream>,
    wire: Wire,
    peer: SocketAddr,
    already_read: Bytes,
) {
    let m = &cache.metrics;
    m.h2_connections_open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGauge(&m.h2_connections_open);
    let cfg = &cache.cfg;
    let h2 = Connection::new(proto::Config {
        max_concurrent_streams: cfg.h2_max_concurrent_streams,
        stream_window: cfg.h2_stream_window,
        connection_window: cfg.h2_connection_window,
        max_header_list: cfg.max_header_bytes,
        max_pending_accept_resets: cfg.h2_max_pending_accept_reset_streams,
        max_local_error_resets: cfg.h2_max_local_error_reset_streams,
        max_client_resets: cfg.h2_max_client_resets,
    });
    let chunk = cache.chunk_of(|| stream.get_ref().local_addr());
    let mut front = Front {
        cache: &cache,
        chunk,
        stream,
        wire,
        peer,
        h2,
        rbuf: BytesMut::from(&already_read[..]),
        streams: HashMap::new(),
        tx: None,
        rx: None,
        enc: encoder(),
        block: Vec::new(),
        scratch: Vec::new(),
        spare: Vec::new(),
        limits: Limits {
            max_request_line: cfg.max_request_line,
            max_head: cfg.max_header_bytes,
            max_headers: cfg.max_headers,
        },
    };
    // Not kept: it may be a slice of the HTTP/1.1 loop's read buffer.
    drop(already_read);
    let result = panic::boundary(front.run()).await;
    match result {
        Ok(Ok(())) => {
            front.close().await;
            return;
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "HTTP/2 connection ended"),
        Err(p) => panic::report(m, &p, "serving an HTTP/2 connection; closed it", Some(peer)),
    }
    if let Wire::Tls(tls) = &mut front.wire {
        wire::close_notify(&front.stream, tls);
    }
}

/// One HTTP/2 connection whose client sends the preface, then `input`,
/// then closes its side: what the server wrote back, within 5 s. For the
/// fuzz target `h2_connection` (the whole path: the protocol core, this
/// module, the cache), over a loopback socket; not an API.
#[doc(hidden)]
pub async fn serve_bytes(cache: Arc<Cache>, input: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else {
        return Vec::new();
    };
    let Ok(addr) = listener.local_addr() else {
        return Vec::new();
    };
    let Ok(mut client) = tokio::net::TcpStream::connect(addr).await else {
        return Vec::new();
    };
    let Ok((server, peer)) = listener.accept() else {
        return Vec::new();
    };
    if server.set_nonblocking(true).is_err() {
        return Vec::new();
    }
    // SAFETY: the AsyncFd owns the socket from here on.
    let Ok(server) = (unsafe { AsyncFd::register(server) }) else {
        return Vec::new();
    };
    let served = tokio::spawn(serve(cache, server, Wire::Plain, peer, Bytes::new()));
    let mut sent = proto::frame::PREFACE.to_vec();
    sent.extend_from_slice(input);
    let mut out = Vec::new();
    let exchange = async {
        let (mut r, mut w) = client.split();
        let write = async {
            let _ = w.write_all(&sent).await;
            let _ = w.shutdown().await;
        };
        let read = async {
            let mut buf = [0u8; 16 << 10];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || out.len() > 16 << 20 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
        };
        tokio::join!(write, read);
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), exchange).await;
    drop(client);
    let _ = tokio::time::timeout(Duration::from_secs(5), served).await;
    out
}

/// Decrements a gauge when dropped (also by a panic).
struct OpenGauge<'a>(&'a AtomicU64);

impl Drop for OpenGauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a stream's task tells the connection.
enum Msg {
    /// An interim (1xx) response, its HTTP/1.1 head.
    Interim(Bytes),
    /// The reply head (HTTP/1.1) and whether no body follows.
    Head { head: Vec<u8>, end: bool },
    /// A piece of the body, and the credit it took.
    Data(Bytes, u32),
    /// The body is complete.
    End,
    /// Reset the stream.
    Reset(Reason),
    /// Request body bytes consumed: open the client's windows.
    Release(usize),
    /// The task is done.
    Done,
}

type Tx = mpsc::UnboundedSender<(u32, Msg)>;

/// The connection's side of a stream it is still answering.
#[derive(Default)]
struct Answer {
    /// Body pieces waiting for flow control, with the credit each took.
    queue: VecDeque<(Bytes, u32)>,
    /// END_STREAM once the queue is sent.
    end: bool,
    /// Since when the queue waits for a window.
    stalled: Option<Instant>,
    /// The task answering the stream.
    task: Option<AbortHandle>,
    /// Its credit for body pieces.
    credit: Option<Arc<Semaphore>>,
    /// Where the request body goes (`None` at its end).
    body: Option<mpsc::UnboundedSender<Option<Bytes>>>,
    /// Answered while the client still sends: until when its bytes are
    /// dropped, and how many were.
    linger: Option<(Instant, usize)>,
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
        if let Some(c) = &self.credit {
            c.close();
        }
    }
}

struct Front<'a> {
    cache: &'a Arc<Cache>,
    stream: AsyncFd<StdStream>,
    wire: Wire,
    peer: SocketAddr,
    /// The chunk this connection was let in for (`crate::chunks`).
    chunk: Option<u64>,
    h2: Connection,
    /// Bytes read, not yet taken by the protocol. Empty while idle.
    rbuf: BytesMut,
    streams: HashMap<u32, Answer>,
    /// The channel from the streams' tasks, while there are any (an idle
    /// connection holds none).
    tx: Option<Tx>,
    rx: Option<mpsc::UnboundedReceiver<(u32, Msg)>>,
    enc: Encoder,
    /// The header block being encoded.
    block: Vec<u8>,
    /// The reply `at_once` writes (head and small body).
    scratch: Vec<u8>,
    spare: Vec<u8>,
    limits: Limits,
}

impl Front<'_> {
    /// End a connection without a reset (`wire::linger`): a PING or frames
    /// the client sent after a GOAWAY would otherwise make the kernel answer
    /// RST, and the client could lose the GOAWAY and the last frames.
    async fn close(&mut self) {
        let until = Instant::now() + CLOSE_LINGER;
        wire::linger(
            &self.stream,
            &mut self.wire,
            self.cache,
            &mut self.rbuf,
            until,
            LINGER_BYTES,
        )
        .await;
    }

    async fn run(&mut self) -> io::Result<()> {
        let cache = self.cache;
        let cfg = &cache.cfg;
        let m = &cache.metrics;
        let born = Instant::now();
        let idle = Duration::from_millis(cfg.idle_timeout_ms);
        let send_timeout = Duration::from_millis(cfg.send_timeout_ms);
        let mut last_active = born;
        let mut draining = cache.draining.subscribe();
        // Set once GOAWAY is sent: the connection ends when its streams are
        // done, or at this deadline.
        let mut closing: Option<Instant> = None;
        let mut events = Vec::new();
        loop {
            if !self.rbuf.is_empty() {
                let r = self.h2.recv(&mut self.rbuf, &mut events);
                if let Err(e) = r {
                    events.clear();
                    m.h2_abuse.fetch_add(1, Ordering::Relaxed);
                    if self.h2.awaiting_preface() || e.reason == Reason::ProtocolError {
                        m.bad_requests.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::info!(peer = %self.peer, reason = ?e.reason, why = e.why, "HTTP/2 connection closed for a protocol error");
                    self.streams.clear();
                    return self.flush().await;
                }
                for ev in events.drain(..) {
                    self.on_event(ev);
                }
            }
            while let Some(Ok((id, msg))) = self.rx.as_mut().map(|rx| rx.try_recv()) {
                self.on_msg(id, msg);
            }
            let more = self.pump();
            self.flush().await?;
            if more {
                continue;
            }
            if self.h2.failed() {
                return Ok(());
            }
            if (closing.is_some() || self.h2.going_away()) && self.streams.is_empty() {
                return Ok(());
            }
            // Wait for the client, a task or a timer.
            let now = Instant::now();
            let mut deadline = if self.h2.awaiting_preface() {
                born + Duration::from_millis(cfg.header_timeout_ms)
            } else if self.streams.is_empty() {
                last_active + idle
            } else {
                now + idle
            };
            if let Some(c) = closing {
                deadline = deadline.min(c);
            }
            for a in self.streams.values() {
                if let Some(s) = a.stalled {
                    deadline = deadline.min(s + send_timeout);
                }
                if let Some((l, _)) = a.linger {
                    deadline = deadline.min(l);
                }
            }
            if self.streams.is_empty() {
                // Idle connections hold no buffers.
                self.h2.shrink();
                self.h2.out = Vec::new();
                if self.rbuf.is_empty() {
                    self.rbuf = BytesMut::new();
                }
                self.streams = HashMap::new();
                self.scratch = Vec::new();
                self.spare = Vec::new();
                self.block = Vec::new();
                events = Vec::new();
                self.tx = None;
                self.rx = None;
            }
            let read = tokio::select! {
                r = read_some(&self.stream, &mut self.wire, cache, &mut self.rbuf, deadline) => Some(r),
                msg = next_msg(&mut self.rx) => {
                    match msg {
                        Some((id, msg)) => self.on_msg(id, msg),
                        None => self.rx = None,
                    }
                    None
                }
                r = draining.wait_for(|d| *d), if closing.is_none() => {
                    self.h2.goaway(Reason::NoError, "");
                    let wait = if r.is_ok() { cfg.drain_timeout_ms } else { 0 };
                    closing = Some(Instant::now() + Duration::from_millis(wait));
                    None
                }
            };
            match read {
                None => {}
                Some(Ok(0)) => {
                    // The client closed its side: nothing more comes.
                    return Ok(());
                }
                Some(Ok(_)) => last_active = Instant::now(),
                Some(Err(e)) if e.kind() == io::ErrorKind::TimedOut => {
                    let now = Instant::now();
                    if self.h2.awaiting_preface() {
                        m.timeouts.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(peer = %self.peer, "HTTP/2 preface did not arrive in time");
                        return Ok(());
                    }
                    if closing.is_some_and(|c| c <= now) {
                        tracing::debug!(peer = %self.peer, "HTTP/2 streams did not finish within the drain time");
                        return Ok(());
                    }
                    self.timers(now, send_timeout);
                    if closing.is_none() && self.streams.is_empty() && now >= last_active + idle {
                        // Idle: say GOAWAY, give the client a moment to see it.
                        self.h2.goaway(Reason::NoError, "idle");
                        closing = Some(now + Duration::from_secs(1));
                    }
                }
                Some(Err(e)) => return Err(e),
            }
        }
    }

    /// Streams whose window stayed shut past the send timeout are reset;
    /// lingering ones past their time too.
    fn timers(&mut self, now: Instant, send_timeout: Duration) {
        let m = &self.cache.metrics;
        let mut gone = Vec::new();
        for (&id, a) in &self.streams {
            if a.stalled.is_some_and(|s| s + send_timeout <= now) {
                m.timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, "HTTP/2 client did not open its window in time; stream reset");
                gone.push((id, Reason::Cancel));
            } else if a.linger.is_some_and(|(l, _)| l <= now) {
                gone.push((id, Reason::NoError));
            }
        }
        for (id, reason) in gone {
            self.h2.reset(id, reason);
            self.streams.remove(&id);
        }
    }

    fn on_event(&mut self, ev: Event) {
        let m = &self.cache.metrics;
        match ev {
            Event::Request {
                id,
                request,
                end_stream,
            } => {
                if !self.h2.can_send(id) {
                    // Reset by the client in the same read: never answered.
                    return;
                }
                m.h2_streams.fetch_add(1, Ordering::Relaxed);
                if end_stream {
                    self.answer_inline(id, request.finish(Body::Whole(0)));
                } else {
                    let (btx, brx) = mpsc::unbounded_channel();
                    let a = self.streams.entry(id).or_default();
                    a.body = Some(btx);
                    self.spawn(id, Job::WithBody(request, brx));
                }
            }
            Event::TooLarge { id, end_stream } => {
                m.bad_requests.fetch_add(1, Ordering::Relaxed);
                m.response(431, 0);
                let max = self.cache.cfg.max_header_bytes;
                let r = error_reply(
                    431,
                    &format!("the request's header fields are larger than the {max} bytes this cache accepts"),
                    false,
                    false,
                );
                self.reply_inline(id, r, false);
                if !end_stream {
                    self.linger(id);
                }
            }
            Event::Data { id, data, end } => {
                let n = data.len();
                let Some(a) = self.streams.get_mut(&id) else {
                    self.h2.release(id, n);
                    return;
                };
                if let Some(body) = &a.body {
                    if body.send(Some(data)).is_ok() {
                        if end {
                            let _ = body.send(None);
                            a.body = None;
                        }
                        return;
                    }
                    a.body = None;
                }
                self.h2.release(id, n);
                if let Some((_, dropped)) = &mut a.linger {
                    *dropped += n;
                    if *dropped > LINGER_BYTES {
                        self.h2.reset(id, Reason::NoError);
                        self.streams.remove(&id);
                        return;
                    }
                }
                self.settle(id);
            }
            Event::Reset { id, .. } => {
                self.streams.remove(&id);
            }
        }
    }

    /// A stream whose request has all arrived, without a body: a fresh hit
    /// is answered here and now; anything else gets a task.
    fn answer_inline(&mut self, id: u32, head: Vec<u8>) {
        let head = match parse_head(head, &self.limits) {
            Ok(h) => h,
            Err((code, msg)) => return self.refuse_inline(id, code, &msg),
        };
        if let Some(why) = self.cache.misdirected(&head, self.chunk) {
            return self.refuse_inline(id, 421, &why);
        }
        let head_only = head.method == Method::Head;
        let cache = self.cache;
        let mut tally = HitTally::default();
        self.scratch.clear();
        let (scratch, spare) = (&mut self.scratch, &mut self.spare);
        let at_once =
            panic::catch(|| cache.at_once(&head, scratch, INLINE_BODY, spare, &mut tally));
        match at_once {
            Err(p) => {
                panic::report(
                    &cache.metrics,
                    &p,
                    "answering an HTTP/2 stream; answered 500",
                    Some(self.peer),
                );
                let r = panic_reply(cache, head_only);
                self.reply_inline(id, r, head_only);
            }
            Ok(AtOnce::Written { .. }) => {
                cache.metrics.add_hits(&mut tally);
                let scratch = std::mem::take(&mut self.scratch);
                let n =
                    memchr::memmem::find(&scratch, b"\r\n\r\n").map_or(scratch.len(), |i| i + 4);
                let body = &scratch[n..];
                let end = body.is_empty();
                if self.send_head(id, &scratch[..n], end) && !end {
                    let sent = self.h2.send_data(id, body, true);
                    if sent < body.len() {
                        let a = self.streams.entry(id).or_default();
                        a.queue
                            .push_back((Bytes::copy_from_slice(&body[sent..]), 0));
                        a.end = true;
                    }
                }
                self.scratch = scratch;
            }
            Ok(AtOnce::Reply(r)) => self.reply_inline(id, r, head_only),
            Ok(AtOnce::Later) => self.spawn(id, Job::Handle(head)),
        }
    }

    /// Refuse a request the parser refuses, as HTTP/1.1 does.
    fn refuse_inline(&mut self, id: u32, code: u16, msg: &str) {
        count_refusal(self.cache, code, msg, self.peer);
        let r = error_reply(code, msg, false, false);
        self.reply_inline(id, r, false);
    }

    /// Send a reply from here: its head now, its body as the windows allow
    /// (a streamed body gets a task).
    fn reply_inline(&mut self, id: u32, reply: Reply, head_only: bool) {
        let no_body = head_only
            || matches!(reply.body, ReplyBody::Empty)
            || matches!(reply.status, 204 | 304);
        if !self.send_head(id, &reply.head, no_body) || no_body {
            return;
        }
        let stats = reply.stats.clone();
        match reply.body {
            ReplyBody::Empty => {}
            ReplyBody::Full(b) | ReplyBody::Shared { bytes: b, .. } => {
                if let Some(s) = &stats {
                    s.served(b.len() as u64);
                }
                let a = self.streams.entry(id).or_default();
                a.queue.push_back((b, 0));
                a.end = true;
            }
            body @ ReplyBody::Stream { .. } => {
                self.spawn(
                    id,
                    Job::Body(Reply {
                        body,
                        head: Vec::new(),
                        ..reply
                    }),
                );
            }
        }
    }

    /// Encode an HTTP/1.1 reply head as HPACK and send it.
    fn send_head(&mut self, id: u32, head: &[u8], end: bool) -> bool {
        self.block.clear();
        encode_head(&mut self.enc, head, &mut self.block);
        self.h2.send_headers(id, &self.block, end)
    }

    fn spawn(&mut self, id: u32, job: Job) {
        let credit = Arc::new(Semaphore::new(self.cache.cfg.h2_max_send_buffer));
        if self.tx.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            self.tx = Some(tx);
            self.rx = Some(rx);
        }
        let t = Task {
            cache: self.cache.clone(),
            id,
            peer: self.peer,
            chunk: self.chunk,
            tx: self.tx.clone().expect("made above"),
            credit: credit.clone(),
            limits: self.limits,
        };
        let handle = tokio::spawn(t.run(job)).abort_handle();
        let a = self.streams.entry(id).or_default();
        a.task = Some(handle);
        a.credit = Some(credit);
    }

    fn on_msg(&mut self, id: u32, msg: Msg) {
        if !self.streams.contains_key(&id) {
            // Reset meanwhile: the task is being aborted.
            return;
        }
        match msg {
            Msg::Interim(head) => {
                self.block.clear();
                encode_head(&mut self.enc, &head, &mut self.block);
                if self
                    .block
                    .first()
                    .is_some_and(|_| head.get(9) == Some(&b'1'))
                {
                    self.h2.send_headers(id, &self.block, false);
                }
            }
            Msg::Head { head, end } => {
                self.send_head(id, &head, end);
                if end {
                    self.settle(id);
                }
            }
            Msg::Data(b, credit) => {
                if let Some(a) = self.streams.get_mut(&id) {
                    a.queue.push_back((b, credit));
                }
            }
            Msg::End => {
                if let Some(a) = self.streams.get_mut(&id) {
                    a.end = true;
                }
            }
            Msg::Reset(reason) => {
                self.h2.reset(id, reason);
                self.streams.remove(&id);
            }
            Msg::Release(n) => self.h2.release(id, n),
            Msg::Done => {
                if let Some(a) = self.streams.get_mut(&id) {
                    a.task = None;
                }
                self.settle(id);
            }
        }
    }

    /// Start dropping what the client still sends on a stream answered
    /// early.
    fn linger(&mut self, id: u32) {
        let a = self.streams.entry(id).or_default();
        a.body = None;
        if a.linger.is_none() {
            a.linger = Some((Instant::now() + LINGER, 0));
        }
    }

    /// Forget a stream that has nothing left to do.
    fn settle(&mut self, id: u32) {
        let Some(a) = self.streams.get(&id) else {
            return;
        };
        let done_sending = !self.h2.can_send(id) || (a.end && a.queue.is_empty());
        if a.task.is_some() || !done_sending || !a.queue.is_empty() {
            return;
        }
        if self.h2.receiving(id) {
            // Answered while the client still sends: drop what comes for a
            // while (the task that read it is done).
            if a.linger.is_none() {
                self.linger(id);
            }
            return;
        }
        self.streams.remove(&id);
    }

    /// Move queued body pieces into DATA frames as the windows allow, up to
    /// [`SEND_BATCH`] bytes. Returns whether more could go at once.
    fn pump(&mut self) -> bool {
        let mut more = false;
        let mut done = Vec::new();
        for (&id, a) in self.streams.iter_mut() {
            if self.h2.out.len() >= SEND_BATCH {
                more |= !a.queue.is_empty() && self.h2.capacity(id) > 0;
                continue;
            }
            loop {
                let last = a.end && a.queue.len() == 1;
                let Some((b, credit)) = a.queue.front_mut() else {
                    break;
                };
                let n = self.h2.send_data(id, b, last);
                bytes::Buf::advance(b, n);
                if b.is_empty() {
                    if *credit > 0 {
                        if let Some(c) = &a.credit {
                            c.add_permits(*credit as usize);
                        }
                    }
                    a.queue.pop_front();
                } else {
                    break;
                }
                if self.h2.out.len() >= SEND_BATCH {
                    break;
                }
            }
            if a.queue.is_empty() && a.end && self.h2.can_send(id) {
                self.h2.send_data(id, &[], true);
            }
            if a.queue.is_empty() {
                a.stalled = None;
                if a.end || !self.h2.can_send(id) {
                    done.push(id);
                }
            } else if self.h2.capacity(id) == 0 {
                a.stalled.get_or_insert_with(Instant::now);
            } else {
                a.stalled = None;
                more = true;
            }
        }
        for id in done {
            self.settle(id);
        }
        more
    }

    /// Write the frames made so far: one write (over TLS, one batch of
    /// records).
    async fn flush(&mut self) -> io::Result<()> {
        if self.h2.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.h2.out);
        let r = write_all(&self.stream, &mut self.wire, self.cache, &out).await;
        if out.capacity() <= SEND_BATCH * 2 {
            self.h2.out = out;
            self.h2.out.clear();
        }
        r
    }
}

impl Drop for Front<'_> {
    fn drop(&mut self) {
        // Streams still answered lose their connection: their tasks stop.
        self.streams.clear();
    }
}

/// The next message of a stream's task; never, without tasks.
async fn next_msg(rx: &mut Option<mpsc::UnboundedReceiver<(u32, Msg)>>) -> Option<(u32, Msg)> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn write_all(
    stream: &AsyncFd<StdStream>,
    wire: &mut Wire,
    cache: &Cache,
    b: &[u8],
) -> io::Result<()> {
    if let Wire::Tls(tls) = wire {
        return wire::send(stream, cache, tls, b, true).await;
    }
    let mut at = 0;
    while at < b.len() {
        let rest = &b[at..];
        let n = write_op(stream, cache, |mut s| {
            let n = s.write(rest)?;
            Ok((n, n < rest.len()))
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        at += n;
    }
    Ok(())
}

/// Read some bytes into `rbuf` (their number; 0 when the client closed),
/// or `TimedOut` at `deadline`.
async fn read_some(
    stream: &AsyncFd<StdStream>,
    wire: &mut Wire,
    cache: &Cache,
    rbuf: &mut BytesMut,
    deadline: Instant,
) -> io::Result<usize> {
    if let Wire::Tls(tls) = wire {
        return wire::fill(stream, cache, tls, rbuf, deadline).await;
    }
    loop {
        let mut guard = match tokio::time::timeout_at(deadline.into(), stream.readable()).await {
            Ok(g) => g?,
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        };
        let mut buf = [0u8; READ];
        match guard.try_io(|s| (&mut s.get_ref()).read(&mut buf)) {
            Ok(Ok(n)) => {
                if n < READ {
                    guard.clear_ready();
                }
                rbuf.extend_from_slice(&buf[..n]);
                return Ok(n);
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
}

/// The connection's HPACK encoder. It never adds to the dynamic table, so
/// the client's table stays empty and the size update to 0 the encoder
/// would open its first block with is not needed: it is spent here.
fn encoder() -> Encoder {
    let mut e = Encoder::new();
    e.begin_block(&mut Vec::new());
    e
}

/// An HTTP/1.1 reply head as HPACK fields: `:status`, then the fields
/// without the connection-specific ones.
fn encode_head(enc: &mut Encoder, head: &[u8], out: &mut Vec<u8>) {
    let status = head
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse::<u16>().ok())
        .unwrap_or(500);
    enc.status(status, out);
    let mut lines = head.split(|&c| c == b'\n').skip(1);
    let mut name = [0u8; 64];
    let mut long;
    for line in &mut lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        let (n, v) = (&line[..colon], &line[colon + 1..]);
        let (s, e) = vcdn_http::header::trim_ows(v);
        let v = &v[s..e];
        let lower: &[u8] = if n.len() <= name.len() {
            for (d, s) in name.iter_mut().zip(n) {
                *d = s.to_ascii_lowercase();
            }
            &name[..n.len()]
        } else {
            long = n.to_ascii_lowercase();
            &long
        };
        if CONNECTION_SPECIFIC.contains(&lower) {
            continue;
        }
        enc.field(lower, v, out);
    }
}

/// Parse the HTTP/1.1 head of a stream's request, or the status and reason
/// to refuse it with.
fn parse_head(head: Vec<u8>, limits: &Limits) -> Result<RequestHead, (u16, String)> {
    match parse_request(&Bytes::from(head), limits) {
        Ok(Some((head, _))) => Ok(head),
        Ok(None) => Err((400, "incomplete request head".into())),
        Err(e) => Err((e.status(), e.to_string())),
    }
}

fn count_refusal(cache: &Cache, code: u16, msg: &str, peer: SocketAddr) {
    let m = &cache.metrics;
    if code == 408 {
        m.timeouts.fetch_add(1, Ordering::Relaxed);
    } else if code != 421 {
        m.bad_requests.fetch_add(1, Ordering::Relaxed);
    }
    m.response(code, 0);
    tracing::debug!(%peer, status = code, reason = msg, "HTTP/2 request refused");
}

/// The answer to a request whose handling panicked (a bug).
fn panic_reply(cache: &Cache, head_only: bool) -> Reply {
    cache.metrics.request(CacheStatus::Error);
    cache.metrics.response(500, 0);
    error_reply(
        500,
        "the cache failed on this request (an internal error, logged for the operator)",
        false,
        head_only,
    )
}

fn too_large(max: u64) -> String {
    format!("the request body is larger than the {max} bytes this cache accepts")
}

/// What a stream's task does.
enum Job {
    /// Handle a request without a body.
    Handle(RequestHead),
    /// Read the request's body, then handle it.
    WithBody(proto::Request, mpsc::UnboundedReceiver<Option<Bytes>>),
    /// Send a streamed reply whose head went already.
    Body(Reply),
}

/// How a stream's task refuses a request.
enum Refusal {
    /// Reset the stream.
    Reset(Reason),
    /// Answer this status with this reason.
    Status(u16, String),
}

/// A stream's task: its side of the channel to the connection.
struct Task {
    cache: Arc<Cache>,
    id: u32,
    peer: SocketAddr,
    chunk: Option<u64>,
    tx: Tx,
    credit: Arc<Semaphore>,
    limits: Limits,
}

/// The request body as a stream's task reads it.
struct BodyRx {
    rx: mpsc::UnboundedReceiver<Option<Bytes>>,
    ended: bool,
}

impl Task {
    fn send(&self, m: Msg) {
        let _ = self.tx.send((self.id, m));
    }

    /// Run `job` within a panic boundary of its own: a panic costs this
    /// stream a 500 or a reset, never the connection.
    async fn run(self, job: Job) {
        let mut started = false;
        let mut head_only = false;
        let r = panic::boundary(self.job(job, &mut started, &mut head_only)).await;
        if let Err(p) = r {
            panic::report(
                &self.cache.metrics,
                &p,
                "answering an HTTP/2 stream; answered 500",
                Some(self.peer),
            );
            if started {
                self.send(Msg::Reset(Reason::InternalError));
            } else {
                let r = panic_reply(&self.cache, head_only);
                self.send_reply(r, head_only, &mut false).await;
            }
        }
        self.send(Msg::Done);
    }

    async fn job(&self, job: Job, started: &mut bool, head_only: &mut bool) {
        match job {
            Job::Handle(head) => {
                *head_only = head.method == Method::Head;
                let reply = self.handle(&head, RequestBody::None).await;
                self.send_reply(reply, *head_only, started).await;
            }
            Job::Body(reply) => {
                *started = true;
                self.send_body(reply).await;
            }
            Job::WithBody(request, rx) => {
                *head_only = request.head_only;
                let mut body = BodyRx { rx, ended: false };
                if let Err(r) = self.with_body(request, &mut body, started).await {
                    self.refused(r, started).await;
                }
            }
        }
    }

    /// The handler's reply, with the upstream's interim responses passed
    /// on meanwhile as informational HEADERS.
    async fn handle(&self, head: &RequestHead, body: RequestBody) -> Reply {
        let (sink, mut interims) = interim::channel(self.cache.via());
        let handled = self
            .cache
            .handle_interim(head, body, self.peer.ip(), Some(sink));
        tokio::pin!(handled);
        let reply = loop {
            tokio::select! {
                biased;
                Some(bytes) = interims.recv() => self.send(Msg::Interim(bytes)),
                r = &mut handled => break r,
            }
        };
        while let Ok(bytes) = interims.try_recv() {
            self.send(Msg::Interim(bytes));
        }
        reply
    }

    async fn with_body(
        &self,
        request: proto::Request,
        body: &mut BodyRx,
        started: &mut bool,
    ) -> Result<(), Refusal> {
        let cfg = &self.cache.cfg;
        let max = cfg.max_request_body;
        if request.content_length.is_some_and(|n| n > max) {
            return Err(Refusal::Status(413, too_large(max)));
        }
        let mut clock = BodyClock::new(cfg);
        // A body that is all here within a few KiB goes whole (with its
        // length); a larger one is streamed.
        let mut got = BytesMut::new();
        while got.len() < INLINE_REQUEST_BODY {
            match self.next_data(body, &mut clock).await? {
                Some(d) => {
                    if (got.len() + d.len()) as u64 > max {
                        return Err(Refusal::Status(413, too_large(max)));
                    }
                    got.extend_from_slice(&d);
                }
                None => break,
            }
        }
        if body.ended {
            let head = parse_head(request.finish(Body::Whole(got.len())), &self.limits)
                .map_err(|(c, m)| Refusal::Status(c, m))?;
            if let Some(why) = self.cache.misdirected(&head, self.chunk) {
                return Err(Refusal::Status(421, why));
            }
            let head_only = head.method == Method::Head;
            let whole = got.freeze();
            let b = if whole.is_empty() {
                RequestBody::None
            } else {
                RequestBody::from(whole)
            };
            let reply = self.handle(&head, b).await;
            self.send_reply(reply, head_only, started).await;
            return Ok(());
        }
        let length = request.content_length;
        let head = parse_head(request.finish(Body::Streamed), &self.limits)
            .map_err(|(c, m)| Refusal::Status(c, m))?;
        if let Some(why) = self.cache.misdirected(&head, self.chunk) {
            return Err(Refusal::Status(421, why));
        }
        let (tx, rx) = BodyStream::channel(length, BODY_DEPTH);
        let first = got.freeze();
        let pump = async {
            // Owned here: dropped without End when the body fails, which
            // tells the upstream side to give up.
            let tx = tx;
            let mut total = first.len() as u64;
            if tx.send(BodyPiece::Data(first)).await.is_err() {
                return Ok(());
            }
            loop {
                let d = tokio::select! {
                    d = self.next_data(body, &mut clock) => d?,
                    _ = tx.closed() => return Ok(()),
                };
                let Some(d) = d else {
                    let _ = tx.send(BodyPiece::End).await;
                    return Ok(());
                };
                total += d.len() as u64;
                if total > max {
                    return Err(Refusal::Status(413, too_large(max)));
                }
                if tx.send(BodyPiece::Data(d)).await.is_err() {
                    return Ok(());
                }
            }
        };
        let (reply, pumped) = tokio::join!(
            self.cache
                .handle(&head, RequestBody::Stream(rx), self.peer.ip()),
            pump
        );
        if let Err(r) = pumped {
            drop(reply);
            return Err(r);
        }
        self.send_reply(reply, head.method == Method::Head, started)
            .await;
        Ok(())
    }

    /// The next piece of the request body, its flow-control capacity given
    /// back (the bytes are ours now: the client may send more), within the
    /// body's time limits. `Ok(None)` at the end.
    async fn next_data(
        &self,
        body: &mut BodyRx,
        clock: &mut BodyClock,
    ) -> Result<Option<Bytes>, Refusal> {
        if body.ended {
            return Ok(None);
        }
        let Some(wait) = clock.allowance() else {
            return Err(Refusal::Status(408, clock.explain()));
        };
        let since = Instant::now();
        match tokio::time::timeout(wait, body.rx.recv()).await {
            Err(_) => Err(Refusal::Status(408, clock.explain())),
            Ok(None) => Err(Refusal::Reset(Reason::Cancel)),
            Ok(Some(None)) => {
                body.ended = true;
                Ok(None)
            }
            Ok(Some(Some(d))) => {
                clock.waited(since, d.len());
                self.send(Msg::Release(d.len()));
                Ok(Some(d))
            }
        }
    }

    async fn refused(&self, r: Refusal, started: &mut bool) {
        match r {
            Refusal::Reset(reason) => {
                self.cache
                    .metrics
                    .bad_requests
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, ?reason, "HTTP/2 stream refused");
                self.send(Msg::Reset(reason));
            }
            Refusal::Status(code, msg) => {
                count_refusal(&self.cache, code, &msg, self.peer);
                let r = error_reply(code, &msg, false, false);
                self.send_reply(r, false, started).await;
            }
        }
    }

    /// Send a reply on the stream: its head, then its body.
    async fn send_reply(&self, mut reply: Reply, head_only: bool, started: &mut bool) {
        let no_body = head_only
            || matches!(reply.body, ReplyBody::Empty)
            || matches!(reply.status, 204 | 304);
        *started = true;
        self.send(Msg::Head {
            head: std::mem::take(&mut reply.head),
            end: no_body,
        });
        if !no_body {
            self.send_body(reply).await;
        }
    }

    /// Send a reply's body (its head went already), within the stream's
    /// credit.
    async fn send_body(&self, reply: Reply) {
        let stats = reply.stats;
        match reply.body {
            ReplyBody::Empty => self.send(Msg::End),
            ReplyBody::Full(b) | ReplyBody::Shared { bytes: b, .. } => {
                if let Some(s) = &stats {
                    s.served(b.len() as u64);
                }
                // Stored bytes: no credit, they are in memory anyway.
                self.send(Msg::Data(b, 0));
                self.send(Msg::End);
            }
            ReplyBody::Stream {
                mut reader,
                mut skip,
                mut take,
                ..
            } => {
                let mut sent = 0u64;
                loop {
                    match reader.next().await {
                        Ok(Some(mut p)) => {
                            p.clip(&mut skip, &mut take);
                            sent += p.len();
                            if self.send_piece(p).await.is_err() {
                                break;
                            }
                            if take == Some(0) {
                                self.send(Msg::End);
                                break;
                            }
                        }
                        Ok(None) => {
                            self.send(Msg::End);
                            break;
                        }
                        Err(e) => {
                            // The upstream failed mid-body: the client must
                            // see a cut response, never a complete wrong one.
                            tracing::debug!(peer = %self.peer, error = %e.message, "stream ended early");
                            self.send(Msg::Reset(Reason::InternalError));
                            break;
                        }
                    }
                }
                if let Some(s) = &stats {
                    s.served(sent);
                }
                self.cache
                    .metrics
                    .body_bytes_sent
                    .fetch_add(sent, Ordering::Relaxed);
            }
        }
    }

    /// Hand over bytes in pieces of at most [`SEND_CHUNK`], each once the
    /// stream's credit allows. `Err` when the stream is gone.
    async fn send_bytes(&self, mut b: Bytes) -> Result<(), ()> {
        while !b.is_empty() {
            let n = b.len().min(self.chunk());
            self.take_credit(n).await?;
            self.send(Msg::Data(b.split_to(n), n as u32));
        }
        Ok(())
    }

    /// The largest piece handed over at once: never more than the whole
    /// credit (a smaller `h2_max_send_buffer` would wait for ever).
    fn chunk(&self) -> usize {
        SEND_CHUNK.min(self.cache.cfg.h2_max_send_buffer)
    }

    async fn take_credit(&self, n: usize) -> Result<(), ()> {
        match self.credit.acquire_many(n as u32).await {
            Ok(p) => {
                p.forget();
                Ok(())
            }
            Err(_) => Err(()),
        }
    }

    /// A piece of a streamed body: bytes, or a range of the file it is
    /// being written to, read with pread as the credit allows (never more
    /// than the credit in memory).
    async fn send_piece(&self, p: Piece) -> Result<(), ()> {
        match p {
            Piece::Bytes(b) => self.send_bytes(b).await,
            Piece::File { file, offset, len } => {
                let mut off = offset;
                let end = offset + len;
                while off < end {
                    let n = ((end - off) as usize).min(self.chunk());
                    self.take_credit(n).await?;
                    let mut buf = vec![0u8; n];
                    let got = std::os::unix::fs::FileExt::read_at(&*file, &mut buf, off)
                        .map_err(|_| ())?;
                    if got == 0 {
                        return Err(());
                    }
                    buf.truncate(got);
                    off += got as u64;
                    self.send(Msg::Data(Bytes::from(buf), n as u32));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_head_becomes_hpack_fields_without_connection_ones() {
        let head = b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\nConnection: keep-alive\r\nX-Cache:  miss \r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut out = Vec::new();
        encode_head(&mut encoder(), head, &mut out);
        let mut fields = Vec::new();
        let mut d = vcdn_http::hpack::Decoder::new(4096);
        assert!(d
            .decode(&out, 1 << 20, |n, v| fields.push((n.to_vec(), v.to_vec())))
            .unwrap());
        let fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect();
        assert_eq!(
            fields,
            [
                (":status".to_string(), "404".to_string()),
                ("content-length".into(), "5".into()),
                ("x-cache".into(), "miss".into()),
            ]
        );
    }
}
