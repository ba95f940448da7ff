//! Admin APIs over TLS, shared by every vcdn server that has one (`vcdn
//! router`, `vcdn cache`, `vcdn proxy`) and by the clients that call them
//! (the control plane, the router's health checks, `vcdn cache ctl`).
//!
//! Server side: `--admin-tls-cert/--admin-tls-key` become a rustls
//! configuration, checked at start; without them the admin API is plain
//! HTTP, which carries its bearer token (and, on a cache, customers'
//! private keys) in clear, so it is allowed on loopback only (as `vcdn up
//! --plain-http` is). Client side: [`AdminClient`] holds one
//! TLS client configuration for many calls (one trust, e.g. the control
//! plane's internal CA), so health polls do not rebuild it each time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{ClientError, ClientResponse, Endpoint};
use crate::tls::{self, rustls, Trust};

/// The admin API's TLS configuration from PEM files, checked now (chain
/// order, key match, dates): a bad file stops the start with a message
/// that names the flag, not a handshake failure later.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let c = std::fs::read(cert).map_err(|e| format!("--admin-tls-cert {}: {e}", cert.display()))?;
    let k = std::fs::read(key).map_err(|e| format!("--admin-tls-key {}: {e}", key.display()))?;
    let b = tls::parse_bundle(&c, &k).map_err(|e| {
        format!(
            "--admin-tls-cert {} / --admin-tls-key {}: {e}",
            cert.display(),
            key.display()
        )
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    b.info
        .check_validity(now)
        .map_err(|e| format!("--admin-tls-cert {}: {e}", cert.display()))?;
    Ok(tls::single_cert_config(b, &[b"http/1.1"]))
}

/// The TLS configuration of an admin API from optional files: both or
/// neither (a half-given pair is an error, not a silent plain API).
pub fn server_config_from(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    match (cert, key) {
        (Some(c), Some(k)) => server_config(c, k).map(Some),
        (None, None) => Ok(None),
        (Some(_), None) => Err("--admin-tls-cert needs --admin-tls-key".into()),
        (None, Some(_)) => Err("--admin-tls-key needs --admin-tls-cert".into()),
    }
}

/// Refuses a plain-HTTP admin API off loopback: its token would cross a
/// network in clear. There is no flag to allow it (issue 18: plain HTTP
/// only on loopback).
pub fn check_plain(admin: SocketAddr) -> Result<(), String> {
    if admin.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "the admin API on {admin} would be plain HTTP, sending its bearer token in clear: plain HTTP is allowed only on a loopback address (127.0.0.0/8, ::1). Give --admin-tls-cert/--admin-tls-key, or listen on loopback"
    ))
}

/// Where a client reaches an admin address: a wildcard listener is reached
/// (and named in its certificate) on loopback.
pub fn reachable(admin: SocketAddr) -> SocketAddr {
    let mut a = admin;
    if a.ip().is_unspecified() {
        a.set_ip(match a.ip() {
            IpAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    a
}

/// Calls admin APIs: plain HTTP, or HTTPS verified against one trust (the
/// certificate must name the address's IP).
#[derive(Clone)]
pub struct AdminClient {
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient").finish_non_exhaustive()
    }
}

impl AdminClient {
    pub fn new(trust: &Trust) -> Result<AdminClient, String> {
        Ok(AdminClient {
            tls: tls::client_config(trust, &[b"http/1.1"])?,
        })
    }

    /// The endpoint of an admin address, over HTTPS or plain HTTP.
    pub fn endpoint(&self, admin: SocketAddr, https: bool) -> Endpoint {
        Endpoint::for_addr(reachable(admin), https.then(|| self.tls.clone()))
    }

    /// The endpoint of an admin address whose certificate names `name`
    /// when given (see [`Endpoint::for_addr_named`]), its IP otherwise.
    pub fn endpoint_named(&self, admin: SocketAddr, https: bool, name: Option<&str>) -> Endpoint {
        match name {
            Some(n) => {
                Endpoint::for_addr_named(reachable(admin), https.then(|| self.tls.clone()), n)
            }
            None => self.endpoint(admin, https),
        }
    }

    /// One request to an admin API.
    #[allow(clippy::too_many_arguments)]
    pub async fn request(
        &self,
        admin: SocketAddr,
        https: bool,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<ClientResponse, ClientError> {
        self.endpoint(admin, https)
            .request(method, path, headers, body, timeout)
            .await
    }
}

/// `https://ADDR` or `http://ADDR`, for messages.
pub fn url(admin: SocketAddr, https: bool) -> String {
    format!(
        "{}://{}",
        if https { "https" } else { "http" },
        reachable(admin)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_is_refused_off_loopback() {
        assert!(check_plain("127.0.0.5:1".parse().unwrap()).is_ok());
        assert!(check_plain("[::1]:1".parse().unwrap()).is_ok());
        let e = check_plain("0.0.0.0:8081".parse().unwrap()).unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        assert!(e.contains("--admin-tls-cert"), "{e}");
        assert!(check_plain("192.0.2.1:1".parse().unwrap()).is_err());
    }

    #[test]
    fn a_half_given_pair_and_bad_files_say_which_flag() {
        let p = Path::new("/nonexistent/a.pem");
        assert!(server_config_from(Some(p), None)
            .unwrap_err()
            .contains("--admin-tls-key"));
        assert!(server_config_from(None, None).unwrap().is_none());
        let e = server_config_from(Some(p), Some(p)).unwrap_err();
        assert!(e.starts_with("--admin-tls-cert /nonexistent/a.pem"), "{e}");
    }

    #[test]
    fn a_wildcard_address_is_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:9".parse().unwrap()),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:9".parse().unwrap()),
            "[::1]:9".parse().unwrap()
        );
        assert_eq!(
            url("127.0.0.2:9".parse().unwrap(), true),
            "https://127.0.0.2:9"
        );
    }
}
