//! Pricing (CDNaaS paper §V-B): flat-rate for a non-scalable deployment,
//! priced once from the initial dimensioning; on-demand for an elastic one,
//! a base price from the order plus what scaling and traffic add.

use serde::Serialize;

use crate::types::{PricingScheme, Service};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Bill {
    pub scheme: PricingScheme,
    pub currency: String,
    /// The planned vCPUs for the whole lease at the vCPU-hour price.
    pub base: f64,
    /// On demand: vCPU-hours beyond the plan so far, plus traffic.
    pub extra: f64,
    pub total: f64,
    pub vcpu_hours: f64,
    pub requests: u64,
    pub bytes: u64,
}

/// The bill of a service as of `now` (Unix seconds).
pub fn bill(s: &Service, now: u64) -> Bill {
    let p = &s.pricing;
    let lease_h = s.lease_end.saturating_sub(s.lease_start) as f64 / 3600.0;
    let base = s.planned_vcpus as f64 * lease_h * p.per_vcpu_hour;
    let used_h = s.usage.vcpu_seconds / 3600.0;
    let extra = match p.scheme {
        PricingScheme::FlatRate => 0.0,
        PricingScheme::OnDemand => {
            let elapsed_h = now
                .clamp(s.lease_start, s.lease_end.max(s.lease_start))
                .saturating_sub(s.lease_start) as f64
                / 3600.0;
            let beyond = (used_h - s.planned_vcpus as f64 * elapsed_h).max(0.0);
            beyond * p.per_vcpu_hour
                + s.usage.bytes as f64 / 1e9 * p.per_gb
                + s.usage.requests as f64 / 1e6 * p.per_million_requests
        }
    };
    // Whatever the inputs (a stored service, a flavor's prices), a bill is
    // a finite, non-negative amount: an overflow saturates, it never wraps
    // or becomes infinite (JSON has no infinity).
    let finite = |x: f64| {
        if x.is_nan() || x <= 0.0 {
            0.0
        } else {
            x.min(f64::MAX)
        }
    };
    let round = |x: f64| {
        let x = finite(x);
        if x < 1e15 {
            (x * 1e6).round() / 1e6
        } else {
            x
        }
    };
    let (base, extra) = (finite(base), finite(extra));
    Bill {
        scheme: p.scheme,
        currency: p.currency.clone(),
        base: round(base),
        extra: round(extra),
        total: round(finite(base + extra)),
        vcpu_hours: round(used_h),
        requests: s.usage.requests,
        bytes: s.usage.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::*;

    fn service(scheme: PricingScheme) -> Service {
        Service {
            id: "s".into(),
            customer: "c".into(),
            spec: ServiceSpec {
                name: "n".into(),
                origin: "http://127.0.0.1:9000".into(),
                hostname: "h.example".into(),
                flavor: "f".into(),
                regions: vec![],
                quality: QualitySpec::default(),
                lease: LeaseSpec::default(),
                acceleration: None,
                origin_ca_pem: None,
                routing: Routing::Dns,
            },
            state: ServiceState::Active,
            created_at: 0,
            lease_start: 0,
            lease_end: 7200,
            graph: ServiceGraph::default(),
            usage: Usage {
                vcpu_seconds: 3.0 * 3600.0,
                requests: 2_000_000,
                bytes: 5_000_000_000,
                accel: AccelUsage::default(),
            },
            pricing: Pricing {
                scheme,
                currency: "EUR".into(),
                per_vcpu_hour: 0.04,
                per_gb: 0.01,
                per_million_requests: 0.002,
            },
            planned_vcpus: 2,
            origin_policy: String::new(),
            error: None,
            hop_key: String::new(),
            billing: Default::default(),
            billing_from_ms: 0,
        }
    }

    #[test]
    fn flat_rate_is_the_planned_vcpus_for_the_lease_whatever_happens() {
        let b = bill(&service(PricingScheme::FlatRate), 3600);
        assert_eq!((b.base, b.extra, b.total), (0.16, 0.0, 0.16));
    }

    #[test]
    fn on_demand_adds_vcpu_hours_beyond_the_plan_and_traffic() {
        // One hour in: 3 vCPU-hours used, 2 planned -> 1 extra vCPU-hour.
        let b = bill(&service(PricingScheme::OnDemand), 3600);
        assert_eq!(b.base, 0.16);
        assert!(
            (b.extra - (0.04 + 0.05 + 0.004)).abs() < 1e-9,
            "{}",
            b.extra
        );
        assert_eq!(b.vcpu_hours, 3.0);
    }

    #[test]
    fn bills_stay_finite_whatever_the_lease_usage_and_prices() {
        for scheme in [PricingScheme::FlatRate, PricingScheme::OnDemand] {
            let mut s = service(scheme);
            s.lease_start = 0;
            s.lease_end = u64::MAX;
            s.planned_vcpus = u32::MAX;
            s.pricing.per_vcpu_hour = f64::MAX;
            s.pricing.per_gb = f64::MAX;
            s.usage.vcpu_seconds = f64::MAX;
            s.usage.bytes = u64::MAX;
            for now in [0, u64::MAX / 2, u64::MAX] {
                let b = bill(&s, now);
                for x in [b.base, b.extra, b.total, b.vcpu_hours] {
                    assert!(x.is_finite() && x >= 0.0, "{b:?}");
                }
            }
            s.usage.vcpu_seconds = f64::NAN;
            let b = bill(&s, 10);
            assert!(b.total.is_finite() && b.vcpu_hours.is_finite(), "{b:?}");
        }
    }
}
