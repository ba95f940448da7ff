//! `vcdn srv6-agent`: the SRv6 server agent of an edge or origin host (the
//! content-aware data-plane paper's LRU filter, in the kernel): loads the
//! programs, routes the host's SID and the delivery of chunk addresses, sizes
//! the filter from the chunk ids it sees, and serves `/metrics` and `/healthz`.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use vcdn_http::serve::{Handler, Request, Response, ServeConfig};
use vcdn_srv6::host::{FilterChoice, HostAgent, HostConfig};
use vcdn_srv6::route::Netns;

#[derive(Args)]
pub struct Srv6AgentArgs {
    /// This host's SID (routed to the agent; steered replies leave from it).
    #[arg(long)]
    sid: Ipv6Addr,
    /// A served chunk /64, e.g. 2001:db8:c:: (repeat).
    #[arg(long = "prefix", required = true)]
    prefixes: Vec<Ipv6Addr>,
    /// A trusted dispatcher's SID; its /64 may send here (repeat).
    #[arg(long = "dispatcher", required = true)]
    dispatchers: Vec<Ipv6Addr>,
    /// The device the SID is reached by and clients are answered by.
    #[arg(long)]
    device: String,
    /// The route to clients that gets the reply program (what follows
    /// `ip route replace`, before `dev`).
    #[arg(long, default_value = "::/0")]
    clients: String,
    /// Routing table of the local delivery hairpin.
    #[arg(long, default_value_t = 100)]
    table: u32,
    /// auto (sized from α and N estimated online and the cache's capacity),
    /// none (accept everything: an origin's agent), or a size (0 rejects
    /// every connection that has a server after this one).
    #[arg(long, default_value = "auto")]
    filter: String,
    /// The local cache's admin address, whose /healthz gives its capacity
    /// in objects (C2) for --filter auto.
    #[arg(long)]
    cache_admin: Option<SocketAddr>,
    /// The cache's capacity in objects (C2), instead of --cache-admin.
    #[arg(long)]
    cache_objects: Option<u64>,
    /// How often --filter auto re-sizes, ms.
    #[arg(long, default_value_t = 5_000)]
    sizing_interval_ms: u64,
    /// Connections remembered (for the SYN-ACK's way through the dispatcher).
    #[arg(long, default_value_t = 65_536)]
    conns: u32,
    /// /metrics and /healthz.
    #[arg(long, default_value = "127.0.0.1:9464")]
    admin: SocketAddr,
}

pub fn run(a: Srv6AgentArgs) -> Result<(), String> {
    let filter: FilterChoice = a.filter.parse()?;
    if filter == FilterChoice::Auto && a.cache_admin.is_none() && a.cache_objects.is_none() {
        return Err("--filter auto needs --cache-admin or --cache-objects (C2)".into());
    }
    let (cache_admin, cache_objects) = (a.cache_admin, a.cache_objects);
    let host = HostAgent::start(HostConfig {
        sid: a.sid,
        prefixes: a.prefixes.clone(),
        dispatchers: a.dispatchers.clone(),
        netns: Netns::current(),
        device: a.device.clone(),
        clients: a.clients.clone(),
        table: a.table,
        filter,
        conns: a.conns,
        sizing_interval: Duration::from_millis(a.sizing_interval_ms),
        cache_objects: Box::new(move || {
            cache_admin
                .and_then(cache_capacity_objects)
                .or(cache_objects)
        }),
    })
    .map_err(|e| e.to_string())?;
    let host = Arc::new(host);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let mut stop = vcdn_http::stop::StopSignal::install()?;
        let l = tokio::net::TcpListener::bind(a.admin)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", a.admin))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        println!(
            "srv6 agent {} listening on http://{addr} (/metrics, /healthz)",
            a.sid
        );
        let _ = std::io::stdout().flush();
        let serve = vcdn_http::serve::serve(l, ServeConfig::default(), handler(host));
        tokio::select! {
            _ = serve => {}
            _ = stop.recv() => {}
        }
        Ok::<(), String>(())
    })
}

fn handler(host: Arc<HostAgent>) -> Handler {
    Arc::new(move |req: Request| {
        let path = String::from_utf8_lossy(req.head.path()).into_owned();
        let r = match path.as_str() {
            "/healthz" => Response::new(
                200,
                "application/json",
                format!("{{\"status\":\"ok\",\"sid\":\"{}\"}}\n", host.agent().sid()),
            ),
            "/metrics" => {
                let mut o = String::new();
                host.metrics(&mut o, "vcdn_srv6_agent");
                Response::new(200, "text/plain; version=0.0.4", o)
            }
            _ => Response::problem(404, "this agent serves /metrics and /healthz"),
        };
        Box::pin(async move { r })
    })
}

/// The cache's capacity in objects of its mean size (C2), from its
/// /healthz (plain HTTP on the host's loopback), as the router computes it.
fn cache_capacity_objects(admin: SocketAddr) -> Option<u64> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: cache\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.take(1 << 20).read_to_end(&mut raw).ok()?;
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let v: serde_json::Value = serde_json::from_slice(&raw[at + 4..]).ok()?;
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let (cap, objects, bytes) = (
        n("memory_capacity_bytes"),
        n("memory_objects"),
        n("memory_bytes"),
    );
    if cap == 0 || objects == 0 || bytes == 0 {
        return None;
    }
    Some((cap as u128 * objects as u128 / bytes as u128) as u64)
}
