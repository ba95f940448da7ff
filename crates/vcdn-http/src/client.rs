//! A one-shot HTTP/1.1 client for control tools and tests: one connection
//! per request, whole body read into memory up to a limit, every step timed.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::chunked::{ChunkedDecoder, Decoded};
use crate::request::Limits;
use crate::response::{parse_response, ResponseFraming, ResponseHead};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("{0} did not answer within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("connection to {0} failed: {1}")]
    Io(SocketAddr, std::io::Error),
    #[error("invalid response from {0}: {1}")]
    Invalid(SocketAddr, String),
}

#[derive(Debug)]
pub struct ClientResponse {
    pub head: ResponseHead,
    pub body: Bytes,
}

impl ClientResponse {
    pub fn status(&self) -> u16 {
        self.head.status
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head
            .headers
            .get_str(name.to_ascii_lowercase().as_bytes())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Send one request and read the whole response (at most 256 MiB).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<ClientResponse, ClientError> {
    tokio::time::timeout(timeout, request_inner(addr, method, path, headers, body))
        .await
        .map_err(|_| ClientError::Timeout(addr, timeout))?
}

async fn request_inner(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<ClientResponse, ClientError> {
    const MAX_BODY: usize = 256 << 20;
    let io = |e| ClientError::Io(addr, e);
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| ClientError::Connect(addr, e))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    // The caller's Host (a service's name) wins over the address.
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    req.push_str("Connection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut out = req.into_bytes();
    out.extend_from_slice(body);
    stream.write_all(&out).await.map_err(io)?;

    let mut buf = BytesMut::with_capacity(8192);
    let limits = Limits::default();
    let (head, n) = loop {
        if let Some(h) = parse_response(&buf.clone().freeze(), &limits)
            .map_err(|e| ClientError::Invalid(addr, e.to_string()))?
        {
            if h.0.status >= 100 && h.0.status < 200 {
                let _ = buf.split_to(h.1);
                continue;
            }
            break h;
        }
        if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
            return Err(ClientError::Invalid(
                addr,
                "connection closed before a response".into(),
            ));
        }
    };
    let _ = buf.split_to(n);
    let framing = head
        .framing(method == "HEAD")
        .map_err(|e| ClientError::Invalid(addr, e.to_string()))?;
    let body = match framing {
        ResponseFraming::Empty => Bytes::new(),
        ResponseFraming::Length(len) => {
            if len as usize > MAX_BODY {
                return Err(ClientError::Invalid(addr, "response body too large".into()));
            }
            while (buf.len() as u64) < len {
                if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
                    return Err(ClientError::Invalid(
                        addr,
                        "response body ended early".into(),
                    ));
                }
            }
            buf.split_to(len as usize).freeze()
        }
        ResponseFraming::UntilClose => {
            while stream.read_buf(&mut buf).await.map_err(io)? != 0 {
                if buf.len() > MAX_BODY {
                    return Err(ClientError::Invalid(addr, "response body too large".into()));
                }
            }
            buf.freeze()
        }
        ResponseFraming::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut body = BytesMut::new();
            loop {
                match dec
                    .decode(&mut buf)
                    .map_err(|e| ClientError::Invalid(addr, e.to_string()))?
                {
                    Decoded::Data(d) => {
                        body.extend_from_slice(&d);
                        if body.len() > MAX_BODY {
                            return Err(ClientError::Invalid(
                                addr,
                                "response body too large".into(),
                            ));
                        }
                    }
                    Decoded::Done => break,
                    Decoded::NeedMore => {
                        if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
                            return Err(ClientError::Invalid(
                                addr,
                                "chunked response body ended early".into(),
                            ));
                        }
                    }
                }
            }
            body.freeze()
        }
    };
    Ok(ClientResponse { head, body })
}
