//! The control plane's certificates, kept in the data directory: the
//! operator's internal CA (`ca.crt`, `ca.key`), which issues the services'
//! certificates when customers upload none, and the API's own certificate
//! (`api.crt`, `api.key`): self-signed, made on the first start and reused,
//! so the API is HTTPS from the first run and clients trust it by its
//! fingerprint (also written to `api.fingerprint`). An operator may give
//! their own certificate instead; plain HTTP is only for loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vcdn_http::tls::{self, CertBundle};

use crate::control::write_secret;

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const API_CERT: &str = "api.crt";
pub const API_KEY: &str = "api.key";
pub const API_FINGERPRINT: &str = "api.fingerprint";

/// The internal CA lives this long (days).
const CA_DAYS: u32 = 3650;
/// The API's self-signed certificate lives this long (days): it is trusted
/// by fingerprint, so a new one means every client must be told again.
const API_DAYS: u32 = 3650;
/// A certificate with less than this left is made anew at start (seconds).
const RENEW_BEFORE_S: i64 = 30 * 86_400;

/// How the API is served.
#[derive(Debug, Clone, Default)]
pub enum ApiTls {
    /// HTTPS with a self-signed certificate made on the first start.
    #[default]
    SelfSigned,
    /// HTTPS with the operator's certificate chain and key (PEM files).
    Files { cert: PathBuf, key: PathBuf },
    /// Plain HTTP, allowed only on a loopback address.
    Plain,
}

/// The operator's internal certificate authority.
pub struct InternalCa {
    pub ca: tls::Ca,
    pub cert_path: PathBuf,
}

impl std::fmt::Debug for InternalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternalCa")
            .field("cert_path", &self.cert_path)
            .finish()
    }
}

fn now() -> i64 {
    crate::control::now_s() as i64
}

fn read(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// The data directory's CA, created on the first start.
pub fn internal_ca(dir: &Path) -> Result<InternalCa, String> {
    let (cp, kp) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if let (Some(c), Some(k)) = (read(&cp)?, read(&kp)?) {
        let ca = tls::Ca::load(&c, &k).map_err(|e| {
            format!(
                "{} and {} are not a usable CA: {e}",
                cp.display(),
                kp.display()
            )
        })?;
        return Ok(InternalCa { ca, cert_path: cp });
    }
    let ca = tls::Ca::create("vcdn internal CA", CA_DAYS)?;
    // The key last: after a crash between the two, the next start finds no
    // key and makes the CA again.
    let _ = std::fs::remove_file(&kp);
    write_secret(&cp, &ca.cert_pem).map_err(|e| format!("cannot write {}: {e}", cp.display()))?;
    write_secret(&kp, &ca.key_pem()).map_err(|e| format!("cannot write {}: {e}", kp.display()))?;
    tracing::info!(cert = %cp.display(), "internal CA created");
    Ok(InternalCa { ca, cert_path: cp })
}

/// The names the API's self-signed certificate carries.
pub fn api_names(listen: SocketAddr) -> Vec<String> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    let ip = listen.ip();
    if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    names
}

/// The API's certificate: the operator's, the data directory's
/// self-signed one (made when missing, expiring or not naming `listen`),
/// or none for plain HTTP (refused unless `listen` is loopback).
pub fn api_certificate(
    dir: &Path,
    listen: SocketAddr,
    how: &ApiTls,
) -> Result<Option<CertBundle>, String> {
    let bundle = match how {
        ApiTls::Plain => {
            check_plain(listen)?;
            let _ = std::fs::remove_file(dir.join(API_FINGERPRINT));
            return Ok(None);
        }
        ApiTls::Files { cert, key } => operator_certificate(cert, key)?,
        ApiTls::SelfSigned => self_signed(dir, listen)?,
    };
    let fp = dir.join(API_FINGERPRINT);
    std::fs::write(&fp, format!("{}\n", bundle.info.fingerprint))
        .map_err(|e| format!("cannot write {}: {e}", fp.display()))?;
    Ok(Some(bundle))
}

/// Refuses plain HTTP off loopback: tokens would cross a network in clear.
pub fn check_plain(listen: SocketAddr) -> Result<(), String> {
    if listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "--plain-http would send the operator token and API keys in clear on {listen}: it is allowed only on a loopback address (127.0.0.0/8, ::1); serve HTTPS instead (the default) or give --tls-cert/--tls-key"
    ))
}

/// The operator's certificate chain and key, checked now.
pub fn operator_certificate(cert: &Path, key: &Path) -> Result<CertBundle, String> {
    let c = std::fs::read(cert).map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let k = std::fs::read(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let b = tls::parse_bundle(&c, &k).map_err(|e| {
        format!(
            "--tls-cert {} / --tls-key {}: {e}",
            cert.display(),
            key.display()
        )
    })?;
    b.info
        .check_validity(now())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    Ok(b)
}

fn self_signed(dir: &Path, listen: SocketAddr) -> Result<CertBundle, String> {
    let (cp, kp) = (dir.join(API_CERT), dir.join(API_KEY));
    let names = api_names(listen);
    if let (Some(c), Some(k)) = (read(&cp)?, read(&kp)?) {
        match tls::parse_bundle(c.as_bytes(), k.as_bytes()) {
            Ok(b)
                if b.info.not_after - now() > RENEW_BEFORE_S
                    && names.iter().all(|n| b.info.covers(n)) =>
            {
                return Ok(b)
            }
            Ok(b) => tracing::warn!(
                cert = %cp.display(),
                not_after = %b.info.not_after_rfc3339(),
                names = ?b.info.names,
                "the API certificate expires soon or does not name the API's address: making a new one (clients must trust its new fingerprint)"
            ),
            // Our own files that do not go together (a crash while they
            // were renewed): made again, like a missing pair.
            Err(e) => tracing::warn!(
                cert = %cp.display(),
                error = %e,
                "the API certificate and key of the data directory do not go together: making new ones (clients must trust the new fingerprint)"
            ),
        }
    }
    let made = tls::self_signed(&names, API_DAYS)?;
    let _ = std::fs::remove_file(&kp);
    write_secret(&cp, &made.cert_pem).map_err(|e| format!("cannot write {}: {e}", cp.display()))?;
    write_secret(&kp, &made.key_pem).map_err(|e| format!("cannot write {}: {e}", kp.display()))?;
    let b = tls::parse_bundle(made.cert_pem.as_bytes(), made.key_pem.as_bytes())
        .map_err(|e| e.to_string())?;
    tracing::info!(cert = %cp.display(), fingerprint = %b.info.fingerprint, "API certificate created");
    Ok(b)
}

/// An admin API's certificate of the internal CA lives this long (days):
/// made anew at each start of its server, so this bounds only how long one
/// process may run without a restart and still be trusted.
const ADMIN_DAYS: u32 = 825;

/// The router admin API's TLS under `vcdn up`: a certificate of the
/// internal CA for the admin address (and `localhost`, `127.0.0.1`, `::1`),
/// made anew at each start and kept in memory only.
pub fn router_admin_tls(
    ca: &InternalCa,
    admin: SocketAddr,
) -> Result<Arc<tls::rustls::ServerConfig>, String> {
    let made = ca.ca.issue(&api_names(admin), ADMIN_DAYS)?;
    let b = tls::parse_bundle(made.cert_pem.as_bytes(), made.key_pem.as_bytes())
        .map_err(|e| format!("the internal CA issued an unusable certificate: {e}"))?;
    Ok(tls::single_cert_config(b, &[b"http/1.1"]))
}

/// A cache's or proxy's admin API certificate: of the internal CA, for its
/// admin address (and `localhost`, `127.0.0.1`, `::1`), made at each
/// start of the instance and handed to it by the VIM driver as files.
pub fn instance_admin_cert(
    ca: &InternalCa,
    admin: SocketAddr,
) -> Result<crate::vim::AdminCert, String> {
    let made = ca.ca.issue(&api_names(admin), ADMIN_DAYS)?;
    Ok(crate::vim::AdminCert {
        cert_pem: made.cert_pem,
        key_pem: made.key_pem,
    })
}

/// The admin certificate of an instance whose IP is not known when it is
/// made (a pod): it names `name` (and `localhost`) only, and the control
/// plane and the router verify that name on whatever IP the pod gets.
pub fn instance_admin_cert_named(
    ca: &InternalCa,
    name: &str,
) -> Result<crate::vim::AdminCert, String> {
    let made = ca
        .ca
        .issue(&[name.to_string(), "localhost".into()], ADMIN_DAYS)?;
    Ok(crate::vim::AdminCert {
        cert_pem: made.cert_pem,
        key_pem: made.key_pem,
    })
}

/// How the control plane calls instances' admin APIs: over HTTPS it
/// trusts the internal CA only (no system root, no other certificate);
/// without a CA (tests, an embedding without one) nothing is trusted and
/// instances are started with plain admin APIs.
pub fn instance_admin_client(
    ca: Option<&InternalCa>,
) -> Result<vcdn_http::admin_tls::AdminClient, String> {
    let roots = match ca {
        Some(ca) => tls::parse_chain(ca.ca.cert_pem.as_bytes())
            .map_err(|e| format!("the internal CA's certificate: {e}"))?,
        None => Vec::new(),
    };
    vcdn_http::admin_tls::AdminClient::new(&tls::Trust::Bundle(roots))
}

/// The server configuration of the API for a certificate.
pub fn server_config(b: CertBundle) -> Arc<tls::rustls::ServerConfig> {
    tls::single_cert_config(b, &[b"http/1.1"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vcdn-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_api_certificate_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("api");
        let listen: SocketAddr = "127.0.0.9:8070".parse().unwrap();
        let a = api_certificate(&d, listen, &ApiTls::SelfSigned)
            .unwrap()
            .unwrap();
        for n in ["localhost", "127.0.0.1", "::1", "127.0.0.9"] {
            assert!(a.info.covers(n), "{n}");
        }
        assert!(a.info.self_signed);
        let b = api_certificate(&d, listen, &ApiTls::SelfSigned)
            .unwrap()
            .unwrap();
        assert_eq!(a.info.fingerprint, b.info.fingerprint);
        assert_eq!(
            std::fs::read_to_string(d.join(API_FINGERPRINT))
                .unwrap()
                .trim(),
            a.info.fingerprint
        );
        let mode = std::fs::metadata(d.join(API_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Another address: a new certificate that names it.
        let c = api_certificate(&d, "127.0.0.10:1".parse().unwrap(), &ApiTls::SelfSigned)
            .unwrap()
            .unwrap();
        assert_ne!(c.info.fingerprint, a.info.fingerprint);
        assert!(c.info.covers("127.0.0.10"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn plain_http_is_refused_off_loopback_and_bad_files_say_why() {
        let d = dir("plain");
        assert!(
            api_certificate(&d, "127.0.0.1:1".parse().unwrap(), &ApiTls::Plain)
                .unwrap()
                .is_none()
        );
        assert!(api_certificate(&d, "[::1]:1".parse().unwrap(), &ApiTls::Plain).is_ok());
        let e = api_certificate(&d, "0.0.0.0:1".parse().unwrap(), &ApiTls::Plain).unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        let e = api_certificate(&d, "192.0.2.1:1".parse().unwrap(), &ApiTls::Plain).unwrap_err();
        assert!(e.contains("--plain-http"), "{e}");
        // The operator's files: garbage, and an expired certificate.
        let (c, k) = (d.join("op.crt"), d.join("op.key"));
        std::fs::write(&c, "not a certificate").unwrap();
        std::fs::write(&k, "nor a key").unwrap();
        let how = ApiTls::Files {
            cert: c.clone(),
            key: k.clone(),
        };
        let e = api_certificate(&d, "127.0.0.1:1".parse().unwrap(), &how).unwrap_err();
        assert!(
            e.contains("--tls-cert") && e.contains("BEGIN CERTIFICATE"),
            "{e}"
        );
        let t = std::time::SystemTime::now();
        let old = tls::self_signed_between(
            &["api.example".into()],
            t - std::time::Duration::from_secs(10 * 86_400),
            t - std::time::Duration::from_secs(86_400),
        )
        .unwrap();
        std::fs::write(&c, &old.cert_pem).unwrap();
        std::fs::write(&k, &old.key_pem).unwrap();
        let e = api_certificate(&d, "127.0.0.1:1".parse().unwrap(), &how).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A crash while the files were written leaves a pair that does not go
    /// together, or a certificate without its key: the next start makes
    /// them again instead of refusing to start.
    #[test]
    fn a_torn_pair_of_files_is_made_again_at_the_next_start() {
        let d = dir("torn");
        let at: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let a = api_certificate(&d, at, &ApiTls::SelfSigned)
            .unwrap()
            .unwrap();
        let other = tls::self_signed(&["x.example".into()], 1).unwrap();
        std::fs::write(d.join(API_KEY), other.key_pem).unwrap();
        let b = api_certificate(&d, at, &ApiTls::SelfSigned)
            .unwrap()
            .unwrap();
        assert_ne!(a.info.fingerprint, b.info.fingerprint);
        assert!(b.info.covers("127.0.0.1"));
        let ca = internal_ca(&d).unwrap();
        std::fs::remove_file(d.join(CA_KEY)).unwrap();
        let again = internal_ca(&d).unwrap();
        assert_ne!(ca.ca.cert_pem, again.ca.cert_pem);
        assert_eq!(internal_ca(&d).unwrap().ca.cert_pem, again.ca.cert_pem);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_internal_ca_is_made_once() {
        let d = dir("ca");
        let a = internal_ca(&d).unwrap();
        let b = internal_ca(&d).unwrap();
        assert_eq!(a.ca.cert_pem, b.ca.cert_pem);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
