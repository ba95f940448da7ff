//! Counters of the cache, rendered in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a request was answered; sent to clients in `X-Cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Served from the store, fresh.
    Hit,
    /// Not in the store: this request started the upstream fetch.
    Miss,
    /// Not in the store: joined a fetch another request had started, and
    /// got its bytes as they arrived (stream cloning).
    Coalesced,
    /// Served stale: while revalidating in the background
    /// (stale-while-revalidate) or because the upstream failed
    /// (stale-if-error).
    Stale,
    /// Stored copy was stale, upstream confirmed it (304), served it.
    Revalidated,
    /// Stored copy was stale and upstream sent a new one.
    Refresh,
    /// Not cacheable (unsafe method, private or no-store response, ...):
    /// forwarded as is.
    Pass,
    /// Answered by the cache itself with an error.
    Error,
    /// Not admitted by the LRU admission filter: redirected (302) to the
    /// origin without proxying.
    Bypass,
}

impl CacheStatus {
    pub const ALL: [CacheStatus; 9] = [
        CacheStatus::Hit,
        CacheStatus::Miss,
        CacheStatus::Coalesced,
        CacheStatus::Stale,
        CacheStatus::Revalidated,
        CacheStatus::Refresh,
        CacheStatus::Pass,
        CacheStatus::Error,
        CacheStatus::Bypass,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Coalesced => "COALESCED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Refresh => "REFRESH",
            CacheStatus::Pass => "PASS",
            CacheStatus::Error => "ERROR",
            CacheStatus::Bypass => "BYPASS",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: [AtomicU64; 9],
    /// Responses by status class 1xx..5xx (index 1..=5).
    pub responses: [AtomicU64; 6],
    pub body_bytes_sent: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub bad_requests: AtomicU64,
    pub misdirected: AtomicU64,
    pub timeouts: AtomicU64,
    pub upstream_requests: AtomicU64,
    pub upstream_errors: AtomicU64,
    pub upstream_bytes: AtomicU64,
    pub upstream_refused: AtomicU64,
    pub evictions: AtomicU64,
    pub purged: AtomicU64,
    /// Panics caught in request handling (bugs; see `crate::panic`).
    pub panics: AtomicU64,
    /// TLS handshakes by how they ended (see `crate::tls`).
    pub tls_handshakes_ok: AtomicU64,
    pub tls_handshakes_failed: AtomicU64,
    pub tls_handshakes_timeout: AtomicU64,
    /// Handshakes that resumed a session (ticket or session ID).
    pub tls_resumed: AtomicU64,
    /// Handshakes failed because no certificate is loaded at all (shared
    /// with the certificate resolver, which counts them).
    pub tls_no_certificate: std::sync::Arc<AtomicU64>,
    /// TLS connections open now, by protocol.
    pub tls_open_h2: AtomicU64,
    pub tls_open_http1: AtomicU64,
    /// HTTP/2 connections open now, and streams accepted on them.
    pub h2_connections_open: AtomicU64,
    pub h2_streams: AtomicU64,
    /// HTTP/2 connections cut off for abuse (GOAWAY `ENHANCE_YOUR_CALM`,
    /// header floods, protocol errors).
    pub h2_abuse: AtomicU64,
}

/// One of the TLS connections counted open in a gauge of [`Metrics`],
/// given back when dropped.
pub struct Open<'a>(&'a AtomicU64);

impl<'a> Open<'a> {
    pub fn count(gauge: &'a AtomicU64) -> Open<'a> {
        gauge.fetch_add(1, Ordering::Relaxed);
        Open(gauge)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Hits answered on a serving thread and not yet added to [`Metrics`]:
/// the hot path counts here and adds once per batch of requests, instead
/// of three shared atomic additions per request.
#[derive(Debug, Default)]
pub struct HitTally {
    pub hits: u64,
    pub body_bytes: u64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    pub fn request(&self, s: CacheStatus) {
        inc(&self.requests[s.index()]);
    }

    /// Adds a thread's tally of 200 hits and empties it.
    pub fn add_hits(&self, t: &mut HitTally) {
        if t.hits > 0 {
            self.requests[CacheStatus::Hit.index()].fetch_add(t.hits, Ordering::Relaxed);
            self.responses[2].fetch_add(t.hits, Ordering::Relaxed);
            self.body_bytes_sent
                .fetch_add(t.body_bytes, Ordering::Relaxed);
            *t = HitTally::default();
        }
    }

    pub fn response(&self, status: u16, body: u64) {
        inc(&self.responses[(status / 100).min(5) as usize]);
        self.body_bytes_sent.fetch_add(body, Ordering::Relaxed);
    }

    pub fn count(&self, s: CacheStatus) -> u64 {
        self.requests[s.index()].load(Ordering::Relaxed)
    }

    /// The TLS listener's counters and gauges, and each certificate's
    /// expiry (`certs`: name, what it says, whether OCSP is stapled), so
    /// operators alert before a certificate runs out.
    pub fn render_tls(&self, certs: &[(String, vcdn_http::tls::CertInfo, bool)], o: &mut String) {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        o.push_str("# HELP vcdn_cache_tls_handshakes_total TLS handshakes by how they ended (timeout: not done within header_timeout_ms).\n# TYPE vcdn_cache_tls_handshakes_total counter\n");
        for (r, c) in [
            ("ok", &self.tls_handshakes_ok),
            ("failed", &self.tls_handshakes_failed),
            ("timeout", &self.tls_handshakes_timeout),
        ] {
            let _ = writeln!(
                o,
                "vcdn_cache_tls_handshakes_total{{result=\"{r}\"}} {}",
                g(c)
            );
        }
        let _ = writeln!(
            o,
            "# HELP vcdn_cache_tls_resumed_total TLS handshakes that resumed a session (ticket or session ID).\n# TYPE vcdn_cache_tls_resumed_total counter\nvcdn_cache_tls_resumed_total {}",
            g(&self.tls_resumed)
        );
        let _ = writeln!(
            o,
            "# HELP vcdn_cache_tls_no_certificate_total TLS handshakes refused because no certificate is loaded.\n# TYPE vcdn_cache_tls_no_certificate_total counter\nvcdn_cache_tls_no_certificate_total {}",
            g(&self.tls_no_certificate)
        );
        o.push_str("# HELP vcdn_cache_tls_connections TLS connections open now, by ALPN protocol.\n# TYPE vcdn_cache_tls_connections gauge\n");
        for (p, c) in [
            ("h2", &self.tls_open_h2),
            ("http/1.1", &self.tls_open_http1),
        ] {
            let _ = writeln!(o, "vcdn_cache_tls_connections{{alpn=\"{p}\"}} {}", g(c));
        }
        o.push_str("# HELP vcdn_cache_tls_certificate_not_after_seconds When each certificate expires (Unix time).\n# TYPE vcdn_cache_tls_certificate_not_after_seconds gauge\n");
        for (name, info, _) in certs {
            let _ = writeln!(
                o,
                "vcdn_cache_tls_certificate_not_after_seconds{{name=\"{}\"}} {}",
                name.replace(['\\', '"', '\n'], "_"),
                info.not_after
            );
        }
    }

    /// Render with the store and fetch gauges given by the caller.
    /// Render; `upstream_retries` comes from the upstream client.
    pub fn render(&self, upstream_retries: u64, gauges: &[(&str, &str, u64)]) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut o = String::with_capacity(4096);
        o.push_str("# HELP vcdn_cache_requests_total Requests by how the cache answered them (X-Cache).\n# TYPE vcdn_cache_requests_total counter\n");
        for s in CacheStatus::ALL {
            let _ = writeln!(
                o,
                "vcdn_cache_requests_total{{result=\"{}\"}} {}",
                s.as_str(),
                self.count(s)
            );
        }
        o.push_str("# HELP vcdn_cache_responses_total Responses by status class.\n# TYPE vcdn_cache_responses_total counter\n");
        for (i, c) in self.responses.iter().enumerate().skip(1) {
            let _ = writeln!(o, "vcdn_cache_responses_total{{class=\"{i}xx\"}} {}", g(c));
        }
        let retries = AtomicU64::new(upstream_retries);
        let counters: [(&str, &str, &AtomicU64); 16] = [
            (
                "vcdn_cache_body_bytes_sent_total",
                "Body bytes sent to clients.",
                &self.body_bytes_sent,
            ),
            (
                "vcdn_cache_connections_total",
                "Client connections accepted.",
                &self.connections_total,
            ),
            (
                "vcdn_cache_connections_refused_total",
                "Client connections closed at once because max_connections was reached.",
                &self.connections_refused,
            ),
            (
                "vcdn_cache_bad_requests_total",
                "Requests rejected by the parser (400, 414, 431, 501, 505).",
                &self.bad_requests,
            ),
            (
                "vcdn_cache_misdirected_total",
                "Requests on a chunk address for another chunk's path (421; the SRv6 data path).",
                &self.misdirected,
            ),
            (
                "vcdn_cache_client_timeouts_total",
                "Clients too slow to send a request (408) or to read a response.",
                &self.timeouts,
            ),
            (
                "vcdn_cache_upstream_requests_total",
                "Requests sent upstream.",
                &self.upstream_requests,
            ),
            (
                "vcdn_cache_upstream_errors_total",
                "Upstream requests that failed (connect, timeout, invalid or cut response).",
                &self.upstream_errors,
            ),
            (
                "vcdn_cache_upstream_refused_total",
                "Upstream connections not made: every address of the upstream is refused by the origin policy.",
                &self.upstream_refused,
            ),
            (
                "vcdn_cache_upstream_bytes_total",
                "Body bytes received from upstream.",
                &self.upstream_bytes,
            ),
            (
                "vcdn_cache_upstream_retries_total",
                "Idempotent requests retried on a failed upstream connection.",
                &retries,
            ),
            (
                "vcdn_cache_evictions_total",
                "Objects evicted from the memory tier.",
                &self.evictions,
            ),
            (
                "vcdn_cache_purged_objects_total",
                "Objects removed by purge or invalidation.",
                &self.purged,
            ),
            (
                "vcdn_cache_panics_total",
                "Panics caught in request handling (bugs: each answered 500 or closed its connection, and logged once).",
                &self.panics,
            ),
            (
                "vcdn_cache_h2_streams_total",
                "HTTP/2 streams (requests) accepted.",
                &self.h2_streams,
            ),
            (
                "vcdn_cache_h2_connection_errors_total",
                "HTTP/2 connections ended by a protocol error or cut off for abuse (rapid reset, CONTINUATION flood, oversized header blocks).",
                &self.h2_abuse,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                g(c)
            );
        }
        let _ = writeln!(
            o,
            "# HELP vcdn_cache_connections_open Client connections open now.\n# TYPE vcdn_cache_connections_open gauge\nvcdn_cache_connections_open {}",
            g(&self.connections_open)
        );
        let _ = writeln!(
            o,
            "# HELP vcdn_cache_h2_connections_open HTTP/2 client connections open now.\n# TYPE vcdn_cache_h2_connections_open gauge\nvcdn_cache_h2_connections_open {}",
            g(&self.h2_connections_open)
        );
        if let Some(b) = heap_bytes() {
            let _ = writeln!(
                o,
                "# HELP vcdn_cache_heap_bytes Bytes of the process's heap in use now (malloc's own count, all arenas; free memory the allocator keeps is not in it).\n# TYPE vcdn_cache_heap_bytes gauge\nvcdn_cache_heap_bytes {b}"
            );
        }
        for (name, help, v) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        o
    }
}

/// Bytes of the heap in use, as glibc's malloc counts them (`mallinfo2`:
/// chunks in use in every arena and large blocks mapped on their own).
/// Unlike the resident set it moves with what is allocated, not with the
/// pages touched, so the memory of connections and buffers can be read
/// from it exactly. It walks the allocator's free lists under their
/// locks: fine for a scrape, not for a hot path.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_bytes() -> Option<u64> {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's
    // state under its own locks.
    let m = unsafe { libc::mallinfo2() };
    Some((m.uordblks + m.hblkhd) as u64)
}

/// Not known with another allocator or C library.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_bytes() -> Option<u64> {
    None
}
