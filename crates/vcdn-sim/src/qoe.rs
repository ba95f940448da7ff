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

/// QoE summary of a set of sessions.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub sessions: usize,
    pub start_s: Cdf,
    pub buffering_ratio: Cdf,
    pub stalls: Cdf,
    pub playback_ratio: Cdf,
    pub from_cache: f64,
}

impl Summary {
    pub fn of(sessions: &[SessionQoe]) -> Self {
        Summary {
            sessions: sessions.len(),
            start_s: Cdf::new(sessions.iter().map(|s| s.start_s()).collect()),
            buffering_ratio: Cdf::new(sessions.iter().map(|s| s.buffering_ratio()).collect()),
            stalls: Cdf::new(sessions.iter().map(|s| s.stalls as f64).collect()),
            playback_ratio: Cdf::new(sessions.iter().map(|s| s.playback_ratio()).collect()),
            from_cache: sessions.iter().filter(|s| s.from_cache).count() as f64
                / sessions.len().max(1) as f64,
        }
    }
}
