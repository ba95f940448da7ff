//! The upstream client: an origin or a parent cache, reached over pooled
//! keep-alive HTTP/1.1 connections, with connect, read and write timeouts
//! and one retry of an idempotent request when a connection fails before
//! any response byte (and before any streamed body byte was sent).
//!
//! Two guards sit at connect time. The operator's origin policy is applied
//! to every address the upstream name resolves to, at each connect (a name
//! may resolve to something else later: DNS rebinding), and only allowed
//! addresses are tried. A pooled connection is checked before reuse: one
//! the upstream closed (or that has unexpected bytes waiting) is dropped,
//! and none is kept idle longer than `idle_timeout`, which stays under
//! common origins' keep-alive timeouts (Apache closes after 5 s), so a
//! request that cannot be retried (a POST) is not sent into a dead socket.
//!
//! An `https://` upstream is reached over TLS (see [`crate::upstream_tls`]):
//! the handshake is part of connecting (same timeout, 504 when it does not
//! finish), a certificate that does not verify is a 502 that says why, and
//! TLS connections are pooled and checked before reuse like plain ones.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use vcdn_http::chunked::{chunk_header, ChunkedDecoder, Decoded};
use vcdn_http::response::ResponseFraming;
use vcdn_http::{parse_response, Limits, ResponseHead};
use vcdn_policy::origin::{OriginPolicy, Refused};

use crate::interim::{InterimSink, MAX_INTERIM};
use crate::upstream_tls::{needs_https, Conn, TlsFailure, TlsFailures, TlsReason, UpstreamTls};

/// Where and how to reach the upstream.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `http://host:port[/base]` or `https://...`, as given by the operator.
    pub url: String,
    pub connect_timeout: Duration,
    /// Longest wait for the upstream to send or to accept bytes.
    pub read_timeout: Duration,
    pub max_idle: usize,
    /// A pooled connection idle longer than this is not used again.
    pub idle_timeout: Duration,
    /// Addresses the cache may connect to (empty: all).
    pub policy: OriginPolicy,
    /// PEM bundle of the CAs an `https://` upstream's certificate is
    /// verified against (none: the system roots).
    pub ca_file: Option<PathBuf>,
    /// Name sent in SNI and verified in the certificate instead of the
    /// URL's host (an origin addressed by IP, or a pinned name).
    pub tls_name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to upstream {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("upstream {0} did not accept a connection within {1:?}")]
    ConnectTimeout(String, Duration),
    /// TCP connected, but the TLS handshake did not finish in time.
    #[error(
        "upstream {0} accepted a connection but did not complete the TLS handshake within {1:?}"
    )]
    TlsTimeout(String, Duration),
    /// The TLS handshake failed: the certificate did not verify, or the
    /// upstream does not speak TLS as asked.
    #[error("upstream {0}: {1}")]
    Tls(String, TlsFailure),
    #[error("upstream {0} sent nothing for {1:?}")]
    Timeout(String, Duration),
    #[error("upstream {0} accepted no request bytes for {1:?}")]
    WriteTimeout(String, Duration),
    #[error("upstream {0} closed the connection: {1}")]
    Closed(String, String),
    #[error("upstream {0} sent an invalid response: {1}")]
    Invalid(String, String),
    /// Every address of the upstream is refused by the origin policy.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The client's request body stopped before its end (too slow, too
    /// large, malformed or cut): the request was abandoned upstream.
    #[error("the request body from the client ended before it was complete")]
    BodyAborted,
}

impl UpstreamError {
    /// 504 for timeouts, 400 for a client body that did not arrive, 502
    /// for everything else.
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::ConnectTimeout(..)
            | UpstreamError::TlsTimeout(..)
            | UpstreamError::Timeout(..)
            | UpstreamError::WriteTimeout(..) => 504,
            UpstreamError::BodyAborted => 400,
            _ => 502,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid upstream URL {0:?}: {1}")]
pub struct BadUrl(String, String);

#[derive(Debug)]
pub struct Upstream {
    cfg: UpstreamConfig,
    /// `host:port` to resolve at each connect.
    host_port: String,
    /// Value of the Host field sent upstream.
    pub authority: String,
    /// Path prefix prepended to every request path.
    base_path: String,
    /// Idle keep-alive connections, oldest first, each with the thread that
    /// opened it and when it was pooled. A connection is registered with the
    /// reactor of that thread's runtime, so only that thread takes it again:
    /// on another, its readiness would wait for the owner to turn its
    /// reactor, which a busy serving thread does only between batches of
    /// its ring.
    idle: Mutex<Vec<Pooled>>,
    /// Requests sent a second time after a failed connection.
    pub retries: std::sync::atomic::AtomicU64,
    /// For an `https://` upstream: the TLS client, built once.
    tls: Option<UpstreamTls>,
    /// TLS handshakes that failed, by reason.
    pub tls_failures: TlsFailures,
    /// TLS connections opened, and how many of them resumed a session.
    pub tls_handshakes: std::sync::atomic::AtomicU64,
    pub tls_resumed: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Pooled {
    owner: ThreadId,
    since: Instant,
    conn: Conn,
}

/// A request to send upstream.
pub struct UpstreamRequest<'a> {
    pub method: &'a [u8],
    pub path_and_query: &'a [u8],
    /// Fields to send, hop-by-hop ones already removed; Host is added here.
    pub headers: Vec<(Bytes, Bytes)>,
    pub idempotent: bool,
    pub head_only: bool,
    /// Where to pass 1xx interim responses (`crate::interim`); None drops
    /// them.
    pub interim: Option<InterimSink>,
}

/// The body of a request to forward.
#[derive(Debug, Default)]
pub enum RequestBody {
    #[default]
    None,
    /// The whole body, already read.
    Full(Bytes),
    /// A body still arriving from the client, forwarded as it comes.
    Stream(BodyStream),
}

/// A complete body; empty is none.
impl From<Bytes> for RequestBody {
    fn from(b: Bytes) -> RequestBody {
        if b.is_empty() {
            RequestBody::None
        } else {
            RequestBody::Full(b)
        }
    }
}

/// A request body that arrives piece by piece from the client's connection
/// through a small bounded channel: the connection reads only as fast as
/// the upstream takes, so an upload of any size holds a few pieces.
#[derive(Debug)]
pub struct BodyStream {
    /// The client's Content-Length, sent upstream as is; `None`: the
    /// body is sent chunked.
    pub length: Option<u64>,
    pub pieces: mpsc::Receiver<BodyPiece>,
}

/// One message of a [`BodyStream`]. The channel closing without `End`
/// means the client's body failed: the upstream request is abandoned.
#[derive(Debug)]
pub enum BodyPiece {
    Data(Bytes),
    End,
}

impl BodyStream {
    /// A stream and the sender that feeds it, holding at most `depth`
    /// pieces in flight.
    pub fn channel(length: Option<u64>, depth: usize) -> (mpsc::Sender<BodyPiece>, BodyStream) {
        let (tx, rx) = mpsc::channel(depth);
        (tx, BodyStream { length, pieces: rx })
    }
}

/// How one exchange failed: the error, and whether the request may be sent
/// again on another connection (no response byte arrived and no piece of a
/// streamed body was used up).
type Failed = (UpstreamError, bool);

impl Upstream {
    pub fn new(cfg: UpstreamConfig) -> Result<Upstream, BadUrl> {
        let url = cfg.url.clone();
        let bad = |why: &str| BadUrl(url.clone(), why.to_string());
        let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => return Err(bad("give http://host[:port][/path] or https://...")),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        let (host, with_port) = match authority.rsplit_once(':') {
            Some((h, p))
                if p.parse::<u16>().is_ok() && (!h.starts_with('[') || h.ends_with(']')) =>
            {
                (h, authority.to_string())
            }
            _ => (
                authority,
                format!("{authority}:{}", if https { 443 } else { 80 }),
            ),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let tls = if https {
            Some(
                UpstreamTls::new(host, cfg.tls_name.as_deref(), cfg.ca_file.as_deref())
                    .map_err(|e| BadUrl(url.clone(), e))?,
            )
        } else {
            if cfg.ca_file.is_some() {
                needs_https("--origin-ca-file", &url).map_err(|e| BadUrl(url.clone(), e))?;
            }
            if cfg.tls_name.is_some() {
                needs_https("--origin-tls-name", &url).map_err(|e| BadUrl(url.clone(), e))?;
            }
            None
        };
        // Checked once here so that a typo stops the start; the name is
        // resolved again at every connect.
        let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&with_port)
            .map_err(|_| bad("host does not resolve"))?
            .collect();
        if addrs.is_empty() {
            return Err(bad("host does not resolve"));
        }
        // Said at start too, so that the operator does not learn it from
        // the first client's 502.
        let refused: Vec<Refused> = addrs
            .iter()
            .filter_map(|a| cfg.policy.check(*a).err())
            .collect();
        if refused.len() == addrs.len() {
            tracing::warn!(upstream = %url, "{}; requests that need the upstream will get 502", refused[0]);
        }
        Ok(Upstream {
            authority: authority.to_string(),
            base_path: path.to_string(),
            host_port: with_port,
            cfg,
            idle: Mutex::new(Vec::new()),
            retries: Default::default(),
            tls,
            tls_failures: TlsFailures::default(),
            tls_handshakes: Default::default(),
            tls_resumed: Default::default(),
        })
    }

    pub fn url(&self) -> &str {
        &self.cfg.url
    }

    pub fn idle_connections(&self) -> usize {
        self.idle.lock().len()
    }

    /// The upstream TLS counters in the Prometheus text format (nothing
    /// for a plain http:// upstream).
    pub fn render_tls_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        if self.tls.is_none() {
            return;
        }
        self.tls_failures.render(out);
        for (name, help, v) in [
            (
                "vcdn_cache_upstream_tls_handshakes_total",
                "TLS connections opened to the upstream.",
                self.tls_handshakes.load(Relaxed),
            ),
            (
                "vcdn_cache_upstream_tls_resumed_total",
                "TLS connections to the upstream that resumed a session (no full handshake).",
                self.tls_resumed.load(Relaxed),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
    }

    /// Resolve the upstream name now and connect to the first address the
    /// origin policy allows that answers; over TLS, the handshake is part
    /// of connecting and shares its timeout.
    async fn connect(&self) -> Result<Conn, UpstreamError> {
        let url = || self.cfg.url.clone();
        let t = self.cfg.connect_timeout;
        let addrs: Vec<SocketAddr> =
            match tokio::time::timeout(t, tokio::net::lookup_host(&self.host_port)).await {
                Ok(Ok(a)) => a.collect(),
                Ok(Err(e)) => return Err(UpstreamError::Connect(url(), e)),
                Err(_) => return Err(UpstreamError::ConnectTimeout(url(), t)),
            };
        let mut refused = None;
        let mut failed = None;
        for addr in addrs {
            if let Err(r) = self.cfg.policy.check(addr) {
                refused.get_or_insert(r);
                continue;
            }
            match self.connect_to(addr, tokio::time::Instant::now() + t).await {
                Ok(c) => return Ok(c),
                // A certificate that does not verify will not verify on
                // the next address either.
                Err(UpstreamError::Tls(u, f)) if !f.transient() => {
                    return Err(UpstreamError::Tls(u, f))
                }
                Err(e) => failed = Some(e),
            }
        }
        Err(match (failed, refused) {
            (Some(e), _) => e,
            (None, Some(r)) => UpstreamError::Refused(r),
            (None, None) => UpstreamError::Connect(
                url(),
                std::io::Error::other(format!("{} resolves to no address", self.host_port)),
            ),
        })
    }

    /// One address: TCP, then TLS for an `https://` upstream.
    /// Both by `deadline`: the handshake is part of connecting.
    async fn connect_to(
        &self,
        addr: SocketAddr,
        deadline: tokio::time::Instant,
    ) -> Result<Conn, UpstreamError> {
        let t = self.cfg.connect_timeout;
        let s = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(UpstreamError::Connect(self.cfg.url.clone(), e)),
            Err(_) => return Err(UpstreamError::ConnectTimeout(self.cfg.url.clone(), t)),
        };
        let _ = s.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Ok(Conn::Plain(s));
        };
        let Ok(done) = tokio::time::timeout_at(deadline, tls.handshake(s)).await else {
            self.tls_failures.count(TlsReason::Timeout);
            return Err(UpstreamError::TlsTimeout(self.cfg.url.clone(), t));
        };
        match done {
            Ok(c) => {
                use std::sync::atomic::Ordering::Relaxed;
                self.tls_handshakes.fetch_add(1, Relaxed);
                if c.resumed() {
                    self.tls_resumed.fetch_add(1, Relaxed);
                }
                Ok(c)
            }
            Err(f) => {
                self.tls_failures.count(f.reason);
                Err(UpstreamError::Tls(self.cfg.url.clone(), f))
            }
        }
    }

    /// The request head, with the framing of `body`; a complete body is
    /// appended so that a small request goes in one write.
    fn encode(&self, req: &UpstreamRequest<'_>, body: &RequestBody) -> Vec<u8> {
        let full = match body {
            RequestBody::Full(b) => &b[..],
            _ => &[],
        };
        let mut out = Vec::with_capacity(512 + full.len());
        out.extend_from_slice(req.method);
        out.push(b' ');
        out.extend_from_slice(self.base_path.as_bytes());
        out.extend_from_slice(req.path_and_query);
        out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        out.extend_from_slice(self.authority.as_bytes());
        out.extend_from_slice(b"\r\n");
        for (n, v) in &req.headers {
            out.extend_from_slice(n);
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        match body {
            RequestBody::Stream(BodyStream {
                length: Some(n), ..
            }) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
            RequestBody::Stream(BodyStream { length: None, .. }) => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n")
            }
            _ if !full.is_empty() || matches!(req.method, b"POST" | b"PUT" | b"PATCH") => {
                out.extend_from_slice(format!("Content-Length: {}\r\n", full.len()).as_bytes())
            }
            _ => {}
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(full);
        out
    }

    /// Send a request and read the response head; the body follows through
    /// [`UpstreamBody::next`].
    pub async fn send(
        &self,
        req: &UpstreamRequest<'_>,
        mut body: RequestBody,
    ) -> Result<UpstreamResponse<'_>, UpstreamError> {
        let wire = self.encode(req, &body);
        let mut retried = false;
        loop {
            let mut conn = match self.take_idle() {
                Some(c) => c,
                None => match self.connect().await {
                    Ok(c) => c,
                    Err(e @ UpstreamError::Refused(_)) => return Err(e),
                    // A certificate that does not verify will not on a
                    // second try.
                    Err(UpstreamError::Tls(u, f)) if !f.transient() => {
                        return Err(UpstreamError::Tls(u, f))
                    }
                    Err(e) if req.idempotent && !retried => {
                        tracing::debug!(error = %e, "retrying upstream connect");
                        retried = true;
                        self.retries
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            match self
                .exchange(
                    &mut conn,
                    &wire,
                    &mut body,
                    req.head_only,
                    req.interim.as_ref(),
                )
                .await
            {
                Ok((head, buf, framing)) => {
                    return Ok(UpstreamResponse {
                        body: UpstreamBody {
                            keep_alive: head.keep_alive(),
                            upstream: self,
                            conn: Some(conn),
                            buf,
                            framing,
                            remaining: match framing {
                                ResponseFraming::Length(n) => n,
                                _ => 0,
                            },
                            decoder: ChunkedDecoder::new(),
                            done: framing == ResponseFraming::Empty,
                        },
                        head,
                    });
                }
                // Nothing of a response arrived: the connection failed, not
                // the request, so an idempotent request may go once more.
                Err((e, true)) if req.idempotent && !retried => {
                    tracing::debug!(error = %e, "retrying upstream request");
                    retried = true;
                    self.retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Write with the read timeout as the bound on an upstream that takes
    /// nothing.
    async fn write(&self, conn: &mut Conn, b: &[u8]) -> Result<(), UpstreamError> {
        let t = self.cfg.read_timeout;
        match tokio::time::timeout(t, conn.write_all(b)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(UpstreamError::Closed(self.cfg.url.clone(), e.to_string())),
            Err(_) => Err(UpstreamError::WriteTimeout(self.cfg.url.clone(), t)),
        }
    }

    /// Forward a streamed body as its pieces arrive. The error's bool says
    /// whether the request may still be retried (no piece used up yet).
    async fn stream_body(&self, conn: &mut Conn, s: &mut BodyStream) -> Result<(), Failed> {
        let chunked = s.length.is_none();
        let mut used = false;
        loop {
            let piece = s.pieces.recv().await;
            match piece {
                Some(BodyPiece::Data(d)) => {
                    used = true;
                    if chunked {
                        let mut h = Vec::with_capacity(12);
                        chunk_header(d.len(), &mut h);
                        self.write(conn, &h).await.map_err(|e| (e, false))?;
                    }
                    self.write(conn, &d).await.map_err(|e| (e, false))?;
                    if chunked {
                        self.write(conn, b"\r\n").await.map_err(|e| (e, false))?;
                    }
                }
                Some(BodyPiece::End) => {
                    if chunked {
                        self.write(conn, b"0\r\n\r\n")
                            .await
                            .map_err(|e| (e, !used))?;
                    }
                    return Ok(());
                }
                None => return Err((UpstreamError::BodyAborted, false)),
            }
        }
    }

    /// Write the request, read the head.
    async fn exchange(
        &self,
        conn: &mut Conn,
        wire: &[u8],
        body: &mut RequestBody,
        head_only: bool,
        interim: Option<&InterimSink>,
    ) -> Result<(ResponseHead, BytesMut, ResponseFraming), Failed> {
        let url = || self.cfg.url.clone();
        self.write(conn, wire).await.map_err(|e| (e, true))?;
        if let RequestBody::Stream(s) = body {
            self.stream_body(conn, s).await?;
        }
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let limits = Limits {
            max_request_line: 8192,
            max_head: 64 * 1024,
            max_headers: 200,
        };
        // A streamed body is used up: the request cannot be sent again.
        let mut again = !matches!(body, RequestBody::Stream(_));
        let mut interims = 0;
        loop {
            let frozen = buf.clone().freeze();
            match parse_response(&frozen, &limits) {
                Ok(Some((head, n))) => {
                    let _ = buf.split_to(n);
                    if head.status < 200 {
                        // Interim responses (RFC 9110 §15.2): passed on
                        // (`crate::interim`), bounded, and never a reason
                        // to send the request again (the client may have
                        // seen them).
                        let invalid = |why: String| (UpstreamError::Invalid(url(), why), false);
                        if head.status == 101 {
                            return Err(invalid(
                                "101 Switching Protocols to a request that asked for no upgrade"
                                    .into(),
                            ));
                        }
                        interims += 1;
                        if interims > MAX_INTERIM {
                            return Err(invalid(format!(
                                "more than {MAX_INTERIM} interim (1xx) responses before the final one"
                            )));
                        }
                        again = false;
                        if let Some(sink) = interim {
                            sink.forward(&head);
                        }
                        continue;
                    }
                    let framing = head
                        .framing(head_only)
                        .map_err(|e| (UpstreamError::Invalid(url(), e.to_string()), false))?;
                    return Ok((head, buf, framing));
                }
                Ok(None) => {}
                Err(e) => return Err((UpstreamError::Invalid(url(), e.to_string()), false)),
            }
            match tokio::time::timeout(self.cfg.read_timeout, conn.read_buf(&mut buf)).await {
                Ok(Ok(0)) => {
                    let none = buf.is_empty() && again;
                    return Err((UpstreamError::Closed(url(), "no response".into()), none));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    let none = buf.is_empty() && again;
                    return Err((UpstreamError::Closed(url(), e.to_string()), none));
                }
                Err(_) => {
                    return Err((UpstreamError::Timeout(url(), self.cfg.read_timeout), false))
                }
            }
        }
    }

    /// The most recently used idle connection this thread opened that is
    /// still good: idle for less than `idle_timeout`, not closed by the
    /// upstream, with no unexpected bytes waiting.
    fn take_idle(&self) -> Option<Conn> {
        let me = std::thread::current().id();
        let now = Instant::now();
        let mut idle = self.idle.lock();
        idle.retain(|p| now.duration_since(p.since) < self.cfg.idle_timeout);
        while let Some(i) = idle.iter().rposition(|p| p.owner == me) {
            let mut p = idle.remove(i);
            if p.conn.still_open() {
                return Some(p.conn);
            }
        }
        None
    }

    /// Pool a connection after a clean response. When the pool is full the
    /// longest idle one goes, the likeliest to have been closed upstream.
    fn give_back(&self, conn: Conn) {
        if self.cfg.max_idle == 0 || self.cfg.idle_timeout.is_zero() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() >= self.cfg.max_idle {
            idle.remove(0);
        }
        idle.push(Pooled {
            owner: std::thread::current().id(),
            since: Instant::now(),
            conn,
        });
    }
}

pub struct UpstreamResponse<'a> {
    pub head: ResponseHead,
    pub body: UpstreamBody<'a>,
}

/// The body of an upstream response, read chunk by chunk. When it ends
/// cleanly on a keep-alive connection, the connection returns to the pool.
pub struct UpstreamBody<'a> {
    upstream: &'a Upstream,
    conn: Option<Conn>,
    buf: BytesMut,
    framing: ResponseFraming,
    remaining: u64,
    decoder: ChunkedDecoder,
    keep_alive: bool,
    done: bool,
}

impl UpstreamBody<'_> {
    /// The declared length, when the response has one.
    pub fn length(&self) -> Option<u64> {
        match self.framing {
            ResponseFraming::Length(n) => Some(n),
            ResponseFraming::Empty => Some(0),
            _ => None,
        }
    }

    /// The next piece of the body; `Ok(None)` at its end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        loop {
            if self.done {
                self.release();
                return Ok(None);
            }
            match self.framing {
                ResponseFraming::Empty => self.done = true,
                ResponseFraming::Length(_) => {
                    if self.remaining == 0 {
                        self.done = true;
                        continue;
                    }
                    if !self.buf.is_empty() {
                        let n = (self.buf.len() as u64).min(self.remaining) as usize;
                        self.remaining -= n as u64;
                        return Ok(Some(self.buf.split_to(n).freeze()));
                    }
                    if !self.fill().await? {
                        return Err(UpstreamError::Closed(
                            self.upstream.cfg.url.clone(),
                            format!("body ended {} bytes early", self.remaining),
                        ));
                    }
                }
                ResponseFraming::Chunked => match self.decoder.decode(&mut self.buf) {
                    Ok(Decoded::Data(d)) => return Ok(Some(d)),
                    Ok(Decoded::Done) => self.done = true,
                    Ok(Decoded::NeedMore) => {
                        if !self.fill().await? {
                            return Err(UpstreamError::Closed(
                                self.upstream.cfg.url.clone(),
                                "chunked body ended early".into(),
                            ));
                        }
                    }
                    Err(e) => {
                        self.conn = None;
                        return Err(UpstreamError::Invalid(
                            self.upstream.cfg.url.clone(),
                            e.to_string(),
                        ));
                    }
                },
                ResponseFraming::UntilClose => {
                    if !self.buf.is_empty() {
                        return Ok(Some(self.buf.split().freeze()));
                    }
                    if !self.fill().await? {
                        self.keep_alive = false;
                        self.done = true;
                    }
                }
            }
        }
    }

    /// Read more; false at end of stream.
    async fn fill(&mut self) -> Result<bool, UpstreamError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(false);
        };
        if self.buf.capacity() - self.buf.len() < 8192 {
            self.buf.reserve(64 * 1024);
        }
        let t = self.upstream.cfg.read_timeout;
        match tokio::time::timeout(t, conn.read_buf(&mut self.buf)).await {
            Ok(Ok(0)) => {
                self.conn = None;
                Ok(false)
            }
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) => {
                self.conn = None;
                Err(UpstreamError::Closed(
                    self.upstream.cfg.url.clone(),
                    e.to_string(),
                ))
            }
            Err(_) => {
                self.conn = None;
                Err(UpstreamError::Timeout(self.upstream.cfg.url.clone(), t))
            }
        }
    }

    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && self.buf.is_empty() {
                self.upstream.give_back(conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    /// A keep-alive origin on loopback that counts the connections it
    /// accepts and answers every request head with a two-byte body.
    fn origin() -> (SocketAddr, Arc<AtomicUsize>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let n = accepted.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                n.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let (mut buf, mut chunk) = (Vec::new(), [0u8; 1024]);
                    loop {
                        while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..i + 4);
                            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                            if s.write_all(ok).is_err() {
                                return;
                            }
                        }
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn get(up: &Upstream) {
        let req = UpstreamRequest {
            method: b"GET",
            path_and_query: b"/x",
            headers: Vec::new(),
            idempotent: true,
            head_only: false,
            interim: None,
        };
        let mut r = up
            .send(&req, RequestBody::None)
            .await
            .expect("upstream answers");
        assert_eq!(r.head.status, 200);
        while r.body.next().await.expect("whole body").is_some() {}
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn config(url: &str) -> UpstreamConfig {
        UpstreamConfig {
            url: url.into(),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            max_idle: 1,
            idle_timeout: Duration::from_secs(1),
            policy: OriginPolicy::default(),
            ca_file: None,
            tls_name: None,
        }
    }

    /// https:// defaults to port 443 and verifies the URL's host (an IPv6
    /// address without its brackets) unless a name is pinned.
    #[test]
    fn https_urls_name_what_tls_verifies() {
        let up = Upstream::new(config("https://127.0.0.1/base/")).unwrap();
        assert_eq!(up.host_port, "127.0.0.1:443");
        assert_eq!(up.base_path, "/base");
        assert_eq!(up.tls.unwrap().name(), "127.0.0.1");
        let up = Upstream::new(config("https://[::1]:8443")).unwrap();
        assert_eq!(up.host_port, "[::1]:8443");
        assert_eq!(up.tls.unwrap().name(), "::1");
        let mut c = config("https://127.0.0.1:8443");
        c.tls_name = Some("origin.example".into());
        let up = Upstream::new(c).unwrap();
        assert_eq!(up.tls.unwrap().name(), "origin.example");
        let up = Upstream::new(config("http://127.0.0.1")).unwrap();
        assert_eq!(up.host_port, "127.0.0.1:80");
        assert!(up.tls.is_none());
        assert!(Upstream::new(config("ftp://127.0.0.1")).is_err());
    }

    /// A connection pooled longer than the idle timeout is not reused: the
    /// origin may be closing it.
    #[test]
    fn pooled_connections_idle_too_long_are_not_reused() {
        let (addr, accepted) = origin();
        let up = Upstream::new(UpstreamConfig {
            url: format!("http://{addr}"),
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(2),
            max_idle: 8,
            idle_timeout: Duration::from_millis(100),
            policy: OriginPolicy::default(),
            ca_file: None,
            tls_name: None,
        })
        .unwrap();
        runtime().block_on(async {
            get(&up).await;
            get(&up).await;
            assert_eq!(accepted.load(Ordering::SeqCst), 1, "reused while fresh");
            tokio::time::sleep(Duration::from_millis(150)).await;
            get(&up).await;
            assert_eq!(
                accepted.load(Ordering::SeqCst),
                2,
                "not reused once idle too long"
            );
        });
    }

    /// Thread A pools a connection and then blocks (as a serving thread
    /// busy in its ring does): thread B must open its own instead of
    /// borrowing A's, whose readiness only A's reactor would report, and A
    /// still reuses its own afterwards.
    #[test]
    fn pooled_connections_stay_with_the_thread_that_opened_them() {
        let (addr, accepted) = origin();
        let up = Arc::new(
            Upstream::new(UpstreamConfig {
                url: format!("http://{addr}"),
                connect_timeout: Duration::from_secs(2),
                read_timeout: Duration::from_secs(2),
                max_idle: 8,
                idle_timeout: Duration::from_secs(4),
                policy: OriginPolicy::default(),
                ca_file: None,
                tls_name: None,
            })
            .unwrap(),
        );
        let turn = Arc::new(Barrier::new(2));
        let a = {
            let (up, turn, accepted) = (up.clone(), turn.clone(), accepted.clone());
            std::thread::spawn(move || {
                runtime().block_on(async {
                    get(&up).await;
                    assert_eq!(up.idle_connections(), 1);
                    turn.wait(); // B runs while this runtime is blocked
                    turn.wait();
                    get(&up).await;
                    assert_eq!(accepted.load(Ordering::SeqCst), 2, "A reuses its own");
                })
            })
        };
        turn.wait();
        let b = {
            let up = up.clone();
            std::thread::spawn(move || runtime().block_on(get(&up)))
        };
        b.join()
            .expect("B's request completes on its own connection");
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "B opened its own");
        assert_eq!(up.idle_connections(), 2);
        turn.wait();
        a.join().unwrap();
    }
}
