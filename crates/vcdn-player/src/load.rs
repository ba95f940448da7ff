//! Plain HTTP load: keep-alive connections requesting one URL, either at a
//! fixed total rate (open loop: each request has a scheduled send time and
//! its latency counts from then, as wrk2 does, so a slow server cannot hide
//! its queueing) or back to back (closed loop). Latencies go into an HDR
//! histogram (µs, 3 significant digits).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::conn::Conn;
use crate::{target, PlayerError};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub url: String,
    pub connections: usize,
    /// Requests per second in total; `None`: closed loop.
    pub rate: Option<f64>,
    pub duration: Duration,
    pub timeout: Duration,
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub url: String,
    pub duration_s: f64,
    pub connections: usize,
    pub target_rate: Option<f64>,
    pub requests: u64,
    pub errors: u64,
    pub statuses: BTreeMap<u16, u64>,
    pub bytes: u64,
    pub requests_per_s: f64,
    pub latency_ms: LoadLatency,
    /// The latency distribution: (fraction of requests, ms) at the
    /// quantiles of [`CDF_QUANTILES`], for plotting a CDF.
    pub cdf: Vec<(f64, f64)>,
}

/// Quantiles of the latency CDF in a report: every 5 % plus the tail.
pub const CDF_QUANTILES: [f64; 23] = [
    0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8,
    0.85, 0.9, 0.95, 0.99, 0.999, 1.0,
];

#[derive(Debug, Clone, Serialize)]
pub struct LoadLatency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

struct Tally {
    hist: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    bytes: u64,
}

pub async fn load(opts: LoadOptions) -> Result<LoadReport, PlayerError> {
    let t = Arc::new(target(&opts.url).await?);
    let conns = opts.connections.max(1);
    let begin = Instant::now();
    let end = begin + opts.duration;
    let done = Arc::new(AtomicU64::new(0));
    let progress = opts.progress.then(|| {
        let done = done.clone();
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let d = done.load(Ordering::Relaxed);
                eprintln!(
                    "load {:>5.1}s  {} req/s",
                    begin.elapsed().as_secs_f64(),
                    d - last
                );
                last = d;
            }
        })
    });
    let interval = opts
        .rate
        .map(|r| Duration::from_secs_f64(conns as f64 / r.max(1e-3)));
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (t, done, timeout) = (t.clone(), done.clone(), opts.timeout);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally {
                hist: Histogram::new_with_bounds(1, 120_000_000, 3)
                    .expect("valid histogram bounds"),
                statuses: BTreeMap::new(),
                errors: 0,
                bytes: 0,
            };
            let mut c = Conn::new(t.addr);
            // Connections' schedules are staggered across one interval.
            let mut k = 0u64;
            loop {
                let scheduled = match interval {
                    Some(iv) => begin + iv.mul_f64(i as f64 / conns as f64) + iv * k as u32,
                    None => Instant::now(),
                };
                if scheduled >= end {
                    break;
                }
                tokio::time::sleep_until(scheduled.into()).await;
                let r = c.get(&t.path, false, timeout).await;
                let now = Instant::now();
                match r {
                    Ok(f) => {
                        *tally.statuses.entry(f.status).or_default() += 1;
                        tally.bytes += f.bytes;
                    }
                    Err(_) => tally.errors += 1,
                }
                let us = now
                    .duration_since(scheduled.min(now))
                    .as_micros()
                    .clamp(1, 120_000_000) as u64;
                let _ = tally.hist.record(us);
                done.fetch_add(1, Ordering::Relaxed);
                k += 1;
                if now >= end {
                    break;
                }
            }
            tally
        }));
    }
    let mut hist: Histogram<u64> =
        Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds");
    let mut statuses = BTreeMap::new();
    let (mut errors, mut bytes) = (0, 0);
    for h in tasks {
        if let Ok(t) = h.await {
            let _ = hist.add(&t.hist);
            for (s, n) in t.statuses {
                *statuses.entry(s).or_default() += n;
            }
            errors += t.errors;
            bytes += t.bytes;
        }
    }
    if let Some(p) = progress {
        p.abort();
    }
    let elapsed = begin.elapsed().as_secs_f64();
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(LoadReport {
        url: opts.url,
        duration_s: elapsed,
        connections: conns,
        target_rate: opts.rate,
        requests: hist.len(),
        errors,
        statuses,
        bytes,
        requests_per_s: hist.len() as f64 / elapsed.max(1e-9),
        latency_ms: LoadLatency {
            mean: hist.mean() / 1000.0,
            p50: ms(hist.value_at_quantile(0.5)),
            p90: ms(hist.value_at_quantile(0.9)),
            p99: ms(hist.value_at_quantile(0.99)),
            p999: ms(hist.value_at_quantile(0.999)),
            max: ms(hist.max()),
        },
        cdf: CDF_QUANTILES
            .iter()
            .map(|&q| (q, ms(hist.value_at_quantile(q))))
            .collect(),
    })
}

/// The human summary.
pub fn describe(r: &LoadReport) -> String {
    let l = &r.latency_ms;
    format!(
        "{} requests in {:.1} s on {} connections to {} ({:.0}/s{}), {} errors, statuses {:?}\n  latency (from the scheduled send): mean {:.2} ms, p50 {:.2}, p90 {:.2}, p99 {:.2}, p99.9 {:.2}, max {:.2} ms",
        r.requests,
        r.duration_s,
        r.connections,
        r.url,
        r.requests_per_s,
        r.target_rate.map_or(String::from(", closed loop"), |t| format!(", target {t:.0}/s")),
        r.errors,
        r.statuses,
        l.mean,
        l.p50,
        l.p90,
        l.p99,
        l.p999,
        l.max
    )
}
