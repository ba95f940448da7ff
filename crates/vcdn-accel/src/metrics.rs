//! The proxy's counters, rendered as Prometheus text on `/metrics` and as
//! the JSON of `/stats` (what the control plane bills).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::wire::MAX_HOPS;

/// Distinct rounds classes counted (larger ones count in the last).
const ROUND_CLASSES: usize = 16;

/// Why an exchange or a hop connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A hop header was refused (malformed, bad tag, wrong service, …).
    HeaderRefused,
    /// A next hop could not be reached or failed before answering.
    HopFailed,
    /// The ingress retried an exchange on a shorter chain.
    Fallback,
    /// The origin could not be reached, was refused by policy or answered garbage.
    OriginFailed,
    /// A client's request was refused (400, 408, 413, 431, …).
    BadRequest,
    /// A transfer broke after its response had started.
    Truncated,
}

impl ErrorKind {
    const ALL: [ErrorKind; 6] = [
        ErrorKind::HeaderRefused,
        ErrorKind::HopFailed,
        ErrorKind::Fallback,
        ErrorKind::OriginFailed,
        ErrorKind::BadRequest,
        ErrorKind::Truncated,
    ];
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::HeaderRefused => "header_refused",
            ErrorKind::HopFailed => "hop_failed",
            ErrorKind::Fallback => "fallback",
            ErrorKind::OriginFailed => "origin_failed",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Truncated => "truncated",
        }
    }
}

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    /// Bytes sent to clients (heads and bodies).
    pub client_bytes_out: AtomicU64,
    pub accepted_client: AtomicU64,
    pub accepted_hop: AtomicU64,
    pub hop_opened: AtomicU64,
    pub hop_reused: AtomicU64,
    pub origin_opened: AtomicU64,
    pub origin_reused: AtomicU64,
    pub warmups: AtomicU64,
    pub open_connections: AtomicU64,
    errors: [AtomicU64; 6],
    chain_len: [AtomicU64; MAX_HOPS + 1],
    rounds: [AtomicU64; ROUND_CLASSES + 1],
    /// Bytes (sent, received) per next hop name, and "origin". Keys come
    /// only from the operator's peer set, so the map is bounded by it.
    per_hop: Mutex<BTreeMap<String, (u64, u64)>>,
}

impl Metrics {
    pub fn error(&self, k: ErrorKind) {
        self.errors[k as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn errors(&self, k: ErrorKind) -> u64 {
        self.errors[k as usize].load(Ordering::Relaxed)
    }

    /// A chain of `hops` proxies (this one included) chosen for `rounds`.
    pub fn chose(&self, hops: usize, rounds: u32) {
        self.chain_len[hops.min(MAX_HOPS)].fetch_add(1, Ordering::Relaxed);
        let class = if rounds == u32::MAX {
            0
        } else {
            (rounds as usize).min(ROUND_CLASSES)
        };
        self.rounds[class].fetch_add(1, Ordering::Relaxed);
    }

    pub fn hop_bytes(&self, hop: &str, sent: u64, received: u64) {
        let mut m = self.per_hop.lock();
        let e = m.entry(hop.to_string()).or_default();
        e.0 += sent;
        e.1 += received;
    }

    pub fn per_hop(&self) -> BTreeMap<String, (u64, u64)> {
        self.per_hop.lock().clone()
    }

    /// Prometheus text; `gauges` are the values only the proxy knows.
    pub fn render(&self, gauges: &[(&str, &str, f64)], relay: &str) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut o = String::with_capacity(4096);
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            "vcdn_proxy_requests_total",
            "Client requests served as ingress.",
            g(&self.requests),
        );
        counter(
            "vcdn_proxy_client_bytes_sent_total",
            "Bytes sent to clients.",
            g(&self.client_bytes_out),
        );
        counter(
            "vcdn_proxy_hop_connections_opened_total",
            "Hop connections this proxy opened to next hops.",
            g(&self.hop_opened),
        );
        counter(
            "vcdn_proxy_hop_connections_reused_total",
            "Exchanges sent on a pooled hop connection.",
            g(&self.hop_reused),
        );
        counter(
            "vcdn_proxy_origin_connections_opened_total",
            "Connections opened to the origin.",
            g(&self.origin_opened),
        );
        counter(
            "vcdn_proxy_origin_connections_reused_total",
            "Exchanges sent on a pooled origin connection.",
            g(&self.origin_reused),
        );
        counter(
            "vcdn_proxy_warmups_total",
            "Warm-up transfers sent or received on new hop connections.",
            g(&self.warmups),
        );
        let _ = writeln!(o, "# HELP vcdn_proxy_connections_accepted_total Connections accepted, by role of the peer.\n# TYPE vcdn_proxy_connections_accepted_total counter");
        let _ = writeln!(
            o,
            "vcdn_proxy_connections_accepted_total{{role=\"client\"}} {}",
            g(&self.accepted_client)
        );
        let _ = writeln!(
            o,
            "vcdn_proxy_connections_accepted_total{{role=\"hop\"}} {}",
            g(&self.accepted_hop)
        );
        let _ = writeln!(o, "# HELP vcdn_proxy_errors_total Failures by kind.\n# TYPE vcdn_proxy_errors_total counter");
        for k in ErrorKind::ALL {
            let _ = writeln!(
                o,
                "vcdn_proxy_errors_total{{kind=\"{}\"}} {}",
                k.as_str(),
                self.errors(k)
            );
        }
        let _ = writeln!(o, "# HELP vcdn_proxy_chain_choices_total Chains chosen, by proxies in the chain (1: straight to the origin).\n# TYPE vcdn_proxy_chain_choices_total counter");
        for (i, c) in self.chain_len.iter().enumerate().skip(1) {
            let _ = writeln!(
                o,
                "vcdn_proxy_chain_choices_total{{proxies=\"{i}\"}} {}",
                g(c)
            );
        }
        let _ = writeln!(o, "# HELP vcdn_proxy_rounds_class_total Chain lookups by estimated slow-start rounds (unknown: never seen, treated as large).\n# TYPE vcdn_proxy_rounds_class_total counter");
        for (i, c) in self.rounds.iter().enumerate() {
            let label = if i == 0 {
                "unknown".to_string()
            } else if i == ROUND_CLASSES {
                format!("{i}+")
            } else {
                i.to_string()
            };
            let _ = writeln!(
                o,
                "vcdn_proxy_rounds_class_total{{rounds=\"{label}\"}} {}",
                g(c)
            );
        }
        let _ = writeln!(o, "# HELP vcdn_proxy_hop_bytes_total Bytes sent to and received from each next hop and the origin.\n# TYPE vcdn_proxy_hop_bytes_total counter");
        for (hop, (s, r)) in self.per_hop() {
            let _ = writeln!(
                o,
                "vcdn_proxy_hop_bytes_total{{hop=\"{hop}\",direction=\"sent\"}} {s}"
            );
            let _ = writeln!(
                o,
                "vcdn_proxy_hop_bytes_total{{hop=\"{hop}\",direction=\"received\"}} {r}"
            );
        }
        for (name, help, v) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let _ = writeln!(o, "# HELP vcdn_proxy_relay_info Relay mode of the data path.\n# TYPE vcdn_proxy_relay_info gauge\nvcdn_proxy_relay_info{{mode=\"{relay}\"}} 1");
        o
    }
}

/// CPU seconds (user + system) this process has used.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}
