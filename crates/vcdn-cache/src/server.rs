//! Listening and the per-connection loop: thread-per-core, each thread with
//! its own single-threaded runtime and its own `SO_REUSEPORT` listener, so
//! the kernel spreads connections and a connection never changes thread.
//! Pipelined requests are answered in order with one write per batch.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::Write;
use std::net::TcpStream as StdStream;

use rustix::net::{acceptfrom_with, SocketFlags};
use tokio::io::unix::AsyncFd;
use vcdn_http::chunked::{chunk_header, ChunkedDecoder, Decoded};
use vcdn_http::{parse_request, BodyFraming, Limits, Method, ParseError, RequestHead};

use crate::fetch::Piece;
use crate::interim;
use crate::metrics::{CacheStatus, HitTally};
use crate::panic;
use crate::proxy::{AtOnce, Cache};
use crate::reply::{error_reply, Reply, ReplyBody};
use crate::request_body::BodyClock;
use crate::upstream::{BodyPiece, BodyStream, RequestBody};
use crate::wire::{self, write_op, Wire};

/// Bodies up to this size are copied into the batch buffer; larger ones are
/// written from the stored bytes directly.
const INLINE_BODY: usize = 16 * 1024;
/// Flush the batch buffer past this size even if more requests wait.
const MAX_BATCH: usize = 64 * 1024;
/// Reads of a request body being streamed upstream.
const BODY_READ: usize = 64 * 1024;
/// Pieces of a streamed request body in flight to the upstream: with
/// [`BODY_READ`], an upload holds a few hundred KiB whatever its size.
const BODY_DEPTH: usize = 2;
/// After an error answered mid-body, what the client still sends is read
/// and dropped for this long (and at most [`LINGER_BYTES`]), so that
/// closing does not reset the connection before it has read the answer.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 << 20;
/// How long a keep-alive connection waits for its next request before it
/// gives back the buffers it keeps for it (read buffer, reply batch,
/// recycled reply head): a busy client's next request comes sooner and
/// finds them, a connection that stays idle holds none.
const SHED_AFTER: Duration = Duration::from_secs(1);

/// Bind a listening socket with `SO_REUSEPORT`, so several threads can each
/// own one on the same address.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<StdListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

/// Accept connections forever on one thread's listener.
pub async fn accept_loop(cache: Arc<Cache>, listener: StdListener) {
    // SAFETY: the AsyncFd owns the listener, whose descriptor stays open and
    // unchanged until it is dropped.
    let listener = match unsafe { AsyncFd::register(listener) } {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register listener");
            return;
        }
    };
    loop {
        let accepted = async {
            let mut guard = listener.readable().await?;
            match guard.try_io(|l| {
                // One syscall: the socket comes back non-blocking.
                acceptfrom_with(l.get_ref(), SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)
                    .map_err(std::io::Error::from)
            }) {
                Ok(r) => r.map(Some),
                Err(_would_block) => Ok(None),
            }
        }
        .await;
        match accepted {
            Ok(None) => {}
            Ok(Some((fd, addr))) => {
                let m = &cache.metrics;
                m.connections_total.fetch_add(1, Ordering::Relaxed);
                if m.connections_open.load(Ordering::Relaxed) >= cache.cfg.max_connections as u64 {
                    m.connections_refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let peer = addr
                    .and_then(|a| SocketAddr::try_from(a).ok())
                    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                let stream = StdStream::from(fd);
                let _ = stream.set_nodelay(true);
                // SAFETY: as for the listener, the AsyncFd owns the socket.
                let stream = match unsafe { AsyncFd::register(stream) } {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register connection");
                        continue;
                    }
                };
                let slot = ConnectionSlot::take(&cache);
                tokio::spawn(async move {
                    connection(slot.cache(), stream, peer).await;
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep going.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// One of `max_connections`, counted in `connections_open` while its
/// connection lives and given back when this guard drops, also when the
/// connection's task ends by a panic or is dropped.
pub(crate) struct ConnectionSlot(Arc<Cache>);

impl ConnectionSlot {
    /// Count a new connection.
    pub(crate) fn take(cache: &Arc<Cache>) -> ConnectionSlot {
        cache
            .metrics
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        ConnectionSlot(cache.clone())
    }

    /// Take over a connection already counted (handed over by the ring).
    pub(crate) fn adopt(cache: &Arc<Cache>) -> ConnectionSlot {
        ConnectionSlot(cache.clone())
    }

    pub(crate) fn cache(&self) -> &Arc<Cache> {
        &self.0
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0
            .metrics
            .connections_open
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// The answer to a request whose handling panicked (a bug): a 500, after
/// which the connection closes, since what else the request left behind
/// cannot be trusted.
fn panic_reply(cache: &Cache, head_only: bool) -> Reply {
    cache.metrics.request(CacheStatus::Error);
    cache.metrics.response(500, 0);
    error_reply(
        500,
        "the cache failed on this request (an internal error, logged for the operator)",
        true,
        head_only,
    )
}

enum Next {
    Request(RequestHead),
    Closed,
    /// The connection opened with the HTTP/2 preface: these are the bytes
    /// read so far, for [`crate::h2front`].
    Http2(Bytes),
}

/// The first line of the HTTP/2 connection preface (RFC 9113 §3.4). The
/// HTTP/1.1 parser refuses it (version 2.0), so it is looked for only
/// there, on a connection's first bytes: the hit path never pays for it.
const H2_PREFACE_LINE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// How the reading of a request body ended.
enum Pumped {
    /// All of it was read and handed over.
    Complete,
    /// The upstream side stopped taking it (it failed or answered early):
    /// the rest is unread, so the connection closes after the answer.
    Abandoned,
    /// The client's body is at fault: answer this, then close.
    Failed(u16, String),
}

/// What to do with a request's body before answering it.
enum BodyPlan {
    /// Already complete in the buffer.
    Ready(RequestBody),
    /// Stream it upstream as it arrives.
    Stream,
    /// Refuse the request with this status and reason, then close.
    Refuse(u16, String),
}

struct Conn<'a> {
    cache: &'a Arc<Cache>,
    /// The socket, with readiness we manage ourselves: after a short read
    /// (or write) the socket is known drained (or full), so readiness is
    /// cleared without the extra system call that would return EAGAIN.
    stream: AsyncFd<StdStream>,
    /// Plain or TLS (see `crate::wire`).
    wire: Wire,
    peer: SocketAddr,
    /// Bytes read but not yet parsed. Empty (no allocation) while idle, so
    /// thousands of idle connections cost little memory.
    rbuf: BytesMut,
    /// Responses waiting to be written as one batch.
    out: Vec<u8>,
    limits: Limits,
    /// When the first byte of the request being read arrived: the whole
    /// head must come within the header timeout (a slowloris client
    /// trickling bytes does not reset it).
    head_started: Option<Instant>,
    /// A buffer for the next reply head, recycled from the last one.
    spare_head: Vec<u8>,
    /// No request has been parsed on this connection yet: an HTTP/2
    /// preface is taken only here (h2c with prior knowledge).
    fresh: bool,
    /// Set when the connection turned out to speak HTTP/2: the bytes read.
    http2: Option<Bytes>,
    /// The chunk this connection was let in for, on a chunk address
    /// (`crate::chunks`): every request on it must name that chunk.
    chunk: Option<u64>,
}

async fn connection(cache: &Arc<Cache>, stream: AsyncFd<StdStream>, peer: SocketAddr) {
    let h = Handover {
        fresh: true,
        ..Handover::default()
    };
    connection_from(cache, stream, peer, h).await
}

/// What a connection brings when the io_uring front end hands it over
/// (`crate::ring`): bytes read but not answered, maybe a reply already made
/// for the first of them, and when the pending request head started.
#[derive(Default)]
pub(crate) struct Handover {
    pub rbuf: BytesMut,
    /// The reply, whether the request was HEAD, whether to close after it.
    pub first: Option<(Reply, bool, bool)>,
    pub head_started: Option<Instant>,
    /// Nothing was answered on the connection before: its first bytes are
    /// in `rbuf` (an HTTP/2 preface may be taken).
    pub fresh: bool,
}

pub(crate) async fn connection_from(
    cache: &Arc<Cache>,
    stream: AsyncFd<StdStream>,
    peer: SocketAddr,
    h: Handover,
) {
    serve(cache, stream, Wire::Plain, peer, h).await
}

/// Serve HTTP/1.1 on a connection whose TLS handshake is done (by
/// `crate::tls`); `tls` may already hold the first request's bytes.
pub(crate) fn connection_tls<'a>(
    cache: &'a Arc<Cache>,
    stream: AsyncFd<StdStream>,
    tls: Box<wire::Tls>,
    peer: SocketAddr,
) -> impl std::future::Future<Output = ()> + 'a {
    serve(cache, stream, Wire::Tls(tls), peer, Handover::default())
}

/// The connection's future. Not an `async fn`: its arguments would stay in
/// the future for the connection's whole life beside the [`Conn`] made of
/// them; this way the future holds the `Conn` alone (and a handed-over
/// reply, boxed).
fn serve<'a>(
    cache: &'a Arc<Cache>,
    stream: AsyncFd<StdStream>,
    wire: Wire,
    peer: SocketAddr,
    h: Handover,
) -> impl std::future::Future<Output = ()> + 'a {
    let cfg = &cache.cfg;
    let chunk = cache.chunk_of(|| stream.get_ref().local_addr());
    let mut c = Conn {
        cache,
        chunk,
        stream,
        wire,
        peer,
        rbuf: h.rbuf,
        out: Vec::new(),
        head_started: h.head_started,
        spare_head: Vec::new(),
        fresh: h.fresh,
        http2: None,
        limits: Limits {
            max_request_line: cfg.max_request_line,
            max_head: cfg.max_header_bytes,
            max_headers: cfg.max_headers,
        },
    };
    let first = h.first.map(Box::new);
    async move {
        // A panic that escapes the per-request boundaries of `run` (while
        // sending, say) ends here: the connection closes (its socket and slot
        // are dropped with it) and the thread serves on.
        let result = panic::boundary(async {
            if let Some(first) = first {
                let (reply, head_only, close) = *first;
                let clean = Box::pin(c.send(reply, head_only)).await?;
                if close || !clean {
                    return c.flush().await.map(|()| None);
                }
            }
            c.run().await?;
            Ok(c.http2.take())
        })
        .await;
        let mut h2c = None;
        match result {
            Ok(Ok(read)) => h2c = read,
            Ok(Err(e)) => tracing::debug!(peer = %c.peer, error = %e, "connection ended"),
            Err(p) => panic::report(
                &cache.metrics,
                &p,
                "serving a connection; closed it",
                Some(c.peer),
            ),
        }
        if let Wire::Tls(tls) = &mut c.wire {
            wire::close_notify(&c.stream, tls);
        }
        if let Some(read) = h2c {
            // h2c with prior knowledge: the socket goes to the HTTP/2 front
            // end, with the bytes already read; this task keeps the slot.
            // The HTTP/1.1 loop's buffers are not kept while HTTP/2 runs.
            let Conn { stream, peer, .. } = c;
            Box::pin(crate::h2front::serve(
                cache.clone(),
                stream,
                Wire::Plain,
                peer,
                read,
            ))
            .await;
        }
    }
}

impl Conn<'_> {
    /// Serve requests until the connection ends. A future is allocated at
    /// the size of its largest state and keeps it for the connection's
    /// whole life, idle or not: so every await on a rarely taken branch
    /// (errors, refusals, `100 Continue`, answers through the handler, a
    /// streamed body) is boxed, and an idle connection carries only the
    /// state of [`Conn::next_request`] (a flush and a read).
    async fn run(&mut self) -> std::io::Result<()> {
        loop {
            // Not awaited in the match's head: a temporary there lives
            // through the arms, and the future would keep room for the
            // read beside that of the final flush.
            let next = self.next_request().await?;
            let head = match next {
                Next::Request(h) => h,
                Next::Closed => return self.flush().await,
                Next::Http2(read) => {
                    self.http2 = Some(read);
                    return Ok(());
                }
            };
            // A future of its own, awaited in its own statement: its state
            // (the request's head, its body, the reply) then shares room
            // with the wait for the next request instead of adding to it.
            let go_on = self.answer(head).await?;
            if !go_on {
                return Ok(());
            }
        }
    }

    /// Answer one request. Returns whether the connection goes on.
    async fn answer(&mut self, head: RequestHead) -> std::io::Result<bool> {
        if let Some(why) = self.cache.misdirected(&head, self.chunk) {
            Box::pin(self.refuse(421, &why)).await?;
            return Ok(false);
        }
        let mut body = RequestBody::None;
        if head.body != BodyFraming::None {
            match self.body_plan(&head) {
                BodyPlan::Ready(b) => body = b,
                BodyPlan::Refuse(code, msg) => {
                    Box::pin(self.refuse(code, &msg)).await?;
                    return Ok(false);
                }
                BodyPlan::Stream => {
                    if head.expect_continue {
                        Box::pin(self.flush()).await?;
                        Box::pin(self.write(b"HTTP/1.1 100 Continue\r\n\r\n")).await?;
                    }
                    return Box::pin(self.forward(&head)).await;
                }
            }
        }
        // A fresh memory hit is answered at once; anything else goes
        // through the handler, boxed because its state is large and a
        // waiting connection should not carry it.
        let head_only = head.method == Method::Head;
        let at_once = match self.answer_at_once(&head) {
            Ok(a) => a,
            Err(p) => {
                Box::pin(self.panicked(&p, head_only)).await?;
                return Ok(false);
            }
        };
        let reply = match at_once {
            AtOnce::Written { close } => {
                // Boxed: a state with the request's head and a write in
                // progress would be room every connection carries.
                if close {
                    Box::pin(self.flush()).await?;
                    return Ok(false);
                }
                if self.out.len() > MAX_BATCH {
                    Box::pin(self.flush()).await?;
                }
                return Ok(true);
            }
            AtOnce::Reply(r) => r,
            AtOnce::Later => {
                let handled = Box::pin(self.handle_interim(&head, body)).await?;
                match handled {
                    Ok(r) => r,
                    Err(p) => {
                        Box::pin(self.panicked(&p, head_only)).await?;
                        return Ok(false);
                    }
                }
            }
        };
        let close = reply.close || !head.keep_alive;
        let clean = Box::pin(self.send(reply, head_only)).await?;
        if close || !clean {
            Box::pin(self.flush()).await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Answer `head` at once if it is a fresh memory hit: written into the
    /// batch, counted. Not in `run`'s body: this function's locals (the
    /// tally, the panic boundary's closure) would be room in every
    /// connection's future, about 400 bytes.
    #[inline]
    fn answer_at_once(&mut self, head: &RequestHead) -> Result<AtOnce, panic::Caught> {
        let mut tally = HitTally::default();
        let batched = self.out.len();
        let (cache, out, spare) = (self.cache, &mut self.out, &mut self.spare_head);
        let r = panic::catch(|| cache.at_once(head, out, INLINE_BODY, spare, &mut tally));
        match &r {
            Ok(AtOnce::Written { .. }) => self.cache.metrics.add_hits(&mut tally),
            Ok(_) => {}
            // Drop what the panicking answer may have half written.
            Err(_) => self.out.truncate(batched),
        }
        r
    }

    /// Answer a request through the handler, writing the upstream's 1xx
    /// interim responses (`crate::interim`) to the client as they come,
    /// before the final answer; an HTTP/1.0 client gets none (RFC 9110
    /// §15.2). Replies queued for earlier pipelined requests go first.
    async fn handle_interim(
        &mut self,
        head: &RequestHead,
        body: RequestBody,
    ) -> std::io::Result<Result<Reply, panic::Caught>> {
        let cache = self.cache;
        let peer = self.peer.ip();
        if head.minor_version == 0 {
            return Ok(panic::boundary(Box::pin(cache.handle(head, body, peer))).await);
        }
        let (sink, mut interims) = interim::channel(cache.via());
        let handled = panic::boundary(Box::pin(cache.handle_interim(head, body, peer, Some(sink))));
        tokio::pin!(handled);
        let handled = loop {
            tokio::select! {
                biased;
                Some(bytes) = interims.recv() => {
                    self.out.extend_from_slice(&bytes);
                    self.flush().await?;
                }
                r = &mut handled => break r,
            }
        };
        // Any still queued go before the final answer.
        while let Ok(bytes) = interims.try_recv() {
            self.out.extend_from_slice(&bytes);
        }
        Ok(handled)
    }

    /// Report a panic caught while answering a request, answer it 500 and
    /// end the connection.
    async fn panicked(&mut self, p: &panic::Caught, head_only: bool) -> std::io::Result<()> {
        panic::report(
            &self.cache.metrics,
            p,
            "answering a request; answered 500",
            Some(self.peer),
        );
        let r = panic_reply(self.cache, head_only);
        self.send(r, head_only).await?;
        self.flush().await
    }

    /// Parse the next request, reading as needed. Parse errors are answered
    /// here; the connection then closes.
    async fn next_request(&mut self) -> std::io::Result<Next> {
        let cfg = &self.cache.cfg;
        loop {
            if !self.rbuf.is_empty() {
                // The request keeps its bytes; the buffer keeps its spare
                // capacity for the next read, so a busy connection rarely
                // allocates.
                let data = self.rbuf.split().freeze();
                match parse_request(&data, &self.limits) {
                    Ok(Some((head, n))) => {
                        if n < data.len() {
                            self.rbuf.extend_from_slice(&data[n..]);
                        }
                        self.head_started = None;
                        self.fresh = false;
                        return Ok(Next::Request(head));
                    }
                    Ok(None) => {
                        let mut whole = data
                            .try_into_mut()
                            .unwrap_or_else(|d| BytesMut::from(&d[..]));
                        whole.unsplit(std::mem::take(&mut self.rbuf));
                        self.rbuf = whole;
                    }
                    Err(_) if self.fresh && data.starts_with(H2_PREFACE_LINE) => {
                        return Ok(Next::Http2(data));
                    }
                    Err(e) => {
                        Box::pin(self.reject(e)).await?;
                        return Ok(Next::Closed);
                    }
                }
            }
            // Nothing complete buffered: send what is pending, then read.
            self.flush().await?;
            let idle = self.rbuf.is_empty();
            let wait = if idle {
                Duration::from_millis(cfg.idle_timeout_ms)
            } else {
                let started = *self.head_started.get_or_insert_with(Instant::now);
                (started + Duration::from_millis(cfg.header_timeout_ms))
                    .saturating_duration_since(Instant::now())
            };
            if idle && self.out.capacity() > 4096 {
                // Idle connections must stay cheap.
                self.out = Vec::new();
            }
            let now = Instant::now();
            let filled = if idle && wait > SHED_AFTER {
                self.fill_idle(now + SHED_AFTER, now + wait).await
            } else {
                self.fill(now + wait).await
            };
            match filled {
                Ok(0) => return Ok(Next::Closed),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    if idle {
                        return Ok(Next::Closed);
                    }
                    self.cache.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                    let r =
                        error_reply(408, "the request head did not arrive in time", true, false);
                    self.cache.metrics.response(408, 0);
                    Box::pin(self.send(r, false)).await?;
                    return Ok(Next::Closed);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Conn::fill`] on an idle connection: at `shed` without a byte, give
    /// back the buffers kept for the next request, then wait on until
    /// `deadline`. One timer at a time, as a plain wait: a busy connection
    /// pays nothing for this.
    async fn fill_idle(&mut self, shed: Instant, deadline: Instant) -> std::io::Result<usize> {
        match self.fill(shed).await {
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            r => return r,
        }
        if self.rbuf.is_empty() {
            // Also when it has no room left: it may still hold the last
            // request's allocation.
            self.rbuf = BytesMut::new();
        }
        self.out = Vec::new();
        self.spare_head = Vec::new();
        self.fill(deadline).await
    }

    /// Read what the socket has into `rbuf`, waiting until `deadline`.
    /// Returns 0 when the peer closed. The buffer is allocated only once the
    /// socket is readable, so a connection that has sent nothing holds none
    /// (a busy one keeps at most the rest of one 4 KiB buffer).
    async fn fill(&mut self, deadline: Instant) -> std::io::Result<usize> {
        self.fill_with(deadline, 4096).await
    }

    /// [`Conn::fill`] with reads of about `chunk` bytes.
    async fn fill_with(&mut self, deadline: Instant, chunk: usize) -> std::io::Result<usize> {
        if let Wire::Tls(tls) = &mut self.wire {
            return wire::fill(&self.stream, self.cache, tls, &mut self.rbuf, deadline).await;
        }
        loop {
            let mut guard =
                match tokio::time::timeout_at(deadline.into(), self.stream.readable()).await {
                    Ok(g) => g?,
                    Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
                };
            if self.rbuf.capacity() - self.rbuf.len() < chunk / 4 {
                self.rbuf.reserve(chunk);
            }
            let rbuf = &mut self.rbuf;
            let res = guard.try_io(|s| {
                let spare = rbuf.spare_capacity_mut();
                let want = spare.len();
                let (filled, _) = rustix::io::read(s.get_ref(), spare)?;
                let n = filled.len();
                // SAFETY: read(2) initialised the first n bytes of the spare capacity.
                unsafe { rbuf.set_len(rbuf.len() + n) };
                Ok((n, want))
            });
            match res {
                Ok(Ok((n, want))) => {
                    if n < want {
                        // Drained: the next bytes will raise a new edge.
                        guard.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {
                    if self.rbuf.is_empty() {
                        self.rbuf = BytesMut::new();
                    }
                }
            }
        }
    }

    async fn reject(&mut self, e: ParseError) -> std::io::Result<()> {
        self.cache
            .metrics
            .bad_requests
            .fetch_add(1, Ordering::Relaxed);
        let code = e.status();
        self.cache.metrics.response(code, 0);
        tracing::debug!(peer = %self.peer, status = code, error = %e, "rejected request");
        self.send(error_reply(code, &e.to_string(), true, false), false)
            .await
            .map(|_| ())
    }

    /// Decide what to do with a request's body from what is buffered: too
    /// large (413) or malformed (400) is refused, a body already complete
    /// goes whole, anything else is streamed.
    fn body_plan(&mut self, head: &RequestHead) -> BodyPlan {
        let max = self.cache.cfg.max_request_body;
        let too_large = || {
            BodyPlan::Refuse(
                413,
                format!("the request body is larger than the {max} bytes this cache accepts"),
            )
        };
        match head.body {
            BodyFraming::None => BodyPlan::Ready(RequestBody::None),
            BodyFraming::Length(n) if n > max => too_large(),
            BodyFraming::Length(n) if self.rbuf.len() as u64 >= n => {
                // n is at most the buffer's length, so it fits a usize.
                BodyPlan::Ready(RequestBody::Full(self.rbuf.split_to(n as usize).freeze()))
            }
            BodyFraming::Length(_) => BodyPlan::Stream,
            BodyFraming::Chunked => {
                // Decode a copy of what is buffered (a few KiB): if the
                // body is all there it goes whole, with a Content-Length.
                let mut probe = self.rbuf.clone();
                let mut dec = ChunkedDecoder::new();
                let mut whole = BytesMut::new();
                loop {
                    match dec.decode(&mut probe) {
                        Ok(Decoded::Data(d)) => {
                            if (whole.len() + d.len()) as u64 > max {
                                return too_large();
                            }
                            whole.extend_from_slice(&d);
                        }
                        Ok(Decoded::Done) => {
                            self.rbuf = probe;
                            return BodyPlan::Ready(RequestBody::Full(whole.freeze()));
                        }
                        Ok(Decoded::NeedMore) => return BodyPlan::Stream,
                        Err(e) => return BodyPlan::Refuse(400, bad_chunked(&e)),
                    }
                }
            }
        }
    }

    /// Answer a request whose body is not taken, then close.
    async fn refuse(&mut self, code: u16, msg: &str) -> std::io::Result<()> {
        let m = &self.cache.metrics;
        if code == 408 {
            m.timeouts.fetch_add(1, Ordering::Relaxed);
        } else if code != 421 {
            m.bad_requests.fetch_add(1, Ordering::Relaxed);
        }
        m.response(code, 0);
        tracing::debug!(peer = %self.peer, status = code, reason = msg, "request refused");
        self.send(error_reply(code, msg, true, false), false)
            .await?;
        self.linger().await;
        Ok(())
    }

    /// Pass a request whose body is still arriving: the body is read and
    /// handed to the upstream piece by piece while the proxy waits for the
    /// answer. Returns whether the connection stays open.
    async fn forward(&mut self, head: &RequestHead) -> std::io::Result<bool> {
        let length = match head.body {
            BodyFraming::Length(n) => Some(n),
            _ => None,
        };
        let (tx, stream) = BodyStream::channel(length, BODY_DEPTH);
        let cache = self.cache;
        let peer = self.peer.ip();
        // The connection is busy reading the body meanwhile, so interim
        // responses wait and go just before the final one.
        let (sink, mut interims) = interim::channel(cache.via());
        let sink = (head.minor_version >= 1).then_some(sink);
        let (handled, pumped) = tokio::join!(
            panic::boundary(Box::pin(cache.handle_interim(
                head,
                RequestBody::Stream(stream),
                peer,
                sink
            ))),
            self.pump(head.body, tx)
        );
        let pumped = pumped?;
        let mut reply = match handled {
            Ok(r) => r,
            Err(p) => {
                // The rest of the body is unread: answer 500 and close.
                self.panicked(&p, head.method == Method::Head).await?;
                return Ok(false);
            }
        };
        if let Pumped::Failed(code, msg) = pumped {
            drop(reply);
            self.refuse(code, &msg).await?;
            return Ok(false);
        }
        let abandoned = matches!(pumped, Pumped::Abandoned);
        if abandoned {
            force_close(&mut reply);
        }
        while let Ok(bytes) = interims.try_recv() {
            self.out.extend_from_slice(&bytes);
        }
        let close = reply.close || !head.keep_alive;
        let clean = Box::pin(self.send(reply, head.method == Method::Head)).await?;
        if abandoned {
            self.linger().await;
            return Ok(false);
        }
        if close || !clean {
            self.flush().await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Read the body of the request being forwarded and hand it to `tx`,
    /// within the body's time limits and `max_request_body`.
    async fn pump(
        &mut self,
        framing: BodyFraming,
        tx: tokio::sync::mpsc::Sender<BodyPiece>,
    ) -> std::io::Result<Pumped> {
        let cfg = &self.cache.cfg;
        let max = cfg.max_request_body;
        let mut clock = BodyClock::new(cfg);
        let mut left = match framing {
            BodyFraming::Length(n) => Some(n),
            _ => None,
        };
        let mut dec = ChunkedDecoder::new();
        let mut total = 0u64;
        loop {
            let piece = match left {
                Some(0) => {
                    let _ = tx.send(BodyPiece::End).await;
                    return Ok(Pumped::Complete);
                }
                Some(_) if self.rbuf.is_empty() => None,
                Some(n) => {
                    let k = n.min(self.rbuf.len() as u64);
                    left = Some(n - k);
                    Some(self.rbuf.split_to(k as usize).freeze())
                }
                None => match dec.decode(&mut self.rbuf) {
                    Ok(Decoded::Data(d)) => {
                        total += d.len() as u64;
                        if total > max {
                            return Ok(Pumped::Failed(
                                413,
                                format!(
                                    "the request body is larger than the {max} bytes this cache accepts"
                                ),
                            ));
                        }
                        Some(d)
                    }
                    Ok(Decoded::Done) => {
                        let _ = tx.send(BodyPiece::End).await;
                        return Ok(Pumped::Complete);
                    }
                    Ok(Decoded::NeedMore) => None,
                    Err(e) => return Ok(Pumped::Failed(400, bad_chunked(&e))),
                },
            };
            if let Some(d) = piece {
                if tx.send(BodyPiece::Data(d)).await.is_err() {
                    return Ok(Pumped::Abandoned);
                }
                continue;
            }
            let Some(wait) = clock.allowance() else {
                return Ok(Pumped::Failed(408, clock.explain()));
            };
            let since = Instant::now();
            let read = tokio::select! {
                r = self.fill_with(since + wait, BODY_READ) => r,
                _ = tx.closed() => return Ok(Pumped::Abandoned),
            };
            match read {
                Ok(0) => {
                    return Ok(Pumped::Failed(
                        400,
                        "the request body ended before its end".into(),
                    ))
                }
                Ok(n) => clock.waited(since, n),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Ok(Pumped::Failed(408, clock.explain()))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Before closing a connection whose client may still be sending (an
    /// answer given before its body was read), stop writing and read what
    /// comes for a while: closing with unread bytes makes the kernel reset
    /// the connection, and the client would lose the answer.
    async fn linger(&mut self) {
        if self.flush().await.is_err() {
            return;
        }
        let until = Instant::now() + LINGER;
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

    /// Queue or write a reply. Returns false if its body could not be
    /// completed (the upstream failed mid-body): the connection must close
    /// so the client sees a truncated response, never a wrong one.
    async fn send(&mut self, reply: Reply, head_only: bool) -> std::io::Result<bool> {
        self.out.extend_from_slice(&reply.head);
        if reply.head.capacity() <= 4096 {
            // Recycled for the next reply's head.
            self.spare_head = reply.head;
        }
        let stats = reply.stats;
        match reply.body {
            ReplyBody::Empty => {}
            ReplyBody::Full(b) if head_only => drop(b),
            ReplyBody::Shared {
                bytes,
                file,
                offset,
            } => {
                if let Some(s) = &stats {
                    s.served(bytes.len() as u64);
                }
                if head_only {
                } else if bytes.len() <= INLINE_BODY {
                    self.out.extend_from_slice(&bytes);
                } else {
                    self.flush_more().await?;
                    if let Wire::Tls(tls) = &mut self.wire {
                        // Mapped already: encrypted from memory, no read.
                        wire::send(&self.stream, self.cache, tls, &bytes, true).await?;
                    } else {
                        self.send_file(&file, offset, bytes.len() as u64).await?;
                    }
                }
            }
            ReplyBody::Full(b) => {
                if let Some(s) = &stats {
                    s.served(b.len() as u64);
                }
                if b.len() <= INLINE_BODY {
                    self.out.extend_from_slice(&b);
                } else {
                    if let Wire::Tls(_) = self.wire {
                        // Head and body leave in one vectored write.
                        self.flush_more().await?;
                    } else {
                        self.flush().await?;
                    }
                    self.write(&b).await?;
                }
            }
            ReplyBody::Stream {
                mut reader,
                mut skip,
                mut take,
                chunked,
            } => {
                self.flush().await?;
                let mut sent = 0u64;
                let complete = loop {
                    match reader.next().await {
                        Ok(Some(mut b)) => {
                            b.clip(&mut skip, &mut take);
                            if !b.is_empty() {
                                sent += b.len();
                                if chunked {
                                    let mut h = Vec::with_capacity(12);
                                    chunk_header(b.len() as usize, &mut h);
                                    self.write_more(&h).await?;
                                    self.write_piece(&b).await?;
                                    self.write_more(b"\r\n").await?;
                                } else {
                                    self.write_piece(&b).await?;
                                }
                            }
                            if take == Some(0) {
                                break true;
                            }
                        }
                        Ok(None) => break true,
                        Err(e) => {
                            tracing::debug!(peer = %self.peer, error = %e.message, "stream ended early");
                            break false;
                        }
                    }
                };
                if let Some(s) = &stats {
                    s.served(sent);
                }
                self.cache
                    .metrics
                    .body_bytes_sent
                    .fetch_add(sent, Ordering::Relaxed);
                if !complete {
                    return Ok(false);
                }
                if chunked {
                    self.write(b"0\r\n\r\n").await?;
                }
            }
        }
        if self.out.len() > MAX_BATCH {
            self.flush().await?;
        }
        Ok(true)
    }

    /// Write a piece of a streamed body: bytes, or a range of the file it
    /// is being written to (sent from the file, never read into memory).
    async fn write_piece(&mut self, p: &Piece) -> std::io::Result<()> {
        match p {
            Piece::Bytes(b) => self.write(b).await,
            Piece::File { file, offset, len } => self.send_file(file, *offset, *len).await,
        }
    }

    /// Send `len` bytes of `file` from `offset` with sendfile(2): the kernel
    /// hands the file's pages to the socket without a copy in user space.
    async fn send_file(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        if let Wire::Tls(tls) = &mut self.wire {
            return wire::send_file(&self.stream, self.cache, tls, file, offset, len).await;
        }
        let mut off = offset;
        let end = offset + len;
        while off < end {
            let want = (end - off).min(1 << 30) as usize;
            let n = write_op(&self.stream, self.cache, |s| {
                let n = rustix::fs::sendfile(s, file, Some(&mut off), want)?;
                Ok((n, n < want))
            })
            .await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// Write the pending batch with MSG_MORE: the kernel holds it back to
    /// share packets with the file data that follows (like TCP_CORK). Over
    /// TLS the records stay buffered until the body follows.
    async fn flush_more(&mut self) -> std::io::Result<()> {
        let out = std::mem::take(&mut self.out);
        if let Wire::Tls(tls) = &mut self.wire {
            let r = wire::send(&self.stream, self.cache, tls, &out, false).await;
            self.out = out;
            self.out.clear();
            return r;
        }
        let mut at = 0;
        while at < out.len() {
            let rest = &out[at..];
            let n = write_op(&self.stream, self.cache, |s| {
                let n = rustix::net::send(s, rest, rustix::net::SendFlags::MORE)?;
                Ok((n, n < rest.len()))
            })
            .await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            at += n;
        }
        self.out = out;
        self.out.clear();
        Ok(())
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        self.write(&out).await?;
        // Keep a modest buffer for the next batch; drop a large one.
        if out.capacity() <= MAX_BATCH {
            self.out = out;
            self.out.clear();
        }
        Ok(())
    }

    /// Write `b`; over TLS, leave its records buffered to leave with
    /// the next write (a chunk's framing with its data, in one `writev`).
    async fn write_more(&mut self, b: &[u8]) -> std::io::Result<()> {
        if let Wire::Tls(tls) = &mut self.wire {
            return wire::send(&self.stream, self.cache, tls, b, false).await;
        }
        self.write(b).await
    }

    async fn write(&mut self, b: &[u8]) -> std::io::Result<()> {
        if let Wire::Tls(tls) = &mut self.wire {
            return wire::send(&self.stream, self.cache, tls, b, true).await;
        }
        let mut at = 0;
        while at < b.len() {
            let rest = &b[at..];
            let n = write_op(&self.stream, self.cache, |mut s| {
                let n = s.write(rest)?;
                Ok((n, n < rest.len()))
            })
            .await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            at += n;
        }
        Ok(())
    }
}

/// The 400 reason for a malformed chunked request body.
fn bad_chunked(e: &ParseError) -> String {
    format!("the chunked request body is malformed: {e}")
}

/// Make a reply end the connection (its request's body was not all read).
fn force_close(r: &mut Reply) {
    if !r.close && r.head.ends_with(b"\r\n\r\n") {
        r.head.truncate(r.head.len() - 2);
        r.head.extend_from_slice(b"Connection: close\r\n\r\n");
    }
    r.close = true;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;

    /// A connection's future is allocated at the size of its largest state
    /// and keeps it while idle: it must stay the `Conn` and the wait for the
    /// next request (about 1.3 KiB). A large state left unboxed on some
    /// branch (a handler's future, a reply, a select) shows here at once.
    #[tokio::test]
    async fn the_connection_future_stays_small() {
        let cache = Arc::new(Cache::new(CacheConfig::default()).unwrap());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = StdStream::connect(l.local_addr().unwrap()).unwrap();
        s.set_nonblocking(true).unwrap();
        let peer = s.local_addr().unwrap();
        // SAFETY: the AsyncFd owns the socket.
        let stream = unsafe { AsyncFd::register(s) }.unwrap();
        let f = serve(&cache, stream, Wire::Plain, peer, Handover::default());
        let size = std::mem::size_of_val(&f);
        assert!(size < 1600, "the connection future is {size} bytes");
    }
}
