//! A small HTTP/1.1 server for control endpoints (admin API, demo origin,
//! metrics): keep-alive, request bodies up to a limit, timeouts, streamed
//! responses, optionally over TLS. The cache's data path has its own faster
//! loop.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::chunked::{chunk_header, ChunkedDecoder, Decoded};
use crate::request::{parse_request, BodyFraming, Limits, Method, RequestHead};
use crate::response::reason;
use crate::tls::{rustls, tokio_rustls};

/// A request with its whole body.
#[derive(Debug)]
pub struct Request {
    pub head: RequestHead,
    pub body: Bytes,
    pub peer: SocketAddr,
}

/// A response body: complete, or streamed piece by piece. A streamed body
/// that yields `Err(())` aborts the connection, so the client sees a
/// truncated message (used by the demo origin to play a failing upstream).
pub enum Body {
    Full(Bytes),
    Stream(mpsc::Receiver<Result<Bytes, ()>>),
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// For a streamed body: announce this Content-Length instead of chunking.
    pub content_length: Option<u64>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: Body::Full(body.into()),
            content_length: None,
        }
    }

    /// An RFC 9457 problem document.
    pub fn problem(status: u16, detail: &str) -> Response {
        let body = format!(
            "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{}}}\n",
            json_string(reason(status)),
            status,
            json_string(detail)
        );
        Response::new(status, "application/problem+json", body)
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Whether `req` carries `Authorization: Bearer <want>` (scheme in any
/// case), compared in constant time. An empty `want` never matches. APIs
/// should rather use [`crate::auth::Guard`], which also throttles guessing.
pub fn bearer_matches(req: &Request, want: &str) -> bool {
    crate::auth::bearer_token(req).is_some_and(|t| crate::auth::token_eq(t, want.as_bytes()))
}

/// Quote a string as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub type Handler =
    Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// Limits and timeouts of a control server, and its TLS.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub limits: Limits,
    pub max_body: usize,
    /// Also the time a TLS handshake may take.
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// Serve HTTPS: every connection does the TLS handshake first (in its
    /// own task, bounded by `header_timeout`), then the same HTTP/1.1.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            limits: Limits::default(),
            max_body: 1024 * 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// Accept connections forever, each served on its own task.
pub async fn serve(listener: TcpListener, cfg: ServeConfig, handler: Handler) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let handler = handler.clone();
                let cfg = cfg.clone();
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    if let Err(e) = accepted(stream, peer, cfg, handler).await {
                        tracing::debug!(%peer, error = %e, "control connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A new connection: the TLS handshake if configured, then HTTP/1.1.
async fn accepted(
    stream: TcpStream,
    peer: SocketAddr,
    cfg: ServeConfig,
    handler: Handler,
) -> std::io::Result<()> {
    let Some(tls) = cfg.tls.clone() else {
        return connection(stream, peer, &cfg, handler).await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let stream = match tokio::time::timeout(cfg.header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return Ok(());
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake did not finish in time");
            return Ok(());
        }
    };
    connection(stream, peer, &cfg, handler).await
}

async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    cfg: &ServeConfig,
    handler: Handler,
) -> std::io::Result<()> {
    let r = serve_requests(&mut stream, peer, cfg, handler).await;
    // Flushes what a TLS layer still holds and sends its close_notify.
    let _ = stream.shutdown().await;
    r
}

async fn serve_requests<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    cfg: &ServeConfig,
    handler: Handler,
) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        // Read a complete head, with the idle timeout before the first byte
        // and the header timeout once a request has started.
        let head = loop {
            let frozen = buf.clone().freeze();
            match parse_request(&frozen, &cfg.limits) {
                Ok(Some((head, n))) => {
                    let _ = buf.split_to(n);
                    break head;
                }
                Ok(None) => {}
                Err(e) => {
                    let resp = Response::problem(e.status(), &e.to_string());
                    write_response(stream, resp, false, false).await?;
                    return Ok(());
                }
            }
            let wait = if buf.is_empty() {
                cfg.idle_timeout
            } else {
                cfg.header_timeout
            };
            match tokio::time::timeout(wait, stream.read_buf(&mut buf)).await {
                Ok(Ok(0)) => return Ok(()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) if buf.is_empty() => return Ok(()),
                Err(_) => {
                    let resp = Response::problem(408, "the request head did not arrive in time");
                    write_response(stream, resp, false, false).await?;
                    return Ok(());
                }
            }
        };
        if head.expect_continue {
            stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
            stream.flush().await?;
        }
        let body = match read_body(stream, &mut buf, head.body, cfg).await {
            Ok(b) => b,
            Err(resp) => {
                write_response(stream, *resp, false, false).await?;
                return Ok(());
            }
        };
        let keep_alive = head.keep_alive;
        let is_head = head.method == Method::Head;
        let resp = handler(Request { head, body, peer }).await;
        let clean = write_response(stream, resp, keep_alive, is_head).await?;
        if !keep_alive || !clean {
            return Ok(());
        }
    }
}

async fn read_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    framing: BodyFraming,
    cfg: &ServeConfig,
) -> Result<Bytes, Box<Response>> {
    let too_large = || Box::new(Response::problem(413, "request body too large"));
    let timeout = || {
        Box::new(Response::problem(
            408,
            "the request body did not arrive in time",
        ))
    };
    match framing {
        BodyFraming::None => Ok(Bytes::new()),
        BodyFraming::Length(n) => {
            if n > cfg.max_body as u64 {
                return Err(too_large());
            }
            while (buf.len() as u64) < n {
                match tokio::time::timeout(cfg.header_timeout, stream.read_buf(buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => {
                        return Err(Box::new(Response::problem(400, "request body ended early")))
                    }
                    Ok(Ok(_)) => {}
                    Err(_) => return Err(timeout()),
                }
            }
            Ok(buf.split_to(n as usize).freeze())
        }
        BodyFraming::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut out = BytesMut::new();
            loop {
                match dec.decode(buf) {
                    Ok(Decoded::Data(d)) => {
                        if out.len() + d.len() > cfg.max_body {
                            return Err(too_large());
                        }
                        out.extend_from_slice(&d);
                    }
                    Ok(Decoded::Done) => return Ok(out.freeze()),
                    Ok(Decoded::NeedMore) => {
                        match tokio::time::timeout(cfg.header_timeout, stream.read_buf(buf)).await {
                            Ok(Ok(0)) | Ok(Err(_)) => {
                                return Err(Box::new(Response::problem(
                                    400,
                                    "request body ended early",
                                )))
                            }
                            Ok(Ok(_)) => {}
                            Err(_) => return Err(timeout()),
                        }
                    }
                    Err(e) => return Err(Box::new(Response::problem(400, &e.to_string()))),
                }
            }
        }
    }
}

/// Write a response; returns false when a streamed body was aborted.
async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    resp: Response,
    keep_alive: bool,
    is_head: bool,
) -> std::io::Result<bool> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status)).as_bytes(),
    );
    out.extend_from_slice(b"Date: ");
    crate::date::write_now(&mut out);
    out.extend_from_slice(b"\r\n");
    for (n, v) in &resp.headers {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    match resp.body {
        Body::Full(b) => {
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", b.len()).as_bytes());
            if !is_head {
                out.extend_from_slice(&b);
            }
            stream.write_all(&out).await?;
            stream.flush().await?;
            Ok(true)
        }
        Body::Stream(mut rx) => {
            let chunked = resp.content_length.is_none();
            match resp.content_length {
                Some(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n\r\n").as_bytes()),
                None => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n"),
            }
            stream.write_all(&out).await?;
            if is_head {
                stream.flush().await?;
                return Ok(true);
            }
            while let Some(piece) = rx.recv().await {
                let Ok(piece) = piece else {
                    stream.flush().await?;
                    return Ok(false);
                };
                if piece.is_empty() {
                    continue;
                }
                if chunked {
                    let mut h = Vec::with_capacity(12);
                    chunk_header(piece.len(), &mut h);
                    stream.write_all(&h).await?;
                    stream.write_all(&piece).await?;
                    stream.write_all(b"\r\n").await?;
                } else {
                    stream.write_all(&piece).await?;
                }
                // A TLS layer would otherwise hold a slow stream's pieces.
                stream.flush().await?;
            }
            if chunked {
                stream.write_all(b"0\r\n\r\n").await?;
            }
            stream.flush().await?;
            Ok(true)
        }
    }
}
