//! A demo origin for trying and testing vcdn without any media files.
//!
//! Endpoints (all deterministic, all on loopback by default):
//! - `GET /size/N`: N bytes, cacheable (`public, max-age=3600`), with ETag
//!   and Last-Modified, answering conditional requests with 304.
//!   Query options: `max_age=S`, `cc=VALUE` (whole Cache-Control),
//!   `cdn_cc=VALUE` (CDN-Cache-Control), `vary=FIELD`, `delay_ms=M`
//!   (before the head), `chunked=1` (no Content-Length), `rate=BPS`
//!   (throttled body), `fail_after=K` (cut the connection after K bytes),
//!   `etag=TAG`. `GET /size/N/NAME`: the same, one object per NAME (a
//!   catalogue of equal-sized chunks, each its own cache key and content id).
//! - `GET /stream?chunks=K&interval_ms=M&size=B`: a chunked stream of K
//!   pieces of B bytes every M ms (K=0: endless, a live stream).
//! - `POST|PUT|DELETE /echo`: echoes the body, `no-store`; the same
//!   methods on `/size/N` answer 200 `updated`.
//! - `GET /dash/vod/{title}/manifest.mpd`, `GET /dash/live/{channel}/manifest.mpd`
//!   and their segments: synthetic DASH with the CDNaaS paper's segment
//!   sizes (see [`dash`]).
//! - `GET /dash/data/NAME.mpd` and its segments: real titles of a DASH
//!   data set, when the origin was given one (see [`titles`]).
//! - `GET /video/testsrc-{S}s/manifest.mpd` and its segments: a real,
//!   decodable title made with ffmpeg, when the origin was given a video
//!   directory (see [`video`]); `GET /watch?mpd=URL` plays one with dash.js
//!   in a browser (see [`watch`]).
//! - `GET /dynamic?size=N`: N bytes generated per request, `no-store` (the
//!   dynamic, non-cacheable content of a site).
//! - `GET /_origin/requests`: requests served per path, as JSON.
//! - `GET /healthz`, `GET /metrics`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use vcdn_http::serve::{json_string, serve, Body, Handler, Request, Response, ServeConfig};
use vcdn_http::Method;

/// Fixed Last-Modified of every synthetic object.
const LAST_MODIFIED: &str = "Thu, 01 Jan 2026 00:00:00 GMT";
/// Largest synthetic object.
const MAX_SIZE: u64 = 16 << 30;
/// Distinct paths counted (beyond that, counted as "other").
const MAX_PATHS: usize = 10_000;

pub mod dash;
pub mod titles;
pub mod video;
pub mod watch;

pub struct Origin {
    requests: AtomicU64,
    bytes: AtomicU64,
    per_path: Mutex<HashMap<String, u64>>,
    /// Seed of the synthetic DASH segment sizes.
    seed: u64,
    /// When live channels started (Unix seconds).
    started: u64,
    /// Responses of `/dynamic` so far (each one is different).
    generated: AtomicU64,
    /// Real titles served under `/dash/data/`.
    titles: titles::Titles,
    /// Added before every media segment's answer (a slow origin, for
    /// testing what viewers see).
    segment_delay: Duration,
    /// Real, decodable titles served under `/video/`.
    video: video::Library,
}

impl Default for Origin {
    fn default() -> Self {
        Origin::new(1)
    }
}

impl Origin {
    pub fn new(seed: u64) -> Origin {
        Origin {
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            per_path: Mutex::new(HashMap::new()),
            seed,
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            generated: AtomicU64::new(0),
            titles: titles::Titles::default(),
            segment_delay: Duration::ZERO,
            video: video::Library::default(),
        }
    }

    /// Answer every DASH media or initialization segment (not manifests)
    /// this late.
    pub fn with_segment_delay(mut self, d: Duration) -> Origin {
        self.segment_delay = d;
        self
    }

    /// Whether `path` is a DASH segment (a media or initialization file).
    fn is_segment(path: &str) -> bool {
        (path.starts_with("/dash/") || path.starts_with("/video/")) && !path.ends_with(".mpd")
    }

    /// Also serve the real titles of a data set (see [`titles`]).
    pub fn with_titles(mut self, t: titles::Titles) -> Origin {
        self.titles = t;
        self
    }

    /// Also serve the decodable titles of a library (see [`video`]).
    pub fn with_video(mut self, v: video::Library) -> Origin {
        self.video = v;
        self
    }

    fn count(&self, path: &str) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut m = self.per_path.lock();
        if m.len() < MAX_PATHS || m.contains_key(path) {
            *m.entry(path.to_string()).or_default() += 1;
        } else {
            *m.entry("other".into()).or_default() += 1;
        }
    }

    /// Requests served for one path.
    pub fn requests_for(&self, path: &str) -> u64 {
        self.per_path.lock().get(path).copied().unwrap_or(0)
    }
}

/// Serve the demo origin on a listener until the runtime ends.
pub async fn run(listener: TcpListener) {
    run_with(listener, Origin::default()).await;
}

/// Serve `origin` (e.g. with a chosen seed) on a listener.
pub async fn run_with(listener: TcpListener, origin: Origin) {
    serve(listener, ServeConfig::default(), handler(Arc::new(origin))).await;
}

/// Serve `origin` until no request has been started or in progress for
/// `idle`, then return (reactive start: the holder that handed over the
/// listener starts the origin again on the next connection). A request
/// counts until its response head is ready; a long streamed body does not
/// keep the origin up.
pub async fn run_until_idle(listener: TcpListener, origin: Origin, idle: Duration) {
    let busy = Arc::new(Activity {
        in_flight: AtomicU64::new(0),
        last: Mutex::new(std::time::Instant::now()),
    });
    let inner = handler(Arc::new(origin));
    let b = busy.clone();
    let counted: Handler = Arc::new(move |req| {
        let (inner, b) = (inner.clone(), b.clone());
        b.in_flight.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let r = inner(req).await;
            *b.last.lock() = std::time::Instant::now();
            b.in_flight.fetch_sub(1, Ordering::SeqCst);
            r
        })
    });
    let tick = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    tokio::select! {
        _ = serve(listener, ServeConfig::default(), counted) => {}
        _ = async {
            loop {
                tokio::time::sleep(tick).await;
                if busy.in_flight.load(Ordering::SeqCst) == 0 && busy.last.lock().elapsed() >= idle {
                    return;
                }
            }
        } => {}
    }
}

struct Activity {
    in_flight: AtomicU64,
    last: Mutex<std::time::Instant>,
}

pub fn handler(origin: Arc<Origin>) -> Handler {
    Arc::new(move |req| {
        let origin = origin.clone();
        Box::pin(async move { route(&origin, req).await })
    })
}

/// The byte at offset `i` of a synthetic object: printable and position
/// dependent, so a client can check any range.
pub fn byte_at(i: u64) -> u8 {
    b"0123456789abcdefghijklmnopqrstuvwxyz"[(i % 36) as usize]
}

fn synth(from: u64, len: usize) -> Bytes {
    (0..len as u64)
        .map(|i| byte_at(from + i))
        .collect::<Vec<u8>>()
        .into()
}

fn query(req: &Request) -> HashMap<String, String> {
    let pq = req.head.path_and_query();
    let Some(i) = pq.iter().position(|&c| c == b'?') else {
        return HashMap::new();
    };
    String::from_utf8_lossy(&pq[i + 1..])
        .split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn route(origin: &Origin, req: Request) -> Response {
    let path = String::from_utf8_lossy(req.head.path()).into_owned();
    origin.count(&path);
    let q = query(&req);
    let num = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = num("delay_ms") {
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    if !origin.segment_delay.is_zero() && Origin::is_segment(&path) {
        tokio::time::sleep(origin.segment_delay).await;
    }
    if matches!(req.head.method, Method::Get | Method::Head) {
        if let Some(page) = watch::route(&path) {
            return page;
        }
    }
    match (req.head.method, path.as_str()) {
        (Method::Get | Method::Head, "/healthz") => {
            Response::new(200, "application/json", "{\"status\":\"ok\"}\n")
        }
        (Method::Get | Method::Head, "/metrics") => Response::new(
            200,
            "text/plain; version=0.0.4",
            format!(
                "# TYPE vcdn_origin_requests_total counter\nvcdn_origin_requests_total {}\n# TYPE vcdn_origin_body_bytes_total counter\nvcdn_origin_body_bytes_total {}\n",
                origin.requests.load(Ordering::Relaxed),
                origin.bytes.load(Ordering::Relaxed)
            ),
        ),
        (Method::Get, "/_origin/requests") => {
            let m = origin.per_path.lock();
            let body: Vec<String> = m.iter().map(|(k, v)| format!("{}:{v}", json_string(k))).collect();
            Response::new(200, "application/json", format!("{{{}}}\n", body.join(",")))
        }
        (Method::Get | Method::Head, p) if p.starts_with("/size/") => {
            let (n, name) = p[6..].split_once('/').unwrap_or((&p[6..], ""));
            match n.parse::<u64>() {
                Ok(n)
                    if n <= MAX_SIZE
                        && name.len() <= 128
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) =>
                {
                    sized(origin, &req, &q, n, name)
                }
                _ => Response::problem(
                    404,
                    "use /size/N or /size/N/NAME with N a number of bytes up to 16 GiB and \
                     NAME up to 128 letters, digits, '.', '_' or '-'",
                ),
            }
        }
        (Method::Get, "/stream") => stream(&q),
        (Method::Get | Method::Head, p) if p.starts_with(titles::PREFIX) => {
            data_route(origin, &p[titles::PREFIX.len()..])
        }
        (Method::Get | Method::Head, p) if p.starts_with("/dash/") => dash_route(origin, p, &q),
        (Method::Get | Method::Head, p) if p.starts_with(video::PREFIX) => {
            video_route(origin, &p[video::PREFIX.len()..]).await
        }
        (Method::Get | Method::Head, "/dynamic") => {
            let n = num("size").unwrap_or(1024);
            if n > 16 << 20 {
                return Response::problem(400, "size must be at most 16 MiB");
            }
            let k = origin.generated.fetch_add(1, Ordering::Relaxed);
            let mut body = format!("generated {k} ").into_bytes();
            body.resize(n as usize, b'.');
            body.truncate(n as usize);
            origin.bytes.fetch_add(n, Ordering::Relaxed);
            Response::new(200, "application/octet-stream", body)
                .header("Cache-Control", "private, no-store")
                .header("X-Generated", k.to_string())
        }
        // Writes to an object succeed (and are not cacheable), so a cache's
        // invalidation on unsafe methods can be seen.
        (Method::Post | Method::Put | Method::Delete, p) if p.starts_with("/size/") => {
            Response::new(200, "text/plain", "updated\n").header("Cache-Control", "no-store")
        }
        (Method::Post | Method::Put | Method::Delete | Method::Patch, "/echo") => {
            Response::new(200, "application/octet-stream", req.body.clone())
                .header("Cache-Control", "no-store")
        }
        (Method::Get | Method::Head, "/") => Response::new(
            200,
            "text/plain; charset=utf-8",
            "vcdn demo origin\n  /size/N            N cacheable bytes\n  /dash/vod/TITLE/manifest.mpd   a DASH title (segment sizes of the CDNaaS paper's Table II)\n  /dash/live/CHANNEL/manifest.mpd   a live DASH channel\n  /dash/data/NAME.mpd  a real title of a DASH data set (with --dash-data DIR)\n  /video/testsrc-2s/manifest.mpd  a decodable title (with --video-dir DIR)\n  /watch?mpd=URL      play a DASH title in this browser with dash.js\n  /dynamic?size=N     N bytes made per request, not cacheable\n  /stream?chunks=K&interval_ms=M&size=B   a chunked stream (K=0: endless)\n  /echo               echoes a POST body\n  /_origin/requests   requests per path\n",
        )
        .header("Cache-Control", "public, max-age=60"),
        _ => Response::problem(404, "no such object on the demo origin; see /"),
    }
}

fn sized(
    origin: &Origin,
    req: &Request,
    q: &HashMap<String, String>,
    n: u64,
    name: &str,
) -> Response {
    let num = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    let etag = format!(
        "\"{}\"",
        q.get("etag")
            .cloned()
            .unwrap_or_else(|| if name.is_empty() {
                format!("size-{n}")
            } else {
                format!("size-{n}-{name}")
            })
    );
    let cc = q
        .get("cc")
        .cloned()
        .unwrap_or_else(|| format!("public, max-age={}", num("max_age").unwrap_or(3600)));
    let with_headers = |r: Response| {
        let mut r = r
            .header("Cache-Control", cc.clone())
            .header("ETag", etag.clone())
            .header("Last-Modified", LAST_MODIFIED);
        if let Some(v) = q.get("cdn_cc") {
            r = r.header("CDN-Cache-Control", v.clone());
        }
        if let Some(v) = q.get("vary") {
            r = r.header("Vary", v.clone());
            // Show which variant was produced.
            let lower = v.to_ascii_lowercase();
            let val = req
                .head
                .headers
                .get_str(lower.as_bytes())
                .unwrap_or("")
                .to_string();
            r = r.header("X-Variant", val);
        }
        r
    };
    if req.head.headers.get(b"if-none-match").is_some_and(|v| {
        v.split(|&c| c == b',')
            .any(|t| t.trim_ascii() == etag.as_bytes())
    }) {
        let mut r = with_headers(Response::new(304, "application/octet-stream", Bytes::new()));
        r.headers.retain(|(k, _)| k != "Content-Type");
        return r;
    }
    let chunked = q.contains_key("chunked");
    let rate = num("rate");
    let fail_after = num("fail_after");
    if !chunked && rate.is_none() && fail_after.is_none() && n <= 4 << 20 {
        origin.bytes.fetch_add(n, Ordering::Relaxed);
        return with_headers(Response::new(
            200,
            "application/octet-stream",
            synth(0, n as usize),
        ));
    }
    let (tx, rx) = mpsc::channel(4);
    let head_only = req.head.method == Method::Head;
    tokio::spawn(async move {
        if head_only {
            return;
        }
        let piece = rate.map_or(64 * 1024, |r| (r / 20).clamp(1, 64 * 1024));
        let mut at = 0u64;
        while at < n {
            let len = piece.min(n - at);
            if fail_after.is_some_and(|k| at + len > k) {
                let k = fail_after.unwrap_or(0);
                if k > at {
                    let _ = tx.send(Ok(synth(at, (k - at) as usize))).await;
                }
                let _ = tx.send(Err(())).await;
                return;
            }
            if tx.send(Ok(synth(at, len as usize))).await.is_err() {
                return;
            }
            at += len;
            if let Some(r) = rate {
                tokio::time::sleep(Duration::from_secs_f64(len as f64 / r.max(1) as f64)).await;
            }
        }
    });
    origin.bytes.fetch_add(n, Ordering::Relaxed);
    let mut r = with_headers(Response {
        status: 200,
        headers: vec![("Content-Type".into(), "application/octet-stream".into())],
        body: Body::Stream(rx),
        content_length: (!chunked).then_some(n),
    });
    r.content_length = (!chunked).then_some(n);
    r
}

fn dash_route(origin: &Origin, path: &str, q: &HashMap<String, String>) -> Response {
    let parts: Vec<&str> = path.trim_start_matches("/dash/").split('/').collect();
    let (kind, name, rest) = match parts.as_slice() {
        [k @ ("vod" | "live"), n, rest @ ..] if dash::valid_name(n) => (*k, *n, rest),
        _ => {
            return Response::problem(
                404,
                "use /dash/vod/TITLE/manifest.mpd or /dash/live/CHANNEL/manifest.mpd",
            )
        }
    };
    let live = kind == "live";
    match rest {
        ["manifest.mpd"] => {
            let mpd = if live {
                dash::live_mpd(origin.started, SystemTime::now())
            } else {
                let d = q
                    .get("duration_s")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(dash::DEFAULT_DURATION_S);
                if !(1..=86_400).contains(&d) {
                    return Response::problem(400, "duration_s must be 1 to 86400");
                }
                dash::vod_mpd(d)
            };
            Response::new(200, "application/dash+xml", mpd).header(
                "Cache-Control",
                if live {
                    "public, max-age=1"
                } else {
                    "public, max-age=3600"
                },
            )
        }
        [rep, file] => {
            let Some(r) = dash::representation(rep) else {
                return Response::problem(404, "representations are low and high");
            };
            let (size, ct) = if *file == "init.mp4" {
                (dash::INIT_BYTES, "video/mp4")
            } else {
                let Some(n) = file
                    .strip_suffix(".m4s")
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|n| (1..=43_200).contains(n))
                else {
                    return Response::problem(404, "segments are N.m4s with N from 1");
                };
                if live {
                    match dash::live_available(origin.started, n, SystemTime::now()) {
                        Ok(()) => {}
                        Err(dash::LiveError::Future(d)) => {
                            return Response::problem(
                                404,
                                &format!("live segment {n} is available in {} ms", d.as_millis()),
                            )
                        }
                        Err(dash::LiveError::Gone) => {
                            return Response::problem(
                                410,
                                &format!(
                                    "live segment {n} left the {} s time-shift window",
                                    dash::TIME_SHIFT_S
                                ),
                            )
                        }
                    }
                }
                (
                    dash::segment_size(origin.seed, name, r, n),
                    "video/iso.segment",
                )
            };
            origin.bytes.fetch_add(size, Ordering::Relaxed);
            Response::new(200, ct, synth(0, size as usize))
                .header(
                    "Cache-Control",
                    if live {
                        "public, max-age=30"
                    } else {
                        "public, max-age=86400"
                    },
                )
                .header(
                    "ETag",
                    format!("\"{}-{}-{}-{size}\"", origin.seed, r.id, file),
                )
                .header("Last-Modified", LAST_MODIFIED)
        }
        _ => Response::problem(404, "no such DASH resource; start from manifest.mpd"),
    }
}

/// A real title's manifest or segment (`path` below `/dash/data/`).
fn data_route(origin: &Origin, path: &str) -> Response {
    if let Some(mpd) = origin.titles.manifest(path) {
        return Response::new(200, "application/dash+xml", mpd.to_string())
            .header("Cache-Control", "public, max-age=3600");
    }
    let Some(size) = origin.titles.size(path) else {
        let names = origin.titles.names();
        let hint = if names.is_empty() {
            "this origin serves no data set (start it with --dash-data DIR)".to_string()
        } else {
            format!(
                "no such object; the titles are {}",
                names
                    .iter()
                    .map(|n| format!("{}{n}.mpd", titles::PREFIX))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Response::problem(404, &hint);
    };
    origin.bytes.fetch_add(size, Ordering::Relaxed);
    Response::new(200, "video/iso.segment", synth(0, size as usize))
        .header("Cache-Control", "public, max-age=86400")
        .header("ETag", format!("\"data-{size}\""))
        .header("Last-Modified", LAST_MODIFIED)
}

/// A decodable title's manifest or segment (`path` below `/video/`).
async fn video_route(origin: &Origin, path: &str) -> Response {
    match origin.video.lookup(path) {
        video::Lookup::File {
            path: file,
            size,
            content_type,
            manifest,
        } => match tokio::fs::read(&file).await {
            Ok(body) => {
                origin.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                Response::new(200, content_type, body)
                    .header(
                        "Cache-Control",
                        if manifest {
                            "public, max-age=3600"
                        } else {
                            "public, max-age=86400"
                        },
                    )
                    .header("ETag", format!("\"video-{size}\""))
                    .header("Last-Modified", LAST_MODIFIED)
                    // A watch page on another host may fetch it.
                    .header("Access-Control-Allow-Origin", "*")
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), "cannot read a video file: {e}");
                Response::problem(500, "the title's file cannot be read; see the origin's log")
                    .header("Cache-Control", "no-store")
            }
        },
        video::Lookup::Making(name) => Response::problem(
            503,
            &format!("{name} is being made with ffmpeg (about 30 s after the origin starts); retry shortly"),
        )
        .header("Retry-After", "5")
        .header("Cache-Control", "no-store"),
        video::Lookup::Failed(name, e) => {
            Response::problem(503, &format!("{name} could not be made: {e}"))
                .header("Cache-Control", "no-store")
        }
        video::Lookup::NotFound => {
            let names = origin.video.names();
            let hint = if names.is_empty() {
                "this origin serves no decodable title (start it with --video-dir DIR)".to_string()
            } else {
                format!(
                    "no such object; the titles are {}",
                    names
                        .iter()
                        .map(|n| format!("{}{n}/manifest.mpd", video::PREFIX))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            Response::problem(404, &hint)
        }
    }
}

fn stream(q: &HashMap<String, String>) -> Response {
    let num = |k: &str, d: u64| q.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(d);
    let chunks = num("chunks", 10);
    let interval = Duration::from_millis(num("interval_ms", 100).min(60_000));
    let size = num("size", 1024).clamp(1, 1 << 20) as usize;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut i = 0u64;
        while chunks == 0 || i < chunks {
            let mut piece = format!("chunk {i} ").into_bytes();
            piece.resize(size.max(piece.len()), b'.');
            if tx.send(Ok(Bytes::from(piece))).await.is_err() {
                return;
            }
            i += 1;
            tokio::time::sleep(interval).await;
        }
    });
    Response {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "text/plain".into()),
            (
                "Cache-Control".into(),
                q.get("cc")
                    .cloned()
                    .unwrap_or_else(|| "public, max-age=2".into()),
            ),
        ],
        body: Body::Stream(rx),
        content_length: None,
    }
}
