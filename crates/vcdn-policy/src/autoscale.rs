//! Autoscaling with hysteresis: the instance manager's elasticity (CDNaaS
//! paper §III-D2 "Instance Manager" and §V-B "on-demand elastic service":
//! monitor the load of every instance and add one before the quality
//! target is missed, remove one when it is safely exceeded).
//!
//! Pure: the caller measures the load and keeps the [`Trend`] per region.

/// Thresholds as fractions of the capacity of the running instances.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Autoscaler {
    /// Scale out above this utilisation…
    pub high: f64,
    /// …seen this many samples in a row.
    pub out_after: u32,
    /// Scale in below this utilisation (and only if one instance fewer
    /// would still be under `high`)…
    pub low: f64,
    /// …seen this many samples in a row.
    pub in_after: u32,
}

impl Default for Autoscaler {
    fn default() -> Self {
        Autoscaler {
            high: 0.75,
            out_after: 2,
            low: 0.35,
            in_after: 10,
        }
    }
}

/// Consecutive samples above `high` and below `low`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trend {
    pub above: u32,
    pub below: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Hold,
    /// Add this many instances.
    Out(u32),
    /// Remove one instance.
    In,
}

impl Autoscaler {
    /// One sample: `load` in the unit of `per_instance` (what one instance
    /// carries at the quality target), with `instances` running and the
    /// flavor's bounds.
    pub fn decide(
        &self,
        trend: &mut Trend,
        load: f64,
        per_instance: f64,
        instances: u32,
        min: u32,
        max: u32,
    ) -> Decision {
        let n = instances.max(1) as f64;
        let util = load / (per_instance * n);
        if util > self.high {
            trend.above += 1;
            trend.below = 0;
        } else if util < self.low {
            trend.below += 1;
            trend.above = 0;
        } else {
            *trend = Trend::default();
        }
        if instances < min {
            *trend = Trend::default();
            return Decision::Out(min - instances);
        }
        if trend.above >= self.out_after && instances < max {
            *trend = Trend::default();
            // Enough to bring utilisation back to the middle of the band.
            let target = (self.high + self.low) / 2.0;
            let want = (load / (per_instance * target)).ceil() as u32;
            return Decision::Out(want.saturating_sub(instances).clamp(1, max - instances));
        }
        if trend.below >= self.in_after && instances > min.max(1) {
            let after = load / (per_instance * (n - 1.0));
            if after < self.high {
                *trend = Trend::default();
                return Decision::In;
            }
        }
        Decision::Hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_out_after_consecutive_high_samples_only() {
        let a = Autoscaler::default();
        let mut t = Trend::default();
        assert_eq!(a.decide(&mut t, 90.0, 100.0, 1, 1, 8), Decision::Hold);
        assert_eq!(
            a.decide(&mut t, 50.0, 100.0, 1, 1, 8),
            Decision::Hold,
            "a dip resets"
        );
        assert_eq!(a.decide(&mut t, 90.0, 100.0, 1, 1, 8), Decision::Hold);
        assert_eq!(
            a.decide(&mut t, 90.0, 100.0, 1, 1, 8),
            Decision::Out(1),
            "to 55 % of two"
        );
    }

    #[test]
    fn a_surge_adds_enough_at_once_within_the_maximum() {
        let a = Autoscaler::default();
        let mut t = Trend::default();
        a.decide(&mut t, 1000.0, 100.0, 2, 1, 6);
        assert_eq!(a.decide(&mut t, 1000.0, 100.0, 2, 1, 6), Decision::Out(4));
        let mut t = Trend::default();
        a.decide(&mut t, 1000.0, 100.0, 6, 1, 6);
        assert_eq!(
            a.decide(&mut t, 1000.0, 100.0, 6, 1, 6),
            Decision::Hold,
            "at the maximum"
        );
    }

    #[test]
    fn scales_in_slowly_and_never_below_the_minimum() {
        let a = Autoscaler::default();
        let mut t = Trend::default();
        for _ in 0..9 {
            assert_eq!(a.decide(&mut t, 10.0, 100.0, 3, 1, 8), Decision::Hold);
        }
        assert_eq!(a.decide(&mut t, 10.0, 100.0, 3, 1, 8), Decision::In);
        let mut t = Trend::default();
        for _ in 0..20 {
            assert_eq!(a.decide(&mut t, 10.0, 100.0, 2, 2, 8), Decision::Hold);
        }
    }

    #[test]
    fn no_scale_in_that_would_overload_the_rest() {
        let a = Autoscaler {
            low: 0.5,
            ..Autoscaler::default()
        };
        let mut t = Trend::default();
        for _ in 0..30 {
            // 40 % of 2 instances is 80 % of one: stay.
            assert_eq!(a.decide(&mut t, 80.0, 100.0, 2, 1, 8), Decision::Hold);
        }
    }

    #[test]
    fn below_the_minimum_is_repaired_at_once() {
        let a = Autoscaler::default();
        assert_eq!(
            a.decide(&mut Trend::default(), 0.0, 100.0, 0, 2, 8),
            Decision::Out(2)
        );
    }
}
