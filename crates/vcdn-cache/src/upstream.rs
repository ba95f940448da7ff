//! The upstream client: an origin or a parent cache, reached over pooled
//! keep-alive HTTP/1.1 connections, with connect and read timeouts and one
//! retry of an idempotent request when a connection fails before any
//! response byte (typically a pooled connection the upstream had closed).

use std::net::SocketAddr;
use std::thread::ThreadId;
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
    /// Idle keep-alive connections, oldest first, each with the thread that
    /// opened it. A connection is registered with the reactor of that
    /// thread's runtime, so only that thread takes it again: on another, its
    /// readiness would wait for the owner to turn its reactor, which a busy
    /// serving thread does only between batches of its ring.
    idle: Mutex<Vec<(ThreadId, TcpStream)>>,
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
            let mut conn = match self.take_idle() {
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

    /// The most recently used idle connection this thread opened.
    fn take_idle(&self) -> Option<TcpStream> {
        let me = std::thread::current().id();
        let mut idle = self.idle.lock();
        let i = idle.iter().rposition(|(owner, _)| *owner == me)?;
        Some(idle.remove(i).1)
    }

    /// Pool a connection after a clean response. When the pool is full the
    /// longest idle one goes, the likeliest to have been closed upstream.
    fn give_back(&self, conn: TcpStream) {
        if self.cfg.max_idle == 0 {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() >= self.cfg.max_idle {
            idle.remove(0);
        }
        idle.push((std::thread::current().id(), conn));
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
            body: Bytes::new(),
            idempotent: true,
            head_only: false,
        };
        let mut r = up.send(&req).await.expect("upstream answers");
        assert_eq!(r.head.status, 200);
        while r.body.next().await.expect("whole body").is_some() {}
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
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
