//! TLS at the edge: the TLS listener of each serving thread, the handshake
//! (on its own task, within the header timeout, so a slow or hostile
//! handshake never holds up other clients), the dispatch on ALPN (`h2` to
//! `crate::h2front`, anything else to the HTTP/1.1 loop of
//! `crate::server` over `crate::wire`), and the certificates: by SNI, from
//! `tls_cert_dir` at start and replaced live through the admin API.
//!
//! One rustls `ServerConfig` is shared by every serving thread, so a
//! session ID or ticket issued on one thread resumes on another.

use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use vcdn_http::tls::rustls::server::{ClientHello, ResolvesServerCert};
use vcdn_http::tls::rustls::sign::CertifiedKey;
use vcdn_http::tls::rustls::{HandshakeKind, ServerConfig};
use vcdn_http::tls::{self as vtls, CertBundle, CertError, CertInfo, CertStore};

use crate::metrics::Open;
use crate::panic;
use crate::proxy::Cache;
use crate::server::{self, ConnectionSlot};
use crate::wire::{self, Tls};

/// ALPN protocols offered, in order of preference.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];
/// Sessions remembered for resumption by session ID (TLS 1.2), shared by
/// all threads. Tickets (TLS 1.3 and 1.2) need no server memory.
const SESSIONS: usize = 16 * 1024;
/// Largest OCSP response accepted for stapling.
const MAX_OCSP: usize = 64 * 1024;

/// The certificate store as rustls asks it, counting handshakes that find
/// no certificate at all (none loaded yet): rustls then refuses the
/// handshake with an alert.
#[derive(Debug)]
struct Resolver {
    store: Arc<CertStore>,
    none: Arc<AtomicU64>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let k = self.store.resolve(hello);
        if k.is_none() {
            self.none.fetch_add(1, Ordering::Relaxed);
        }
        k
    }
}

/// The server configuration of the TLS listener (built once per process).
pub fn server_config(cache: &Cache) -> Arc<ServerConfig> {
    let resolver = Arc::new(Resolver {
        store: cache.certs.clone(),
        none: cache.metrics.tls_no_certificate.clone(),
    });
    vtls::server_config(resolver, &ALPN, SESSIONS)
}

/// The store name of a host name or wildcard as given in a URL path or a
/// file name: lowercase, `_wildcard.` standing for `*.`. None if it is not
/// a host name (letters, digits, `-`, dots; at most 253 characters).
pub fn cert_name(raw: &str) -> Option<String> {
    let s = raw.trim_end_matches('.').to_ascii_lowercase();
    let s = match s.strip_prefix("_wildcard.") {
        Some(rest) => format!("*.{rest}"),
        None => s.replace("%2a", "*"),
    };
    let host = s.strip_prefix("*.").unwrap_or(&s);
    let ok = !host.is_empty()
        && s.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
        });
    ok.then_some(s)
}

/// The file stem of a store name (`*.` written `_wildcard.`).
pub fn file_stem(name: &str) -> String {
    match name.strip_prefix("*.") {
        Some(rest) => format!("_wildcard.{rest}"),
        None => name.to_string(),
    }
}

/// Why a certificate was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{0}")]
    Cert(#[from] CertError),
    #[error("the OCSP response is not usable: {0}")]
    Ocsp(String),
}

/// Parse and check a certificate for `name`: chain and key (see
/// `vcdn_http::tls::parse_bundle`), valid now, covering `name`; with its
/// OCSP response (DER) if given.
pub fn check(
    name: &str,
    cert_pem: &[u8],
    key_pem: &[u8],
    ocsp: Option<Vec<u8>>,
    now: i64,
) -> Result<CertBundle, Refused> {
    let mut b = vtls::parse_bundle(cert_pem, key_pem)?;
    b.info.check_validity(now)?;
    if !b.info.covers(name) {
        return Err(CertError::WrongName(name.to_string(), b.info.names.join(", ")).into());
    }
    if let Some(o) = ocsp {
        check_ocsp(&o).map_err(Refused::Ocsp)?;
        let mut k = (*b.key).clone();
        k.ocsp = Some(o);
        b.key = Arc::new(k);
    }
    Ok(b)
}

/// A DER OCSP response is one SEQUENCE: refuse anything else (a PEM or
/// base64 text, an empty file), which clients would reject mid-handshake.
fn check_ocsp(der: &[u8]) -> Result<(), String> {
    if der.is_empty() {
        return Err("it is empty".into());
    }
    if der.len() > MAX_OCSP {
        return Err(format!("it is {} bytes, over {MAX_OCSP}", der.len()));
    }
    if der[0] != 0x30 {
        return Err("it is not DER (an OCSPResponse starts with a SEQUENCE, byte 0x30)".into());
    }
    Ok(())
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The certificate store, with the certificates of `dir` (`NAME.crt`,
/// `NAME.key`, optional `NAME.ocsp`). A file that cannot be used stops the
/// start with a message naming it; an expired certificate is loaded with a
/// warning (clients see it expired, operators see it in
/// `vcdn_cache_tls_certificate_not_after_seconds`).
pub fn load_dir(dir: Option<&Path>) -> Result<Arc<CertStore>, String> {
    let store = CertStore::new();
    let Some(dir) = dir else {
        return Ok(store);
    };
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("--tls-cert-dir {}: {e}", dir.display()))?;
    let mut stems: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "crt").then(|| p.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    stems.sort();
    for stem in stems {
        let at = |f: &str| dir.join(format!("{stem}.{f}"));
        let name = cert_name(&stem).ok_or_else(|| {
            format!(
                "{}: the file name must be a host name (or _wildcard.DOMAIN for *.DOMAIN)",
                at("crt").display()
            )
        })?;
        let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let cert = read(&at("crt"))?;
        let key = read(&at("key"))?;
        let ocsp = match std::fs::read(at("ocsp")) {
            Ok(o) => Some(o),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: {e}", at("ocsp").display())),
        };
        let mut b = vtls::parse_bundle(&cert, &key)
            .map_err(|e| format!("{} with {}: {e}", at("crt").display(), at("key").display()))?;
        if let Err(e) = b.info.check_validity(unix_now()) {
            tracing::warn!(certificate = %at("crt").display(), "{e}; loaded anyway");
        }
        if !b.info.covers(&name) {
            tracing::warn!(certificate = %at("crt").display(), names = ?b.info.names, "the certificate does not cover its file's name");
        }
        if let Some(o) = ocsp {
            check_ocsp(&o).map_err(|e| format!("{}: {e}", at("ocsp").display()))?;
            let mut k = (*b.key).clone();
            k.ocsp = Some(o);
            b.key = Arc::new(k);
        }
        store.set(&name, b);
    }
    Ok(store)
}

/// What the admin API shows of a certificate (never its key).
pub fn describe(name: &str, info: &CertInfo, ocsp: bool) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "names": info.names,
        "not_after": info.not_after_rfc3339(),
        "fingerprint": info.fingerprint,
        "ocsp": ocsp,
    })
}

/// Accept TLS connections forever on one thread's TLS listener: each gets
/// a connection slot at once and its handshake on a task of its own.
pub async fn accept_loop(cache: Arc<Cache>, listener: StdListener, config: Arc<ServerConfig>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the TLS listener");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                let m = &cache.metrics;
                m.connections_total.fetch_add(1, Ordering::Relaxed);
                if m.connections_open.load(Ordering::Relaxed) >= cache.cfg.max_connections as u64 {
                    m.connections_refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let _ = tcp.set_nodelay(true);
                let slot = ConnectionSlot::take(&cache);
                let config = config.clone();
                tokio::spawn(async move {
                    let cache = slot.cache().clone();
                    if let Err(p) =
                        panic::boundary(handshake_and_serve(&cache, config, tcp, peer)).await
                    {
                        panic::report(
                            &cache.metrics,
                            &p,
                            "on a TLS connection; closed it",
                            Some(peer),
                        );
                    }
                    drop(slot);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, keep going.
                tracing::warn!(error = %e, "TLS accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The handshake, then the connection by ALPN. The task lives as long as
/// the connection and is allocated at the size of its largest state: the
/// handshake and the connections run boxed, so a waiting connection
/// carries neither the handshake's state (tokio-rustls's stream in the
/// making, the acceptor's future, the timer) nor room for it.
async fn handshake_and_serve(
    cache: &Arc<Cache>,
    config: Arc<ServerConfig>,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let done = Box::pin(handshake(cache, config, tcp, peer)).await;
    match done {
        Some(Handshaken::Http1(stream, conn)) => {
            let _open = Open::count(&cache.metrics.tls_open_http1);
            Box::pin(server::connection_tls(cache, stream, conn, peer)).await;
        }
        Some(Handshaken::H2(stream, conn)) => {
            // HTTP/2 runs on the same wire as HTTP/1.1.
            let _open = Open::count(&cache.metrics.tls_open_h2);
            Box::pin(crate::h2front::serve(
                cache.clone(),
                stream,
                crate::wire::Wire::Tls(conn),
                peer,
                Bytes::new(),
            ))
            .await;
        }
        None => {}
    }
}

/// A connection past its handshake, by ALPN: the socket, registered with
/// the reactor, and the TLS connection (both front ends run over
/// `crate::wire`).
enum Handshaken {
    /// HTTP/1.1, for the loop of `crate::server`.
    Http1(AsyncFd<StdStream>, Box<Tls>),
    /// HTTP/2 (ALPN `h2`), for `crate::h2front`.
    H2(AsyncFd<StdStream>, Box<Tls>),
}

/// The handshake, within the header timeout; counted in the metrics.
async fn handshake(
    cache: &Arc<Cache>,
    config: Arc<ServerConfig>,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
) -> Option<Handshaken> {
    let m = &cache.metrics;
    let stream = match tcp.into_std() {
        // SAFETY: the AsyncFd owns the socket from here on.
        Ok(s) => match unsafe { AsyncFd::register(s) } {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register a TLS connection");
                return None;
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot take over a TLS connection");
            return None;
        }
    };
    let mut tls = match Tls::new(config) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start a TLS connection");
            return None;
        }
    };
    let limit = Duration::from_millis(cache.cfg.header_timeout_ms);
    match tokio::time::timeout(limit, wire::handshake(&stream, cache, &mut tls)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            m.tls_handshakes_failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return None;
        }
        Err(_) => {
            m.tls_handshakes_timeout.fetch_add(1, Ordering::Relaxed);
            m.timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "TLS handshake not done in time");
            return None;
        }
    }
    m.tls_handshakes_ok.fetch_add(1, Ordering::Relaxed);
    if tls.handshake_kind() == Some(HandshakeKind::Resumed) {
        m.tls_resumed.fetch_add(1, Ordering::Relaxed);
    }
    Some(if tls.alpn_protocol() == Some(b"h2") {
        Handshaken::H2(stream, tls)
    } else {
        Handshaken::Http1(stream, tls)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_paths_and_files() {
        assert_eq!(
            cert_name("Video.Example.").as_deref(),
            Some("video.example")
        );
        assert_eq!(
            cert_name("_wildcard.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(
            cert_name("%2A.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(cert_name("*.example.com").as_deref(), Some("*.example.com"));
        for bad in [
            "",
            ".",
            "a..b",
            "-a.b",
            "a b",
            "a/b",
            "../x",
            "*",
            "*.",
            "a.*.b",
            "a\"b",
            "x".repeat(64).as_str(),
        ] {
            assert_eq!(cert_name(bad), None, "{bad:?}");
        }
        assert_eq!(file_stem("*.example.com"), "_wildcard.example.com");
        assert_eq!(
            cert_name(&file_stem("*.example.com")).as_deref(),
            Some("*.example.com")
        );
    }

    /// Whatever bytes are given as a name, the answer is a name made of
    /// safe characters (it ends up in metrics labels and file names) or
    /// none, never a panic.
    #[test]
    fn any_input_gives_a_safe_name_or_none() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet = b"aZ09-.*_%2A/\\\" \n\x00\xffw";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let s: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i % 60)) as usize + i) % alphabet.len()])
                .collect();
            let s = String::from_utf8_lossy(&s);
            if let Some(n) = cert_name(&s) {
                assert!(
                    n.bytes().all(|c| c.is_ascii_lowercase()
                        || c.is_ascii_digit()
                        || b"-.*".contains(&c)),
                    "{s:?} -> {n:?}"
                );
                assert!(!n.contains("..") && !n.starts_with('.'));
            }
        }
    }

    #[test]
    fn ocsp_responses_must_be_der() {
        assert!(check_ocsp(b"").is_err());
        assert!(check_ocsp(b"-----BEGIN").is_err());
        assert!(check_ocsp(&vec![0x30; MAX_OCSP + 1]).is_err());
        assert!(check_ocsp(&[0x30, 0x03, 0x0a, 0x01, 0x00]).is_ok());
    }
}
