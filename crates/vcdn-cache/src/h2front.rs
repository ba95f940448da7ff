//! The HTTP/2 front end: one cache, two front ends. A stream is turned into
//! the HTTP/1.1 request head the other front end would have parsed (so
//! every rule of the cache, and the strict parser's checks and limits,
//! apply unchanged), answered by [`Cache::at_once`] / [`Cache::handle`], and
//! the reply's HTTP/1.1 head is turned back into HTTP/2 fields.
//!
//! The protocol itself (framing, HPACK, flow control, stream states) is the
//! `h2` crate's: it is maintained, used by hyper and so by much of the Rust
//! ecosystem's HTTP/2 traffic, and hardened against the known attacks
//! (rapid reset CVE-2023-44487, CONTINUATION floods, HPACK bombs,
//! MadeYouReset). What this module adds is the limits of this cache
//! ([`CacheConfig`](crate::CacheConfig)'s `h2_*` fields, `max_header_bytes`,
//! the timeouts), a per-connection count of client resets on top of h2's,
//! a write timeout on the socket (a client that stops reading is cut off
//! after `send_timeout_ms`, as on HTTP/1.1), and GOAWAY when the cache
//! drains.
//!
//! Reached by h2c with prior knowledge on the plain listener (`server.rs`
//! hands over a connection whose first bytes are the HTTP/2 preface) and
//! by ALPN `h2` on the TLS listener. The caller holds the connection's
//! [`ConnectionSlot`](crate::server::ConnectionSlot).

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout, Instant, Sleep};
use vcdn_http::header::is_token;
use vcdn_http::{parse_request, parse_response, Limits, Method, RequestHead};

use crate::fetch::Piece;
use crate::interim;
use crate::metrics::{CacheStatus, HitTally};
use crate::panic;
use crate::proxy::{AtOnce, Cache};
use crate::reply::{error_reply, Reply, ReplyBody};
use crate::request_body::BodyClock;
use crate::upstream::{BodyPiece, BodyStream, RequestBody};

/// A request body that has all arrived within this many bytes goes to the
/// handler whole; a larger one is streamed upstream as it arrives.
const INLINE_REQUEST_BODY: usize = 64 * 1024;
/// Pieces of a streamed request body in flight to the upstream.
const BODY_DEPTH: usize = 2;
/// The most response bytes asked of flow control at once, and the size of
/// a read from a file piece.
const SEND_CHUNK: usize = 64 * 1024;
/// After an early answer, what the client still sends is read and dropped
/// for this long, and at most this much (see [`linger`]).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 << 20;

/// Fields that describe one HTTP/1.1 connection and are malformed in
/// HTTP/2 (RFC 9113 §8.2.2); `te` is allowed only as `trailers`.
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// Serve one HTTP/2 connection until it closes. `already_read` are bytes
/// read from `io` before the handoff (the preface, on h2c).
pub(crate) async fn serve<IO>(cache: Arc<Cache>, io: IO, peer: SocketAddr, already_read: Bytes)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let m = &cache.metrics;
    m.h2_connections_open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGauge(&m.h2_connections_open);
    let result = panic::boundary(connection(&cache, io, peer, already_read)).await;
    if let Err(p) = result {
        panic::report(m, &p, "serving an HTTP/2 connection; closed it", Some(peer));
    }
}

/// One HTTP/2 connection whose client sends the preface, then `input`,
/// then closes its side: what the server wrote back, within 5 s. For the
/// fuzz target `h2_connection` (the whole path: h2's frame and HPACK
/// parsing, this module, the cache); not an API.
#[doc(hidden)]
pub async fn serve_bytes(cache: Arc<Cache>, input: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let peer = SocketAddr::from(([127, 0, 0, 1], 1));
    let served = tokio::spawn(serve(cache, server, peer, Bytes::new()));
    let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    sent.extend_from_slice(input);
    let mut out = Vec::new();
    let exchange = async {
        let (mut r, mut w) = tokio::io::split(&mut client);
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
    let _ = timeout(Duration::from_secs(5), exchange).await;
    drop(client);
    let _ = timeout(Duration::from_secs(5), served).await;
    out
}

/// Decrements a gauge when dropped (also by a panic).
struct OpenGauge<'a>(&'a AtomicU64);

impl Drop for OpenGauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn builder(cfg: &crate::CacheConfig) -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.max_concurrent_streams(cfg.h2_max_concurrent_streams)
        .max_header_list_size(cfg.max_header_bytes.min(u32::MAX as usize) as u32)
        .initial_window_size(cfg.h2_stream_window)
        .initial_connection_window_size(cfg.h2_connection_window)
        .max_send_buffer_size(cfg.h2_max_send_buffer)
        .max_pending_accept_reset_streams(cfg.h2_max_pending_accept_reset_streams)
        .max_local_error_reset_streams(Some(cfg.h2_max_local_error_reset_streams));
    b
}

async fn connection<IO>(cache: &Arc<Cache>, io: IO, peer: SocketAddr, already_read: Bytes)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &cache.cfg;
    let m = &cache.metrics;
    let io = Guarded::new(io, already_read, Duration::from_millis(cfg.send_timeout_ms));
    // The client preface (and our SETTINGS out) within the header timeout.
    let handshake = builder(cfg).handshake::<_, Bytes>(io);
    let mut conn = match timeout(Duration::from_millis(cfg.header_timeout_ms), handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            m.bad_requests.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            m.timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "HTTP/2 preface did not arrive in time");
            return;
        }
    };
    // Streams the client reset while they were answered, of `opened`.
    let resets = Arc::new(AtomicU64::new(0));
    let mut opened = 0u64;
    let mut streams: JoinSet<()> = JoinSet::new();
    let idle = Duration::from_millis(cfg.idle_timeout_ms);
    let mut deadline = Instant::now() + idle;
    let mut draining = cache.draining.subscribe();
    // Set once GOAWAY is sent: the connection ends when its streams are
    // done, or at this deadline.
    let mut closing: Option<Instant> = None;
    loop {
        let until = closing.unwrap_or(deadline);
        tokio::select! {
            Some(_) = streams.join_next(), if !streams.is_empty() => {
                deadline = Instant::now() + idle;
            }
            accepted = conn.accept() => match accepted {
                Some(Ok((req, respond))) => {
                    m.h2_streams.fetch_add(1, Ordering::Relaxed);
                    opened += 1;
                    deadline = Instant::now() + idle;
                    let (cache, resets) = (cache.clone(), resets.clone());
                    streams.spawn(stream(cache, req, respond, peer, resets));
                }
                Some(Err(e)) => {
                    ended_by(cache, peer, &e);
                    break;
                }
                None => break,
            },
            r = draining.wait_for(|d| *d), if closing.is_none() => {
                if r.is_ok() {
                    conn.graceful_shutdown();
                    closing = Some(Instant::now() + Duration::from_millis(cfg.drain_timeout_ms));
                } else {
                    closing = Some(Instant::now());
                }
            }
            _ = sleep_until(until) => {
                if closing.is_some() {
                    tracing::debug!(%peer, "HTTP/2 streams did not finish within the drain time");
                    break;
                }
                if streams.is_empty() {
                    // Idle: say GOAWAY, give the client a moment to see it.
                    conn.graceful_shutdown();
                    closing = Some(Instant::now() + Duration::from_secs(1));
                } else {
                    deadline = Instant::now() + idle;
                }
            }
        }
        let reset = resets.load(Ordering::Relaxed);
        if reset > cfg.h2_max_client_resets && reset * 2 > opened && closing.is_none() {
            m.h2_abuse.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, resets = cfg.h2_max_client_resets, "HTTP/2 client reset too many streams; GOAWAY ENHANCE_YOUR_CALM");
            conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
            closing = Some(Instant::now() + Duration::from_secs(1));
        }
    }
    // Dropping the set aborts streams still running: their connection is
    // gone.
    streams.shutdown().await;
}

/// Account for an HTTP/2 connection that ended in an error.
fn ended_by(cache: &Cache, peer: SocketAddr, e: &h2::Error) {
    let m = &cache.metrics;
    if e.is_io() {
        let timed_out = e
            .get_io()
            .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut);
        if timed_out {
            m.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(%peer, error = %e, "HTTP/2 connection ended");
        return;
    }
    if e.is_go_away() && e.reason() == Some(Reason::NO_ERROR) {
        return;
    }
    m.h2_abuse.fetch_add(1, Ordering::Relaxed);
    tracing::info!(%peer, error = %e, "HTTP/2 connection closed for a protocol error");
}

/// One stream: its request answered, within a panic boundary of its own (a
/// panic costs this stream a 500 or a reset, never the connection).
async fn stream(
    cache: Arc<Cache>,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: SocketAddr,
    resets: Arc<AtomicU64>,
) {
    let mut started = false;
    let head_only = req.method() == http::Method::HEAD;
    let answered = panic::boundary(answer(
        &cache,
        req,
        &mut respond,
        &mut started,
        peer,
        &resets,
    ))
    .await;
    if let Err(p) = answered {
        panic::report(
            &cache.metrics,
            &p,
            "answering an HTTP/2 stream; answered 500",
            Some(peer),
        );
        if started {
            respond.send_reset(Reason::INTERNAL_ERROR);
        } else {
            cache.metrics.request(CacheStatus::Error);
            cache.metrics.response(500, 0);
            let r = error_reply(
                500,
                "the cache failed on this request (an internal error, logged for the operator)",
                false,
                head_only,
            );
            let _ = send_reply(&cache, &mut respond, &mut false, r, head_only, peer).await;
        }
    }
}

/// The client's request as the HTTP/1.1 front end would have parsed it;
/// `Err` is how to refuse it.
enum Refusal {
    /// Malformed in HTTP/2 terms: reset the stream.
    Reset(Reason),
    /// Answer this status with this reason.
    Status(u16, String),
}

async fn answer(
    cache: &Arc<Cache>,
    req: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    started: &mut bool,
    peer: SocketAddr,
    resets: &AtomicU64,
) {
    let (parts, mut body) = req.into_parts();
    answer_parts(cache, parts, &mut body, respond, started, peer, resets).await;
    if !body.is_end_stream() && *started {
        linger(&mut body).await;
    }
}

/// After an answer given before the request body was all read (an error,
/// or an upstream that answered early): read and drop what the client
/// still sends for a while, so the stream ends cleanly rather than with a
/// reset that makes some clients drop the answer (as HTTP/1.1 lingers
/// before closing).
async fn linger(body: &mut RecvStream) {
    let until = Instant::now() + LINGER;
    let mut dropped = 0;
    while dropped < LINGER_BYTES && !body.is_end_stream() {
        match tokio::time::timeout_at(until, body.data()).await {
            Ok(Some(Ok(d))) => {
                dropped += d.len();
                let _ = body.flow_control().release_capacity(d.len());
            }
            _ => return,
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn answer_parts(
    cache: &Arc<Cache>,
    parts: http::request::Parts,
    body: &mut RecvStream,
    respond: &mut SendResponse<Bytes>,
    started: &mut bool,
    peer: SocketAddr,
    resets: &AtomicU64,
) {
    let cfg = &cache.cfg;
    let max = cfg.max_request_body;
    let has_body = !body.is_end_stream();
    // A body that is all here within a few KiB goes whole (with its length);
    // a larger one is streamed.
    let mut whole: Option<Bytes> = None;
    let mut clock = BodyClock::new(cfg);
    if has_body {
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return refuse(cache, respond, started, 413, &too_large(max), peer).await;
        }
        let mut got = BytesMut::new();
        loop {
            if body.is_end_stream() {
                whole = Some(std::mem::take(&mut got).freeze());
                break;
            }
            if got.len() >= INLINE_REQUEST_BODY {
                break;
            }
            match next_data(body, &mut clock).await {
                Ok(Some(d)) => {
                    if (got.len() + d.len()) as u64 > max {
                        return refuse(cache, respond, started, 413, &too_large(max), peer).await;
                    }
                    got.extend_from_slice(&d);
                }
                Ok(None) => {
                    whole = Some(std::mem::take(&mut got).freeze());
                    break;
                }
                Err(r) => return refused(cache, respond, started, r, peer).await,
            }
        }
        if whole.is_none() {
            // Stream it: what was read so far goes first.
            return stream_body(
                cache,
                parts,
                body,
                got.freeze(),
                clock,
                respond,
                started,
                peer,
            )
            .await;
        }
    }
    let head = match request_head(cache, &parts, whole.as_ref().map(Bytes::len)) {
        Ok(h) => h,
        Err(r) => return refused(cache, respond, started, r, peer).await,
    };
    let head_only = head.method == Method::Head;
    let body = whole.map_or(RequestBody::None, RequestBody::from);
    let reply = match at_once(cache, &head) {
        Ok(r) => r,
        Err(()) => {
            // The upstream's 1xx interim responses (103 Early Hints) go to
            // the client as informational HEADERS before the final answer,
            // as the HTTP/1.1 front end writes them (`crate::interim`).
            let (sink, mut interims) = interim::channel(cache.via());
            let handled = cache.handle_interim(&head, body, peer.ip(), Some(sink));
            tokio::pin!(handled);
            let reply = loop {
                tokio::select! {
                    biased;
                    Some(bytes) = interims.recv() => send_interim(respond, &bytes),
                    r = &mut handled => break r,
                    _ = poll_fn(|cx| respond.poll_reset(cx)) => {
                        resets.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            };
            while let Ok(bytes) = interims.try_recv() {
                send_interim(respond, &bytes);
            }
            reply
        }
    };
    if !send_reply(cache, respond, started, reply, head_only, peer).await {
        resets.fetch_add(1, Ordering::Relaxed);
    }
}

/// A fresh memory hit answered at once, or `Err` for the handler.
fn at_once(cache: &Cache, head: &RequestHead) -> Result<Reply, ()> {
    let mut out = Vec::new();
    let mut spare = Vec::new();
    let mut tally = HitTally::default();
    // No body is copied into `out` (max_body 0): bodies go as slices of
    // the stored bytes.
    match cache.at_once(head, &mut out, 0, &mut spare, &mut tally) {
        AtOnce::Written { .. } => {
            cache.metrics.add_hits(&mut tally);
            let out = Bytes::from(out);
            let n = parse_response(&out, &reply_limits())
                .ok()
                .flatten()
                .map_or(out.len(), |(_, n)| n);
            let status = out
                .get(9..12)
                .and_then(|s| std::str::from_utf8(s).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(200);
            let body = out.slice(n..);
            Ok(Reply {
                status,
                head: out[..n].to_vec(),
                body: if body.is_empty() {
                    ReplyBody::Empty
                } else {
                    ReplyBody::Full(body)
                },
                close: false,
                stats: None,
            })
        }
        AtOnce::Reply(r) => Ok(r),
        AtOnce::Later => Err(()),
    }
}

/// Limits for parsing the cache's own reply heads (trusted, but bounded).
fn reply_limits() -> Limits {
    Limits {
        max_request_line: 8 << 10,
        max_head: 1 << 20,
        max_headers: 1000,
    }
}

fn too_large(max: u64) -> String {
    format!("the request body is larger than the {max} bytes this cache accepts")
}

/// The next piece of a request body, its flow-control capacity given back
/// (the bytes are ours now: the client may send more), within the body's
/// time limits. `Ok(None)` at the end.
async fn next_data(body: &mut RecvStream, clock: &mut BodyClock) -> Result<Option<Bytes>, Refusal> {
    let Some(wait) = clock.allowance() else {
        return Err(Refusal::Status(408, clock.explain()));
    };
    let since = std::time::Instant::now();
    match timeout(wait, body.data()).await {
        Err(_) => Err(Refusal::Status(408, clock.explain())),
        Ok(None) => Ok(None),
        Ok(Some(Ok(d))) => {
            clock.waited(since, d.len());
            let _ = body.flow_control().release_capacity(d.len());
            Ok(Some(d))
        }
        Ok(Some(Err(e))) => Err(Refusal::Reset(e.reason().unwrap_or(Reason::CANCEL))),
    }
}

/// The HTTP/1.1 request head of an HTTP/2 request, parsed by the strict
/// parser. `body_len`: the length of a body that has all arrived, sent as
/// Content-Length; `None` with a body still arriving keeps the client's
/// Content-Length, or says chunked.
fn request_head(
    cache: &Cache,
    parts: &http::request::Parts,
    body_len: Option<usize>,
) -> Result<RequestHead, Refusal> {
    serialise(parts, body_len).and_then(|h1| {
        let cfg = &cache.cfg;
        let limits = Limits {
            max_request_line: cfg.max_request_line,
            max_head: cfg.max_header_bytes,
            max_headers: cfg.max_headers,
        };
        match parse_request(&h1, &limits) {
            Ok(Some((head, _))) => Ok(head),
            Ok(None) => Err(Refusal::Status(400, "incomplete request head".into())),
            Err(e) => Err(Refusal::Status(e.status(), e.to_string())),
        }
    })
}

/// Write the request as an HTTP/1.1 head. Fields HTTP/2 forbids are a
/// stream error (`PROTOCOL_ERROR`); values are checked for the bytes that
/// would end a line, so nothing can be smuggled into the head.
fn serialise(parts: &http::request::Parts, body_len: Option<usize>) -> Result<Bytes, Refusal> {
    let malformed = Err(Refusal::Reset(Reason::PROTOCOL_ERROR));
    let mut h = Vec::with_capacity(512);
    h.extend_from_slice(parts.method.as_str().as_bytes());
    h.push(b' ');
    let target = match parts.uri.path_and_query() {
        Some(pq) => pq.as_str(),
        None if parts.method == http::Method::CONNECT => "",
        None => return malformed,
    };
    if target.is_empty() {
        // CONNECT: authority-form, refused by the parser (501).
        h.extend_from_slice(parts.uri.authority().map_or("", |a| a.as_str()).as_bytes());
    } else {
        h.extend_from_slice(target.as_bytes());
    }
    h.extend_from_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority().map(|a| a.as_str());
    if let Some(a) = authority {
        // RFC 9113 §8.3.1: Host, if also sent, must name the same.
        if parts
            .headers
            .get_all(http::header::HOST)
            .iter()
            .any(|v| v.as_bytes() != a.as_bytes())
        {
            return malformed;
        }
        h.extend_from_slice(b"host: ");
        h.extend_from_slice(a.as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    let mut cookies: Vec<&[u8]> = Vec::new();
    for (name, value) in &parts.headers {
        let n = name.as_str();
        if CONNECTION_SPECIFIC.contains(&n) {
            return malformed;
        }
        if n == "te" {
            if value.as_bytes() != b"trailers" {
                return malformed;
            }
            continue;
        }
        if !is_token(n.as_bytes())
            || value
                .as_bytes()
                .iter()
                .any(|&c| c == b'\r' || c == b'\n' || c == 0)
        {
            return malformed;
        }
        if (n == "host" && authority.is_some()) || (n == "content-length" && body_len.is_some()) {
            continue;
        }
        if n == "cookie" {
            // RFC 9113 §8.2.3: crumbs are joined into one field.
            cookies.push(value.as_bytes());
            continue;
        }
        h.extend_from_slice(n.as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(value.as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    if !cookies.is_empty() {
        h.extend_from_slice(b"cookie: ");
        h.extend_from_slice(&cookies.join(&b"; "[..]));
        h.extend_from_slice(b"\r\n");
    }
    match body_len {
        Some(0) => {}
        Some(n) => {
            h.extend_from_slice(b"content-length: ");
            h.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            h.extend_from_slice(b"\r\n");
        }
        None if parts.headers.contains_key(http::header::CONTENT_LENGTH) => {}
        None => h.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    h.extend_from_slice(b"\r\n");
    Ok(Bytes::from(h))
}

/// Answer a request whose body is still arriving: the body is handed to
/// the upstream piece by piece while the cache waits for the answer.
#[allow(clippy::too_many_arguments)]
async fn stream_body(
    cache: &Arc<Cache>,
    parts: http::request::Parts,
    body: &mut RecvStream,
    first: Bytes,
    mut clock: BodyClock,
    respond: &mut SendResponse<Bytes>,
    started: &mut bool,
    peer: SocketAddr,
) {
    let head = match request_head(cache, &parts, None) {
        Ok(h) => h,
        Err(r) => return refused(cache, respond, started, r, peer).await,
    };
    let length = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (tx, rx) = BodyStream::channel(length, BODY_DEPTH);
    let max = cache.cfg.max_request_body;
    let pump = async {
        // Owned here: dropped without End when the body fails, which tells
        // the upstream side to give up.
        let tx = tx;
        let mut total = first.len() as u64;
        if !first.is_empty() && tx.send(BodyPiece::Data(first)).await.is_err() {
            return Ok(());
        }
        loop {
            let d = tokio::select! {
                d = next_data(body, &mut clock) => d?,
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
        cache.handle(&head, RequestBody::Stream(rx), peer.ip()),
        pump
    );
    if let Err(r) = pumped {
        drop(reply);
        return refused(cache, respond, started, r, peer).await;
    }
    send_reply(
        cache,
        respond,
        started,
        reply,
        head.method == Method::Head,
        peer,
    )
    .await;
}

async fn refused(
    cache: &Cache,
    respond: &mut SendResponse<Bytes>,
    started: &mut bool,
    r: Refusal,
    peer: SocketAddr,
) {
    match r {
        Refusal::Reset(reason) => {
            cache.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, ?reason, "HTTP/2 stream refused");
            respond.send_reset(reason);
        }
        Refusal::Status(code, msg) => refuse(cache, respond, started, code, &msg, peer).await,
    }
}

/// Answer a request the parser or the body rules refuse, as HTTP/1.1 does.
async fn refuse(
    cache: &Cache,
    respond: &mut SendResponse<Bytes>,
    started: &mut bool,
    code: u16,
    msg: &str,
    peer: SocketAddr,
) {
    let m = &cache.metrics;
    if code == 408 {
        m.timeouts.fetch_add(1, Ordering::Relaxed);
    } else {
        m.bad_requests.fetch_add(1, Ordering::Relaxed);
    }
    m.response(code, 0);
    tracing::debug!(%peer, status = code, reason = msg, "HTTP/2 request refused");
    let r = error_reply(code, msg, false, false);
    send_reply(cache, respond, started, r, false, peer).await;
}

/// The HTTP/2 response head of a reply's HTTP/1.1 head, without the fields
/// that describe an HTTP/1.1 connection.
fn response_head(reply: &Reply) -> Response<()> {
    fields(Bytes::copy_from_slice(&reply.head), reply.status)
}

/// Send one interim response (its HTTP/1.1 head from `crate::interim`) as
/// informational HEADERS; a stream the client reset is not an error.
fn send_interim(respond: &mut SendResponse<Bytes>, head: &Bytes) {
    let resp = fields(head.clone(), 103);
    if resp.status().is_informational() {
        let _ = respond.send_informational(resp);
    }
}

/// An HTTP/1.1 response head as HTTP/2 fields: status, and the fields
/// without the connection-specific ones. `status` if it cannot be parsed.
fn fields(head: Bytes, status: u16) -> Response<()> {
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let Ok(Some((parsed, _))) = parse_response(&head, &reply_limits()) else {
        return resp;
    };
    if let Ok(s) = StatusCode::from_u16(parsed.status) {
        *resp.status_mut() = s;
    }
    let h = resp.headers_mut();
    for (n, v) in parsed.headers.iter() {
        let lower = n.to_ascii_lowercase();
        if CONNECTION_SPECIFIC.iter().any(|c| c.as_bytes() == lower) {
            continue;
        }
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&lower),
            HeaderValue::from_maybe_shared(v.clone()),
        ) else {
            continue;
        };
        h.append(name, value);
    }
    resp
}

/// Send a reply on the stream, its body within flow control. Returns
/// false if the client went away (reset) before it was all sent.
async fn send_reply(
    cache: &Cache,
    respond: &mut SendResponse<Bytes>,
    started: &mut bool,
    reply: Reply,
    head_only: bool,
    peer: SocketAddr,
) -> bool {
    let resp = response_head(&reply);
    let no_body =
        head_only || matches!(reply.body, ReplyBody::Empty) || matches!(reply.status, 204 | 304);
    *started = true;
    let mut tx = match respond.send_response(resp, no_body) {
        Ok(tx) => tx,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "HTTP/2 response not sent");
            return false;
        }
    };
    if no_body {
        return true;
    }
    let wait = Duration::from_millis(cache.cfg.send_timeout_ms);
    let stats = reply.stats;
    let sent = match reply.body {
        ReplyBody::Empty => Ok(()),
        ReplyBody::Full(b) | ReplyBody::Shared { bytes: b, .. } => {
            if let Some(s) = &stats {
                s.served(b.len() as u64);
            }
            send_bytes(&mut tx, b, true, wait).await
        }
        ReplyBody::Stream {
            mut reader,
            mut skip,
            mut take,
            ..
        } => {
            let mut sent = 0u64;
            let r = loop {
                match reader.next().await {
                    Ok(Some(mut p)) => {
                        if skip > 0 {
                            let n = skip.min(p.len());
                            p.advance(n);
                            skip -= n;
                        }
                        if let Some(t) = take.as_mut() {
                            p.truncate(*t);
                            *t -= p.len();
                        }
                        sent += p.len();
                        if let Err(e) = send_piece(&mut tx, p, wait).await {
                            break Err(e);
                        }
                        if take == Some(0) {
                            break send_bytes(&mut tx, Bytes::new(), true, wait).await;
                        }
                    }
                    Ok(None) => break send_bytes(&mut tx, Bytes::new(), true, wait).await,
                    Err(e) => {
                        // The upstream failed mid-body: the client must see
                        // a cut response, never a complete wrong one.
                        tracing::debug!(%peer, error = %e.message, "stream ended early");
                        tx.send_reset(Reason::INTERNAL_ERROR);
                        break Ok(());
                    }
                }
            };
            if let Some(s) = &stats {
                s.served(sent);
            }
            cache
                .metrics
                .body_bytes_sent
                .fetch_add(sent, Ordering::Relaxed);
            r
        }
    };
    match sent {
        Ok(()) => true,
        Err(SendFailed::TimedOut) => {
            cache.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "HTTP/2 client did not open its window in time; stream reset");
            tx.send_reset(Reason::CANCEL);
            true
        }
        Err(SendFailed::Gone) => false,
    }
}

enum SendFailed {
    /// The client gave no window within the send timeout.
    TimedOut,
    /// The stream or the connection is gone.
    Gone,
}

/// Wait until flow control grants some of the `want` bytes.
async fn capacity(
    tx: &mut SendStream<Bytes>,
    want: usize,
    wait: Duration,
) -> Result<usize, SendFailed> {
    tx.reserve_capacity(want);
    let deadline = Instant::now() + wait;
    loop {
        let cap = tx.capacity();
        if cap > 0 {
            return Ok(cap.min(want));
        }
        match tokio::time::timeout_at(deadline, poll_fn(|cx| tx.poll_capacity(cx))).await {
            Err(_) => return Err(SendFailed::TimedOut),
            Ok(None) | Ok(Some(Err(_))) => return Err(SendFailed::Gone),
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// Send bytes as DATA frames as the windows allow, slices of `b` (no copy).
async fn send_bytes(
    tx: &mut SendStream<Bytes>,
    mut b: Bytes,
    end: bool,
    wait: Duration,
) -> Result<(), SendFailed> {
    if b.is_empty() {
        return if end {
            tx.send_data(b, true).map_err(|_| SendFailed::Gone)
        } else {
            Ok(())
        };
    }
    while !b.is_empty() {
        let n = capacity(tx, b.len().min(SEND_CHUNK), wait).await?;
        let piece = b.split_to(n.min(b.len()));
        tx.send_data(piece, end && b.is_empty())
            .map_err(|_| SendFailed::Gone)?;
    }
    Ok(())
}

/// Send a piece of a streamed body: bytes, or a range of the file it is
/// being written to, read with pread as the windows allow (never more than
/// one window's worth in memory).
async fn send_piece(
    tx: &mut SendStream<Bytes>,
    p: Piece,
    wait: Duration,
) -> Result<(), SendFailed> {
    match p {
        Piece::Bytes(b) => send_bytes(tx, b, false, wait).await,
        Piece::File { file, offset, len } => {
            let mut off = offset;
            let end = offset + len;
            while off < end {
                let want = ((end - off) as usize).min(SEND_CHUNK);
                let n = capacity(tx, want, wait).await?;
                let mut buf = vec![0u8; n];
                let got = std::os::unix::fs::FileExt::read_at(&*file, &mut buf, off)
                    .map_err(|_| SendFailed::Gone)?;
                if got == 0 {
                    return Err(SendFailed::Gone);
                }
                buf.truncate(got);
                off += got as u64;
                tx.send_data(Bytes::from(buf), false)
                    .map_err(|_| SendFailed::Gone)?;
            }
            Ok(())
        }
    }
}

/// The connection's socket as h2 sees it: the bytes read before the
/// handoff come first, and a write that makes no progress for the send
/// timeout fails (a client that stops reading, or never opens its TCP
/// window, is cut off as on HTTP/1.1).
struct Guarded<IO> {
    io: IO,
    prefix: Bytes,
    wait: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> Guarded<IO> {
    fn new(io: IO, prefix: Bytes, wait: Duration) -> Self {
        Guarded {
            io,
            prefix,
            wait,
            stalled: None,
        }
    }

    /// After a write that did not progress: fail once the timer runs out.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let wait = self.wait;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "client did not read the response in time",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let p = self.prefix.split_to(n);
            buf.put_slice(&p);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Pending => self.stall(cx).map(Err),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.stall(cx).map(Err),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.stall(cx).map(Err),
            r => {
                self.stalled = None;
                r
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(req: http::Request<()>) -> http::request::Parts {
        req.into_parts().0
    }

    fn text(r: Result<Bytes, Refusal>) -> String {
        match r {
            Ok(b) => String::from_utf8(b.to_vec()).unwrap(),
            Err(Refusal::Reset(r)) => format!("reset {r:?}"),
            Err(Refusal::Status(c, m)) => format!("{c} {m}"),
        }
    }

    #[test]
    fn a_request_becomes_the_http1_head_the_other_front_end_parses() {
        let p = parts(
            http::Request::get("http://example.com/a?b=1")
                .header("accept", "*/*")
                .header("cookie", "a=1")
                .header("cookie", "b=2")
                .header("te", "trailers")
                .body(())
                .unwrap(),
        );
        assert_eq!(
            text(serialise(&p, None)),
            "GET /a?b=1 HTTP/1.1\r\nhost: example.com\r\naccept: */*\r\ncookie: a=1; b=2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        assert!(text(serialise(&p, Some(0))).ends_with("b=2\r\n\r\n"));
        assert!(text(serialise(&p, Some(5))).ends_with("content-length: 5\r\n\r\n"));
    }

    #[test]
    fn connection_specific_fields_and_a_different_host_are_malformed() {
        for (n, v) in [
            ("connection", "close"),
            ("keep-alive", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("te", "gzip"),
            ("host", "other.example"),
        ] {
            let p = parts(
                http::Request::get("http://example.com/")
                    .header(n, v)
                    .body(())
                    .unwrap(),
            );
            assert_eq!(text(serialise(&p, Some(0))), "reset PROTOCOL_ERROR", "{n}");
        }
    }
}
