//! Dimensioning: how many vCPUs a region needs so that the customer's
//! quality target holds at the stated demand (CDNaaS paper §V-A: "the
//! number of vCPUs necessary … to serve a specific customer-specified
//! demand under capacity (operator) and quality (customer) constraints").

use vcdn_model::capacity::CapacityModel;

/// The paper's HD test video: 1.7 Mb/s in 2 s chunks.
pub const DEFAULT_BITRATE_KBPS: f64 = 1_700.0;
pub const DEFAULT_CHUNK_S: f64 = 2.0;
/// The low-quality chunk of Table II, for request demand without a size.
pub const DEFAULT_OBJECT_BYTES: u64 = 73_262;
/// Load kept free when no quality target bounds it.
pub const HEADROOM: f64 = 0.8;

/// Peak demand in one region: concurrent video viewers, or a request rate.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Demand {
    pub peak_users: Option<u64>,
    pub requests_per_s: Option<f64>,
    pub object_bytes: Option<u64>,
    pub bitrate_kbps: Option<f64>,
    pub chunk_s: Option<f64>,
}

/// The customer's quality specification (a service-level objective).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Quality {
    /// Mean MOS of viewers at least this (1–5).
    MinMos(f64),
    /// This percentile of response times within `max_ms`.
    ResponseTime { percentile: u8, max_ms: f64 },
    /// No target: size from raw throughput with [`HEADROOM`].
    BestEffort,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DimensionError {
    #[error("demand needs peak_users or requests_per_s")]
    NoDemand,
    #[error("the quality target cannot be met at any load: {0}")]
    Unattainable(String),
}

/// What one vCPU carries under `quality`, in the unit of the demand
/// (sessions for viewers, requests/s for a request rate).
pub fn capacity_per_vcpu(
    demand: &Demand,
    quality: Quality,
    model: &CapacityModel,
) -> Result<f64, DimensionError> {
    let cap = if demand.peak_users.is_some() {
        let bitrate = demand.bitrate_kbps.unwrap_or(DEFAULT_BITRATE_KBPS);
        let chunk = demand.chunk_s.unwrap_or(DEFAULT_CHUNK_S);
        let chunk_bytes = (bitrate * 1000.0 / 8.0 * chunk) as u64;
        match quality {
            Quality::MinMos(m) => model.sessions_per_vcpu(bitrate, chunk, m),
            Quality::ResponseTime { percentile, max_ms } => model
                .requests_per_vcpu_within(chunk_bytes, percentile, max_ms)
                .map_or(0.0, |r| r * chunk),
            Quality::BestEffort => model.requests_per_vcpu(chunk_bytes) * chunk * HEADROOM,
        }
    } else if demand.requests_per_s.is_some() {
        let bytes = demand.object_bytes.unwrap_or(DEFAULT_OBJECT_BYTES);
        match quality {
            Quality::ResponseTime { percentile, max_ms } => model
                .requests_per_vcpu_within(bytes, percentile, max_ms)
                .unwrap_or(0.0),
            // A MOS target on plain requests: hold them to the headroom.
            Quality::MinMos(_) | Quality::BestEffort => model.requests_per_vcpu(bytes) * HEADROOM,
        }
    } else {
        return Err(DimensionError::NoDemand);
    };
    if cap > 0.0 && cap.is_finite() {
        Ok(cap)
    } else {
        Err(DimensionError::Unattainable(match quality {
            Quality::MinMos(m) => format!("no measured load keeps the mean MOS at {m} or above"),
            Quality::ResponseTime { percentile, max_ms } => {
                format!("no measured load keeps the p{percentile} response time within {max_ms} ms")
            }
            Quality::BestEffort => "the capacity model has no throughput".into(),
        }))
    }
}

/// vCPUs (fractional) the demand needs under the quality target.
pub fn vcpus(
    demand: &Demand,
    quality: Quality,
    model: &CapacityModel,
) -> Result<f64, DimensionError> {
    let cap = capacity_per_vcpu(demand, quality, model)?;
    let load = demand
        .peak_users
        .map(|u| u as f64)
        .or(demand.requests_per_s)
        .ok_or(DimensionError::NoDemand)?;
    Ok(load / cap)
}

/// What one instance of `vcpus_per_instance` carries, in bit/s, of video
/// at `bitrate_kbps` in chunks of `chunk_s` under `quality`: the sessions
/// per vCPU of [`capacity_per_vcpu`] at that bitrate. A simulator whose
/// viewers watch a mix of bitrates sizes instances at the mix's mean.
pub fn instance_bps(
    bitrate_kbps: f64,
    chunk_s: f64,
    quality: Quality,
    model: &CapacityModel,
    vcpus_per_instance: u32,
) -> Result<f64, DimensionError> {
    let demand = Demand {
        peak_users: Some(1),
        bitrate_kbps: Some(bitrate_kbps),
        chunk_s: Some(chunk_s),
        ..Demand::default()
    };
    let sessions = capacity_per_vcpu(&demand, quality, model)?;
    Ok(sessions * vcpus_per_instance.max(1) as f64 * bitrate_kbps * 1e3)
}

/// Instances of `vcpus_per_instance` for `vcpus`, never fewer than `min`.
pub fn instances(vcpus: f64, vcpus_per_instance: u32, min: u32) -> u32 {
    let per = vcpus_per_instance.max(1) as f64;
    ((vcpus / per - 1e-9).ceil().max(0.0) as u32).max(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(n: u64) -> Demand {
        Demand {
            peak_users: Some(n),
            ..Demand::default()
        }
    }

    #[test]
    fn an_instance_carries_its_sessions_times_their_bitrate() {
        let m = CapacityModel::default();
        let per = capacity_per_vcpu(&users(1), Quality::MinMos(4.9), &m).unwrap();
        let bps = instance_bps(
            DEFAULT_BITRATE_KBPS,
            DEFAULT_CHUNK_S,
            Quality::MinMos(4.9),
            &m,
            2,
        )
        .unwrap();
        assert!((bps - per * 2.0 * 1.7e6).abs() < 1e-6 * bps, "{bps}");
    }

    #[test]
    fn hd_viewers_at_excellent_quality_use_the_paper_figure() {
        let m = CapacityModel::default();
        // 12,000 HD sessions per vCPU at MOS 4.9 (Fig. 10, docker).
        let v = vcpus(&users(24_000), Quality::MinMos(4.9), &m).unwrap();
        assert!((v - 2.0).abs() < 1e-9, "{v}");
        assert_eq!(instances(v, 1, 1), 2);
        assert_eq!(instances(0.01, 1, 2), 2, "the template's minimum holds");
        assert_eq!(instances(2.5, 2, 1), 2);
    }

    #[test]
    fn a_stricter_target_needs_more_vcpus() {
        let m = CapacityModel::default();
        let loose = vcpus(&users(50_000), Quality::MinMos(3.5), &m).unwrap();
        let strict = vcpus(&users(50_000), Quality::MinMos(4.5), &m).unwrap();
        assert!(strict > loose, "{strict} vs {loose}");
    }

    #[test]
    fn request_demand_with_a_response_time_target() {
        let m = CapacityModel::default();
        let d = Demand {
            requests_per_s: Some(25_000.0),
            object_bytes: Some(73_262),
            ..Demand::default()
        };
        let v = vcpus(
            &d,
            Quality::ResponseTime {
                percentile: 90,
                max_ms: 33.2,
            },
            &m,
        )
        .unwrap();
        assert!((v - 2.0).abs() < 1e-3, "{v}");
    }

    #[test]
    fn impossible_targets_and_missing_demand_are_errors() {
        let m = CapacityModel::default();
        assert!(matches!(
            vcpus(&users(10), Quality::MinMos(5.0), &m),
            Err(DimensionError::Unattainable(_))
        ));
        assert_eq!(
            vcpus(&Demand::default(), Quality::BestEffort, &m),
            Err(DimensionError::NoDemand)
        );
    }
}
