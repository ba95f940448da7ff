//! The outcome of a run: CDNSim's QoE metrics per session, peaks per VM
//! and per AS, and distributions of them.

use std::collections::HashMap;

use crate::cache::Served;

/// One finished session's experience (the paper's §3.1 metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionQoe {
    pub id: u64,
    /// Graph node of the viewer's access AS.
    pub access: u32,
    pub channel: u32,
    pub quality_bps: f64,
    pub request_ns: u64,
    /// Request to first frame.
    pub start_ns: u64,
    /// Time not playing: the start-up wait and every stall.
    pub buffering_ns: u64,
    pub playing_ns: u64,
    /// Buffer under-runs while still downloading.
    pub stalls: u32,
    /// Bits downloaded / time downloading.
    pub mean_rate_bps: f64,
    /// Served through a cache (a live channel's feed, or a VoD hit or
    /// miss), not straight from the origin.
    pub from_cache: bool,
    /// A VoD title instead of the live channel…
    pub title: Option<u32>,
    /// … and what its site's cache did with it (`None`: no cache ready).
    pub vod: Option<Served>,
}

impl SessionQoe {
    /// Buffering time / (buffering + playback), the start-up included.
    pub fn buffering_ratio(&self) -> f64 {
        let total = self.buffering_ns + self.playing_ns;
        if total == 0 {
            0.0
        } else {
            self.buffering_ns as f64 / total as f64
        }
    }

    /// Mean download rate / codec rate (1 or more: no time lost).
    pub fn playback_ratio(&self) -> f64 {
        self.mean_rate_bps / self.quality_bps
    }

    pub fn start_s(&self) -> f64 {
        self.start_ns as f64 / 1e9
    }

    pub const CSV_HEADER: &'static str = "id,access,channel,quality_bps,request_s,start_s,buffering_s,playing_s,buffering_ratio,stalls,playback_ratio,from_cache,title,vod";

    pub fn csv(&self) -> String {
        format!(
            "{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{},{:.6},{},{},{}",
            self.id,
            self.access,
            self.channel,
            self.quality_bps,
            self.request_ns as f64 / 1e9,
            self.start_s(),
            self.buffering_ns as f64 / 1e9,
            self.playing_ns as f64 / 1e9,
            self.buffering_ratio(),
            self.stalls,
            self.playback_ratio(),
            self.from_cache as u8,
            self.title.map_or(String::new(), |t| t.to_string()),
            self.vod.map_or("", Served::as_str),
        )
    }
}

/// Peak values per access AS and overall.
#[derive(Debug, Clone, Default)]
pub struct Peaks {
    /// Keyed by the workload's access index while running, by graph node
    /// after [`Peaks::map_access`].
    pub per_as: HashMap<u32, AsPeak>,
    pub active_flows: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AsPeak {
    pub rate_bps: f64,
    pub connections: u32,
    pub vms: u32,
}

impl Peaks {
    pub fn note_as(&mut self, access: u32, rate: f64, connections: u32, vms: u32) {
        let p = self.per_as.entry(access).or_default();
        p.rate_bps = p.rate_bps.max(rate);
        p.connections = p.connections.max(connections);
        p.vms = p.vms.max(vms);
    }

    pub fn note_flows(&mut self, n: usize) {
        self.active_flows = self.active_flows.max(n);
    }

    pub fn map_access(&mut self, nodes: &[u32]) {
        self.per_as = self
            .per_as
            .drain()
            .map(|(a, p)| (nodes[a as usize], p))
            .collect();
    }
}

/// An empirical distribution: sorted samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cdf {
    sorted: Vec<f64>,
}

impl Cdf {
    pub fn new(mut xs: Vec<f64>) -> Self {
        xs.retain(|x| x.is_finite());
        xs.sort_by(f64::total_cmp);
        Cdf { sorted: xs }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The q-quantile (0..=1), nearest rank.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        let i = ((q.clamp(0.0, 1.0) * self.sorted.len() as f64).ceil() as usize)
            .clamp(1, self.sorted.len());
        self.sorted[i - 1]
    }

    pub fn mean(&self) -> f64 {
        self.sorted.iter().sum::<f64>() / self.sorted.len() as f64
    }

    pub fn max(&self) -> f64 {
        self.sorted.last().copied().unwrap_or(f64::NAN)
    }

    /// Share of samples ≤ x.
    pub fn at(&self, x: f64) -> f64 {
        self.sorted.partition_point(|&s| s <= x) as f64 / self.sorted.len() as f64
    }
}

/// A streaming histogram of values ≥ 0 with log-spaced buckets 0.5 % wide:
/// quantiles within 0.5 % of the exact ones (exact for small integers
/// such as stall counts, which fall in buckets of their own), memory
/// bounded by the range of the values, not their number.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    zeros: u64,
    /// Bucket index → (count, largest value seen in it).
    buckets: std::collections::BTreeMap<i32, (u64, f64)>,
    n: u64,
    sum: f64,
    max: f64,
}

const BUCKET_GROWTH: f64 = 1.005;

impl Histogram {
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() || x < 0.0 {
            return;
        }
        self.n += 1;
        self.sum += x;
        self.max = self.max.max(x);
        if x == 0.0 {
            self.zeros += 1;
            return;
        }
        let i = (x.ln() / BUCKET_GROWTH.ln()).floor() as i32;
        let b = self.buckets.entry(i).or_insert((0, x));
        b.0 += 1;
        b.1 = b.1.max(x);
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            f64::NAN
        } else {
            self.sum / self.n as f64
        }
    }

    pub fn max(&self) -> f64 {
        if self.n == 0 {
            f64::NAN
        } else {
            self.max
        }
    }

    /// The value at or below which a share `q` of the values lie (the
    /// largest value seen in that bucket).
    pub fn quantile(&self, q: f64) -> f64 {
        if self.n == 0 {
            return f64::NAN;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        if rank <= self.zeros {
            return 0.0;
        }
        let mut seen = self.zeros;
        for &(count, top) in self.buckets.values() {
            seen += count;
            if seen >= rank {
                return top;
            }
        }
        self.max
    }

    /// Share of values ≤ x (to the bucket).
    pub fn at(&self, x: f64) -> f64 {
        if self.n == 0 {
            return f64::NAN;
        }
        let below: u64 = self.zeros
            + self
                .buckets
                .values()
                .filter(|b| b.1 <= x)
                .map(|b| b.0)
                .sum::<u64>();
        below as f64 / self.n as f64
    }

    /// `n + 1` points (value, share ≤ it) of the CDF at evenly spaced
    /// shares, for plots.
    pub fn cdf_points(&self, n: usize) -> Vec<(f64, f64)> {
        (0..=n)
            .map(|i| {
                let q = i as f64 / n as f64;
                (self.quantile(q), q)
            })
            .collect()
    }
}

/// The QoE of sessions as they end, in histograms.
#[derive(Debug, Clone, Default)]
pub struct QoeHistograms {
    pub sessions: u64,
    pub start_s: Histogram,
    pub buffering_ratio: Histogram,
    pub stalls: Histogram,
    pub playback_ratio: Histogram,
    pub from_cache: u64,
    pub stalled: u64,
}

impl QoeHistograms {
    pub fn add(&mut self, s: &SessionQoe) {
        self.sessions += 1;
        self.start_s.add(s.start_s());
        self.buffering_ratio.add(s.buffering_ratio());
        self.stalls.add(s.stalls as f64);
        self.playback_ratio.add(s.playback_ratio());
        self.from_cache += s.from_cache as u64;
        self.stalled += (s.stalls > 0) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn histogram_quantiles_are_within_half_a_percent_and_integers_exact() {
        let mut rng = Rng::new(7);
        let xs: Vec<f64> = (0..100_000)
            .map(|_| crate::dist::exponential(&mut rng, 3.0))
            .collect();
        let mut h = Histogram::default();
        for &x in &xs {
            h.add(x);
        }
        let exact = Cdf::new(xs.clone());
        for q in [0.01, 0.1, 0.5, 0.9, 0.99, 0.999] {
            let (a, b) = (h.quantile(q), exact.quantile(q));
            assert!(a >= b && a <= b * 1.005 + 1e-12, "q{q}: {a} vs {b}");
        }
        assert_eq!(h.max(), exact.max());
        assert!((h.mean() - xs.iter().sum::<f64>() / xs.len() as f64).abs() < 1e-9);
        let mut k = Histogram::default();
        for i in 0..1000u32 {
            k.add((i % 7) as f64);
        }
        assert_eq!(k.quantile(0.0), 0.0);
        assert_eq!(k.quantile(0.5), 3.0);
        assert_eq!(k.quantile(1.0), 6.0);
        assert!((k.at(2.0) - 429.0 / 1000.0).abs() < 1e-12);
    }
}
