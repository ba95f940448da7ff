//! Calibration (CDNaaS paper §IV-C/D, measured on the operator's own
//! hardware): drive a cache that is held to a known CPU share and write
//! what one vCPU sustains as a `vcdn_model::capacity::CapacityModel`.
//!
//! 1. Throughput (Table III's analogue): closed-loop requests for cached
//!    objects of the paper's two chunk sizes; requests/s ÷ CPUs.
//! 2. Response times (Fig. 14's analogue): open-loop runs of the small
//!    chunk at fractions of that throughput; p50/p90/p99 per load.
//! 3. Video (Fig. 10's analogue): DASH sessions of the high representation
//!    at fractions of the raw session capacity; mean MOS per load.
//!
//! Results are divided by the CPU share, i.e. assumed linear in CPUs (the
//! paper found the second vCPU roughly doubles capacity, §IV-D2). A small
//! share keeps the player, which runs on the same machine, from being the
//! bottleneck.

use std::net::SocketAddr;
use std::time::Duration;

use vcdn_model::capacity::{
    CapacityModel, LatencyCurve, LatencyPoint, MosPoint, Throughput, VideoCurve,
};

use crate::load::{load, LoadOptions};
use crate::{run, PlayerError, PlayerOptions, Quality};

#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// The cache under test, in front of a `vcdn origin`.
    pub cache: SocketAddr,
    /// CPUs the cache is held to.
    pub cpus: f64,
    /// CPU time one vCPU stands for (1.0: results per whole CPU).
    pub vcpu_share: f64,
    /// Length of each measured throughput and latency run.
    pub run: Duration,
    /// Length of each video run: long enough for stalls to show (players
    /// keep a few segments of buffer) and for whole 16 s MOS windows.
    pub video_run: Duration,
    pub progress: bool,
}

/// The paper's two chunk sizes (Table II means).
pub const SIZES: [u64; 2] = [73_262, 434_830];
const LOAD_FRACTIONS: [f64; 4] = [0.25, 0.5, 0.75, 0.9];
const SESSION_FRACTIONS: [f64; 5] = [0.25, 0.5, 0.75, 1.0, 1.25];

fn say(opts: &CalibrateOptions, what: String) {
    if opts.progress {
        eprintln!("calibrate: {what}");
    }
}

pub async fn calibrate(opts: CalibrateOptions) -> Result<CapacityModel, PlayerError> {
    let base = format!("http://{}", opts.cache);
    // Results are per vCPU: the cache had cpus / vcpu_share of them.
    let cpus = (opts.cpus / opts.vcpu_share.max(0.01)).max(0.01);
    let mut model = CapacityModel {
        source: format!(
            "vcdn calibrate: vcdn cache held to {} CPU ({cpus} vCPU of {} CPU), {} s runs, {} s video runs",
            opts.cpus,
            opts.vcpu_share,
            opts.run.as_secs_f64(),
            opts.video_run.as_secs_f64()
        ),
        throughput: Vec::new(),
        video: Vec::new(),
        latency: Vec::new(),
    };
    let quick = |url: String, rate: Option<f64>, connections: usize| LoadOptions {
        url,
        connections,
        rate,
        duration: opts.run,
        timeout: Duration::from_secs(10),
        progress: false,
    };
    for bytes in SIZES {
        let url = format!("{base}/size/{bytes}");
        // Warm the object into the cache.
        load(LoadOptions {
            duration: Duration::from_millis(300),
            ..quick(url.clone(), None, 2)
        })
        .await?;
        let r = load(quick(url.clone(), None, 64)).await?;
        let per_cpu = r.requests_per_s / cpus;
        say(
            &opts,
            format!(
                "{bytes} B: {:.0} requests/s ({per_cpu:.0} per vCPU), {} errors",
                r.requests_per_s, r.errors
            ),
        );
        model.throughput.push(Throughput {
            object_bytes: bytes,
            requests_per_s: per_cpu.max(1.0),
        });
        if bytes == SIZES[0] {
            let mut points = Vec::new();
            for f in LOAD_FRACTIONS {
                let rate = r.requests_per_s * f;
                let l = load(quick(url.clone(), Some(rate), 64)).await?;
                say(
                    &opts,
                    format!(
                        "{bytes} B at {rate:.0}/s: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms",
                        l.latency_ms.p50, l.latency_ms.p90, l.latency_ms.p99
                    ),
                );
                points.push(LatencyPoint {
                    requests_per_s: rate / cpus,
                    p50_ms: l.latency_ms.p50,
                    p90_ms: l.latency_ms.p90,
                    p99_ms: l.latency_ms.p99,
                });
            }
            model.latency.push(LatencyCurve {
                object_bytes: bytes,
                points,
            });
        }
    }
    // Video: the demo origin's high representation (2.5 Mb/s, 2 s chunks).
    let raw = model.throughput[1].requests_per_s * cpus * 2.0;
    let mut points: Vec<MosPoint> = Vec::new();
    for f in SESSION_FRACTIONS {
        let sessions = ((raw * f).round() as usize).max(1);
        let report = run(PlayerOptions {
            url: format!("{base}/dash/vod/calibration/manifest.mpd"),
            sessions,
            duration: opts.video_run,
            ramp: Duration::from_secs(2),
            quality: Quality::Highest,
            ..PlayerOptions::default()
        })
        .await?;
        let s = &report.summary;
        say(
            &opts,
            format!(
                "{sessions} HD sessions: mean MOS {:.2}, {} stalls, {} failed",
                s.mean_mos, s.stalls, s.failed
            ),
        );
        let x = sessions as f64 / cpus;
        if points.last().is_none_or(|p| x > p.sessions) {
            points.push(MosPoint {
                sessions: x,
                mos: s.mean_mos,
            });
        }
    }
    model.video.push(VideoCurve {
        bitrate_kbps: 2_500.0,
        chunk_s: 2.0,
        points,
    });
    model
        .validate()
        .map_err(|e| PlayerError::Calibration(e.to_string()))?;
    Ok(model)
}
