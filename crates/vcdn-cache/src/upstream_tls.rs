//! TLS to an `https://` origin or parent: the client configuration built
//! once per cache (trust, ALPN `http/1.1`, a session cache so that
//! reconnects resume instead of doing a full handshake), the handshake
//! with SNI and the name to verify, the connection type the upstream pool
//! holds (plain TCP or TLS over TCP), the check of an idle TLS connection
//! before reuse, and the translation of rustls's verdicts into sentences
//! an operator can act on.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use vcdn_http::tls::rustls::pki_types::ServerName;
use vcdn_http::tls::rustls::{self, CertificateError, ClientConfig};
use vcdn_http::tls::tokio_rustls::client::TlsStream;
use vcdn_http::tls::tokio_rustls::TlsConnector;
use vcdn_http::tls::{self, Trust};

/// TLS sessions remembered for resumption (per cache; one upstream name,
/// so a few suffice, but each serving thread opens its own connections).
const SESSIONS: usize = 256;

/// How the cache speaks TLS to its upstream: built once at start.
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
    /// Sent in SNI (when a DNS name) and verified against the certificate.
    name: ServerName<'static>,
    /// Where the trust comes from, for error messages.
    trust: &'static str,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("name", &self.name)
            .field("trust", &self.trust)
            .finish()
    }
}

impl UpstreamTls {
    /// `host` is the URL's host (brackets of an IPv6 address removed);
    /// `pinned` replaces it as the name sent and verified; `ca_file` is a
    /// PEM bundle to trust instead of the system roots.
    pub fn new(host: &str, pinned: Option<&str>, ca_file: Option<&Path>) -> Result<Self, String> {
        let name_text = pinned.unwrap_or(host);
        let name = ServerName::try_from(name_text.to_string()).map_err(|_| {
            format!(
                "{name_text:?} is not a DNS name or IP address to verify the origin's certificate against{}",
                if pinned.is_some() { " (--origin-tls-name)" } else { "" }
            )
        })?;
        let (trust, from) = match ca_file {
            Some(p) => (Trust::Bundle(read_bundle(p)?), "--origin-ca-file"),
            None => (Trust::System, "the system roots"),
        };
        let base = tls::client_config(&trust, &[b"http/1.1"])?;
        let mut config = (*base).clone();
        config.resumption = rustls::client::Resumption::in_memory_sessions(SESSIONS);
        Ok(UpstreamTls {
            config: Arc::new(config),
            name,
            trust: from,
        })
    }

    /// The name sent in SNI (a DNS name) and verified.
    pub fn name(&self) -> String {
        self.name.to_str().into_owned()
    }

    /// The TLS handshake on a connected socket. The caller bounds it in
    /// time (it counts as part of connecting).
    pub async fn handshake(&self, tcp: TcpStream) -> Result<Conn, TlsFailure> {
        let connector = TlsConnector::from(self.config.clone());
        match connector.connect(self.name.clone(), tcp).await {
            Ok(s) => Ok(Conn::Tls(Box::new(s))),
            Err(e) => Err(TlsFailure::from_io(&e, self.trust)),
        }
    }
}

fn read_bundle(p: &Path) -> Result<Vec<tls::rustls::pki_types::CertificateDer<'static>>, String> {
    let text = std::fs::read(p)
        .map_err(|e| format!("cannot read --origin-ca-file {}: {e}", p.display()))?;
    tls::parse_chain(&text).map_err(|e| format!("--origin-ca-file {}: {e}", p.display()))
}

/// An upstream connection: plain, or TLS over TCP.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Plain(s) => write!(f, "Plain({:?})", s.peer_addr().ok()),
            Conn::Tls(s) => write!(f, "Tls({:?})", s.get_ref().0.peer_addr().ok()),
        }
    }
}

impl Conn {
    /// Whether an idle connection can carry a request: the upstream has
    /// neither closed it nor sent bytes nobody asked for (a late or extra
    /// response, which would be taken for the answer to the next request).
    /// Looks at the TCP socket without waiting; on TLS, records that did
    /// arrive are read and decrypted here: a session ticket is fine, a
    /// close_notify or application data is not.
    pub fn still_open(&mut self) -> bool {
        match self {
            Conn::Plain(s) => peek(s) == Peek::Quiet,
            Conn::Tls(s) => {
                let (tcp, session) = s.get_mut();
                // Plaintext already decrypted and not read, or a close
                // seen while reading the last response.
                match session.process_new_packets() {
                    Ok(st) if st.plaintext_bytes_to_read() == 0 && !st.peer_has_closed() => {}
                    _ => return false,
                }
                match peek(tcp) {
                    Peek::Quiet => return true,
                    Peek::Closed => return false,
                    Peek::Bytes => {}
                }
                // Records are waiting: take them in without blocking.
                loop {
                    match session.read_tls(&mut NoWait(tcp)) {
                        Ok(0) => return false,
                        Ok(_) => match session.process_new_packets() {
                            Ok(st)
                                if st.plaintext_bytes_to_read() == 0 && !st.peer_has_closed() => {}
                            _ => return false,
                        },
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                        Err(_) => return false,
                    }
                }
            }
        }
    }
}

#[derive(PartialEq, Eq)]
enum Peek {
    /// Nothing waiting, not closed.
    Quiet,
    Closed,
    Bytes,
}

/// One non-blocking peek at the socket, past tokio's readiness cache (a
/// serving thread turns its reactor only between batches).
fn peek(s: &TcpStream) -> Peek {
    use rustix::net::{recv, RecvFlags};
    let mut byte = [0u8; 1];
    match recv(s, &mut byte, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Peek::Quiet,
        Err(_) => Peek::Closed,
        Ok((0, _)) => Peek::Closed,
        Ok(_) => Peek::Bytes,
    }
}

/// A non-blocking reader straight from the socket, for rustls's
/// `read_tls` during the idle check.
struct NoWait<'a>(&'a TcpStream);

impl io::Read for NoWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use rustix::net::{recv, RecvFlags};
        recv(self.0, buf, RecvFlags::DONTWAIT)
            .map(|(n, _)| n)
            .map_err(io::Error::from)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl Conn {
    /// Whether this is a TLS connection whose session was resumed (no
    /// full handshake).
    pub fn resumed(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(s) => s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
        }
    }
}

/// Why a TLS handshake with the upstream failed, for the metric label and
/// for the 502's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsReason {
    UnknownIssuer,
    NameMismatch,
    Expired,
    NotYetValid,
    Revoked,
    BadCertificate,
    /// The origin sent a fatal alert.
    Alert,
    /// The origin did not answer in TLS at all (a plain HTTP port).
    NotTls,
    /// No common version, cipher suite or ALPN protocol.
    Incompatible,
    /// Anything else: closed mid-handshake, protocol errors.
    Handshake,
    /// The handshake did not finish within the connect timeout (504).
    Timeout,
}

impl TlsReason {
    pub const ALL: [TlsReason; 11] = [
        TlsReason::UnknownIssuer,
        TlsReason::NameMismatch,
        TlsReason::Expired,
        TlsReason::NotYetValid,
        TlsReason::Revoked,
        TlsReason::BadCertificate,
        TlsReason::Alert,
        TlsReason::NotTls,
        TlsReason::Incompatible,
        TlsReason::Handshake,
        TlsReason::Timeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TlsReason::UnknownIssuer => "unknown_issuer",
            TlsReason::NameMismatch => "name_mismatch",
            TlsReason::Expired => "expired",
            TlsReason::NotYetValid => "not_yet_valid",
            TlsReason::Revoked => "revoked",
            TlsReason::BadCertificate => "bad_certificate",
            TlsReason::Alert => "alert",
            TlsReason::NotTls => "not_tls",
            TlsReason::Incompatible => "incompatible",
            TlsReason::Handshake => "handshake",
            TlsReason::Timeout => "timeout",
        }
    }
}

/// A failed handshake: why, in a word and in a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    pub reason: TlsReason,
    pub message: String,
}

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl TlsFailure {
    /// Whether another try may succeed: the connection broke during the
    /// handshake (an origin restarting), as opposed to a verdict on the
    /// certificate or the protocol, which would be the same again.
    pub fn transient(&self) -> bool {
        self.reason == TlsReason::Handshake
    }

    fn from_io(e: &io::Error, trust: &str) -> TlsFailure {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(r) => TlsFailure::from_rustls(r, trust),
            None if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ) =>
            {
                TlsFailure {
                    reason: TlsReason::Handshake,
                    message: "the origin closed the connection during the TLS handshake (does it serve TLS on this port?)".into(),
                }
            }
            None => TlsFailure {
                reason: TlsReason::Handshake,
                message: format!("the TLS handshake with the origin failed: {e}"),
            },
        }
    }

    /// rustls's error as a plain sentence (`trust` says what the
    /// certificate was verified against).
    pub fn from_rustls(e: &rustls::Error, trust: &str) -> TlsFailure {
        use rustls::Error as E;
        let (reason, message) = match e {
            E::InvalidCertificate(c) => certificate(c, trust),
            E::NoCertificatesPresented => (
                TlsReason::BadCertificate,
                "the origin presented no certificate".into(),
            ),
            E::AlertReceived(a) => (
                TlsReason::Alert,
                format!("the origin refused the TLS handshake (alert {a:?})"),
            ),
            E::InvalidMessage(_) | E::InappropriateMessage { .. } => (
                TlsReason::NotTls,
                "the origin did not answer in TLS (is it a plain HTTP port? then use http://)"
                    .into(),
            ),
            E::NoApplicationProtocol => (
                TlsReason::Incompatible,
                "the origin does not offer HTTP/1.1 over TLS (ALPN)".into(),
            ),
            E::PeerIncompatible(p) => (
                TlsReason::Incompatible,
                format!("the origin shares no TLS version or cipher suite with the cache ({p:?}); TLS 1.2 or 1.3 is required"),
            ),
            other => (
                TlsReason::Handshake,
                format!("the TLS handshake with the origin failed: {other}"),
            ),
        };
        TlsFailure { reason, message }
    }
}

fn certificate(c: &CertificateError, trust: &str) -> (TlsReason, String) {
    use CertificateError as C;
    let untrusted = |why: &str| format!("the origin's certificate is not trusted: {why}");
    match c {
        C::UnknownIssuer => (
            TlsReason::UnknownIssuer,
            format!(
                "{} (verified against {trust}; name the origin's CA with --origin-ca-file)",
                untrusted("unknown issuer")
            ),
        ),
        C::NotValidForNameContext {
            expected,
            presented,
        } => {
            let names: Vec<String> = presented.iter().map(|p| presented_name(p)).collect();
            let is_for = if names.is_empty() {
                "names no host".to_string()
            } else {
                format!("is for {}", names.join(", "))
            };
            (
                TlsReason::NameMismatch,
                format!(
                    "the origin's certificate {is_for}, not {} (pin the name to verify with --origin-tls-name)",
                    expected.to_str()
                ),
            )
        }
        C::NotValidForName => (
            TlsReason::NameMismatch,
            "the origin's certificate is not for the origin's name (pin the name to verify with --origin-tls-name)".into(),
        ),
        C::ExpiredContext { not_after, .. } => (
            TlsReason::Expired,
            format!(
                "the origin's certificate expired on {}",
                tls::rfc3339(not_after.as_secs() as i64)
            ),
        ),
        C::Expired => (
            TlsReason::Expired,
            "the origin's certificate has expired".into(),
        ),
        C::NotValidYetContext { not_before, .. } => (
            TlsReason::NotYetValid,
            format!(
                "the origin's certificate is not valid before {} (check the clocks)",
                tls::rfc3339(not_before.as_secs() as i64)
            ),
        ),
        C::NotValidYet => (
            TlsReason::NotYetValid,
            "the origin's certificate is not valid yet (check the clocks)".into(),
        ),
        C::Revoked => (
            TlsReason::Revoked,
            "the origin's certificate is revoked".into(),
        ),
        // A trusted certificate bears the issuer's name but did not sign
        // this one (a self-signed certificate named like a system root,
        // e.g. Debian's snakeoil `CN=localhost`, or a forgery).
        C::BadSignature | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => (
            TlsReason::UnknownIssuer,
            format!(
                "{} (verified against {trust}; name the origin's CA with --origin-ca-file)",
                untrusted("no trusted CA signed it (one has its issuer's name, but its signature does not verify)")
            ),
        ),
        C::UnsupportedSignatureAlgorithmContext { .. } => (
            TlsReason::BadCertificate,
            untrusted("it is signed with an algorithm the cache does not support"),
        ),
        C::BadEncoding => (
            TlsReason::BadCertificate,
            "the origin's certificate cannot be parsed".into(),
        ),
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => (
            TlsReason::BadCertificate,
            "the origin's certificate is not for server authentication (extended key usage)"
                .into(),
        ),
        other => (
            TlsReason::BadCertificate,
            untrusted(&format!("{other:?}")),
        ),
    }
}

/// `DnsName("a.example")` or `IpAddress(192.0.2.1)` (webpki's rendering
/// of a presented name) → `a.example`, `192.0.2.1`.
fn presented_name(p: &str) -> String {
    for (open, close) in [("DnsName(\"", "\")"), ("IpAddress(", ")")] {
        if let Some(inner) = p.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
            return inner.to_string();
        }
    }
    p.to_string()
}

/// Handshake failures by reason, for `/metrics`.
#[derive(Debug, Default)]
pub struct TlsFailures([AtomicU64; TlsReason::ALL.len()]);

impl TlsFailures {
    pub fn count(&self, r: TlsReason) {
        self.0[r as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, r: TlsReason) -> u64 {
        self.0[r as usize].load(Ordering::Relaxed)
    }

    /// `vcdn_cache_upstream_tls_failures_total{reason}` in the Prometheus
    /// text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str("# HELP vcdn_cache_upstream_tls_failures_total TLS handshakes with the upstream that failed, by reason (certificate not trusted, wrong name, expired, ...).\n# TYPE vcdn_cache_upstream_tls_failures_total counter\n");
        for r in TlsReason::ALL {
            let _ = writeln!(
                out,
                "vcdn_cache_upstream_tls_failures_total{{reason=\"{}\"}} {}",
                r.as_str(),
                self.get(r)
            );
        }
    }
}

/// A CA bundle path given without an https:// upstream is a mistake.
pub fn needs_https(what: &str, upstream: &str) -> Result<(), String> {
    if upstream.starts_with("https://") {
        Ok(())
    } else {
        Err(format!(
            "{what} applies to an https:// upstream only; --upstream is {upstream}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presented_names_are_unwrapped() {
        assert_eq!(presented_name("DnsName(\"a.example\")"), "a.example");
        assert_eq!(presented_name("IpAddress(192.0.2.1)"), "192.0.2.1");
        assert_eq!(presented_name("Unsupported(0x01)"), "Unsupported(0x01)");
    }

    #[test]
    fn verdicts_read_as_sentences() {
        let f = TlsFailure::from_rustls(
            &rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            "the system roots",
        );
        assert_eq!(f.reason, TlsReason::UnknownIssuer);
        assert!(f
            .message
            .starts_with("the origin's certificate is not trusted: unknown issuer"));
        let f = TlsFailure::from_rustls(
            &rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("origin.example").unwrap(),
                presented: vec!["DnsName(\"other.example\")".into()],
            }),
            "x",
        );
        assert!(
            f.message
                .starts_with("the origin's certificate is for other.example, not origin.example"),
            "{}",
            f.message
        );
    }
}
