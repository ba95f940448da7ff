//! The upstream client: an origin or a parent cache, reached over pooled
//! keep-alive HTTP/1.1 connections, with connect and read timeouts and one
//! retry of an idempotent request when a connection fails before any
//! response byte (typically a pooled connection the upstream had closed).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vcdn_http::chunked::{ChunkedDecoder, Decoded};
use vcdn_http::response::ResponseFraming;
use vcdn_http::{parse_response, Limits, ResponseHead};

/// Where and how to reach the upstream.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `http://host:port[/base]`, as given by the operator.
    pub url: String,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub max_idle: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to upstream {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("upstream {0} did not accept a connection within {1:?}")]
    ConnectTimeout(String, Duration),
    #[error("upstream {0} sent nothing for {1:?}")]
    Timeout(String, Duration),
    #[error("upstream {0} closed the connection: {1}")]
    Closed(String, String),
    #[error("upstream {0} sent an invalid response: {1}")]
    Invalid(String, String),
}

impl UpstreamError {
    /// 504 for timeouts, 502 for everything else.
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::ConnectTimeout(..) | UpstreamError::Timeout(..) => 504,
            _ => 502,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid upstream URL {0:?}: {1}")]
pub struct BadUrl(String, &'static str);

#[derive(Debug)]
pub struct Upstream {
    cfg: UpstreamConfig,
    addr: SocketAddr,
    /// Value of the Host field sent upstream.
    pub authority: String,
    /// Path prefix prepended to every request path.
    base_path: String,
    idle: Mutex<Vec<TcpStream>>,
    /// Requests sent a second time after a failed connection.
    pub retries: std::sync::atomic::AtomicU64,
}

/// A request to send upstream.
pub struct UpstreamRequest<'a> {
    pub method: &'a [u8],
    pub path_and_query: &'a [u8],
    /// Fields to send, hop-by-hop ones already removed; Host is added here.
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
    pub idempotent: bool,
    pub head_only: bool,
}

impl Upstream {
    pub fn new(cfg: UpstreamConfig) -> Result<Upstream, BadUrl> {
        let url = cfg.url.clone();
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| BadUrl(url.clone(), "only http:// upstreams are supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(BadUrl(url.clone(), "no host"));
        }
        let with_port = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&with_port)
            .map_err(|_| BadUrl(url.clone(), "host does not resolve"))?
            .next()
            .ok_or_else(|| BadUrl(url.clone(), "host does not resolve"))?;
        Ok(Upstream {
            authority: authority.to_string(),
            base_path: path.to_string(),
            addr,
            cfg,
            idle: Mutex::new(Vec::new()),
            retries: Default::default(),
        })
    }

    pub fn url(&self) -> &str {
        &self.cfg.url
    }

    pub fn idle_connections(&self) -> usize {
        self.idle.lock().len()
    }

    async fn connect(&self) -> Result<TcpStream, UpstreamError> {
        match tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(self.addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Ok(s)
            }
            Ok(Err(e)) => Err(UpstreamError::Connect(self.cfg.url.clone(), e)),
            Err(_) => Err(UpstreamError::ConnectTimeout(
                self.cfg.url.clone(),
                self.cfg.connect_timeout,
            )),
        }
    }

    fn encode(&self, req: &UpstreamRequest<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(512 + req.body.len());
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
        if !req.body.is_empty() || matches!(req.method, b"POST" | b"PUT" | b"PATCH") {
            out.extend_from_slice(format!("Content-Length: {}\r\n", req.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&req.body);
        out
    }

    /// Send a request and read the response head; the body follows through
    /// [`UpstreamBody::next`].
    pub async fn send(
        &self,
        req: &UpstreamRequest<'_>,
    ) -> Result<UpstreamResponse<'_>, UpstreamError> {
        let wire = self.encode(req);
        let mut retried = false;
        loop {
            let pooled = self.idle.lock().pop();
            let mut conn = match pooled {
                Some(c) => c,
                None => match self.connect().await {
                    Ok(c) => c,
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
            match self.exchange(&mut conn, &wire, req.head_only).await {
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
                Err((e, false)) if req.idempotent && !retried => {
                    tracing::debug!(error = %e, "retrying upstream request");
                    retried = true;
                    self.retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Write the request, read the head. The bool in an error says whether
    /// any response byte had arrived.
    async fn exchange(
        &self,
        conn: &mut TcpStream,
        wire: &[u8],
        head_only: bool,
    ) -> Result<(ResponseHead, BytesMut, ResponseFraming), (UpstreamError, bool)> {
        let url = || self.cfg.url.clone();
        if let Err(e) = conn.write_all(wire).await {
            return Err((UpstreamError::Closed(url(), e.to_string()), false));
        }
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let limits = Limits {
            max_request_line: 8192,
            max_head: 64 * 1024,
            max_headers: 200,
        };
        loop {
            let frozen = buf.clone().freeze();
            match parse_response(&frozen, &limits) {
                Ok(Some((head, n))) => {
                    let _ = buf.split_to(n);
                    if head.status < 200 {
                        // Interim responses (100 Continue, 103) are skipped.
                        continue;
                    }
                    let framing = head
                        .framing(head_only)
                        .map_err(|e| (UpstreamError::Invalid(url(), e.to_string()), true))?;
                    return Ok((head, buf, framing));
                }
                Ok(None) => {}
                Err(e) => return Err((UpstreamError::Invalid(url(), e.to_string()), true)),
            }
            match tokio::time::timeout(self.cfg.read_timeout, conn.read_buf(&mut buf)).await {
                Ok(Ok(0)) => {
                    let any = !buf.is_empty();
                    return Err((UpstreamError::Closed(url(), "no response".into()), any));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    let any = !buf.is_empty();
                    return Err((UpstreamError::Closed(url(), e.to_string()), any));
                }
                Err(_) => return Err((UpstreamError::Timeout(url(), self.cfg.read_timeout), true)),
            }
        }
    }

    fn give_back(&self, conn: TcpStream) {
        let mut idle = self.idle.lock();
        if idle.len() < self.cfg.max_idle {
            idle.push(conn);
        }
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
    conn: Option<TcpStream>,
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
