//! `vcdn router`: flags → `vcdn_router::start`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use vcdn_router::{RouterConfig, RouterOptions};

#[derive(Args)]
pub struct RouterArgs {
    /// DNS address (UDP and TCP) [default: 127.0.0.1:5353].
    #[arg(long, env = "VCDN_ROUTER_DNS")]
    dns: Option<SocketAddr>,
    /// HTTP routing address (302 redirects) [default: 127.0.0.1:8053].
    #[arg(long, env = "VCDN_ROUTER_HTTP")]
    http: Option<SocketAddr>,
    /// Admin API, /metrics and /healthz [default: 127.0.0.1:8054].
    #[arg(long, env = "VCDN_ROUTER_ADMIN")]
    admin: Option<SocketAddr>,
    /// Bearer token of the admin API (generated and logged if absent).
    #[arg(long, env = "VCDN_ROUTER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Serve the admin API over HTTPS with this certificate chain (PEM).
    #[arg(long, requires = "admin_tls_key", env = "VCDN_ROUTER_ADMIN_TLS_CERT")]
    admin_tls_cert: Option<PathBuf>,
    /// The private key of --admin-tls-cert (PEM).
    #[arg(long, requires = "admin_tls_cert", env = "VCDN_ROUTER_ADMIN_TLS_KEY")]
    admin_tls_key: Option<PathBuf>,
    /// PEM bundle of the CA certificates the health checks trust on caches'
    /// HTTPS admin APIs (`admin_https = true`) [default: the system roots].
    #[arg(long, env = "VCDN_ROUTER_CACHE_ADMIN_CA_FILE")]
    cache_admin_ca_file: Option<PathBuf>,
    /// TOML file: DNS zone data, coverage zones, regions, services.
    #[arg(long, env = "VCDN_ROUTER_CONFIG")]
    config: Option<PathBuf>,
    /// DNS UDP serving threads (overrides dns.threads).
    #[arg(long)]
    dns_threads: Option<usize>,
    /// Serve no DNS.
    #[arg(long, conflicts_with = "dns")]
    no_dns: bool,
    /// The deployment's telemetry key file (member-only): with it the
    /// router publishes its routing decisions as router.decisions records
    /// [default: no telemetry].
    #[arg(long, env = "VCDN_TELEMETRY_KEYS")]
    telemetry_keys: Option<PathBuf>,
    /// Telemetry node id and record source.
    #[arg(long, default_value = "router", env = "VCDN_TELEMETRY_NODE")]
    telemetry_node: String,
    /// UDP port of telemetry discovery.
    #[arg(long, default_value_t = 12555, env = "VCDN_TELEMETRY_DISCOVERY_PORT")]
    telemetry_discovery_port: u16,
    /// Broadcast address of telemetry discovery.
    #[arg(
        long,
        default_value = "127.255.255.255",
        env = "VCDN_TELEMETRY_BROADCAST"
    )]
    telemetry_broadcast: std::net::IpAddr,
    /// How often router.decisions is published, ms.
    #[arg(long, default_value_t = 1000)]
    telemetry_interval_ms: u64,
}

pub fn run(a: RouterArgs) -> Result<(), String> {
    let telemetry = match &a.telemetry_keys {
        Some(p) => Some(
            vcdn_telemetry::keys::KeyFile::load(p)
                .and_then(|f| f.keyring())
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let mut agent_cfg = vcdn_telemetry::agent::AgentConfig::loopback(
        &a.telemetry_node,
        vec![vcdn_telemetry::message::Role::P2pProducer],
    );
    agent_cfg.publish = vec![vcdn_telemetry::record::TOPIC_ROUTER_DECISIONS.into()];
    agent_cfg.discovery_port = a.telemetry_discovery_port;
    agent_cfg.broadcast = a.telemetry_broadcast;
    let every = std::time::Duration::from_millis(a.telemetry_interval_ms.max(100));
    let mut cfg = match &a.config {
        Some(p) => RouterConfig::from_file(p).map_err(|e| e.to_string())?,
        None => RouterConfig::default(),
    };
    if let Some(t) = a.dns_threads {
        cfg.dns.threads = t.max(1);
    }
    let opts = RouterOptions {
        dns: if a.no_dns {
            None
        } else {
            Some(
                a.dns
                    .unwrap_or_else(|| "127.0.0.1:5353".parse().expect("static address")),
            )
        },
        http: Some(
            a.http
                .unwrap_or_else(|| "127.0.0.1:8053".parse().expect("static address")),
        ),
        admin: Some(
            a.admin
                .unwrap_or_else(|| "127.0.0.1:8054".parse().expect("static address")),
        ),
        admin_token: a.admin_token,
        admin_tls: vcdn_http::admin_tls::server_config_from(
            a.admin_tls_cert.as_deref(),
            a.admin_tls_key.as_deref(),
        )?,
        cache_admin_trust: match &a.cache_admin_ca_file {
            Some(p) => {
                let pem = std::fs::read(p)
                    .map_err(|e| format!("--cache-admin-ca-file {}: {e}", p.display()))?;
                Some(vcdn_http::tls::Trust::Bundle(
                    vcdn_http::tls::parse_chain(&pem)
                        .map_err(|e| format!("--cache-admin-ca-file {}: {e}", p.display()))?,
                ))
            }
            None => None,
        },
    };
    if let (Some(ad), None) = (opts.admin, &opts.admin_tls) {
        vcdn_http::admin_tls::check_plain(ad)?;
    }
    let scheme = if opts.admin_tls.is_some() {
        "https"
    } else {
        "http"
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    rt.block_on(async move {
        let services = cfg.services.len();
        let (router, l) = vcdn_router::start(cfg, opts).await?;
        if let Some(keys) = telemetry {
            let keys = std::sync::Arc::new(keys);
            let agent = vcdn_telemetry::agent::Agent::start(agent_cfg, keys.clone())
                .await
                .map_err(|e| format!("cannot start the telemetry agent: {e}"))?;
            tokio::spawn(publish_decisions(agent, keys, router.clone(), every));
        }
        if let Some(d) = l.dns {
            println!("vcdn router DNS on udp/{d} and tcp/{d}");
        }
        if let Some(h) = l.http {
            println!("vcdn router HTTP routing on http://{h}");
        }
        if let Some(ad) = l.admin {
            println!("vcdn router admin on {scheme}://{ad} (/healthz, /metrics, /services, /caches)");
        }
        tracing::info!(dns = ?l.dns, http = ?l.http, admin = ?l.admin, services, "vcdn router ready");
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// Publishes the router's decisions (cumulative counts per service, region
/// and cache, [`vcdn_router::metrics::decisions`]) as one `router.decisions`
/// record per service every `every`, never one datagram per request.
async fn publish_decisions(
    agent: vcdn_telemetry::agent::Agent,
    keys: std::sync::Arc<vcdn_telemetry::keys::Keyring>,
    router: std::sync::Arc<vcdn_router::Router>,
    every: std::time::Duration,
) {
    use vcdn_telemetry::record::{self, Record, TOPIC_ROUTER_DECISIONS};
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let (inc, mut seq) = (now_ms(), 0u64);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for d in vcdn_router::metrics::decisions(&router.snapshot()) {
            seq += 1;
            let r = Record {
                source: agent.node_id().to_string(),
                service: d["service"].as_str().map(str::to_string),
                inc,
                seq,
                ts: now_ms(),
                data: d,
            };
            let f = record::seal(&keys, &r);
            if f.len() <= record::MAX_RECORD {
                agent.publish(TOPIC_ROUTER_DECISIONS, &f);
            }
        }
    }
}
