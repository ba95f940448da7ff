//! Who watches what, when and for how long.
//!
//! Two presets: [`Workload::paper`] (the MiniCache paper's §3.2 as
//! written, its unstated parameters filled in as documented) and
//! [`Workload::original`] (what the authors' published CDNSim actually
//! draws). Arrivals come from one sequential stream; each session's
//! choices from a stream of its own ([`crate::rng::stream`]), so two runs
//! that differ only in a policy see the same users.

use crate::dist::{self, Discrete};
use crate::rng::{self, Rng, Zipf};

/// The video qualities of §3.2: 360p … 4K, bit/s.
pub const QUALITIES_BPS: [f64; 6] = [1e6, 2.5e6, 5e6, 8e6, 10e6, 20e6];

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Users (hosts) spread over the access ASes by weight; each session
    /// is one user's, drawn uniformly.
    pub users: u64,
    /// Mean requests per second while requests arrive.
    pub rate: f64,
    /// Shape k of the Gamma-distributed gap between requests (scale
    /// 1/(k·rate), so the mean gap is 1/rate and its coefficient of
    /// variation 1/√k): 1 is a Poisson process.
    pub gap_shape: f64,
    /// No request arrives after this time (s); the run then drains.
    pub arrivals_s: f64,
    /// Live channels, picked by Zipf over ranks 1..=channels.
    pub channels: u32,
    pub zipf: f64,
    /// Quality index: Poisson(this mean) restricted to the list.
    pub quality_mean: f64,
    pub qualities_bps: Vec<f64>,
    /// Session length (s of video watched): triangular (min, mode, max).
    pub session_s: (f64, f64, f64),
    /// A share of sessions that watch a title of a VoD catalogue instead
    /// of a live channel (not in the paper, whose workload is live only).
    pub vod: Option<Vod>,
}

/// The VoD part of a workload: titles picked by Zipf (the independent
/// reference model of the LRU-filter paper).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vod {
    /// Share of sessions that are VoD (0–1).
    pub share: f64,
    pub titles: u32,
    pub zipf: f64,
}

impl Workload {
    /// §3.2 as written: 1 M users, 200 channels, the six qualities by
    /// Poisson, sessions triangular between 1 min and 1 h. Unstated and
    /// filled in here: the mode of the triangle at its middle (30.5 min),
    /// the Zipf exponent and the Poisson mean as the original code has
    /// them (1.2 and 2), and Poisson arrivals (Gamma gaps of shape 1) for
    /// 3,000 s at the rate that Little's law turns into the paper's peak
    /// of ~100K concurrent sessions (100,000 / 1,830 s = 54.6 per s).
    pub fn paper() -> Self {
        let session_s = (60.0, 1_830.0, 3_600.0);
        Workload {
            users: 1_000_000,
            rate: 100_000.0 / dist::triangular_mean(session_s.0, session_s.1, session_s.2),
            gap_shape: 1.0,
            arrivals_s: 3_000.0,
            channels: 200,
            zipf: 1.2,
            quality_mean: 2.0,
            qualities_bps: QUALITIES_BPS.to_vec(),
            session_s,
            vod: None,
        }
    }

    /// The published code's defaults: requests for 30 s at ~3,333 per s
    /// (~100K sessions, all concurrent soon after), gaps
    /// `standard_gamma(1/λ)` (shape 1/λ, scale 1: the right mean but a
    /// coefficient of variation of √λ, a very bursty process), channel
    /// `zipf(1.2) − 1` drawn again until below 200, quality Poisson(2)
    /// drawn again until ≤ 5, sessions triangular(60, 1,800, 2,700) s.
    pub fn original() -> Self {
        let rate = 100_000.0 / 30.0;
        Workload {
            users: 1_000_000,
            rate,
            gap_shape: 1.0 / rate,
            arrivals_s: 30.0,
            channels: 200,
            zipf: 1.2,
            quality_mean: 2.0,
            qualities_bps: QUALITIES_BPS.to_vec(),
            session_s: (60.0, 1_800.0, 2_700.0),
            vod: None,
        }
    }

    /// Expected sessions: rate × arrival window.
    pub fn expected_sessions(&self) -> f64 {
        self.rate * self.arrivals_s
    }

    /// Mean session length (s).
    pub fn mean_session_s(&self) -> f64 {
        dist::triangular_mean(self.session_s.0, self.session_s.1, self.session_s.2)
    }

    /// Mean bitrate of a session (bit/s), over the quality distribution.
    pub fn mean_bitrate_bps(&self) -> f64 {
        let q = Discrete::truncated_poisson(self.quality_mean, self.qualities_bps.len());
        self.qualities_bps
            .iter()
            .enumerate()
            .map(|(i, v)| q.p(i) * v)
            .sum()
    }

    /// Checks the parameters, with a message a person can act on.
    pub fn validate(&self) -> Result<(), String> {
        let (lo, mode, hi) = self.session_s;
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return Err(format!("the request rate must be > 0, not {}", self.rate));
        }
        if !(self.gap_shape > 0.0 && self.gap_shape.is_finite()) {
            return Err("the gap shape must be > 0".into());
        }
        if !(self.arrivals_s >= 0.0 && self.arrivals_s.is_finite()) {
            return Err("the arrival window must be ≥ 0 s".into());
        }
        if self.channels == 0 || self.qualities_bps.is_empty() {
            return Err("a workload needs at least one channel and one quality".into());
        }
        if self
            .qualities_bps
            .iter()
            .any(|q| !(*q > 0.0 && q.is_finite()))
        {
            return Err("every quality needs a rate > 0".into());
        }
        if !(lo > 0.0 && lo <= mode && mode <= hi && lo < hi && hi.is_finite()) {
            return Err(format!(
                "session lengths need 0 < min ≤ mode ≤ max, min < max; got {lo}, {mode}, {hi}"
            ));
        }
        if !(self.zipf >= 0.0 && self.quality_mean >= 0.0) {
            return Err("the Zipf exponent and the quality mean must be ≥ 0".into());
        }
        if let Some(v) = self.vod {
            if !(0.0..=1.0).contains(&v.share) || v.titles == 0 || v.zipf.is_nan() || v.zipf < 0.0 {
                return Err(
                    "VoD needs a share between 0 and 1, at least one title and a Zipf exponent ≥ 0"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// One request, as the workload draws it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub id: u64,
    /// ns since the start.
    pub at_ns: u64,
    /// Index into the access ASes given to [`Requests::new`].
    pub access: u32,
    pub channel: u32,
    pub quality: u8,
    pub length_s: f64,
    /// A VoD title instead of the live channel.
    pub title: Option<u32>,
}

const ARRIVALS: u64 = 1;
const SESSIONS: u64 = 2;

/// The request stream of a workload over a set of access ASes.
#[derive(Debug, Clone)]
pub struct Requests {
    workload: Workload,
    seed: u64,
    arrivals: Rng,
    where_: Discrete,
    channels: Zipf,
    qualities: Discrete,
    titles: Option<Zipf>,
    next_id: u64,
    clock_s: f64,
}

impl Requests {
    /// `weights`: the users of each access AS (relative).
    pub fn new(workload: &Workload, weights: &[f64], seed: u64) -> Self {
        Requests {
            workload: workload.clone(),
            seed,
            arrivals: rng::stream(seed, ARRIVALS, 0),
            where_: Discrete::new(weights),
            channels: Zipf::new(workload.zipf, workload.channels as usize),
            qualities: Discrete::truncated_poisson(
                workload.quality_mean,
                workload.qualities_bps.len(),
            ),
            titles: workload.vod.map(|v| Zipf::new(v.zipf, v.titles as usize)),
            next_id: 0,
            clock_s: 0.0,
        }
    }

    /// Probability that a session watches `channel`.
    pub fn channel_p(&self, channel: u32) -> f64 {
        let total: f64 = (0..self.workload.channels)
            .map(|c| self.channels.rate(c))
            .sum();
        self.channels.rate(channel) / total
    }
}

impl Iterator for Requests {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        let w = &self.workload;
        let k = w.gap_shape;
        self.clock_s += dist::gamma(&mut self.arrivals, k, 1.0 / (k * w.rate));
        if self.clock_s > w.arrivals_s {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut r = rng::stream(self.seed, SESSIONS, id);
        let (lo, mode, hi) = w.session_s;
        let access = self.where_.sample(&mut r) as u32;
        let channel = self.channels.sample(&mut r);
        let quality = self.qualities.sample(&mut r) as u8;
        let length_s = dist::triangular(&mut r, lo, mode, hi);
        // Drawn last, so the live choices above do not depend on it.
        let title = match (w.vod, &self.titles) {
            (Some(v), Some(z)) if r.next_f64() < v.share => Some(z.sample(&mut r)),
            _ => None,
        };
        Some(Request {
            id,
            at_ns: (self.clock_s * 1e9) as u64,
            access,
            channel,
            quality,
            length_s,
            title,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_preset_draws_its_documented_shares() {
        let w = Workload::original();
        let reqs: Vec<Request> = Requests::new(&w, &[1.0, 3.0], 1).collect();
        let n = reqs.len() as f64;
        // ~100K requests in 30 s. The gaps' coefficient of variation is
        // √λ ≈ 58, so the count itself varies by ~18K (one sd) between seeds.
        assert!((n - 100_000.0).abs() < 40_000.0, "{n}");
        let top = reqs.iter().filter(|r| r.channel == 0).count() as f64 / n;
        let top10 = reqs.iter().filter(|r| r.channel < 10).count() as f64 / n;
        assert!((top - 0.259).abs() < 0.01, "top channel {top}");
        assert!((top10 - 0.639).abs() < 0.01, "top 10 {top10}");
        let mean_q: f64 = reqs
            .iter()
            .map(|r| w.qualities_bps[r.quality as usize])
            .sum::<f64>()
            / n;
        assert!((mean_q - 5.32e6).abs() < 0.05e6, "mean quality {mean_q}");
        let second = reqs.iter().filter(|r| r.access == 1).count() as f64 / n;
        assert!((second - 0.75).abs() < 0.01, "{second}");
        let mean_len: f64 = reqs.iter().map(|r| r.length_s).sum::<f64>() / n;
        assert!((mean_len - 1520.0).abs() < 10.0, "{mean_len}");
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_cv_one() {
        let w = Workload {
            rate: 50.0,
            arrivals_s: 2_000.0,
            ..Workload::paper()
        };
        let reqs: Vec<Request> = Requests::new(&w, &[1.0], 3).collect();
        let n = reqs.len() as f64;
        assert!((n - 100_000.0).abs() < 5.0 * 100_000f64.sqrt(), "{n}");
        let gaps: Vec<f64> = reqs
            .windows(2)
            .map(|p| (p[1].at_ns - p[0].at_ns) as f64 / 1e9)
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.02, "cv {}", sd / mean);
    }

    #[test]
    fn sessions_do_not_depend_on_what_else_was_drawn() {
        let w = Workload::paper();
        let a: Vec<Request> = Requests::new(&w, &[1.0, 1.0, 1.0], 9).take(100).collect();
        let b: Vec<Request> = Requests::new(&w, &[1.0, 1.0, 1.0], 9).take(100).collect();
        assert_eq!(a, b);
        let c: Vec<Request> = Requests::new(&w, &[1.0, 1.0, 1.0], 10).take(100).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn bad_parameters_are_explained() {
        let w = Workload {
            session_s: (100.0, 50.0, 10.0),
            ..Workload::paper()
        };
        assert!(w.validate().unwrap_err().contains("min ≤ mode ≤ max"));
        assert!(Workload::paper().validate().is_ok() && Workload::original().validate().is_ok());
    }
}
