//! TLS for every vcdn server and client, on rustls with the aws-lc-rs
//! provider: certificates read from PEM and checked (chain order, key
//! match, validity) with errors a person can act on; a certificate store
//! chosen by SNI and replaced live; server and client configurations with
//! the same defaults everywhere; certificates made here (self-signed, or
//! issued by an operator's internal CA); trust by fingerprint for a
//! self-signed control plane.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use sha2::{Digest, Sha256};

pub use rustls;
pub use tokio_rustls;

/// The one crypto provider of the process (aws-lc-rs).
pub fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| {
        let p = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        // Also the process default, for libraries that ask for it.
        let _ = CryptoProvider::install_default((*p).clone());
        p
    })
    .clone()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertError {
    #[error("no certificate found: expected one or more PEM blocks 'BEGIN CERTIFICATE'")]
    NoCertificate,
    #[error("the certificate PEM is malformed: {0}")]
    BadCertificatePem(String),
    #[error("no private key found: expected a PEM block 'BEGIN PRIVATE KEY' (PKCS#8), 'BEGIN EC PRIVATE KEY' or 'BEGIN RSA PRIVATE KEY'")]
    NoKey,
    #[error("the private key is not usable: {0}")]
    BadKey(String),
    #[error("certificate {0} of the chain cannot be parsed as X.509: {1}")]
    BadCertificate(usize, String),
    #[error("the private key does not belong to the first certificate of the chain (its public key differs)")]
    KeyMismatch,
    #[error("the chain is out of order: certificate {0} ({1}) is not issued by the next one ({2}); put the server's certificate first, then each issuer")]
    ChainOrder(usize, String, String),
    #[error("the certificate expired on {0}")]
    Expired(String),
    #[error("the certificate is valid only from {0}")]
    NotYetValid(String),
    #[error("the certificate does not cover {0}: it names {1}")]
    WrongName(String, String),
}

/// What a certificate says about itself, for APIs, events and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub subject: String,
    pub issuer: String,
    /// DNS names and IP addresses of its subjectAltName (the subject's
    /// common name when it has none).
    pub names: Vec<String>,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// `sha256:` and the hex of the SHA-256 of the end-entity certificate.
    pub fingerprint: String,
    pub self_signed: bool,
}

impl CertInfo {
    pub fn not_after_rfc3339(&self) -> String {
        rfc3339(self.not_after)
    }

    /// Whether this certificate is good for `host` (exact, or a `*.`
    /// wildcard covering one label, RFC 6125 §6.4.3).
    pub fn covers(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.names.iter().any(|n| name_matches(n, &host))
    }

    /// Refuse a certificate that is not valid at `now` (Unix seconds).
    pub fn check_validity(&self, now: i64) -> Result<(), CertError> {
        if now > self.not_after {
            return Err(CertError::Expired(rfc3339(self.not_after)));
        }
        if now < self.not_before {
            return Err(CertError::NotYetValid(rfc3339(self.not_before)));
        }
        Ok(())
    }
}

fn name_matches(pattern: &str, host: &str) -> bool {
    let p = pattern.to_ascii_lowercase();
    if let Some(suffix) = p.strip_prefix("*.") {
        return host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix);
    }
    p == host
}

/// `2026-11-27T04:00:00Z` from Unix seconds.
pub fn rfc3339(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `sha256:` and the lowercase hex of the SHA-256 of `der`.
pub fn fingerprint(der: &[u8]) -> String {
    let d = Sha256::digest(der);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parse a fingerprint as printed by [`fingerprint`] (colons and case
/// ignored, the `sha256:` prefix optional).
pub fn parse_fingerprint(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    let s = s.strip_prefix("sha256:").unwrap_or(s);
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A certificate chain and its key, parsed and checked.
#[derive(Clone, Debug)]
pub struct CertBundle {
    pub key: Arc<CertifiedKey>,
    pub info: CertInfo,
}

/// Parse a PEM chain (server certificate first) and its PEM private key,
/// checking that every certificate parses, that each is issued by the next
/// (by name), and that the key belongs to the first. Validity dates are
/// not checked here (see [`CertInfo::check_validity`]).
pub fn parse_bundle(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertBundle, CertError> {
    let chain = parse_chain(cert_pem)?;
    let key = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(k) => k,
        Err(rustls::pki_types::pem::Error::NoItemsFound) => return Err(CertError::NoKey),
        Err(e) => return Err(CertError::BadKey(e.to_string())),
    };
    let info = inspect(&chain)?;
    let provider = provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| CertError::BadKey(e.to_string()))?;
    let ck = CertifiedKey::new(chain, signing);
    match ck.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(CertError::KeyMismatch)
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => return Err(CertError::BadKey(e.to_string())),
    }
    Ok(CertBundle {
        key: Arc::new(ck),
        info,
    })
}

/// The certificates of a PEM text, in order.
pub fn parse_chain(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::BadCertificatePem(e.to_string()))?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate);
    }
    Ok(chain)
}

/// Read a chain's end-entity certificate, and check the chain's order.
pub fn inspect(chain: &[CertificateDer<'_>]) -> Result<CertInfo, CertError> {
    use x509_parser::prelude::*;
    let mut parsed = Vec::with_capacity(chain.len());
    for (i, der) in chain.iter().enumerate() {
        let (_, c) = parse_x509_certificate(der.as_ref())
            .map_err(|e| CertError::BadCertificate(i + 1, e.to_string()))?;
        parsed.push(c);
    }
    for (i, w) in parsed.windows(2).enumerate() {
        if w[0].issuer().as_raw() != w[1].subject().as_raw() {
            return Err(CertError::ChainOrder(
                i + 1,
                w[0].subject().to_string(),
                w[1].subject().to_string(),
            ));
        }
    }
    let leaf = &parsed[0];
    let mut names = Vec::new();
    if let Ok(Some(san)) = leaf.subject_alternative_name() {
        for g in &san.value.general_names {
            match g {
                GeneralName::DNSName(d) => names.push(d.to_ascii_lowercase()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap()).to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    if names.is_empty() {
        for cn in leaf.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_ascii_lowercase());
            }
        }
    }
    Ok(CertInfo {
        subject: leaf.subject().to_string(),
        issuer: leaf.issuer().to_string(),
        names,
        not_before: leaf.validity().not_before.timestamp(),
        not_after: leaf.validity().not_after.timestamp(),
        fingerprint: fingerprint(chain[0].as_ref()),
        self_signed: leaf.issuer().as_raw() == leaf.subject().as_raw(),
    })
}

/// Certificates by host name, chosen by the client's SNI and replaced live:
/// a new certificate is used by the next handshake, connections already up
/// keep theirs. A client without SNI (or with an unknown name) gets the
/// default certificate, if one is set.
#[derive(Default)]
pub struct CertStore {
    by_name: RwLock<HashMap<String, CertBundle>>,
    default: RwLock<Option<String>>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("names", &self.names())
            .finish()
    }
}

impl CertStore {
    pub fn new() -> Arc<CertStore> {
        Arc::new(CertStore::default())
    }

    /// Set (or replace) the certificate for `name` (a host name, or a
    /// `*.` wildcard). The first one set becomes the default.
    pub fn set(&self, name: &str, bundle: CertBundle) {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.by_name.write().insert(name.clone(), bundle);
        let mut d = self.default.write();
        if d.is_none() {
            *d = Some(name);
        }
    }

    /// Set the OCSP response stapled with `name`'s certificate.
    pub fn set_ocsp(&self, name: &str, ocsp: Option<Vec<u8>>) -> bool {
        let mut m = self.by_name.write();
        let Some(b) = m.get_mut(&name.to_ascii_lowercase()) else {
            return false;
        };
        let mut k = (*b.key).clone();
        k.ocsp = ocsp;
        b.key = Arc::new(k);
        true
    }

    pub fn remove(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        let gone = self.by_name.write().remove(&name).is_some();
        let mut d = self.default.write();
        if d.as_deref() == Some(name.as_str()) {
            *d = self.by_name.read().keys().min().cloned();
        }
        gone
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_name.read().keys().cloned().collect();
        v.sort();
        v
    }

    /// Every certificate with what it says about itself.
    pub fn list(&self) -> Vec<(String, CertInfo, bool)> {
        let m = self.by_name.read();
        let mut v: Vec<_> = m
            .iter()
            .map(|(n, b)| (n.clone(), b.info.clone(), b.key.ocsp.is_some()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.read().is_empty()
    }

    /// The certificate for a host name: exact, then wildcard, then default.
    pub fn lookup(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let m = self.by_name.read();
        if let Some(host) = sni {
            let host = host.trim_end_matches('.').to_ascii_lowercase();
            if let Some(b) = m.get(&host) {
                return Some(b.key.clone());
            }
            if let Some((_, rest)) = host.split_once('.') {
                if let Some(b) = m.get(&format!("*.{rest}")) {
                    return Some(b.key.clone());
                }
            }
        }
        let d = self.default.read();
        d.as_ref().and_then(|n| m.get(n)).map(|b| b.key.clone())
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.lookup(hello.server_name())
    }
}

/// A server configuration: TLS 1.3 and 1.2, certificates from `certs`,
/// `alpn` offered in order of preference, session resumption by ID (a
/// shared cache of `sessions` entries) and by tickets whose keys rotate
/// every 6 hours (rustls's ticket rotator; the previous key still decrypts).
pub fn server_config(
    certs: Arc<dyn ResolvesServerCert>,
    alpn: &[&[u8]],
    sessions: usize,
) -> Arc<ServerConfig> {
    let mut c = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the provider supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(certs);
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    c.session_storage = ServerSessionMemoryCache::new(sessions.max(1));
    c.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new().expect("ticketer");
    c.send_tls13_tickets = 1;
    // Requests are small; large early data would be an amplifier.
    c.max_early_data_size = 0;
    Arc::new(c)
}

/// A server configuration with one certificate for every name.
pub fn single_cert_config(bundle: CertBundle, alpn: &[&[u8]]) -> Arc<ServerConfig> {
    let store = CertStore::new();
    store.set("*", bundle);
    server_config(store, alpn, 1024)
}

/// Whom a client trusts.
#[derive(Clone, Debug)]
pub enum Trust {
    /// The system's roots (Debian's `/etc/ssl/certs`, or `SSL_CERT_FILE`).
    System,
    /// Only these CA certificates (PEM bundle).
    Bundle(Vec<CertificateDer<'static>>),
    /// Exactly the server certificate with this SHA-256 fingerprint,
    /// whatever its names or issuer (a self-signed control plane).
    Fingerprint([u8; 32]),
}

/// The system's roots, read once. Unreadable ones are skipped.
pub fn system_roots() -> Arc<RootCertStore> {
    static R: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    R.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "a system CA certificate could not be read");
        }
        let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
        Arc::new(roots)
    })
    .clone()
}

/// A client configuration for `trust`, offering `alpn`.
pub fn client_config(trust: &Trust, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let mut c = match trust {
        Trust::System => builder
            .with_root_certificates(system_roots())
            .with_no_client_auth(),
        Trust::Bundle(cas) => {
            let mut roots = RootCertStore::empty();
            for ca in cas {
                roots
                    .add(ca.clone())
                    .map_err(|e| format!("a CA certificate of the bundle is not usable: {e}"))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::Fingerprint(fp) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                fingerprint: *fp,
                provider: provider(),
            }))
            .with_no_client_auth(),
    };
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(c))
}

/// A server presented another certificate than the one trusted by
/// fingerprint (inside `rustls::Error::Other`, so a client can say which).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the server's certificate has fingerprint {seen}, not the one trusted")]
pub struct FingerprintMismatch {
    pub seen: String,
}

/// Accepts exactly one certificate, by fingerprint; signatures are still
/// verified, so only the holder of its key can complete the handshake.
#[derive(Debug)]
struct PinnedVerifier {
    fingerprint: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if got == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::Other(rustls::OtherError(Arc::new(
                FingerprintMismatch {
                    seen: fingerprint(end_entity.as_ref()),
                },
            ))))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A certificate and key made here, in PEM.
#[derive(Clone, Debug)]
pub struct MadeCert {
    pub cert_pem: String,
    pub key_pem: String,
}

fn params(names: &[String], days: u32) -> Result<rcgen::CertificateParams, String> {
    let now = std::time::SystemTime::now();
    params_between(
        names,
        now - std::time::Duration::from_secs(300),
        now + std::time::Duration::from_secs(u64::from(days) * 86_400),
    )
}

fn params_between(
    names: &[String],
    from: std::time::SystemTime,
    to: std::time::SystemTime,
) -> Result<rcgen::CertificateParams, String> {
    let mut p = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
    p.not_before = from.into();
    p.not_after = to.into();
    if let Some(first) = names.first() {
        p.distinguished_name
            .push(rcgen::DnType::CommonName, first.clone());
    }
    Ok(p)
}

/// A self-signed ECDSA P-256 certificate for `names`, valid `days` days.
pub fn self_signed(names: &[String], days: u32) -> Result<MadeCert, String> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let cert = params(names, days)?
        .self_signed(&key)
        .map_err(|e| e.to_string())?;
    Ok(MadeCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A self-signed certificate valid only between `from` and `to` (tests of
/// expired and not-yet-valid certificates).
pub fn self_signed_between(
    names: &[String],
    from: std::time::SystemTime,
    to: std::time::SystemTime,
) -> Result<MadeCert, String> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let cert = params_between(names, from, to)?
        .self_signed(&key)
        .map_err(|e| e.to_string())?;
    Ok(MadeCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// An operator's internal certificate authority (ECDSA P-256).
pub struct Ca {
    pub cert_pem: String,
    key: rcgen::KeyPair,
}

impl Ca {
    /// A new CA named `name`, valid `days` days.
    pub fn create(name: &str, days: u32) -> Result<Ca, String> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| e.to_string())?;
        let mut p = params(&[], days)?;
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).map_err(|e| e.to_string())?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key,
        })
    }

    /// A CA saved before (`cert_pem`, `key_pem`).
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<Ca, String> {
        let key = rcgen::KeyPair::from_pem(key_pem).map_err(|e| e.to_string())?;
        // Check that it parses as a CA certificate with this key.
        rcgen::Issuer::from_ca_cert_pem(cert_pem, &key).map_err(|e| e.to_string())?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            key,
        })
    }

    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A server certificate for `names`, valid `days` days, issued by this
    /// CA. `cert_pem` holds the certificate then the CA's.
    pub fn issue(&self, names: &[String], days: u32) -> Result<MadeCert, String> {
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)
            .map_err(|e| e.to_string())?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| e.to_string())?;
        let mut p = params(names, days)?;
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = p.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
        Ok(MadeCert {
            cert_pem: format!("{}{}", cert.pem(), self.cert_pem),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn a_made_certificate_parses_and_names_its_hosts() {
        let m = self_signed(&["video.example".into(), "127.0.0.1".into()], 30).unwrap();
        let b = parse_bundle(m.cert_pem.as_bytes(), m.key_pem.as_bytes()).unwrap();
        assert!(b.info.covers("video.example"));
        assert!(b.info.covers("VIDEO.example."));
        assert!(b.info.covers("127.0.0.1"));
        assert!(!b.info.covers("other.example"));
        assert!(b.info.self_signed);
        b.info.check_validity(now()).unwrap();
        assert!(b.info.not_after - now() > 29 * 86_400);
        assert!(b.info.fingerprint.starts_with("sha256:"));
        assert_eq!(
            parse_fingerprint(&b.info.fingerprint.to_uppercase().replace("SHA256:", "")),
            parse_fingerprint(&b.info.fingerprint)
        );
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let a = self_signed(&["a.example".into()], 30).unwrap();
        let b = self_signed(&["b.example".into()], 30).unwrap();
        let e = parse_bundle(a.cert_pem.as_bytes(), b.key_pem.as_bytes()).unwrap_err();
        assert_eq!(e, CertError::KeyMismatch);
    }

    #[test]
    fn garbage_and_missing_parts_say_what_is_wrong() {
        let a = self_signed(&["a.example".into()], 30).unwrap();
        assert_eq!(
            parse_bundle(b"hello", a.key_pem.as_bytes()).unwrap_err(),
            CertError::NoCertificate
        );
        assert_eq!(
            parse_bundle(a.cert_pem.as_bytes(), b"").unwrap_err(),
            CertError::NoKey
        );
        let broken = a.cert_pem.replace("MI", "**");
        assert!(parse_bundle(broken.as_bytes(), a.key_pem.as_bytes()).is_err());
    }

    #[test]
    fn ca_issued_chains_are_checked_for_order() {
        let ca = Ca::create("vcdn test CA", 365).unwrap();
        let leaf = ca.issue(&["*.svc.example".into()], 10).unwrap();
        let b = parse_bundle(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).unwrap();
        assert!(!b.info.self_signed);
        assert!(b.info.covers("demo.svc.example"));
        assert!(!b.info.covers("a.b.svc.example"));
        assert!(!b.info.covers("svc.example"));
        // CA first, leaf second: out of order.
        let chain: Vec<&str> = leaf
            .cert_pem
            .split_inclusive("-----END CERTIFICATE-----\n")
            .collect();
        let swapped = format!("{}{}", chain[1], chain[0]);
        let e = parse_bundle(swapped.as_bytes(), leaf.key_pem.as_bytes()).unwrap_err();
        assert!(matches!(e, CertError::ChainOrder(1, _, _)), "{e}");
        // The CA survives a save and load.
        let again = Ca::load(&ca.cert_pem, &ca.key_pem()).unwrap();
        again.issue(&["x.example".into()], 1).unwrap();
    }

    #[test]
    fn validity_is_checked_against_the_clock() {
        let m = self_signed(&["a.example".into()], 1).unwrap();
        let b = parse_bundle(m.cert_pem.as_bytes(), m.key_pem.as_bytes()).unwrap();
        assert!(matches!(
            b.info.check_validity(now() + 3 * 86_400),
            Err(CertError::Expired(_))
        ));
        assert!(matches!(
            b.info.check_validity(now() - 3 * 86_400),
            Err(CertError::NotYetValid(_))
        ));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn the_store_picks_by_sni_exact_then_wildcard_then_default() {
        let s = CertStore::new();
        let mk = |n: &str| {
            let m = self_signed(&[n.to_string()], 5).unwrap();
            parse_bundle(m.cert_pem.as_bytes(), m.key_pem.as_bytes()).unwrap()
        };
        let a = mk("a.example");
        let w = mk("*.w.example");
        s.set("a.example", a.clone());
        s.set("*.w.example", w.clone());
        let fp = |k: Arc<CertifiedKey>| fingerprint(k.cert[0].as_ref());
        assert_eq!(fp(s.lookup(Some("A.example")).unwrap()), a.info.fingerprint);
        assert_eq!(
            fp(s.lookup(Some("x.w.example")).unwrap()),
            w.info.fingerprint
        );
        assert_eq!(fp(s.lookup(None).unwrap()), a.info.fingerprint);
        assert_eq!(
            fp(s.lookup(Some("nobody.example")).unwrap()),
            a.info.fingerprint
        );
        // Replaced live.
        let a2 = mk("a.example");
        s.set("a.example", a2.clone());
        assert_eq!(
            fp(s.lookup(Some("a.example")).unwrap()),
            a2.info.fingerprint
        );
        assert!(s.remove("a.example"));
        assert_eq!(fp(s.lookup(None).unwrap()), w.info.fingerprint);
    }
}
