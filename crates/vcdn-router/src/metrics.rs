//! The router's counters and their Prometheus rendering.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dns::wire::Rcode;
use crate::state::Router;

const RCODES: [Rcode; 6] = [
    Rcode::NoError,
    Rcode::FormErr,
    Rcode::NxDomain,
    Rcode::NotImp,
    Rcode::Refused,
    Rcode::BadVers,
];

#[derive(Debug, Default)]
pub struct Metrics {
    pub dns_udp: AtomicU64,
    pub dns_tcp: AtomicU64,
    /// Idle TCP connections closed to make room for a new one.
    pub dns_tcp_evicted: AtomicU64,
    /// TCP connections refused because every slot was busy.
    pub dns_tcp_refused: AtomicU64,
    pub dns_dropped: AtomicU64,
    pub dns_truncated: AtomicU64,
    pub dns_ecs: AtomicU64,
    dns_rcode: [AtomicU64; 6],
    pub http_edge: AtomicU64,
    pub http_edge_fallback: AtomicU64,
    /// Redirected to the region's acceleration ingress proxy.
    pub http_accel: AtomicU64,
    pub http_origin_filter: AtomicU64,
    pub http_origin_nocache: AtomicU64,
    pub http_unknown_host: AtomicU64,
    pub http_bad_method: AtomicU64,
    pub health_checks: AtomicU64,
    pub health_failures: AtomicU64,
}

impl Metrics {
    pub fn count_rcode(&self, r: Rcode) {
        if let Some(i) = RCODES.iter().position(|&x| x == r) {
            self.dns_rcode[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Prometheus text format of every counter and gauge.
pub fn render(router: &Router) -> String {
    let m = &router.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut o = String::with_capacity(4096);
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_queries_total DNS queries received."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_queries_total counter");
    let _ = writeln!(
        o,
        "vcdn_router_dns_queries_total{{transport=\"udp\"}} {}",
        g(&m.dns_udp)
    );
    let _ = writeln!(
        o,
        "vcdn_router_dns_queries_total{{transport=\"tcp\"}} {}",
        g(&m.dns_tcp)
    );
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_responses_total DNS responses by rcode."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_responses_total counter");
    for (i, r) in RCODES.iter().enumerate() {
        let _ = writeln!(
            o,
            "vcdn_router_dns_responses_total{{rcode=\"{}\"}} {}",
            r.as_str(),
            g(&m.dns_rcode[i])
        );
    }
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_dropped_total Packets dropped unanswered (not queries)."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_dropped_total counter");
    let _ = writeln!(o, "vcdn_router_dns_dropped_total {}", g(&m.dns_dropped));
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_tcp_evicted_total Idle DNS TCP connections closed to make room for new ones."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_tcp_evicted_total counter");
    let _ = writeln!(
        o,
        "vcdn_router_dns_tcp_evicted_total {}",
        g(&m.dns_tcp_evicted)
    );
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_tcp_refused_total DNS TCP connections refused because every slot was busy with a query."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_tcp_refused_total counter");
    let _ = writeln!(
        o,
        "vcdn_router_dns_tcp_refused_total {}",
        g(&m.dns_tcp_refused)
    );
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_truncated_total UDP answers truncated (TC) for TCP retry."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_truncated_total counter");
    let _ = writeln!(o, "vcdn_router_dns_truncated_total {}", g(&m.dns_truncated));
    let _ = writeln!(
        o,
        "# HELP vcdn_router_dns_client_subnet_total Queries located by their EDNS Client Subnet."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_dns_client_subnet_total counter");
    let _ = writeln!(o, "vcdn_router_dns_client_subnet_total {}", g(&m.dns_ecs));
    let _ = writeln!(
        o,
        "# HELP vcdn_router_http_routed_total HTTP requests redirected, by target and reason."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_http_routed_total counter");
    for (target, reason, v) in [
        ("edge", "region", &m.http_edge),
        ("edge", "fallback_region", &m.http_edge_fallback),
        ("accel", "ingress", &m.http_accel),
        ("origin", "filter", &m.http_origin_filter),
        ("origin", "no_healthy_cache", &m.http_origin_nocache),
    ] {
        let _ = writeln!(
            o,
            "vcdn_router_http_routed_total{{target=\"{target}\",reason=\"{reason}\"}} {}",
            g(v)
        );
    }
    let _ = writeln!(
        o,
        "# HELP vcdn_router_http_rejected_total HTTP requests not routed."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_http_rejected_total counter");
    let _ = writeln!(
        o,
        "vcdn_router_http_rejected_total{{reason=\"unknown_host\"}} {}",
        g(&m.http_unknown_host)
    );
    let _ = writeln!(
        o,
        "vcdn_router_http_rejected_total{{reason=\"method\"}} {}",
        g(&m.http_bad_method)
    );
    let _ = writeln!(
        o,
        "# HELP vcdn_router_health_checks_total Cache health polls, and failed ones."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_health_checks_total counter");
    let _ = writeln!(o, "vcdn_router_health_checks_total {}", g(&m.health_checks));
    let _ = writeln!(
        o,
        "# HELP vcdn_router_health_check_failures_total Cache health polls that failed."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_health_check_failures_total counter");
    let _ = writeln!(
        o,
        "vcdn_router_health_check_failures_total {}",
        g(&m.health_failures)
    );

    let snap = router.snapshot();
    let _ = writeln!(
        o,
        "# HELP vcdn_router_cache_up 1 if the cache is alive and not overloaded."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_cache_up gauge");
    let mut admission = String::new();
    // One family per string: the exposition format wants each family's
    // samples together under its own TYPE.
    let [mut capacity, mut entries, mut alpha, mut catalogue]: [String; 4] = Default::default();
    for svc in &snap.services {
        for (ri, caches) in &svc.regions {
            let region = &snap.regions[*ri].name;
            for c in caches {
                let labels = format!(
                    "service=\"{}\",region=\"{}\",cache=\"{}\"",
                    svc.config.name, region, c.key
                );
                let _ = writeln!(
                    o,
                    "vcdn_router_cache_up{{{labels}}} {}",
                    c.state.is_available() as u8
                );
                let _ = writeln!(
                    admission,
                    "vcdn_router_admission_total{{{labels},decision=\"edge\"}} {}",
                    g(&c.state.admitted_edge)
                );
                let _ = writeln!(
                    admission,
                    "vcdn_router_admission_total{{{labels},decision=\"origin\"}} {}",
                    g(&c.state.admitted_origin)
                );
                if let Some(f) = &c.filter {
                    let f = f.lock();
                    let _ = writeln!(
                        capacity,
                        "vcdn_router_filter_capacity{{{labels}}} {}",
                        f.capacity()
                    );
                    let _ = writeln!(
                        entries,
                        "vcdn_router_filter_entries{{{labels}}} {}",
                        f.len()
                    );
                }
            }
        }
        if let Some(p) = svc.popularity.lock().estimate() {
            let _ = writeln!(
                alpha,
                "vcdn_router_popularity_alpha{{service=\"{}\"}} {:.4}",
                svc.config.name, p.alpha
            );
            let _ = writeln!(
                catalogue,
                "vcdn_router_popularity_catalogue{{service=\"{}\"}} {:.0}",
                svc.config.name, p.catalogue
            );
        }
    }
    let _ = writeln!(
        o,
        "# HELP vcdn_router_admission_total LRU filter decisions per cache."
    );
    let _ = writeln!(o, "# TYPE vcdn_router_admission_total counter");
    o.push_str(&admission);
    for (name, help, samples) in [
        (
            "filter_capacity",
            "LRU filter size (C1) per cache.",
            capacity,
        ),
        (
            "filter_entries",
            "Entries in the LRU filter per cache.",
            entries,
        ),
        (
            "popularity_alpha",
            "Estimated Zipf alpha of a service's requests.",
            alpha,
        ),
        (
            "popularity_catalogue",
            "Estimated catalogue size of a service.",
            catalogue,
        ),
    ] {
        let _ = writeln!(o, "# HELP vcdn_router_{name} {help}");
        let _ = writeln!(o, "# TYPE vcdn_router_{name} gauge");
        o.push_str(&samples);
    }
    if router.dataplane.get().is_some() || router.srv6_unavailable.get().is_some() {
        let _ = writeln!(
            o,
            "# HELP vcdn_router_srv6_dispatching Whether the configured SRv6 dispatcher runs (0: the kernel or the process lacks what it needs; see the log)."
        );
        let _ = writeln!(o, "# TYPE vcdn_router_srv6_dispatching gauge");
        let _ = writeln!(
            o,
            "vcdn_router_srv6_dispatching {}",
            router.dataplane.get().is_some() as u8
        );
    }
    if let Some(st) = router.dataplane.get().and_then(|d| d.stats()) {
        let (flows, capacity) = (st.flows, st.flow_capacity);
        for (name, help, v) in st.counters.fields() {
            let _ = writeln!(
                o,
                "# HELP vcdn_router_srv6_{name}_total SRv6 dispatcher: {help}."
            );
            let _ = writeln!(o, "# TYPE vcdn_router_srv6_{name}_total counter");
            let _ = writeln!(o, "vcdn_router_srv6_{name}_total {v}");
        }
        let _ = writeln!(
            o,
            "# HELP vcdn_router_srv6_flows Learnt connections held by the SRv6 dispatcher."
        );
        let _ = writeln!(o, "# TYPE vcdn_router_srv6_flows gauge");
        let _ = writeln!(o, "vcdn_router_srv6_flows {flows}");
        let _ = writeln!(o, "# HELP vcdn_router_srv6_flow_capacity Learnt connections the SRv6 dispatcher holds at most.");
        let _ = writeln!(o, "# TYPE vcdn_router_srv6_flow_capacity gauge");
        let _ = writeln!(o, "vcdn_router_srv6_flow_capacity {capacity}");
        vcdn_srv6::render_program_runs(&mut o, "vcdn_router_srv6", &st.programs);
    }
    o
}

/// The routing decisions of `snap`, one JSON document per service: for
/// each of its regions and caches, how many HTTP requests were sent to the
/// cache (`edge`) and to the origin by its admission filter (`origin`),
/// cumulative since the cache entered the router. What the router
/// publishes as `router.decisions` telemetry records: counts, not one
/// datagram per request, and cumulative, so a lost record costs nothing
/// but freshness.
pub fn decisions(snap: &crate::state::Snapshot) -> Vec<serde_json::Value> {
    snap.services
        .iter()
        .map(|s| {
            let regions: Vec<serde_json::Value> = s
                .regions
                .iter()
                .map(|(r, caches)| {
                    serde_json::json!({
                        "region": snap.regions.get(*r).map(|r| r.name.as_str()),
                        "caches": caches.iter().map(|c| serde_json::json!({
                            "cache": c.state.endpoint.address.to_string(),
                            "edge": c.state.admitted_edge.load(Ordering::Relaxed),
                            "origin": c.state.admitted_origin.load(Ordering::Relaxed),
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            serde_json::json!({"service": s.config.name, "regions": regions})
        })
        .collect()
}
