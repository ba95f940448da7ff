//! Chunk catalogue load (the content-aware data-plane paper's query
//! generator, §IV-B): `clients` concurrent clients each request a chunk
//! drawn from a Zipf(α) catalogue of N equal-sized chunks, on a new
//! connection every time (the connection's SYN is what an in-network
//! filter decides on), read it whole, and draw the next one.
//!
//! Chunk k is `/size/BYTES/cK` at the demo origin; its content id is
//! `vcdn_content::content_id` of that path, as the router and caches name
//! it. Three ways to reach it, to compare the three forms of the filter:
//! - [`ChunkTarget::Srv6`]: connect to the chunk's own address, the
//!   service's /64 and the content id (`vcdn name`); the network decides.
//! - [`ChunkTarget::Http`]: GET from a base URL (the router's HTTP routing
//!   or a cache with `--admission-filter`); one `302` is followed, on a new
//!   connection.
//!
//! Each answer is classed by who served it: an edge hit (`X-Cache: HIT`),
//! an edge miss (other `X-Cache` values: the edge proxied it) or the origin
//! (no `X-Cache`). The global hit rate is edge hits over requests, the
//! paper's metric.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::PlayerError;

#[derive(Debug, Clone)]
pub enum ChunkTarget {
    /// Connect to `prefix | content id` on `port`.
    Srv6 { prefix: Ipv6Addr, port: u16 },
    /// GET `base + path`, following one redirect.
    Http { base: SocketAddr },
}

#[derive(Debug, Clone)]
pub struct ChunkLoadOptions {
    pub target: ChunkTarget,
    /// N, the catalogue size.
    pub catalogue: u64,
    /// Zipf exponent α.
    pub alpha: f64,
    pub object_bytes: u64,
    pub clients: usize,
    /// Requests measured (after the warm-up).
    pub requests: u64,
    /// Requests made first and not measured (the caches fill).
    pub warmup: u64,
    /// Stop by this time whatever is left.
    pub max_duration: Duration,
    pub seed: u64,
    pub timeout: Duration,
    pub progress: bool,
    /// The `Host` of every request (a router routes by it).
    pub host: String,
}

/// Who served a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    EdgeHit,
    EdgeMiss,
    Origin,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct ClassStats {
    pub requests: u64,
    pub mean_ms: f64,
    pub p10_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChunkLoadReport {
    pub catalogue: u64,
    pub alpha: f64,
    pub object_bytes: u64,
    pub clients: usize,
    pub requests: u64,
    pub errors: u64,
    pub duration_s: f64,
    pub requests_per_s: f64,
    /// Edge hits / requests (the paper's global hit rate).
    pub hit_rate: f64,
    pub redirects: u64,
    pub all: ClassStats,
    pub edge_hit: ClassStats,
    pub edge_miss: ClassStats,
    pub origin: ClassStats,
}

/// Zipf(α) ranks 0..n by inverse CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: u64, alpha: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for r in 1..=n {
            acc += (r as f64).powf(-alpha);
            cdf.push(acc);
        }
        let total = acc;
        cdf.iter_mut().for_each(|c| *c /= total);
        Zipf { cdf }
    }

    /// The rank (0 = most popular) at uniform `u` in [0, 1).
    pub fn rank(&self, u: f64) -> u64 {
        (self.cdf.partition_point(|&c| c < u) as u64).min(self.cdf.len() as u64 - 1)
    }
}

/// The path of chunk `rank`.
pub fn chunk_path(object_bytes: u64, rank: u64) -> String {
    format!("/size/{object_bytes}/c{rank}")
}

/// xorshift64*: each client's own stream, from the seed and its index.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, i: u64) -> Rng {
        Rng((seed ^ (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Tally {
    hist: [Histogram<u64>; 3],
    errors: u64,
    redirects: u64,
}

fn class_stats(h: &Histogram<u64>) -> ClassStats {
    if h.is_empty() {
        return ClassStats::default();
    }
    let ms = |v: u64| v as f64 / 1000.0;
    ClassStats {
        requests: h.len(),
        mean_ms: h.mean() / 1000.0,
        p10_ms: ms(h.value_at_quantile(0.1)),
        p50_ms: ms(h.value_at_quantile(0.5)),
        p90_ms: ms(h.value_at_quantile(0.9)),
    }
}

pub async fn run(opts: ChunkLoadOptions) -> Result<ChunkLoadReport, PlayerError> {
    if opts.catalogue == 0 || opts.catalogue > 100_000_000 || opts.clients == 0 {
        return Err(PlayerError::Usage(
            "give a catalogue of 1 to 100,000,000 chunks and at least one client".into(),
        ));
    }
    let zipf = Arc::new(Zipf::new(opts.catalogue, opts.alpha));
    let issued = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let total = opts.warmup + opts.requests;
    let begin = Instant::now();
    let deadline = begin + opts.max_duration;
    let measure_from = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let progress = opts.progress.then(|| {
        let done = done.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!(
                    "chunks {:>6.1}s  {} of {total} requests",
                    begin.elapsed().as_secs_f64(),
                    done.load(Ordering::Relaxed)
                );
            }
        })
    });
    let mut tasks = Vec::new();
    for i in 0..opts.clients {
        let (opts, zipf, issued, done, measure_from) = (
            opts.clone(),
            zipf.clone(),
            issued.clone(),
            done.clone(),
            measure_from.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let new = || Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
            let mut t = Tally {
                hist: [new(), new(), new()],
                errors: 0,
                redirects: 0,
            };
            let mut rng = Rng::new(opts.seed, i as u64);
            loop {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() >= deadline {
                    break;
                }
                let rank = zipf.rank(rng.unit());
                let path = chunk_path(opts.object_bytes, rank);
                let t0 = Instant::now();
                let r = tokio::time::timeout(opts.timeout, fetch(&opts.target, &opts.host, &path))
                    .await;
                let took = t0.elapsed();
                done.fetch_add(1, Ordering::Relaxed);
                if n < opts.warmup {
                    continue;
                }
                if n == opts.warmup {
                    *measure_from.lock().unwrap_or_else(|e| e.into_inner()) = Some(t0);
                }
                match r {
                    Ok(Ok((served, redirected))) => {
                        let k = served as usize;
                        let _ = t.hist[k].record((took.as_micros() as u64).clamp(1, 600_000_000));
                        t.redirects += redirected as u64;
                    }
                    _ => t.errors += 1,
                }
            }
            t
        }));
    }
    let mut hist: [Histogram<u64>; 3] = std::array::from_fn(|_| {
        Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds")
    });
    let (mut errors, mut redirects) = (0, 0);
    for task in tasks {
        let t = task.await.map_err(|e| PlayerError::Usage(e.to_string()))?;
        for (a, b) in hist.iter_mut().zip(t.hist.iter()) {
            let _ = a.add(b);
        }
        errors += t.errors;
        redirects += t.redirects;
    }
    if let Some(p) = progress {
        p.abort();
    }
    let from = measure_from
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or(begin);
    let duration_s = from.elapsed().as_secs_f64();
    let mut all = hist[0].clone();
    let _ = all.add(&hist[1]);
    let _ = all.add(&hist[2]);
    let served = all.len();
    Ok(ChunkLoadReport {
        catalogue: opts.catalogue,
        alpha: opts.alpha,
        object_bytes: opts.object_bytes,
        clients: opts.clients,
        requests: served,
        errors,
        duration_s,
        requests_per_s: served as f64 / duration_s.max(1e-9),
        hit_rate: if served == 0 {
            0.0
        } else {
            hist[0].len() as f64 / served as f64
        },
        redirects,
        all: class_stats(&all),
        edge_hit: class_stats(&hist[0]),
        edge_miss: class_stats(&hist[1]),
        origin: class_stats(&hist[2]),
    })
}

/// One chunk, fetched whole: who served it, and whether a redirect was
/// followed.
async fn fetch(target: &ChunkTarget, host: &str, path: &str) -> Result<(Served, bool), String> {
    let (addr, path) = match target {
        ChunkTarget::Srv6 { prefix, port } => {
            let id = vcdn_content::content_id(None, path);
            let a = Ipv6Addr::from(u128::from(*prefix) | id as u128);
            (SocketAddr::new(IpAddr::V6(a), *port), path.to_string())
        }
        ChunkTarget::Http { base } => (*base, path.to_string()),
    };
    let (status, head) = get(addr, host, &path).await?;
    if status == 302 {
        let loc = header(&head, "location").ok_or("302 without Location")?;
        let rest = loc
            .strip_prefix("http://")
            .ok_or("a redirect to a non-http URL")?;
        let (host, p) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let to: SocketAddr = host
            .parse()
            .map_err(|_| format!("a redirect to {host}: not an address"))?;
        let (status, head) = get(to, host, if p.is_empty() { "/" } else { p }).await?;
        if status != 200 {
            return Err(format!("status {status} after the redirect"));
        }
        return Ok((class(&head), true));
    }
    if status != 200 {
        return Err(format!("status {status}"));
    }
    Ok((class(&head), false))
}

fn class(head: &str) -> Served {
    match header(head, "x-cache") {
        Some(v) if v.starts_with("HIT") => Served::EdgeHit,
        Some(_) => Served::EdgeMiss,
        None => Served::Origin,
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// GET on a new connection, read until the body's last byte (by its
/// Content-Length, as a player reads it; to the close without one):
/// (status, head). Only the head is kept.
async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<(u16, String), String> {
    const MAX_HEAD: usize = 16 << 10;
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = vec![0u8; 64 << 10];
    // Until the end of the head.
    let (end, mut body) = loop {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before the end of the head".into());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break (end, (head.len() - end - 4) as u64);
        }
        if head.len() > MAX_HEAD {
            return Err("a head over 16 KiB".into());
        }
    };
    let head = String::from_utf8_lossy(&head[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    let length = header(&head, "content-length").and_then(|v| v.parse::<u64>().ok());
    while length.is_none_or(|l| body < l) {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            if length.is_some() {
                return Err("closed before the end of the body".into());
            }
            break;
        }
        body += n as u64;
    }
    Ok((status, head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_ranks_follow_the_law() {
        let z = Zipf::new(1000, 0.9);
        let mut rng = Rng::new(7, 0);
        let mut top = 0;
        for _ in 0..100_000 {
            if z.rank(rng.unit()) == 0 {
                top += 1;
            }
        }
        // P(rank 1) = 1 / H(1000, 0.9) ≈ 0.0829 (H ≈ 12.06).
        let h: f64 = (1..=1000).map(|r| (r as f64).powf(-0.9)).sum();
        let want = 100_000.0 / h;
        assert!((top as f64 - want).abs() < 0.05 * want, "{top} vs {want}");
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_999), 999);
    }
}
