//! A keep-alive HTTP/1.1 GET client for players: one TCP connection, one
//! request at a time, the body counted (and kept only when asked, for the
//! MPD), every wait bounded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vcdn_http::chunked::{ChunkedDecoder, Decoded};
use vcdn_http::request::Limits;
use vcdn_http::response::{parse_response, ResponseFraming};

/// Largest body kept in memory (an MPD).
const MAX_KEEP: usize = vcdn_content::mpd::MAX_MPD_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("connect to {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("{0}: no answer within {1:?}")]
    Timeout(String, Duration),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: {1}")]
    Invalid(String, String),
    #[error("{0}: HTTP {1}")]
    Status(String, u16),
}

pub struct Fetched {
    pub status: u16,
    pub bytes: u64,
    pub body: Option<Bytes>,
    /// When the response head was complete (the wait before it is latency,
    /// the time after it transfer).
    pub first_byte: Instant,
}

/// How far a response has come, for a player that may give up on a
/// download that is too slow (dash.js's abandonment rule).
#[derive(Debug, Default)]
pub struct Progress {
    total: AtomicU64,
    got: AtomicU64,
    first_byte: OnceLock<Instant>,
}

impl Progress {
    /// The body's length (0 while unknown).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Body bytes received so far.
    pub fn got(&self) -> u64 {
        self.got.load(Ordering::Relaxed)
    }

    /// When the response head arrived.
    pub fn first_byte(&self) -> Option<Instant> {
        self.first_byte.get().copied()
    }
}

pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: BytesMut,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            stream: None,
            buf: BytesMut::with_capacity(16 * 1024),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// GET `path`; a 2xx body is read to its end. A connection that the
    /// server closed between requests is reopened once.
    pub async fn get(
        &mut self,
        path: &str,
        keep_body: bool,
        timeout: Duration,
    ) -> Result<Fetched, FetchError> {
        self.get_tracked(path, keep_body, timeout, None).await
    }

    /// [`Conn::get`], recording the body's progress in `progress`.
    pub async fn get_tracked(
        &mut self,
        path: &str,
        keep_body: bool,
        timeout: Duration,
        progress: Option<&Progress>,
    ) -> Result<Fetched, FetchError> {
        if let Some(p) = progress {
            p.got.store(0, Ordering::Relaxed);
        }
        match tokio::time::timeout(timeout, self.get_inner(path, keep_body, true, progress)).await {
            Ok(r) => {
                if r.is_err() {
                    self.stream = None;
                }
                r
            }
            Err(_) => {
                self.stream = None;
                Err(FetchError::Timeout(path.to_string(), timeout))
            }
        }
    }

    async fn get_inner(
        &mut self,
        path: &str,
        keep_body: bool,
        may_retry: bool,
        progress: Option<&Progress>,
    ) -> Result<Fetched, FetchError> {
        let io = |e| FetchError::Io(path.to_string(), e);
        let reused = self.stream.is_some();
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr)
                .await
                .map_err(|e| FetchError::Connect(self.addr, e))?;
            let _ = s.set_nodelay(true);
            self.stream = Some(s);
            self.buf.clear();
        }
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: vcdn-player\r\n\r\n",
            self.addr
        );
        let stream = self.stream.as_mut().expect("connected");
        if let Err(e) = stream.write_all(req.as_bytes()).await {
            self.stream = None;
            return if reused && may_retry {
                Box::pin(self.get_inner(path, keep_body, false, progress)).await
            } else {
                Err(io(e))
            };
        }
        let limits = Limits::default();
        let (head, n) = loop {
            if let Some(h) = parse_response(&head_of(&self.buf), &limits)
                .map_err(|e| FetchError::Invalid(path.to_string(), e.to_string()))?
            {
                break h;
            }
            let stream = self.stream.as_mut().expect("connected");
            let got = stream.read_buf(&mut self.buf).await.map_err(io)?;
            if got == 0 {
                self.stream = None;
                if reused && may_retry && self.buf.is_empty() {
                    return Box::pin(self.get_inner(path, keep_body, false, progress)).await;
                }
                return Err(FetchError::Invalid(
                    path.to_string(),
                    "connection closed before a response".into(),
                ));
            }
        };
        let first_byte = Instant::now();
        let _ = self.buf.split_to(n);
        let framing = head
            .framing(false)
            .map_err(|e| FetchError::Invalid(path.to_string(), e.to_string()))?;
        if let Some(p) = progress {
            let _ = p.first_byte.set(first_byte);
            if let ResponseFraming::Length(len) = framing {
                p.total.store(len, Ordering::Relaxed);
            }
        }
        let keep = keep_body && (200..300).contains(&head.status);
        let mut body = BytesMut::new();
        let mut total = 0u64;
        let stream = self.stream.as_mut().expect("connected");
        match framing {
            ResponseFraming::Empty => {}
            ResponseFraming::Length(len) => {
                let mut left = len;
                loop {
                    let take = (self.buf.len() as u64).min(left) as usize;
                    let chunk = self.buf.split_to(take);
                    left -= take as u64;
                    total += take as u64;
                    if let Some(p) = progress {
                        p.got.store(total, Ordering::Relaxed);
                    }
                    if keep && body.len() + chunk.len() <= MAX_KEEP {
                        body.extend_from_slice(&chunk);
                    }
                    if left == 0 {
                        break;
                    }
                    if stream.read_buf(&mut self.buf).await.map_err(io)? == 0 {
                        self.stream = None;
                        return Err(FetchError::Invalid(
                            path.to_string(),
                            "body ended early".into(),
                        ));
                    }
                }
            }
            ResponseFraming::Chunked => {
                let mut dec = ChunkedDecoder::new();
                loop {
                    match dec
                        .decode(&mut self.buf)
                        .map_err(|e| FetchError::Invalid(path.to_string(), e.to_string()))?
                    {
                        Decoded::Data(d) => {
                            total += d.len() as u64;
                            if keep && body.len() + d.len() <= MAX_KEEP {
                                body.extend_from_slice(&d);
                            }
                        }
                        Decoded::Done => break,
                        Decoded::NeedMore => {
                            if stream.read_buf(&mut self.buf).await.map_err(io)? == 0 {
                                self.stream = None;
                                return Err(FetchError::Invalid(
                                    path.to_string(),
                                    "chunked body ended early".into(),
                                ));
                            }
                        }
                    }
                }
            }
            ResponseFraming::UntilClose => {
                loop {
                    total += self.buf.len() as u64;
                    let chunk = self.buf.split();
                    if keep && body.len() + chunk.len() <= MAX_KEEP {
                        body.extend_from_slice(&chunk);
                    }
                    if stream.read_buf(&mut self.buf).await.map_err(io)? == 0 {
                        break;
                    }
                }
                self.stream = None;
            }
        }
        if !head.keep_alive() {
            self.stream = None;
        }
        Ok(Fetched {
            status: head.status,
            bytes: total,
            body: keep.then(|| body.freeze()),
            first_byte,
        })
    }
}

/// What of `buf` the response parser needs to see, as `Bytes` (it takes
/// `Bytes`, a `BytesMut` must be copied): once the head's empty line is in,
/// the head alone (a few hundred bytes, where the whole buffer would be up
/// to 16 KiB with the body's start, a large allocation and copy per
/// segment); before that all of it, so that incomplete and bad heads are
/// judged as before. The parser's answer is the same either way, since a
/// head ends at its first CRLF CRLF.
fn head_of(buf: &BytesMut) -> Bytes {
    match memchr::memmem::find(buf, b"\r\n\r\n") {
        Some(i) => Bytes::copy_from_slice(&buf[..i + 4]),
        None => Bytes::copy_from_slice(buf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head alone parses as the whole buffer does: same head, same
    /// length, same errors.
    #[test]
    fn the_head_alone_parses_as_the_whole_buffer() {
        let limits = Limits::default();
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello\r\n\r\n"[..],
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Len",
            b"HTTP/1.1 200 OK\nA: b\n\nbody\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nA: b\nc\r\n\r\n",
            b"HTTP/1.1 999 No\r\n\r\n",
        ] {
            let buf = BytesMut::from(raw);
            let whole = parse_response(&Bytes::copy_from_slice(raw), &limits);
            let head = parse_response(&head_of(&buf), &limits);
            match (whole, head) {
                (Ok(Some((a, n))), Ok(Some((b, m)))) => {
                    assert_eq!((a.status, n), (b.status, m));
                    assert_eq!(a.framing(false).ok(), b.framing(false).ok());
                }
                (Ok(None), Ok(None)) => {}
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                (a, b) => panic!("{raw:?}: {:?} vs {:?}", a.is_ok(), b.is_ok()),
            }
        }
    }
}
