//! `vcdn srv6-agent`: the SRv6 server agent of an edge or origin host (the
//! content-aware data-plane paper's LRU filter, in the kernel): loads the
//! programs, routes the host's SID and the delivery of chunk addresses, sizes
//! the filter from the chunk ids it sees, and serves `/metrics` and `/healthz`.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use vcdn_http::serve::{Handler, Request, Response, ServeConfig};
use vcdn_srv6::agent::{Agent, AgentConfig, Filter, SelfSizing};
use vcdn_srv6::route::{self, Netns};

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

/// The size an auto filter starts with, before estimates exist (the
/// router's initial size).
const INITIAL: u32 = vcdn_router::state::INITIAL_FILTER_SIZE as u32;

pub fn run(a: Srv6AgentArgs) -> Result<(), String> {
    let (filter, auto) = match a.filter.as_str() {
        "auto" => {
            if a.cache_admin.is_none() && a.cache_objects.is_none() {
                return Err("--filter auto needs --cache-admin or --cache-objects (C2)".into());
            }
            (Filter::Lru(INITIAL), true)
        }
        "none" => (Filter::AcceptAll, false),
        n => (
            Filter::Lru(
                n.parse()
                    .map_err(|_| format!("--filter {n}: give auto, none or a size"))?,
            ),
            false,
        ),
    };
    vcdn_srv6::probe().map_err(|e| e.to_string())?;
    let agent = Agent::load(&AgentConfig {
        sid: a.sid,
        table: a.table,
        filter,
        conns: a.conns,
    })
    .map_err(|e| e.to_string())?;
    for p in &a.prefixes {
        agent.serve_prefix(*p).map_err(|e| e.to_string())?;
    }
    for d in &a.dispatchers {
        agent.trust_dispatcher(*d).map_err(|e| e.to_string())?;
    }
    let routes = route::agent(
        &Netns::current(),
        &agent,
        a.table,
        &a.prefixes,
        &a.device,
        &a.clients,
    )
    .map_err(|e| e.to_string())?;
    let agent = Arc::new(agent);
    if auto {
        let (agent, every) = (
            agent.clone(),
            Duration::from_millis(a.sizing_interval_ms.max(10)),
        );
        let (cache_admin, cache_objects) = (a.cache_admin, a.cache_objects);
        let mut sampler = agent.sampler().map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("srv6-sizing".into())
            .spawn(move || {
                let mut sizing = SelfSizing::new(cache_objects.unwrap_or(0));
                let mut next = Instant::now() + every;
                loop {
                    let _ = sampler.poll(Duration::from_millis(100), |id| sizing.observe(id));
                    if Instant::now() < next {
                        continue;
                    }
                    next = Instant::now() + every;
                    if let Some(c2) = cache_admin.and_then(cache_capacity_objects) {
                        sizing.cache_objects = c2;
                    }
                    if sizing.cache_objects == 0 {
                        continue;
                    }
                    if let Some(f) = sizing.decide(agent.filter()) {
                        tracing::info!(from = ?agent.filter(), to = ?f, "resizing the SRv6 LRU filter");
                        if let Err(e) = agent.set_filter(f) {
                            tracing::warn!(error = %e, "cannot resize the filter");
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(a.admin)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", a.admin))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        println!(
            "srv6 agent {} listening on http://{addr} (/metrics, /healthz)",
            a.sid
        );
        let _ = std::io::stdout().flush();
        let serve = vcdn_http::serve::serve(l, ServeConfig::default(), handler(agent));
        tokio::select! {
            _ = serve => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated() => {}
        }
        Ok::<(), String>(())
    })?;
    drop(routes);
    Ok(())
}

async fn terminated() {
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        s.recv().await;
    }
}

fn handler(agent: Arc<Agent>) -> Handler {
    Arc::new(move |req: Request| {
        let path = String::from_utf8_lossy(req.head.path()).into_owned();
        let r = match path.as_str() {
            "/healthz" => Response::new(
                200,
                "application/json",
                format!("{{\"status\":\"ok\",\"sid\":\"{}\"}}\n", agent.sid()),
            ),
            "/metrics" => Response::new(200, "text/plain; version=0.0.4", metrics(&agent)),
            _ => Response::problem(404, "this agent serves /metrics and /healthz"),
        };
        Box::pin(async move { r })
    })
}

fn metrics(agent: &Agent) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if let Ok(s) = agent.stats() {
        for (name, help, v) in s.fields() {
            let _ = writeln!(o, "# HELP vcdn_srv6_agent_{name}_total {help}.");
            let _ = writeln!(o, "# TYPE vcdn_srv6_agent_{name}_total counter");
            let _ = writeln!(o, "vcdn_srv6_agent_{name}_total {v}");
        }
    }
    let size = match agent.filter() {
        Filter::Lru(n) => n as i64,
        Filter::AcceptAll => -1,
    };
    let _ = writeln!(o, "# HELP vcdn_srv6_agent_filter_size Capacity of the LRU filter in chunk ids (-1: no filter).");
    let _ = writeln!(o, "# TYPE vcdn_srv6_agent_filter_size gauge");
    let _ = writeln!(o, "vcdn_srv6_agent_filter_size {size}");
    let _ = writeln!(
        o,
        "# HELP vcdn_srv6_agent_filter_entries Chunk ids in the LRU filter."
    );
    let _ = writeln!(o, "# TYPE vcdn_srv6_agent_filter_entries gauge");
    let _ = writeln!(o, "vcdn_srv6_agent_filter_entries {}", agent.filter_len());
    vcdn_router::metrics::program_runs(&mut o, "vcdn_srv6_agent", &agent.program_runs());
    o
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
