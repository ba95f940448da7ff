//! The capacity model: what one vCPU of a cache instance sustains, the
//! planner's input (CDNaaS paper §IV–V-A: "the empirical model of QoE as a
//! function of workload").
//!
//! A TOML file with three kinds of curves, all per vCPU:
//!
//! ```toml
//! source = "where the numbers come from"
//!
//! # Requests/s one vCPU serves, per object size (Table III's analogue).
//! [[throughput]]
//! object_bytes = 73262
//! requests_per_s = 15928
//!
//! # Mean MOS by concurrent video sessions on one vCPU (Fig. 10's analogue).
//! [[video]]
//! bitrate_kbps = 1700
//! chunk_s = 2.0
//! points = [{ sessions = 12000, mos = 4.9 }, { sessions = 17000, mos = 4.5 }]
//!
//! # Response-time percentiles by request rate on one vCPU (Fig. 14's analogue).
//! [[latency]]
//! object_bytes = 73262
//! points = [{ requests_per_s = 8000, p50_ms = 3.0, p90_ms = 9.0, p99_ms = 30.0 }]
//! ```
//!
//! [`CapacityModel::default`] holds the paper's own figures for nginx in a
//! docker container on one vCPU; `vcdn calibrate` measures vcdn's cache on
//! the operator's hardware and writes the same format.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CapacityModel {
    /// Where the numbers come from (a measurement run, a paper).
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub throughput: Vec<Throughput>,
    #[serde(default)]
    pub video: Vec<VideoCurve>,
    #[serde(default)]
    pub latency: Vec<LatencyCurve>,
}

/// Requests per second one vCPU sustains for objects of one size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Throughput {
    pub object_bytes: u64,
    pub requests_per_s: f64,
}

/// Mean MOS as a function of concurrent sessions of one video quality.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VideoCurve {
    pub bitrate_kbps: f64,
    pub chunk_s: f64,
    /// By increasing `sessions`.
    pub points: Vec<MosPoint>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MosPoint {
    pub sessions: f64,
    pub mos: f64,
}

/// Response-time percentiles as a function of the request rate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LatencyCurve {
    pub object_bytes: u64,
    /// By increasing `requests_per_s`.
    pub points: Vec<LatencyPoint>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LatencyPoint {
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

/// A model that cannot be used, with what to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CapacityError {
    #[error("capacity model: {0}")]
    Invalid(String),
    #[error("capacity model: {0}")]
    Parse(String),
}

impl Default for CapacityModel {
    /// The paper's measurements of nginx in docker on one vCPU: Table III
    /// (1,000 connections) for throughput; Fig. 10 and §IV-D2 for HD video
    /// (no stalls up to 12,000 sessions, degrading "more drastically" past
    /// 17,000); Fig. 14 and §V-B for the low-quality chunk's 90th
    /// percentile (33 ms at the load of 25,000 streams). Conservative for
    /// vcdn's own cache, which `vcdn calibrate` replaces with measurements.
    fn default() -> Self {
        CapacityModel {
            source:
                "CDNaaS paper (Frangoudis et al.): nginx, docker, 1 vCPU; Table III, Fig. 10, §V-B"
                    .into(),
            throughput: vec![
                Throughput {
                    object_bytes: 73_262,
                    requests_per_s: 15_928.0,
                },
                Throughput {
                    object_bytes: 434_830,
                    requests_per_s: 8_723.0,
                },
            ],
            video: vec![VideoCurve {
                bitrate_kbps: 1_700.0,
                chunk_s: 2.0,
                points: vec![
                    MosPoint {
                        sessions: 1_000.0,
                        mos: 4.9,
                    },
                    MosPoint {
                        sessions: 12_000.0,
                        mos: 4.9,
                    },
                    MosPoint {
                        sessions: 17_000.0,
                        mos: 4.2,
                    },
                    MosPoint {
                        sessions: 20_000.0,
                        mos: 3.0,
                    },
                    MosPoint {
                        sessions: 25_000.0,
                        mos: 1.5,
                    },
                ],
            }],
            latency: vec![LatencyCurve {
                object_bytes: 73_262,
                points: vec![
                    LatencyPoint {
                        requests_per_s: 2_500.0,
                        p50_ms: 2.0,
                        p90_ms: 5.0,
                        p99_ms: 12.0,
                    },
                    LatencyPoint {
                        requests_per_s: 12_500.0,
                        p50_ms: 12.0,
                        p90_ms: 33.2,
                        p99_ms: 80.0,
                    },
                    LatencyPoint {
                        requests_per_s: 15_928.0,
                        p50_ms: 60.0,
                        p90_ms: 250.0,
                        p99_ms: 600.0,
                    },
                ],
            }],
        }
    }
}

impl CapacityModel {
    pub fn from_toml(text: &str) -> Result<CapacityModel, CapacityError> {
        let m: CapacityModel =
            toml::from_str(text).map_err(|e| CapacityError::Parse(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    pub fn validate(&self) -> Result<(), CapacityError> {
        let bad = |s: String| Err(CapacityError::Invalid(s));
        if self.throughput.is_empty() {
            return bad("at least one [[throughput]] entry is needed".into());
        }
        for t in &self.throughput {
            // Written so that NaN fails too.
            if t.requests_per_s.is_nan() || t.requests_per_s <= 0.0 || t.object_bytes == 0 {
                return bad(format!(
                    "throughput for {} B must have object_bytes > 0 and requests_per_s > 0",
                    t.object_bytes
                ));
            }
        }
        for v in &self.video {
            if v.bitrate_kbps.is_nan()
                || v.bitrate_kbps <= 0.0
                || v.chunk_s.is_nan()
                || v.chunk_s <= 0.0
                || v.points.is_empty()
            {
                return bad(format!(
                    "video curve at {} kb/s needs bitrate_kbps > 0, chunk_s > 0 and points",
                    v.bitrate_kbps
                ));
            }
            if v.points.windows(2).any(|w| w[1].sessions <= w[0].sessions) {
                return bad(format!(
                    "video curve at {} kb/s: points must have increasing sessions",
                    v.bitrate_kbps
                ));
            }
        }
        for l in &self.latency {
            if l.points.is_empty()
                || l.points
                    .windows(2)
                    .any(|w| w[1].requests_per_s <= w[0].requests_per_s)
            {
                return bad(format!(
                    "latency curve for {} B needs points with increasing requests_per_s",
                    l.object_bytes
                ));
            }
        }
        Ok(())
    }

    /// Requests/s one vCPU serves for objects of `bytes`: interpolated
    /// log-log between measured sizes (cost per request grows roughly as a
    /// power of its size), held flat beyond the ends.
    pub fn requests_per_vcpu(&self, bytes: u64) -> f64 {
        let mut pts: Vec<(f64, f64)> = self
            .throughput
            .iter()
            .map(|t| ((t.object_bytes.max(1) as f64).ln(), t.requests_per_s.ln()))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        interpolate(&pts, (bytes.max(1) as f64).ln()).exp()
    }

    /// Concurrent sessions of `bitrate_kbps` video in `chunk_s` chunks one
    /// vCPU carries while the mean MOS stays at or above `min_mos`.
    ///
    /// With a measured curve of (about) that bitrate this reads it directly.
    /// Otherwise it carries the nearest curve over: that curve's sessions at
    /// `min_mos` as a fraction of what its chunk rate would allow by raw
    /// throughput, applied to the throughput for this bitrate's chunks.
    pub fn sessions_per_vcpu(&self, bitrate_kbps: f64, chunk_s: f64, min_mos: f64) -> f64 {
        let chunk_bytes = (bitrate_kbps * 1000.0 / 8.0 * chunk_s).max(1.0) as u64;
        let raw = self.requests_per_vcpu(chunk_bytes) * chunk_s;
        let Some(curve) = self.video.iter().min_by(|a, b| {
            (a.bitrate_kbps / bitrate_kbps)
                .ln()
                .abs()
                .total_cmp(&(b.bitrate_kbps / bitrate_kbps).ln().abs())
        }) else {
            // No QoE measurement at all: keep a fifth of raw throughput
            // free, where the paper's curves start to bend.
            return raw * 0.8;
        };
        let at = sessions_at_mos(&curve.points, min_mos);
        let close = (curve.bitrate_kbps / bitrate_kbps - 1.0).abs() < 0.1
            && (curve.chunk_s - chunk_s).abs() < 1e-9;
        let carried = if close {
            at
        } else {
            let curve_bytes = (curve.bitrate_kbps * 1000.0 / 8.0 * curve.chunk_s).max(1.0) as u64;
            let curve_raw = self.requests_per_vcpu(curve_bytes) * curve.chunk_s;
            raw * (at / curve_raw)
        };
        // Never more sessions than the vCPU's throughput serves chunks for:
        // past that a backlog grows without bound, however good a short
        // measurement looked while the players' buffers lasted (the paper's
        // Fig. 10 bends exactly there, at ~17,000 HD sessions for ~8,700
        // chunks/s).
        carried.min(raw)
    }

    /// The mean MOS the model expects when one vCPU carries
    /// `sessions_per_vcpu` sessions of this video (the inverse of
    /// [`Self::sessions_per_vcpu`]); `None` without a video curve.
    pub fn mos_at(&self, bitrate_kbps: f64, chunk_s: f64, sessions_per_vcpu: f64) -> Option<f64> {
        let curve = self.video.iter().min_by(|a, b| {
            (a.bitrate_kbps / bitrate_kbps)
                .ln()
                .abs()
                .total_cmp(&(b.bitrate_kbps / bitrate_kbps).ln().abs())
        })?;
        let close = (curve.bitrate_kbps / bitrate_kbps - 1.0).abs() < 0.1
            && (curve.chunk_s - chunk_s).abs() < 1e-9;
        let x = if close {
            sessions_per_vcpu
        } else {
            let bytes = |kbps: f64, c: f64| (kbps * 1000.0 / 8.0 * c).max(1.0) as u64;
            let raw = self.requests_per_vcpu(bytes(bitrate_kbps, chunk_s)) * chunk_s;
            let curve_raw =
                self.requests_per_vcpu(bytes(curve.bitrate_kbps, curve.chunk_s)) * curve.chunk_s;
            sessions_per_vcpu * curve_raw / raw.max(1e-9)
        };
        let pts: Vec<(f64, f64)> = curve.points.iter().map(|p| (p.sessions, p.mos)).collect();
        Some(interpolate(&pts, x))
    }

    /// The highest request rate per vCPU at which the `percentile` (50, 90
    /// or 99) of response times stays within `max_ms`, for objects of
    /// `bytes` (the curve of the nearest size). `None` when no latency
    /// curve exists or even the lightest measured load misses the target.
    pub fn requests_per_vcpu_within(&self, bytes: u64, percentile: u8, max_ms: f64) -> Option<f64> {
        let curve = self.latency.iter().min_by(|a, b| {
            let d = |c: &LatencyCurve| {
                ((c.object_bytes.max(1) as f64) / (bytes.max(1) as f64))
                    .ln()
                    .abs()
            };
            d(a).total_cmp(&d(b))
        })?;
        let pick = |p: &LatencyPoint| match percentile {
            0..=50 => p.p50_ms,
            51..=90 => p.p90_ms,
            _ => p.p99_ms,
        };
        let pts: Vec<(f64, f64)> = curve
            .points
            .iter()
            .map(|p| (p.requests_per_s, pick(p)))
            .collect();
        let scale = self.requests_per_vcpu(bytes) / self.requests_per_vcpu(curve.object_bytes);
        let mut best = None;
        for (i, &(rps, ms)) in pts.iter().enumerate() {
            if ms <= max_ms {
                best = Some(rps);
                continue;
            }
            // Between the last point within the target and this one.
            if i > 0 {
                let (r0, m0) = pts[i - 1];
                if m0 <= max_ms {
                    best = Some(r0 + (rps - r0) * (max_ms - m0) / (ms - m0));
                }
            }
            break;
        }
        best.map(|r| r * scale)
    }
}

/// The largest session count whose MOS is at least `min_mos`, linear
/// between points (MOS falls with load).
fn sessions_at_mos(points: &[MosPoint], min_mos: f64) -> f64 {
    let mut best = 0.0;
    for (i, p) in points.iter().enumerate() {
        if p.mos >= min_mos {
            best = p.sessions;
            continue;
        }
        if i > 0 {
            let q = points[i - 1];
            if q.mos >= min_mos && q.mos > p.mos {
                best = q.sessions + (p.sessions - q.sessions) * (q.mos - min_mos) / (q.mos - p.mos);
            }
        }
        break;
    }
    best
}

/// Piecewise-linear through sorted `(x, y)`, flat beyond the ends.
fn interpolate(pts: &[(f64, f64)], x: f64) -> f64 {
    match pts {
        [] => 0.0,
        [only] => only.1,
        _ => {
            if x <= pts[0].0 {
                return pts[0].1;
            }
            for w in pts.windows(2) {
                let ((x0, y0), (x1, y1)) = (w[0], w[1]);
                if x <= x1 {
                    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
                }
            }
            pts[pts.len() - 1].1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_is_valid_and_round_trips_through_toml() {
        let m = CapacityModel::default();
        m.validate().unwrap();
        assert_eq!(CapacityModel::from_toml(&m.to_toml()).unwrap(), m);
    }

    #[test]
    fn throughput_reads_measured_sizes_and_interpolates_between() {
        let m = CapacityModel::default();
        assert!((m.requests_per_vcpu(73_262) - 15_928.0).abs() < 1.0);
        assert!((m.requests_per_vcpu(434_830) - 8_723.0).abs() < 1.0);
        let mid = m.requests_per_vcpu(200_000);
        assert!(mid < 15_928.0 && mid > 8_723.0, "{mid}");
        assert!(
            (m.requests_per_vcpu(10_000_000) - 8_723.0).abs() < 1.0,
            "flat beyond the end"
        );
    }

    #[test]
    fn sessions_follow_the_video_curve_at_its_bitrate() {
        let m = CapacityModel::default();
        assert_eq!(m.sessions_per_vcpu(1_700.0, 2.0, 4.9), 12_000.0);
        // Halfway between 4.9 at 12k and 4.2 at 17k.
        assert!((m.sessions_per_vcpu(1_700.0, 2.0, 4.55) - 14_500.0).abs() < 1.0);
        assert_eq!(m.sessions_per_vcpu(1_700.0, 2.0, 5.0), 0.0);
    }

    #[test]
    fn sessions_never_exceed_what_the_throughput_serves() {
        // A short run that still looked good at 1.25x the chunk rate (the
        // players' buffers hid the backlog) must not size for it.
        let m = CapacityModel {
            source: String::new(),
            throughput: vec![Throughput {
                object_bytes: 434_830,
                requests_per_s: 600.0,
            }],
            video: vec![VideoCurve {
                bitrate_kbps: 1_700.0,
                chunk_s: 2.0,
                points: vec![
                    MosPoint {
                        sessions: 1_200.0,
                        mos: 5.0,
                    },
                    MosPoint {
                        sessions: 1_500.0,
                        mos: 4.5,
                    },
                ],
            }],
            latency: vec![],
        };
        assert_eq!(m.sessions_per_vcpu(1_700.0, 2.0, 4.5), 1_200.0);
        assert_eq!(m.sessions_per_vcpu(1_700.0, 2.0, 5.0), 1_200.0);
    }

    #[test]
    fn mos_at_inverts_sessions_per_vcpu() {
        let m = CapacityModel::default();
        let n = m.sessions_per_vcpu(1_700.0, 2.0, 4.55);
        assert!((m.mos_at(1_700.0, 2.0, n).unwrap() - 4.55).abs() < 1e-9);
        assert_eq!(
            m.mos_at(1_700.0, 2.0, 100.0),
            Some(4.9),
            "flat below the first point"
        );
        let sd = m.sessions_per_vcpu(250.0, 2.0, 4.0);
        assert!((m.mos_at(250.0, 2.0, sd).unwrap() - 4.0).abs() < 1e-6);
        assert_eq!(
            CapacityModel { video: vec![], ..m }.mos_at(1_700.0, 2.0, 1.0),
            None
        );
    }

    #[test]
    fn lower_bitrates_carry_more_sessions() {
        let m = CapacityModel::default();
        let hd = m.sessions_per_vcpu(1_700.0, 2.0, 4.0);
        let sd = m.sessions_per_vcpu(250.0, 2.0, 4.0);
        assert!(sd > hd * 1.5, "sd {sd} hd {hd}");
    }

    #[test]
    fn latency_target_gives_the_highest_rate_that_meets_it() {
        let m = CapacityModel::default();
        let r = m.requests_per_vcpu_within(73_262, 90, 33.2).unwrap();
        assert!((r - 12_500.0).abs() < 1.0, "{r}");
        let half = m.requests_per_vcpu_within(73_262, 90, 19.1).unwrap();
        assert!(half > 2_500.0 && half < 12_500.0, "{half}");
        assert_eq!(m.requests_per_vcpu_within(73_262, 99, 1.0), None);
    }

    #[test]
    fn bad_models_are_refused_with_the_reason() {
        let e = CapacityModel::from_toml("source = \"x\"").unwrap_err();
        assert!(e.to_string().contains("[[throughput]]"), "{e}");
        let e = CapacityModel::from_toml(
            "[[throughput]]\nobject_bytes = 10\nrequests_per_s = 5\n[[video]]\nbitrate_kbps = 1\nchunk_s = 2\npoints = [{sessions = 5, mos = 4}, {sessions = 2, mos = 3}]",
        )
        .unwrap_err();
        assert!(e.to_string().contains("increasing sessions"), "{e}");
        assert!(CapacityModel::from_toml("nonsense = [").is_err());
    }
}
