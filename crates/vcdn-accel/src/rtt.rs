//! The RTT measurement service: each proxy measures its round-trip time to
//! the other proxy locations and tells the controller only when one of them
//! moved enough to matter for chain choice (MOSTO §IV: "the RTT measurement
//! service reports to the controller only when an RTT changes by more than a
//! threshold").
//!
//! **Samples.** A probe is a TCP connect to the peer's proxy port, timed
//! from `connect(2)` to its completion (SYN → SYN-ACK: one real RTT, no data
//! sent), then closed. The data path adds the kernel's RTT of its warm hop
//! connections with [`RttService::observe`] (from `TCP_INFO`).
//!
//! **Smoothing: the minimum over a time window** (default 10 s, as BBR's
//! min-RTT filter). Chain choice wants the path's propagation delay, and
//! every sample is that plus queueing and scheduling noise, which is never
//! negative: the minimum removes it, where an EWMA would carry a burst of
//! queueing into the table and trigger needless recomputation. The price is
//! that an RTT that grows is seen only once the smaller samples leave the
//! window; a shrinking one is seen at once.
//!
//! **Reporting.** `POST {controller}/v1/accel/rtt` with
//! `{"service":S,"from":LOC,"rtt_ms":{"LOC":ms|null,...}}` (`null`: the peer
//! failed `fail_after` probes in a row; a peer without any result yet is
//! absent), bearer token. A report goes out when a peer's value moved by more
//! than max(`threshold_ms`, `threshold_ratio` × last reported value) since
//! the last *successful* report, when a peer became (un)reachable or
//! appeared/disappeared, and every `full_report_every` regardless, so a
//! restarted controller learns everything. Failed reports are retried with
//! exponential backoff on their own task: the proxy never waits for the
//! controller, and a controller that is down changes nothing for it.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Notify;

/// At most this many samples are kept per peer (the window is also bounded
/// in time): `observe` may be called on every exchange.
const MAX_SAMPLES: usize = 64;

/// How much an RTT must move (since the last report) to be reported again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// Absolute floor, in milliseconds.
    pub ms: f64,
    /// Relative part, e.g. 0.10 for 10 %.
    pub ratio: f64,
}

impl Default for Threshold {
    fn default() -> Self {
        Threshold {
            ms: 1.0,
            ratio: 0.10,
        }
    }
}

impl Threshold {
    /// Whether going from the reported `last` to `now` is worth a report.
    pub fn crossed(&self, last: f64, now: f64) -> bool {
        (now - last).abs() > self.ms.max(self.ratio * last.abs())
    }
}

/// Where to report, with the bearer token the controller requires.
#[derive(Debug, Clone)]
pub struct Controller {
    /// `http[s]://host:port[/base]`.
    pub url: String,
    pub token: String,
    /// For `https`: trust exactly the certificate with this SHA-256
    /// fingerprint (a self-signed control plane); the system roots without.
    pub fingerprint: Option<String>,
}

#[derive(Debug, Clone)]
pub struct RttConfig {
    /// This proxy's location name (`from` in the reports).
    pub location: String,
    /// The service whose proxies these are.
    pub service: String,
    /// Peer locations and their proxy addresses (replace with `set_peers`).
    pub peers: BTreeMap<String, SocketAddr>,
    pub probe_interval: Duration,
    /// A connect that takes longer is a failure.
    pub probe_timeout: Duration,
    /// The minimum is taken over the samples of this last period.
    pub window: Duration,
    /// Consecutive failed probes after which a peer is reported unreachable.
    pub fail_after: u32,
    pub threshold: Threshold,
    /// A full report is sent at least this often (when a controller is set).
    pub full_report_every: Duration,
    /// Without a controller the service only measures (for `GET /rtt`).
    pub controller: Option<Controller>,
    /// Timeout of one report request.
    pub report_timeout: Duration,
}

impl RttConfig {
    /// The defaults: probe every 2 s, 1 s timeout, 10 s min window,
    /// unreachable after 3 failures, threshold max(1 ms, 10 %), full report
    /// every 60 s.
    pub fn new(location: &str, service: &str) -> RttConfig {
        RttConfig {
            location: location.into(),
            service: service.into(),
            peers: BTreeMap::new(),
            probe_interval: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(1),
            window: Duration::from_secs(10),
            fail_after: 3,
            threshold: Threshold::default(),
            full_report_every: Duration::from_secs(60),
            controller: None,
            report_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RttError {
    #[error("controller URL {0:?} is not of the form http[s]://host:port[/base]")]
    BadControllerUrl(String),
    #[error("controller fingerprint {0:?} is not a SHA-256 fingerprint (sha256:HEX)")]
    BadFingerprint(String),
}

/// What `GET /rtt` shows.
#[derive(Debug, Clone, Serialize)]
pub struct RttSnapshot {
    pub location: String,
    pub service: String,
    pub peers: BTreeMap<String, PeerSnapshot>,
    /// The values the next report would carry (`null`: unreachable).
    pub rtt_ms: BTreeMap<String, Option<f64>>,
    pub controller: Option<String>,
    pub reports_sent: u64,
    pub reports_failed: u64,
    /// Seconds since the last successful report.
    pub last_report_age_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerSnapshot {
    pub addr: SocketAddr,
    /// Minimum over the window; `None` before the first sample or when
    /// unreachable.
    pub rtt_ms: Option<f64>,
    pub reachable: bool,
    /// Samples taken (probes and observations), ever.
    pub samples: u64,
    /// Failed probes, ever.
    pub failures: u64,
    pub consecutive_failures: u32,
    pub last_sample_age_s: Option<f64>,
}

#[derive(Debug)]
struct Peer {
    addr: SocketAddr,
    window: VecDeque<(Instant, f64)>,
    samples: u64,
    failures: u64,
    consecutive_failures: u32,
    /// Whether a probe ever concluded (success or `fail_after` failures).
    known: bool,
}

impl Peer {
    fn new(addr: SocketAddr) -> Peer {
        Peer {
            addr,
            window: VecDeque::new(),
            samples: 0,
            failures: 0,
            consecutive_failures: 0,
            known: false,
        }
    }

    fn sample(&mut self, now: Instant, ms: f64) {
        if self.window.len() == MAX_SAMPLES {
            self.window.pop_front();
        }
        self.window.push_back((now, ms));
        self.samples += 1;
        self.consecutive_failures = 0;
        self.known = true;
    }

    fn failure(&mut self, fail_after: u32) {
        self.failures += 1;
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if self.consecutive_failures >= fail_after {
            self.window.clear();
            self.known = true;
        }
    }

    fn reachable(&self, fail_after: u32) -> bool {
        self.consecutive_failures < fail_after
    }

    /// Drop samples older than the window, but keep the newest one so a
    /// peer probed less often than the window still has a value.
    fn expire(&mut self, now: Instant, window: Duration) {
        while self.window.len() > 1 && now.duration_since(self.window[0].0) > window {
            self.window.pop_front();
        }
    }

    fn min_ms(&self) -> Option<f64> {
        self.window.iter().map(|s| s.1).reduce(f64::min)
    }

    /// The value a report carries: absent before any result, `null` when
    /// unreachable.
    fn reported(&self, fail_after: u32) -> Option<Option<f64>> {
        if !self.known {
            return None;
        }
        if !self.reachable(fail_after) {
            return Some(None);
        }
        self.min_ms().map(Some)
    }
}

/// Whether `current` differs enough from what was `last` reported to send a
/// report: a peer appeared or disappeared, became (un)reachable, or its RTT
/// crossed the threshold.
pub fn report_needed(
    last: &BTreeMap<String, Option<f64>>,
    current: &BTreeMap<String, Option<f64>>,
    threshold: Threshold,
) -> bool {
    if last.len() != current.len() || last.keys().ne(current.keys()) {
        return true;
    }
    last.values()
        .zip(current.values())
        .any(|(l, c)| match (l, c) {
            (Some(l), Some(c)) => threshold.crossed(*l, *c),
            (None, None) => false,
            _ => true,
        })
}

/// The report body.
#[derive(Debug, Serialize)]
struct Report<'a> {
    service: &'a str,
    from: &'a str,
    rtt_ms: &'a BTreeMap<String, Option<f64>>,
}

#[derive(Debug, Default)]
struct ReportState {
    last_sent: Option<BTreeMap<String, Option<f64>>>,
    last_sent_at: Option<Instant>,
    sent: u64,
    failed: u64,
}

struct Inner {
    cfg: RttConfig,
    /// Controller address parts: (host:port, base path).
    controller: Option<(String, String)>,
    /// Whom an `https` controller may be.
    trust: vcdn_http::tls::Trust,
    peers: Mutex<BTreeMap<String, Peer>>,
    reports: Mutex<ReportState>,
    /// Woken after each probe round and observation.
    changed: Arc<Notify>,
}

/// The measurement service. Its tasks run on the tokio runtime it was
/// started on and stop when the last clone of it is dropped.
#[derive(Clone)]
pub struct RttService {
    inner: Arc<Inner>,
}

/// Split `http[s]://host:port[/base]` into authority and base path.
fn parse_controller(url: &str) -> Result<(String, String), RttError> {
    let bad = || RttError::BadControllerUrl(url.into());
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(bad)?;
    let (authority, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = authority.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() || authority.contains('@') {
        return Err(bad());
    }
    Ok((authority.into(), base.into()))
}

fn round_ms(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

impl RttService {
    /// Start probing (and reporting, with a controller) on the current tokio
    /// runtime.
    pub fn start(cfg: RttConfig) -> Result<RttService, RttError> {
        let controller = cfg
            .controller
            .as_ref()
            .map(|c| parse_controller(&c.url))
            .transpose()?;
        let trust = match cfg.controller.as_ref().and_then(|c| c.fingerprint.as_ref()) {
            Some(f) => vcdn_http::tls::Trust::Fingerprint(
                vcdn_http::tls::parse_fingerprint(f)
                    .ok_or_else(|| RttError::BadFingerprint(f.clone()))?,
            ),
            None => vcdn_http::tls::Trust::System,
        };
        let peers = cfg
            .peers
            .iter()
            .map(|(k, a)| (k.clone(), Peer::new(*a)))
            .collect();
        let inner = Arc::new(Inner {
            cfg,
            controller,
            trust,
            peers: Mutex::new(peers),
            reports: Mutex::new(ReportState::default()),
            changed: Arc::new(Notify::new()),
        });
        tokio::spawn(probe_loop(Arc::downgrade(&inner)));
        if inner.controller.is_some() {
            tokio::spawn(report_loop(Arc::downgrade(&inner), inner.changed.clone()));
        }
        Ok(RttService { inner })
    }

    /// Replace the peer set; peers that stay keep their samples (a changed
    /// address starts afresh).
    pub fn set_peers(&self, peers: BTreeMap<String, SocketAddr>) {
        let mut cur = self.inner.peers.lock();
        let mut next = BTreeMap::new();
        for (loc, addr) in peers {
            let p = match cur.remove(&loc) {
                Some(p) if p.addr == addr => p,
                _ => Peer::new(addr),
            };
            next.insert(loc, p);
        }
        *cur = next;
        drop(cur);
        self.inner.changed.notify_one();
    }

    /// Add an RTT measured by the data path (e.g. `TCP_INFO.tcpi_rtt` of a
    /// warm hop connection to `loc`). Unknown locations are ignored.
    pub fn observe(&self, loc: &str, rtt: Duration) {
        let ms = rtt.as_secs_f64() * 1000.0;
        if !ms.is_finite() {
            return;
        }
        if let Some(p) = self.inner.peers.lock().get_mut(loc) {
            p.sample(Instant::now(), ms);
        }
    }

    /// The current values, as a report would carry them.
    pub fn rtt_ms(&self) -> BTreeMap<String, Option<f64>> {
        self.inner.current()
    }

    pub fn snapshot(&self) -> RttSnapshot {
        let now = Instant::now();
        let fail_after = self.inner.cfg.fail_after;
        let mut peers = self.inner.peers.lock();
        let mut out = BTreeMap::new();
        for (loc, p) in peers.iter_mut() {
            p.expire(now, self.inner.cfg.window);
            let reachable = p.reachable(fail_after);
            out.insert(
                loc.clone(),
                PeerSnapshot {
                    addr: p.addr,
                    rtt_ms: if reachable {
                        p.min_ms().map(round_ms)
                    } else {
                        None
                    },
                    reachable,
                    samples: p.samples,
                    failures: p.failures,
                    consecutive_failures: p.consecutive_failures,
                    last_sample_age_s: p
                        .window
                        .back()
                        .map(|s| now.duration_since(s.0).as_secs_f64()),
                },
            );
        }
        drop(peers);
        let r = self.inner.reports.lock();
        RttSnapshot {
            location: self.inner.cfg.location.clone(),
            service: self.inner.cfg.service.clone(),
            peers: out,
            rtt_ms: self.inner.current(),
            controller: self.inner.cfg.controller.as_ref().map(|c| c.url.clone()),
            reports_sent: r.sent,
            reports_failed: r.failed,
            last_report_age_s: r.last_sent_at.map(|t| now.duration_since(t).as_secs_f64()),
        }
    }

    /// Prometheus text lines for the proxy's `/metrics`.
    pub fn metrics(&self) -> String {
        let s = self.snapshot();
        let mut out = String::new();
        out.push_str("# TYPE vcdn_accel_rtt_ms gauge\n");
        for (loc, p) in &s.peers {
            if let Some(ms) = p.rtt_ms {
                out.push_str(&format!("vcdn_accel_rtt_ms{{peer=\"{loc}\"}} {ms}\n"));
            }
        }
        out.push_str("# TYPE vcdn_accel_rtt_peer_reachable gauge\n");
        for (loc, p) in &s.peers {
            out.push_str(&format!(
                "vcdn_accel_rtt_peer_reachable{{peer=\"{loc}\"}} {}\n",
                u8::from(p.reachable)
            ));
        }
        out.push_str("# TYPE vcdn_accel_rtt_samples_total counter\n");
        for (loc, p) in &s.peers {
            out.push_str(&format!(
                "vcdn_accel_rtt_samples_total{{peer=\"{loc}\"}} {}\n",
                p.samples
            ));
        }
        out.push_str(&format!(
            "# TYPE vcdn_accel_rtt_reports_total counter\nvcdn_accel_rtt_reports_total{{result=\"sent\"}} {}\nvcdn_accel_rtt_reports_total{{result=\"failed\"}} {}\n",
            s.reports_sent, s.reports_failed
        ));
        if let Some(age) = s.last_report_age_s {
            out.push_str(&format!(
                "# TYPE vcdn_accel_rtt_report_age_seconds gauge\nvcdn_accel_rtt_report_age_seconds {age:.3}\n"
            ));
        }
        out
    }
}

impl Inner {
    fn current(&self) -> BTreeMap<String, Option<f64>> {
        let now = Instant::now();
        let mut peers = self.peers.lock();
        peers
            .iter_mut()
            .filter_map(|(loc, p)| {
                p.expire(now, self.cfg.window);
                p.reported(self.cfg.fail_after)
                    .map(|v| (loc.clone(), v.map(round_ms)))
            })
            .collect()
    }
}

/// One probe: the time a TCP handshake with `addr` takes.
async fn probe(addr: SocketAddr, timeout: Duration) -> Option<f64> {
    let start = Instant::now();
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            drop(s);
            Some(ms)
        }
        _ => None,
    }
}

async fn probe_loop(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let targets: Vec<(String, SocketAddr)> = inner
            .peers
            .lock()
            .iter()
            .map(|(l, p)| (l.clone(), p.addr))
            .collect();
        let (timeout, interval) = (inner.cfg.probe_timeout, inner.cfg.probe_interval);
        drop(inner);
        let mut set = tokio::task::JoinSet::new();
        for (loc, addr) in targets {
            set.spawn(async move { (loc, addr, probe(addr, timeout).await) });
        }
        let mut results = Vec::new();
        while let Some(r) = set.join_next().await {
            if let Ok(r) = r {
                results.push(r);
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        {
            let now = Instant::now();
            let mut peers = inner.peers.lock();
            for (loc, addr, r) in results {
                // The peer may have been replaced while probing.
                let Some(p) = peers.get_mut(&loc).filter(|p| p.addr == addr) else {
                    continue;
                };
                match r {
                    Some(ms) => p.sample(now, ms),
                    None => {
                        p.failure(inner.cfg.fail_after);
                        tracing::debug!(peer = %loc, %addr, "RTT probe failed");
                    }
                }
            }
        }
        inner.changed.notify_one();
        drop(inner);
        tokio::time::sleep(interval).await;
    }
}

async fn report_loop(weak: Weak<Inner>, changed: Arc<Notify>) {
    let mut backoff = Duration::ZERO;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let full_every = inner.cfg.full_report_every;
        let (due_full, current) = {
            let r = inner.reports.lock();
            let due_full = r
                .last_sent_at
                .is_none_or(|t| t.elapsed() >= inner.cfg.full_report_every);
            (due_full, r.last_sent.clone())
        };
        let now_values = inner.current();
        let moved = match &current {
            Some(last) => report_needed(last, &now_values, inner.cfg.threshold),
            None => !now_values.is_empty(),
        };
        if moved || (due_full && !now_values.is_empty()) {
            match send_report(&inner, &now_values).await {
                Ok(()) => {
                    backoff = Duration::ZERO;
                    let mut r = inner.reports.lock();
                    r.sent += 1;
                    r.last_sent = Some(now_values);
                    r.last_sent_at = Some(Instant::now());
                }
                Err(e) => {
                    inner.reports.lock().failed += 1;
                    backoff = (backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                    tracing::warn!(error = %e, retry_in = ?backoff, "RTT report to the controller failed");
                }
            }
        }
        // Wait for a change, the next full report, or the end of a backoff,
        // without keeping the service alive.
        drop(inner);
        if backoff > Duration::ZERO {
            tokio::time::sleep(backoff).await;
            continue;
        }
        let deadline = tokio::time::Instant::now() + full_every;
        loop {
            tokio::select! {
                _ = changed.notified() => break,
                _ = tokio::time::sleep_until(deadline) => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    if weak.strong_count() == 0 { return; }
                }
            }
        }
    }
}

async fn send_report(inner: &Inner, values: &BTreeMap<String, Option<f64>>) -> Result<(), String> {
    let (Some(_), Some(c)) = (&inner.controller, &inner.cfg.controller) else {
        return Ok(());
    };
    let body = serde_json::to_vec(&Report {
        service: &inner.cfg.service,
        from: &inner.cfg.location,
        rtt_ms: values,
    })
    .map_err(|e| e.to_string())?;
    let endpoint = vcdn_http::client::Endpoint::new(&c.url, &inner.trust)
        .await
        .map_err(|e| e.to_string())?;
    let auth = format!("Bearer {}", c.token);
    let resp = endpoint
        .request(
            "POST",
            "/v1/accel/rtt",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            &body,
            inner.cfg.report_timeout,
        )
        .await
        .map_err(|e| e.to_string())?;
    if (200..300).contains(&resp.status()) {
        Ok(())
    } else {
        Err(format!(
            "controller answered {}: {}",
            resp.status(),
            resp.text().chars().take(200).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &[(&str, Option<f64>)]) -> BTreeMap<String, Option<f64>> {
        v.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn threshold_is_the_larger_of_absolute_and_relative() {
        let t = Threshold::default();
        // Small RTTs: the 1 ms floor decides.
        assert!(!t.crossed(2.0, 2.9));
        assert!(t.crossed(2.0, 3.1));
        // Large RTTs: 10 % decides.
        assert!(!t.crossed(100.0, 109.0));
        assert!(t.crossed(100.0, 111.0));
        assert!(t.crossed(100.0, 89.0));
        assert!(!t.crossed(100.0, 91.0));
    }

    #[test]
    fn report_needed_on_threshold_reachability_and_peer_set() {
        let t = Threshold::default();
        let last = m(&[("a", Some(20.0)), ("b", Some(50.0))]);
        assert!(!report_needed(
            &last,
            &m(&[("a", Some(21.5)), ("b", Some(54.0))]),
            t
        ));
        assert!(report_needed(
            &last,
            &m(&[("a", Some(23.0)), ("b", Some(50.0))]),
            t
        ));
        assert!(report_needed(
            &last,
            &m(&[("a", Some(20.0)), ("b", None)]),
            t
        ));
        assert!(report_needed(
            &m(&[("a", Some(20.0)), ("b", None)]),
            &last,
            t
        ));
        assert!(report_needed(&last, &m(&[("a", Some(20.0))]), t));
        assert!(report_needed(
            &last,
            &m(&[("a", Some(20.0)), ("c", Some(50.0))]),
            t
        ));
        assert!(!report_needed(&m(&[("b", None)]), &m(&[("b", None)]), t));
    }

    #[test]
    fn drift_is_measured_from_the_last_report_not_the_last_sample() {
        // 5 → 5.6 → 6.2: each step is under 1 ms, the sum is not.
        let t = Threshold::default();
        let last = m(&[("a", Some(5.0))]);
        assert!(!report_needed(&last, &m(&[("a", Some(5.6))]), t));
        assert!(report_needed(&last, &m(&[("a", Some(6.2))]), t));
    }

    #[test]
    fn peer_is_min_of_window_and_unreachable_after_failures() {
        let mut p = Peer::new("127.0.0.1:1".parse().unwrap());
        assert_eq!(p.reported(3), None, "no result yet: absent");
        let t0 = Instant::now();
        p.sample(t0, 30.0);
        p.sample(t0 + Duration::from_secs(2), 21.0);
        p.sample(t0 + Duration::from_secs(4), 25.0);
        assert_eq!(p.reported(3), Some(Some(21.0)));
        // The 21 ms sample leaves the 10 s window; the minimum rises.
        p.expire(t0 + Duration::from_secs(13), Duration::from_secs(10));
        assert_eq!(p.reported(3), Some(Some(25.0)));
        p.failure(3);
        p.failure(3);
        assert_eq!(p.reported(3), Some(Some(25.0)), "two failures: still up");
        p.failure(3);
        assert_eq!(p.reported(3), Some(None), "three failures: unreachable");
        p.sample(t0 + Duration::from_secs(20), 26.0);
        assert_eq!(p.reported(3), Some(Some(26.0)), "reachable again");
    }

    #[test]
    fn window_is_bounded_in_count() {
        let mut p = Peer::new("127.0.0.1:1".parse().unwrap());
        let t0 = Instant::now();
        for i in 0..1000 {
            p.sample(t0, 100.0 - i as f64 * 0.01);
        }
        assert_eq!(p.window.len(), MAX_SAMPLES);
    }

    #[test]
    fn controller_url_is_checked() {
        assert_eq!(
            parse_controller("http://127.0.0.1:8000").unwrap(),
            ("127.0.0.1:8000".into(), "".into())
        );
        assert_eq!(
            parse_controller("http://ctl.local:80/api/").unwrap(),
            ("ctl.local:80".into(), "/api".into())
        );
        assert_eq!(
            parse_controller("https://x:1").unwrap(),
            ("x:1".into(), "".into())
        );
        assert!(parse_controller("ftp://x:1").is_err());
        assert!(parse_controller("http://x").is_err());
        assert!(parse_controller("http://u@x:1").is_err());
    }
}
