//! vcdn's DASH player emulator (CDNaaS paper §IV-D: many paced video
//! sessions against a server, each scored as a viewer would see it).
//!
//! Each session fetches the MPD, picks a representation (fixed, or by
//! throughput), fetches the initialization segment and then segments on an
//! **open-loop schedule**: segment `i` is requested at `(i − ahead)·d` after
//! the session began, whatever happened to earlier requests (a late
//! response does not delay the next request: up to `max_connections`
//! requests of a session run at once), so the offered load does not fall
//! when the server slows, as with wrk2. A [`playback::Playback`] turns
//! arrivals into start-up delay and stalls, and `vcdn_model::qoe` turns
//! those into a MOS per 16 s window and per session.
//!
//! A live (dynamic) MPD is joined two segments behind its live edge, and
//! each segment is requested when it becomes available
//! (`availabilityStartTime` + its end), not earlier.

pub mod browser;
pub mod calibrate;
pub mod chunks;
mod closed;
pub mod conn;
pub mod load;
mod open;
pub mod playback;
pub mod servers;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Mutex;
use vcdn_content::mpd::{self, Manifest, Representation};
use vcdn_model::qoe::{window_score, SessionMos, WINDOW_S};
use vcdn_policy::abr::AbrConfig;

use crate::conn::{Conn, FetchError};
use crate::playback::Playback;
use crate::servers::{Avoided, Servers};

/// Which representation sessions play.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quality {
    Highest,
    Lowest,
    /// By position in increasing bandwidth.
    Index(usize),
    /// The highest whose bandwidth is under 80 % of the measured
    /// throughput (a rate-based adaptation).
    Adaptive,
}

/// How sessions pace their requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// As a viewer's player: the next segment when the previous one has
    /// arrived and the buffer has room (see [`closed`]).
    #[default]
    Closed,
    /// As a load generator: segment `i` at `(i − ahead)·d` whatever
    /// happened before (see [`open`]).
    Open,
}

#[derive(Debug, Clone)]
pub struct PlayerOptions {
    pub mode: Mode,
    /// Closed loop: the bitrate adaptation and buffer targets.
    pub abr: AbrConfig,
    /// Closed loop: media seconds buffered before playback starts (default:
    /// one segment, as a media element starts on its first data).
    pub start_buffer_s: Option<f64>,
    /// `http://host:port/path/manifest.mpd`
    pub url: String,
    /// More servers of the same content (`http://host:port`, same path):
    /// sessions are spread over `url` and these (see [`servers`]), as
    /// viewers resolving a name to several caches would be.
    pub mirrors: Vec<String>,
    /// Resolve the URL's host name at this DNS server (and again when the
    /// answer's TTL runs out) instead of using a fixed address: sessions
    /// follow the servers it names (see [`servers`]).
    pub dns: Option<SocketAddr>,
    pub sessions: usize,
    pub duration: Duration,
    /// Sessions start evenly over this time.
    pub ramp: Duration,
    pub quality: Quality,
    /// Open loop: segments requested ahead of playback.
    pub ahead: u64,
    /// Open loop: requests of one session in flight at most.
    pub max_connections: usize,
    pub request_timeout: Duration,
    /// Frame rate for the picture-quality model.
    pub frame_rate: f64,
    /// Print progress to stderr every second.
    pub progress: bool,
    /// Where to send the mean MOS of each 16 s period (the control plane's
    /// `POST /v1/services/{id}/qoe`), with the bearer token and region.
    pub qoe_report: Option<QoeReport>,
}

#[derive(Debug, Clone)]
pub struct QoeReport {
    /// `http[s]://host:port/v1/services/NAME/qoe`.
    pub url: String,
    pub token: String,
    pub region: String,
    /// Whom an `https` control plane may be.
    pub trust: vcdn_http::tls::Trust,
}

impl Default for PlayerOptions {
    fn default() -> Self {
        PlayerOptions {
            mode: Mode::Closed,
            abr: AbrConfig::default(),
            start_buffer_s: None,
            url: String::new(),
            sessions: 1,
            duration: Duration::from_secs(30),
            ramp: Duration::from_secs(1),
            quality: Quality::Adaptive,
            ahead: 3,
            max_connections: 4,
            request_timeout: Duration::from_secs(10),
            frame_rate: 25.0,
            progress: false,
            qoe_report: None,
            mirrors: Vec::new(),
            dns: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionReport {
    pub id: usize,
    /// Representation ids played, in order of first use.
    pub representations: Vec<String>,
    pub startup_delay_s: Option<f64>,
    pub stalls: usize,
    pub stall_s: f64,
    /// Quality switches in the media played.
    pub switches: usize,
    pub failed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// MOS of every 16 s window.
    pub windows: Vec<f64>,
    /// The session's MOS (recency-weighted over its windows).
    pub mos: f64,
    pub requests: u64,
    pub bytes: u64,
}

impl SessionReport {
    fn new(id: usize) -> SessionReport {
        SessionReport {
            id,
            representations: Vec::new(),
            startup_delay_s: None,
            stalls: 0,
            stall_s: 0.0,
            switches: 0,
            failed: false,
            error: None,
            windows: Vec::new(),
            mos: 1.0,
            requests: 0,
            bytes: 0,
        }
    }

    /// The session cannot go on; the first reason is kept.
    fn fail(&mut self, e: String) {
        self.failed = true;
        self.error.get_or_insert(e);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub mode: Mode,
    pub sessions: usize,
    pub started: usize,
    pub failed: usize,
    pub mean_mos: f64,
    /// 5th percentile of session MOS.
    pub p5_mos: f64,
    pub stalls: usize,
    pub stalls_per_minute: f64,
    /// Stall time over playing time plus stall time.
    pub stall_ratio: f64,
    pub switches: usize,
    pub mean_startup_delay_s: f64,
    pub p95_startup_delay_s: f64,
    pub requests: u64,
    pub errors: u64,
    pub bytes: u64,
    pub requests_per_s: f64,
    pub mbit_per_s: f64,
    /// Segment response time from its scheduled send time (so a slow
    /// server is not hidden by late sends), ms.
    pub latency_ms: Percentiles,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub url: String,
    pub duration_s: f64,
    pub summary: Summary,
    pub per_session: Vec<SessionReport>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlayerError {
    #[error("{0}")]
    Url(String),
    #[error("the manifest: {0}")]
    Manifest(String),
    #[error("calibration: {0}")]
    Calibration(String),
    #[error("{0}")]
    Usage(String),
}

/// Counters the progress line reads.
#[derive(Default)]
struct Live {
    /// Scores of windows completed since the last QoE report.
    recent: std::sync::Mutex<Vec<f64>>,
    running: AtomicU64,
    playing: AtomicU64,
    stalled: AtomicU64,
    failed: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    /// Directory of the MPD (ends with `/`), for relative segment URLs.
    dir: String,
    pub(crate) path: String,
}

/// `http://host[:port]/path` as (host, port, path).
fn split_url(url: &str) -> Result<(&str, u16, &str), PlayerError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| PlayerError::Url(format!("{url}: give an http:// URL")))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| PlayerError::Url(format!("{url}: unclosed '['")))?;
            (h, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(p) => p
            .parse()
            .map_err(|_| PlayerError::Url(format!("{url}: bad port '{p}'")))?,
        None => 80,
    };
    Ok((host, port, path))
}

pub(crate) async fn target(url: &str) -> Result<Target, PlayerError> {
    let (host, port, path) = split_url(url)?;
    let addr = tokio::net::lookup_host((host, port))
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| PlayerError::Url(format!("cannot resolve {host}")))?;
    Ok(Target {
        addr,
        dir: dir_of(path),
        path: path.to_string(),
    })
}

/// The directory of a path (ends with `/`), for relative URLs.
fn dir_of(path: &str) -> String {
    let no_query = path.split('?').next().unwrap_or("/");
    no_query[..=no_query.rfind('/').unwrap_or(0)].to_string()
}

/// The path to request for a manifest URL (relative to the MPD).
fn path_of(t: &Target, url: &str) -> String {
    if let Some(rest) = url.strip_prefix("http://") {
        return rest.find('/').map_or("/".into(), |i| rest[i..].to_string());
    }
    if url.starts_with('/') {
        url.to_string()
    } else {
        format!("{}{url}", t.dir)
    }
}

fn pick(m: &Manifest, q: Quality, throughput_kbps: Option<f64>) -> &Representation {
    let reps = &m.representations;
    match q {
        Quality::Highest => reps.last().expect("a manifest has a representation"),
        Quality::Lowest => &reps[0],
        Quality::Index(i) => &reps[i.min(reps.len() - 1)],
        Quality::Adaptive => match throughput_kbps {
            None => &reps[0],
            Some(t) => reps
                .iter()
                .rev()
                .find(|r| (r.bandwidth as f64) / 1000.0 <= 0.8 * t)
                .unwrap_or(&reps[0]),
        },
    }
}

/// Runs every session to the end of `duration` (or of the content).
pub async fn run(opts: PlayerOptions) -> Result<Report, PlayerError> {
    let (servers, t) = servers_of(&opts).await?;
    let t = Arc::new(t);
    // One MPD fetch up front checks the URL and gives a clear error.
    let mut c = Conn::new(t.addr);
    let got = c
        .get(&t.path, true, opts.request_timeout)
        .await
        .map_err(|e| PlayerError::Manifest(e.to_string()))?;
    if got.status != 200 {
        return Err(PlayerError::Manifest(format!(
            "{} answered {}",
            opts.url, got.status
        )));
    }
    let text = String::from_utf8_lossy(got.body.as_deref().unwrap_or_default()).into_owned();
    let m = mpd::parse(&text).map_err(|e| PlayerError::Manifest(e.to_string()))?;
    if m.dynamic
        && m.availability_start
            .as_deref()
            .and_then(mpd::parse_datetime)
            .is_none()
    {
        return Err(PlayerError::Manifest(
            "a live (dynamic) MPD needs a valid availabilityStartTime".into(),
        ));
    }
    let live = Arc::new(Live::default());
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let begin = Instant::now();
    let end = begin + opts.duration;
    let progress = opts.progress.then(|| {
        let live = live.clone();
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let r = live.requests.load(Ordering::Relaxed);
                eprintln!(
                    "player {:>5.1}s  sessions {} playing {} stalled {} failed {}  {} req/s  {:.1} Mb/s on average  {} errors",
                    begin.elapsed().as_secs_f64(),
                    live.running.load(Ordering::Relaxed),
                    live.playing.load(Ordering::Relaxed),
                    live.stalled.load(Ordering::Relaxed),
                    live.failed.load(Ordering::Relaxed),
                    r - last,
                    live.bytes.load(Ordering::Relaxed) as f64 * 8.0 / 1e6 / begin.elapsed().as_secs_f64(),
                    live.errors.load(Ordering::Relaxed),
                );
                last = r;
            }
        })
    });
    let qoe = match &opts.qoe_report {
        Some(q) => Some(Arc::new(qoe_target(q).await?)),
        None => None,
    };
    // Every 16 s, the windows completed meanwhile.
    let reporter = qoe.clone().map(|t| {
        let live = live.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_secs_f64(vcdn_model::qoe::WINDOW_S));
            tick.tick().await;
            loop {
                tick.tick().await;
                flush_qoe(&t, &live).await;
            }
        })
    });
    let m = Arc::new(m);
    let mut tasks = Vec::with_capacity(opts.sessions);
    for id in 0..opts.sessions {
        let start = begin + opts.ramp.mul_f64(id as f64 / opts.sessions.max(1) as f64);
        let (t, servers, m, live, lat, opts) = (
            t.clone(),
            servers.clone(),
            m.clone(),
            live.clone(),
            latencies.clone(),
            opts.clone(),
        );
        tasks.push(tokio::spawn(async move {
            match opts.mode {
                Mode::Closed => {
                    closed::session(id, &opts, &t, servers, &m, &live, &lat, start, end).await
                }
                Mode::Open => {
                    open::session(id, &opts, &t, servers, &m, &live, &lat, start, end).await
                }
            }
        }));
    }
    let mut per_session = Vec::with_capacity(tasks.len());
    for h in tasks {
        if let Ok(r) = h.await {
            per_session.push(r);
        }
    }
    if let Some(p) = progress {
        p.abort();
    }
    if let Some(r) = reporter {
        r.abort();
    }
    if let Some(t) = &qoe {
        flush_qoe(t, &live).await;
    }
    let elapsed = begin.elapsed().as_secs_f64();
    let mut lat = std::mem::take(&mut *latencies.lock().await);
    Ok(Report {
        url: opts.url.clone(),
        duration_s: elapsed,
        summary: summarize(opts.mode, &per_session, &mut lat, &live, elapsed),
        per_session,
    })
}

/// The servers of a run (fixed, or from DNS) and the MPD's path; the
/// target's address is the first session's first choice.
async fn servers_of(opts: &PlayerOptions) -> Result<(Arc<Servers>, Target), PlayerError> {
    let (host, port, path) = split_url(&opts.url)?;
    let servers = match opts.dns {
        Some(dns) => Servers::from_dns(dns, host, port).await?,
        None => {
            let mut addrs = vec![target(&opts.url).await?.addr];
            for m in &opts.mirrors {
                addrs.push(target(m).await?.addr);
            }
            Servers::fixed(addrs)
        }
    };
    let addr = *servers
        .ranked(0, &Avoided::default())
        .first()
        .ok_or_else(|| PlayerError::Url(format!("{}: no server", opts.url)))?;
    let t = Target {
        addr,
        dir: dir_of(path),
        path: path.to_string(),
    };
    Ok((servers, t))
}

/// GET `path` for session `id` on its preferred server, over the session's
/// idle connection to it when there is one. When that fails (no answer in
/// time, a broken connection, a 5xx) the server is avoided for a while and
/// the request goes at once to the session's next choice; with one server,
/// once more on a fresh connection. Keeps one idle connection per session.
#[allow(clippy::too_many_arguments)]
async fn fetch(
    servers: &Servers,
    id: usize,
    avoided: &Avoided,
    pool: &Mutex<Vec<Conn>>,
    path: &str,
    keep_body: bool,
    timeout: Duration,
    progress: Option<&conn::Progress>,
) -> Result<conn::Fetched, FetchError> {
    let mut tries = servers.ranked(id, avoided);
    tries.truncate(3);
    if tries.len() == 1 {
        tries.push(tries[0]);
    }
    let mut last = None;
    for (k, addr) in tries.into_iter().enumerate() {
        let pooled = if k == 0 {
            let mut idle = pool.lock().await;
            let at = idle.iter().position(|c| c.addr() == addr);
            at.map(|i| idle.swap_remove(i))
        } else {
            None
        };
        let mut c = pooled.unwrap_or_else(|| Conn::new(addr));
        match c.get_tracked(path, keep_body, timeout, progress).await {
            Ok(f) if f.status < 500 => {
                let mut idle = pool.lock().await;
                idle.retain(|c| c.addr() == addr);
                if idle.is_empty() {
                    idle.push(c);
                }
                return Ok(f);
            }
            Ok(f) => last = Some(FetchError::Status(path.to_string(), f.status)),
            Err(e) => last = Some(e),
        }
        avoided.add(addr);
    }
    Err(last.unwrap_or_else(|| FetchError::Invalid(path.to_string(), "no server to ask".into())))
}

fn summarize(
    mode: Mode,
    s: &[SessionReport],
    lat: &mut [f64],
    live: &Live,
    elapsed: f64,
) -> Summary {
    let pct = |v: &[f64], p: f64| -> f64 {
        if v.is_empty() {
            0.0
        } else {
            v[((v.len() - 1) as f64 * p).round() as usize]
        }
    };
    let mut mos: Vec<f64> = s.iter().map(|r| r.mos).collect();
    mos.sort_by(f64::total_cmp);
    let mut start: Vec<f64> = s.iter().filter_map(|r| r.startup_delay_s).collect();
    start.sort_by(f64::total_cmp);
    lat.sort_by(f64::total_cmp);
    let stalls: usize = s.iter().map(|r| r.stalls).sum();
    let playing_min: f64 = s
        .iter()
        .map(|r| r.windows.len() as f64 * vcdn_model::qoe::WINDOW_S / 60.0)
        .sum();
    let requests = live.requests.load(Ordering::Relaxed);
    let bytes = live.bytes.load(Ordering::Relaxed);
    let stall_s: f64 = s.iter().map(|r| r.stall_s).sum();
    Summary {
        mode,
        sessions: s.len(),
        started: start.len(),
        failed: s.iter().filter(|r| r.failed).count(),
        mean_mos: if mos.is_empty() {
            0.0
        } else {
            mos.iter().sum::<f64>() / mos.len() as f64
        },
        p5_mos: pct(&mos, 0.05),
        stalls,
        stalls_per_minute: if playing_min > 0.0 {
            stalls as f64 / playing_min
        } else {
            0.0
        },
        stall_ratio: if playing_min > 0.0 {
            stall_s / (playing_min * 60.0).max(stall_s)
        } else {
            0.0
        },
        switches: s.iter().map(|r| r.switches).sum(),
        mean_startup_delay_s: if start.is_empty() {
            0.0
        } else {
            start.iter().sum::<f64>() / start.len() as f64
        },
        p95_startup_delay_s: pct(&start, 0.95),
        requests,
        errors: live.errors.load(Ordering::Relaxed),
        bytes,
        requests_per_s: requests as f64 / elapsed.max(1e-9),
        mbit_per_s: bytes as f64 * 8.0 / 1e6 / elapsed.max(1e-9),
        latency_ms: Percentiles {
            p50: pct(lat, 0.5),
            p90: pct(lat, 0.9),
            p99: pct(lat, 0.99),
            max: lat.last().copied().unwrap_or(0.0),
        },
    }
}

/// Where QoE reports go.
struct QoeTarget {
    endpoint: vcdn_http::client::Endpoint,
    auth: String,
    region: String,
}

async fn qoe_target(q: &QoeReport) -> Result<QoeTarget, PlayerError> {
    let endpoint = vcdn_http::client::Endpoint::new(&q.url, &q.trust)
        .await
        .map_err(|e| PlayerError::Url(format!("--qoe-to: {e}")))?;
    Ok(QoeTarget {
        endpoint,
        auth: format!("Bearer {}", q.token),
        region: q.region.clone(),
    })
}

/// Posts the mean score of the windows completed since the last report.
async fn flush_qoe(t: &QoeTarget, live: &Live) {
    let scores = live
        .recent
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    if scores.is_empty() {
        return;
    }
    let mos = scores.iter().sum::<f64>() / scores.len() as f64;
    let body = serde_json::json!({"region": t.region, "mos": mos}).to_string();
    let headers = [
        ("Authorization", t.auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    match t
        .endpoint
        .request(
            "POST",
            "",
            &headers,
            body.as_bytes(),
            Duration::from_secs(5),
        )
        .await
    {
        Ok(r) if r.status() < 300 => {}
        Ok(r) => tracing::warn!(status = r.status(), body = %r.text().trim(), "QoE report refused"),
        Err(e) => tracing::warn!(error = %e, "QoE report failed"),
    }
}

/// Adds the scores of the 16 s windows completed by `now` (seconds since
/// the session began) to the QoE reports.
pub(crate) fn report_windows(
    p: &Playback,
    reported: &mut usize,
    now: f64,
    live: &Live,
    best_kbps: f64,
    frame_rate: f64,
) {
    let Some(start) = p.play_start else { return };
    let done = ((now - start) / WINDOW_S).floor().max(0.0) as usize;
    if done <= *reported {
        return;
    }
    let ws = p.clone().windows(start + done as f64 * WINDOW_S);
    if let Ok(mut r) = live.recent.lock() {
        for w in ws.iter().skip(*reported).take(done - *reported) {
            r.push(window_score(w, best_kbps, frame_rate));
        }
    }
    *reported = done;
}

/// Ends a session at `t_end` (seconds since it began): its windows, the
/// ones not yet reported to the QoE reports, its MOS and stalls.
pub(crate) fn finish(
    mut report: SessionReport,
    mut playback: Playback,
    live: &Live,
    reported: usize,
    t_end: f64,
    best_kbps: f64,
    frame_rate: f64,
) -> SessionReport {
    let windows = playback.windows(t_end);
    if let Ok(mut r) = live.recent.lock() {
        for w in windows.iter().skip(reported) {
            r.push(window_score(w, best_kbps, frame_rate));
        }
    }
    let mut q = SessionMos::default();
    for w in &windows {
        q.push(w, best_kbps, frame_rate);
    }
    report.windows = q.scores.clone();
    report.mos = q.mos().unwrap_or(1.0);
    report.startup_delay_s = playback.play_start;
    report.stalls = playback.stalls.len();
    report.stall_s = playback.stalls.iter().fold(0.0, |a, s| a + s.duration);
    report.switches = playback.switches();
    if report.failed {
        live.failed.fetch_add(1, Ordering::Relaxed);
    }
    live.running.fetch_sub(1, Ordering::Relaxed);
    report
}

fn track(c: &AtomicU64, was: bool, now: bool) {
    match (was, now) {
        (false, true) => {
            c.fetch_add(1, Ordering::Relaxed);
        }
        (true, false) => {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// The human summary.
pub fn describe(r: &Report) -> String {
    let s = &r.summary;
    format!(
        "{} sessions for {:.1} s on {}\n  started {}  failed {}  mean MOS {:.2} (p5 {:.2})\n  stalls {} ({:.2} per minute of playback)  start-up delay mean {:.2} s, p95 {:.2} s\n  {} requests ({:.0}/s), {} errors, {:.1} Mb/s\n  segment response time from schedule: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        s.sessions,
        r.duration_s,
        r.url,
        s.started,
        s.failed,
        s.mean_mos,
        s.p5_mos,
        s.stalls,
        s.stalls_per_minute,
        s.mean_startup_delay_s,
        s.p95_startup_delay_s,
        s.requests,
        s.requests_per_s,
        s.errors,
        s.mbit_per_s,
        s.latency_ms.p50,
        s.latency_ms.p90,
        s.latency_ms.p99,
        s.latency_ms.max,
    )
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(
            split_url("http://a.example/x/m.mpd").unwrap(),
            ("a.example", 80, "/x/m.mpd")
        );
        assert_eq!(
            split_url("http://127.0.0.1:8080").unwrap(),
            ("127.0.0.1", 8080, "/")
        );
        assert_eq!(split_url("http://[::1]:81/m").unwrap(), ("::1", 81, "/m"));
        assert_eq!(split_url("http://[::1]/m").unwrap(), ("::1", 80, "/m"));
        assert!(split_url("http://a:x/m").is_err());
        assert!(split_url("https://a/m").is_err());
        assert!(split_url("http://[::1/m").is_err());
    }
}
