//! The proxy's admin API: `/healthz` and `/metrics` open (as every vcdn
//! server's), the rest behind the bearer token: `/stats` (what the control
//! plane bills), `PUT /peers`, `PUT|GET /chains`, `GET /rtt`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use vcdn_http::auth::{Guard, ThrottleConfig};
use vcdn_http::serve::{Handler, Request, Response};
use vcdn_http::Method;

use crate::metrics::cpu_seconds;
use crate::proxy::Proxy;
use crate::table::ChainTable;

pub fn handler(p: Arc<Proxy>) -> Handler {
    let guard = Arc::new(Guard::new("vcdn-proxy", ThrottleConfig::default()));
    Arc::new(move |req| {
        let p = p.clone();
        let guard = guard.clone();
        Box::pin(async move { route(&p, &guard, req) })
    })
}

fn json_ok(v: Value) -> Response {
    Response::new(200, "application/json", format!("{v}\n"))
}

fn route(p: &Proxy, guard: &Guard, req: Request) -> Response {
    let path = String::from_utf8_lossy(req.head.path()).into_owned();
    let m = req.head.method;
    match (m, path.as_str()) {
        (Method::Get | Method::Head, "/healthz") => return health(p),
        (Method::Get | Method::Head, "/metrics") => {
            return Response::new(200, "text/plain; version=0.0.4", metrics(p))
        }
        _ => {}
    }
    if let Err(r) = guard.authorize(&req, p.cfg.admin_token.as_deref().unwrap_or("")) {
        return r;
    }
    match (m, path.as_str()) {
        (Method::Get, "/stats") => json_ok(stats(p)),
        (Method::Put, "/peers") => put_peers(p, &req.body),
        (Method::Get, "/peers") => json_ok(json!({ "peers": p.peers() })),
        (Method::Put, "/chains") => put_chains(p, &req.body),
        (Method::Get, "/chains") => match p.table() {
            Some((t, age)) => json_ok(json!({
                "version": t.version, "egress": t.egress, "chains": t.chains,
                "age_s": age.as_secs_f64(),
            })),
            None => Response::problem(
                404,
                "no chain table yet: PUT /chains, or start with --chains FILE",
            ),
        },
        (Method::Get, "/rtt") => match p.rtt() {
            Some(r) => json_ok(json!(r.snapshot())),
            None => Response::problem(503, "the RTT service is not running yet"),
        },
        (_, "/stats" | "/rtt") => {
            Response::problem(405, "method not allowed").header("Allow", "GET")
        }
        (_, "/peers" | "/chains") => {
            Response::problem(405, "method not allowed").header("Allow", "GET, PUT")
        }
        _ => Response::problem(
            404,
            "no such endpoint; try /healthz, /metrics, /stats, /peers, /chains or /rtt",
        ),
    }
}

fn health(p: &Proxy) -> Response {
    json_ok(json!({
        "status": if p.is_stopping() { "stopping" } else { "ok" },
        "instance": p.cfg.instance_id,
        "instance_id": p.cfg.instance_id,
        "name": p.cfg.name,
        "service": p.cfg.service,
        "relay": p.cfg.relay.as_str(),
        "uptime_s": p.started.elapsed().as_secs(),
        "exchanges_in_flight": p.exchanges_in_flight(),
        "pooled_connections": p.pooled(),
        "down_hops": p.down_hops(),
        "tcp_slow_start_after_idle": p.slow_start_after_idle,
    }))
}

pub fn stats(p: &Proxy) -> Value {
    let m = &p.metrics;
    let per_hop: serde_json::Map<String, Value> = m
        .per_hop()
        .into_iter()
        .map(|(h, (s, r))| (h, json!({ "sent": s, "received": r })))
        .collect();
    json!({
        "instance_id": p.cfg.instance_id,
        "name": p.cfg.name,
        "service": p.cfg.service,
        "requests": m.requests.load(Ordering::Relaxed),
        "bytes": m.client_bytes_out.load(Ordering::Relaxed),
        "cpu_seconds": cpu_seconds(),
        "uptime_s": p.started.elapsed().as_secs(),
        "hops": per_hop,
    })
}

fn metrics(p: &Proxy) -> String {
    let m = &p.metrics;
    let table_age = p.table().map_or(-1.0, |(_, age)| age.as_secs_f64());
    let gauges = [
        (
            "vcdn_proxy_pooled_connections",
            "Idle pooled connections (next hops and origin).",
            p.pooled() as f64,
        ),
        (
            "vcdn_proxy_open_connections",
            "Accepted connections open.",
            m.open_connections.load(Ordering::Relaxed) as f64,
        ),
        (
            "vcdn_proxy_exchanges_in_flight",
            "Exchanges in progress.",
            p.exchanges_in_flight() as f64,
        ),
        (
            "vcdn_proxy_chain_table_age_seconds",
            "Seconds since the chain table was last set (-1: none).",
            table_age,
        ),
        (
            "vcdn_proxy_down_hops",
            "Next hops skipped after a recent failure.",
            p.down_hops().len() as f64,
        ),
        (
            "vcdn_proxy_size_prefixes",
            "URL prefixes with a size estimate.",
            p.estimator.len() as f64,
        ),
        (
            "vcdn_proxy_tcp_slow_start_after_idle",
            "net.ipv4.tcp_slow_start_after_idle in force (0 keeps idle windows; -1 unknown).",
            p.slow_start_after_idle.map_or(-1.0, f64::from),
        ),
        (
            "vcdn_proxy_cpu_seconds",
            "CPU seconds used by this process.",
            cpu_seconds(),
        ),
    ];
    let mut out = m.render(&gauges, p.cfg.relay.as_str());
    if let Some(r) = p.rtt() {
        out.push_str(&r.metrics());
    }
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Peers {
    peers: HashMap<String, String>,
}

fn put_peers(p: &Proxy, body: &[u8]) -> Response {
    let parsed: Peers = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Response::problem(
                400,
                &format!("expected {{\"peers\":{{\"LOC\":\"ADDR\",...}}}}: {e}"),
            )
        }
    };
    let mut peers = HashMap::new();
    for (n, a) in parsed.peers {
        match a.parse::<SocketAddr>() {
            Ok(addr) => {
                peers.insert(n, addr);
            }
            Err(_) => {
                return Response::problem(
                    400,
                    &format!("peer {n}: {a:?} is not an IP:port address"),
                )
            }
        }
    }
    match p.set_peers(peers) {
        Ok(()) => json_ok(json!({ "peers": p.peers() })),
        Err(e) => Response::problem(400, &e),
    }
}

fn put_chains(p: &Proxy, body: &[u8]) -> Response {
    let t: ChainTable = match serde_json::from_slice(body) {
        Ok(t) => t,
        Err(e) => return Response::problem(400, &format!("not a chain table ({{\"version\":N,\"egress\":\"LOC\",\"chains\":[{{\"max_rounds\":R,\"chain\":[...]}}]}}): {e}")),
    };
    let v = t.version;
    match p.set_table(t) {
        Ok(()) => json_ok(json!({ "version": v })),
        Err(e) => Response::problem(400, &format!("chain table refused: {e}")),
    }
}
