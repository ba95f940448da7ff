//! A one-shot HTTP/1.1 client for control tools and tests: one connection
//! per request, whole body read into memory up to a limit, every step timed;
//! plain HTTP to an address ([`request`]) or HTTP and HTTPS to a URL
//! ([`Endpoint`], [`request_url`]) with the trust of [`crate::tls::Trust`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::tls::{rustls, tokio_rustls, Trust};

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
    #[error("{0} is not a URL of the form http[s]://host[:port][/base]")]
    BadUrl(String),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, String),
    #[error("TLS: {0}")]
    TlsConfig(String),
    /// The server's certificate is not the one whose fingerprint is trusted.
    #[error("the certificate of {addr} has fingerprint {seen}, which is not the one trusted")]
    FingerprintMismatch { addr: SocketAddr, seen: String },
    #[error("TLS handshake with {0} failed: {1}")]
    Tls(SocketAddr, String),
}

/// What `handshake_error` adds to a certificate the trust refused.
const UNTRUSTED_HINT: &str =
    " (the server's certificate is not trusted: give its CA or its fingerprint)";

impl ClientError {
    /// The server presented a certificate the trust refused (not a network
    /// failure during the handshake): waiting will not change it.
    pub fn is_untrusted_certificate(&self) -> bool {
        match self {
            ClientError::FingerprintMismatch { .. } => true,
            ClientError::Tls(_, m) => m.ends_with(UNTRUSTED_HINT),
            _ => false,
        }
    }
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
    tokio::time::timeout(timeout, async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| ClientError::Connect(addr, e))?;
        exchange(stream, addr, &addr.to_string(), method, path, headers, body).await
    })
    .await
    .map_err(|_| ClientError::Timeout(addr, timeout))?
}

/// Where requests to a URL go: its address, its Host, and for `https` the
/// TLS configuration and the name the certificate must carry.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// `host[:port]` as in the URL, sent as Host.
    authority: String,
    /// The URL's path, put before every request's path (no trailing `/`).
    base: String,
    tls: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("authority", &self.authority)
            .field("base", &self.base)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// A URL's parts: (https?, host, port, base path).
pub fn parse_url(url: &str) -> Result<(bool, String, u16, String), ClientError> {
    let bad = || ClientError::BadUrl(url.to_string());
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad());
    };
    let (authority, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') || base.contains(['?', '#']) {
        return Err(bad());
    }
    let default_port = if https { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if after.is_empty() => default_port,
            None => return Err(bad()),
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((https, host, port, base.to_string()))
}

impl Endpoint {
    /// Resolve `url` (`http://` or `https://`); `trust` decides which
    /// certificates an `https` server may present.
    pub async fn new(url: &str, trust: &Trust) -> Result<Endpoint, ClientError> {
        let (https, host, port, base) = parse_url(url)?;
        let addr = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port),
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| ClientError::Resolve(host.clone(), e.to_string()))?
                .next()
                .ok_or_else(|| ClientError::Resolve(host.clone(), "no address".into()))?,
        };
        let authority = match (host.contains(':'), port == if https { 443 } else { 80 }) {
            (true, true) => format!("[{host}]"),
            (true, false) => format!("[{host}]:{port}"),
            (false, true) => host.clone(),
            (false, false) => format!("{host}:{port}"),
        };
        let tls = if https {
            let cfg =
                crate::tls::client_config(trust, &[b"http/1.1"]).map_err(ClientError::TlsConfig)?;
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| ClientError::BadUrl(url.to_string()))?;
            Some((cfg, name))
        } else {
            None
        };
        Ok(Endpoint {
            addr,
            authority,
            base,
            tls,
        })
    }

    /// An address, plain or over TLS with a prepared configuration (reused
    /// across calls); the certificate must name the address's IP.
    pub fn for_addr(addr: SocketAddr, tls: Option<Arc<rustls::ClientConfig>>) -> Endpoint {
        let authority = match addr.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
            std::net::IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        };
        Endpoint {
            addr,
            authority,
            base: String::new(),
            tls: tls.map(|c| {
                (
                    c,
                    rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
                )
            }),
        }
    }

    /// An address over TLS whose certificate must carry `name` (not the
    /// address's IP): an instance whose IP is given after its certificate
    /// was made (a Kubernetes pod) proves who it is by name.
    pub fn for_addr_named(
        addr: SocketAddr,
        tls: Option<Arc<rustls::ClientConfig>>,
        name: &str,
    ) -> Endpoint {
        let mut e = Endpoint::for_addr(addr, tls);
        if let (Some((_, n)), Ok(named)) = (
            &mut e.tls,
            rustls::pki_types::ServerName::try_from(name.to_string()),
        ) {
            *n = named;
        }
        e
    }

    pub fn is_https(&self) -> bool {
        self.tls.is_some()
    }

    /// Send one request to `base + path` and read the whole response.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<ClientResponse, ClientError> {
        let addr = self.addr;
        let path = format!("{}{path}", self.base);
        tokio::time::timeout(timeout, async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| ClientError::Connect(addr, e))?;
            let _ = stream.set_nodelay(true);
            match &self.tls {
                None => exchange(stream, addr, &self.authority, method, &path, headers, body).await,
                Some((cfg, name)) => {
                    let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                        .connect(name.clone(), stream)
                        .await
                        .map_err(|e| handshake_error(addr, e))?;
                    exchange(tls, addr, &self.authority, method, &path, headers, body).await
                }
            }
        })
        .await
        .map_err(|_| ClientError::Timeout(addr, timeout))?
    }
}

/// Send one request to `url` (+ `path`), trusting `trust` for `https`.
pub async fn request_url(
    url: &str,
    trust: &Trust,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<ClientResponse, ClientError> {
    Endpoint::new(url, trust)
        .await?
        .request(method, path, headers, body, timeout)
        .await
}

/// What a failed handshake means, with the fingerprint seen when it was
/// not the one trusted.
fn handshake_error(addr: SocketAddr, e: std::io::Error) -> ClientError {
    if let Some(r) = e.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>()) {
        if let rustls::Error::Other(o) = r {
            if let Some(m) = o.0.downcast_ref::<crate::tls::FingerprintMismatch>() {
                return ClientError::FingerprintMismatch {
                    addr,
                    seen: m.seen.clone(),
                };
            }
        }
        let hint = match r {
            rustls::Error::InvalidCertificate(_) => UNTRUSTED_HINT,
            _ => "",
        };
        return ClientError::Tls(addr, format!("{r}{hint}"));
    }
    ClientError::Tls(addr, e.to_string())
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    addr: SocketAddr,
    authority: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<ClientResponse, ClientError> {
    const MAX_BODY: usize = 256 << 20;
    let io = |e| ClientError::Io(addr, e);
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    // The caller's Host (a service's name) wins over the address.
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {authority}\r\n"));
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
    stream.flush().await.map_err(io)?;

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
