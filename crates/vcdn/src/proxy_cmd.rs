//! `vcdn proxy`: flags → `vcdn_accel::start`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use vcdn_accel::table::ChainTable;
use vcdn_accel::{ProxyConfig, RelayMode};

#[derive(Args)]
pub struct ProxyArgs {
    /// This proxy's location name (as in chains and peer sets).
    #[arg(long, env = "VCDN_PROXY_NAME")]
    name: String,
    /// Address for clients and peer proxies (one port for both).
    #[arg(long, env = "VCDN_PROXY_LISTEN", required_unless_present = "listen_fd")]
    listen: Option<SocketAddr>,
    /// Serve on this inherited listening socket instead (reactive start).
    #[arg(long)]
    listen_fd: Option<i32>,
    /// Admin API, /metrics and /healthz.
    #[arg(long, env = "VCDN_PROXY_ADMIN")]
    admin: Option<SocketAddr>,
    /// Bearer token of the admin API.
    #[arg(long, env = "VCDN_PROXY_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Serve the admin API over HTTPS with this certificate chain (PEM).
    /// Without it the admin API is plain HTTP, allowed only on loopback.
    #[arg(long, requires = "admin_tls_key", env = "VCDN_PROXY_ADMIN_TLS_CERT")]
    admin_tls_cert: Option<PathBuf>,
    /// The private key of --admin-tls-cert (PEM).
    #[arg(long, requires = "admin_tls_cert", env = "VCDN_PROXY_ADMIN_TLS_KEY")]
    admin_tls_key: Option<PathBuf>,
    /// The service whose traffic this proxy carries.
    #[arg(long, env = "VCDN_PROXY_SERVICE")]
    service: String,
    /// The service's origin, http://host:port[/base].
    #[arg(long, env = "VCDN_PROXY_ORIGIN")]
    origin: String,
    /// Origin policy checked at every connect to the origin, e.g.
    /// "deny non-public, allow 127.0.0.1:9000" [default: allow all].
    #[arg(long, env = "VCDN_ORIGIN_POLICY", default_value = "")]
    origin_policy: String,
    /// Key authenticating hop headers between the service's proxies (32+ characters).
    #[arg(long, env = "VCDN_PROXY_HOP_KEY", hide_env_values = true)]
    hop_key: Option<String>,
    /// A peer proxy, LOC=IP:PORT (repeat). Only peers can be next hops.
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<(String, SocketAddr)>,
    /// Where chains end without a table [default: this proxy].
    #[arg(long)]
    egress: Option<String>,
    /// Chain table (JSON, as `PUT /chains`).
    #[arg(long)]
    chains: Option<PathBuf>,
    /// Connections kept open to every next hop (0: a new one per exchange).
    #[arg(long, default_value_t = 2)]
    warm: usize,
    /// Bytes a peer sends on each new pooled connection to open its
    /// congestion window (0: no warm-up; at most 4 MiB).
    #[arg(long, default_value_t = 256 * 1024)]
    warmup_bytes: u64,
    /// How bodies of known length are relayed: splice, or sockmap (a BPF
    /// sk_skb redirect; needs CAP_BPF and CAP_NET_ADMIN).
    #[arg(long, default_value = "splice", value_parser = ["splice", "sockmap"])]
    relay: String,
    /// Exit after this many seconds without a connection.
    #[arg(long)]
    idle_exit: Option<u64>,
    /// Reactive start: hold `--listen` and start the proxy (this command
    /// without `--reactive`, on the held socket) at the first connection,
    /// again after it exits idle (`--idle-exit`, default 60 s here). The
    /// admin API answers only while the proxy runs.
    #[arg(long, conflicts_with = "listen_fd")]
    reactive: bool,
    /// Who this process is to the control plane (in /healthz and /stats).
    #[arg(long, env = "VCDN_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Leave net.ipv4.tcp_slow_start_after_idle alone (by default the proxy
    /// sets it to 0 in its network namespace so pooled connections keep
    /// their congestion window across idle).
    #[arg(long)]
    keep_sysctl: bool,
    /// A client's request head must arrive within this (408 otherwise).
    #[arg(long, default_value_t = 10_000, hide = true)]
    header_timeout_ms: u64,
    /// Controller receiving RTT reports.
    #[arg(long)]
    controller: Option<String>,
    /// Bearer token for the controller.
    #[arg(long, env = "VCDN_PROXY_CONTROLLER_TOKEN", hide_env_values = true)]
    controller_token: Option<String>,
    /// Trust an https controller by its certificate's SHA-256 fingerprint
    /// (what `vcdn up` prints) instead of the system roots.
    #[arg(long)]
    controller_fingerprint: Option<String>,
}

fn parse_peer(s: &str) -> Result<(String, SocketAddr), String> {
    let (n, a) = s.split_once('=').ok_or("expected LOC=IP:PORT")?;
    let a = a
        .parse()
        .map_err(|_| format!("{a:?} is not an IP:PORT address"))?;
    Ok((n.to_string(), a))
}

pub fn run(a: ProxyArgs) -> Result<(), String> {
    if a.reactive {
        return hold(&a);
    }
    if let Some(t) = &a.admin_token {
        vcdn_http::auth::check_token_strength("--admin-token", t)?;
    }
    let mut cfg = ProxyConfig::new(&a.name, &a.service, &a.origin);
    cfg.origin_policy = a.origin_policy;
    cfg.hop_key = a.hop_key;
    cfg.peers = a.peers.into_iter().collect::<HashMap<_, _>>();
    cfg.egress = a.egress;
    cfg.chains = match &a.chains {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).map_err(|e| format!("--chains {}: {e}", p.display()))?;
            Some(
                serde_json::from_str::<ChainTable>(&text)
                    .map_err(|e| format!("--chains {}: {e}", p.display()))?,
            )
        }
        None => None,
    };
    cfg.warm = a.warm;
    cfg.warmup_bytes = a.warmup_bytes;
    cfg.relay = if a.relay == "sockmap" {
        RelayMode::Sockmap
    } else {
        RelayMode::Splice
    };
    cfg.idle_exit = a.idle_exit.map(Duration::from_secs);
    cfg.instance_id = a.instance_id;
    cfg.tune_sysctl = !a.keep_sysctl;
    cfg.timeouts.header = Duration::from_millis(a.header_timeout_ms);
    cfg.admin_token = a.admin_token;
    cfg.admin_tls = vcdn_http::admin_tls::server_config_from(
        a.admin_tls_cert.as_deref(),
        a.admin_tls_key.as_deref(),
    )?;
    let admin_scheme = if cfg.admin_tls.is_some() {
        "https"
    } else {
        "http"
    };
    cfg.controller = a.controller;
    cfg.controller_token = a.controller_token;
    cfg.controller_fingerprint = a.controller_fingerprint;
    let listener = match (a.listen_fd, a.listen) {
        (Some(fd), _) => vcdn_accel::reactive::inherited_listener(fd)
            .map_err(|e| format!("--listen-fd {fd}: {e}"))?,
        (None, Some(addr)) => std::net::TcpListener::bind(addr)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?,
        (None, None) => return Err("--listen or --listen-fd is required".into()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    rt.block_on(async move {
        let stop = vcdn_http::stop::StopSignal::install()?;
        let r = vcdn_accel::start(cfg, listener, a.admin).await?;
        println!("vcdn proxy {} listening on http://{}", r.proxy.cfg.name, r.listen);
        if let Some(ad) = r.admin {
            println!("vcdn proxy admin on {admin_scheme}://{ad} (/healthz, /metrics, /stats, /peers, /chains, /rtt)");
        }
        tracing::info!(name = %r.proxy.cfg.name, listen = %r.listen, admin = ?r.admin, "vcdn proxy ready");
        vcdn_accel::run_until_stopped(r.proxy, stop).await;
        Ok::<(), String>(())
    })?;
    // Connections still open after the drain are dropped with the runtime.
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}

/// `--reactive`: holds the listening socket and runs this very command
/// line (without `--reactive` and `--listen`, with `--listen-fd 3` and an
/// idle exit) whenever a connection waits and no proxy runs.
fn hold(a: &ProxyArgs) -> Result<(), String> {
    let addr = a.listen.ok_or("--reactive needs --listen")?;
    let l =
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let mut args: Vec<OsString> = Vec::new();
    let mut it = std::env::args_os().skip(1);
    while let Some(x) = it.next() {
        let s = x.to_string_lossy();
        if s == "--reactive" || s.starts_with("--listen=") {
            continue;
        }
        if s == "--listen" {
            it.next();
            continue;
        }
        args.push(x);
    }
    args.extend([
        "--listen-fd".into(),
        vcdn_accel::reactive::LISTEN_FD.to_string().into(),
    ]);
    if a.idle_exit.is_none() {
        args.extend(["--idle-exit".into(), "60".into()]);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    println!(
        "vcdn proxy {} listening on http://{addr} (reactive: the proxy starts on the first connection)",
        a.name
    );
    vcdn_accel::reactive::hold(l, exe, args, Default::default())
        .map_err(|e| format!("holding {addr}: {e}"))
}
