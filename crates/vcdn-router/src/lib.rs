//! vcdn's request router (CDN-as-a-Service paper §III-C; content-aware
//! data plane paper, all of it, at L7 and DNS level).
//!
//! - [`dns`]: authoritative geo-DNS over UDP and TCP: a service hostname
//!   resolves to the healthy caches of the client's region (from its source
//!   address or its EDNS Client Subnet).
//! - [`http`]: HTTP routing: `302` to the cache that consistent hashing
//!   picks for the content, or straight to the origin when that cache's LRU
//!   admission filter judges the content unpopular.
//! - [`health`]: polls every cache; dead or overloaded caches leave the
//!   answers within a second.
//! - [`sizing`]: sizes the filters from the model and online estimates.
//! - [`admin`]: the API the control plane uses to change services live.

pub mod admin;
pub mod config;
pub mod coverage;
pub mod dataplane;
pub mod dns;
pub mod geo;
pub mod health;
pub mod http;
pub mod metrics;
pub mod naming;
pub mod routing;
pub mod sizing;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use config::RouterConfig;
pub use state::Router;

/// Where to listen; `None` leaves a part off.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    pub dns: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    /// Bearer token of the admin API. Without one a random token is made
    /// and logged.
    pub admin_token: Option<String>,
    /// Serve the admin API over HTTPS with this configuration.
    pub admin_tls: Option<std::sync::Arc<vcdn_http::tls::rustls::ServerConfig>>,
    /// Whom the health checks trust on caches' HTTPS admin APIs
    /// (`admin_https`): `vcdn up` gives its internal CA; none: the system
    /// roots.
    pub cache_admin_trust: Option<vcdn_http::tls::Trust>,
}

/// The addresses a started router listens on.
#[derive(Debug, Clone)]
pub struct Listening {
    pub dns: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub admin_token: String,
}

/// Binds every listener and starts serving on the current tokio runtime
/// (DNS UDP on threads of its own).
pub async fn start(
    cfg: RouterConfig,
    opts: RouterOptions,
) -> Result<(Arc<Router>, Listening), String> {
    let threads = cfg.dns.threads;
    let health = cfg.health.clone();
    let sizing = Duration::from_millis(cfg.sizing_interval_ms);
    let srv6 = cfg.srv6.clone();
    let router = Router::new(cfg).map_err(|e| e.to_string())?;
    if let Some(v) = srv6 {
        match dataplane::DataPlane::start(v) {
            Ok(dp) => {
                let _ = router.dataplane.set(dp);
            }
            // The kernel or the process lacks something: said once, in
            // /metrics too, and the services' chunk prefixes are not
            // dispatched; DNS and HTTP routing, with their LRU filters,
            // serve on (the HTTP-level form of the same filter).
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "no SRv6 dispatching: chunk addresses are not routed; DNS and HTTP routing (with the HTTP-level filter) serve on"
                );
                let _ = router.srv6_unavailable.set(e);
            }
        }
    }
    let token: Arc<str> = match &opts.admin_token {
        Some(t) if !t.is_empty() => {
            vcdn_http::auth::check_token_strength("--admin-token", t)?;
            t.as_str().into()
        }
        _ => {
            let t = format!("{:032x}", random_u128());
            tracing::warn!("no --admin-token given; generated one for this run: {t}");
            t.into()
        }
    };
    let mut listening = Listening {
        dns: None,
        http: None,
        admin: None,
        admin_token: token.to_string(),
    };
    if let Some(addr) = opts.dns {
        // UDP and TCP on the same port. With port 0 the kernel picks a free
        // UDP port, which TCP may have in use: then try another.
        let mut attempt = 0;
        let (sockets, tcp, bound) = loop {
            let (sockets, bound) = dns::server::bind_udp(addr, threads)
                .map_err(|e| format!("cannot listen for DNS on udp/{addr}: {e}"))?;
            match tokio::net::TcpListener::bind(bound).await {
                Ok(tcp) => break (sockets, tcp, bound),
                Err(_) if addr.port() == 0 && attempt < 50 => attempt += 1,
                Err(e) => return Err(format!("cannot listen for DNS on tcp/{bound}: {e}")),
            }
        };
        dns::server::start_udp(router.clone(), sockets)
            .map_err(|e| format!("cannot start DNS threads: {e}"))?;
        tokio::spawn(dns::tcp::serve(
            router.clone(),
            tcp,
            dns::tcp::Limits::default(),
        ));
        listening.dns = Some(bound);
    }
    let serve_cfg = vcdn_http::serve::ServeConfig::default();
    if let Some(addr) = opts.http {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen for HTTP routing on {addr}: {e}"))?;
        listening.http = Some(l.local_addr().map_err(|e| e.to_string())?);
        tokio::spawn(vcdn_http::serve::serve(
            l,
            serve_cfg.clone(),
            http::handler(router.clone()),
        ));
    }
    if let Some(addr) = opts.admin {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen for the admin API on {addr}: {e}"))?;
        listening.admin = Some(l.local_addr().map_err(|e| e.to_string())?);
        let cfg = vcdn_http::serve::ServeConfig {
            max_body: 1 << 20,
            tls: opts.admin_tls.clone(),
            ..serve_cfg
        };
        tokio::spawn(vcdn_http::serve::serve(
            l,
            cfg,
            admin::handler(router.clone(), token),
        ));
    }
    let admin_client = vcdn_http::admin_tls::AdminClient::new(
        opts.cache_admin_trust
            .as_ref()
            .unwrap_or(&vcdn_http::tls::Trust::System),
    )?;
    tokio::spawn(health::run(router.clone(), health, admin_client));
    tokio::spawn(sizing::run(router.clone(), sizing));
    if let Some(dp) = router.dataplane.get() {
        tokio::spawn(dataplane::run(router.clone(), dp.clone()));
    }
    Ok((router, listening))
}

fn random_u128() -> u128 {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u128::from_le_bytes(b)
}
