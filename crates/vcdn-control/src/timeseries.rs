//! History for the charts: what the supervisor already observes of each
//! service (requests, bytes, hits, instances, load, MOS, cost), per
//! region, kept in the store at three resolutions so that a day is seen
//! in 10 s steps and a year in hours, in bounded space.
//!
//! Every sample (about once a second) adds to the current 10 s bucket of
//! each (service, region) in memory; when the bucket closes it is added to
//! the store's buckets of every resolution in one transaction, and what a
//! resolution no longer keeps is dropped. Counters add; gauges are kept as
//! sums with their sample count (a mean at read time); the cost keeps its
//! highest value. A crash loses at most the open 10 s bucket; a restart
//! adds to the buckets already stored, never replaces them.
//!
//! Size: at most `(services x (regions + 1)) x (8,640 + 8,640 + 9,600)`
//! rows, about 27,000 per service and region.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// (step in seconds, how long it is kept in seconds): 10 s for a day,
/// 5 min for 30 days, 1 h for 400 days.
pub const RESOLUTIONS: [(u64, u64); 3] = [(10, 86_400), (300, 30 * 86_400), (3600, 400 * 86_400)];

/// The most points of one series an answer carries when the caller leaves
/// the step to the API.
const MAX_POINTS: u64 = 1500;

/// A bucket's sums. `region` "" holds what belongs to the service as a
/// whole (its cost).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accumulator {
    pub requests: u64,
    pub bytes: u64,
    /// Cache hits (fresh, stale and revalidated) and lookups (hits, misses,
    /// coalesced and refreshed): the hit ratio is their quotient.
    pub hits: u64,
    pub lookups: u64,
    /// Samples of the gauges below.
    pub samples: u64,
    /// Serving instances, summed over samples.
    pub instances: f64,
    /// The supervisor's load (sessions or requests/s), summed over samples.
    pub load: f64,
    /// MOS the capacity model expects at that load, and the count.
    pub mos_est: f64,
    pub mos_est_n: u64,
    /// MOS players reported, and the count.
    pub mos_rep: f64,
    pub mos_rep_n: u64,
    /// The service's cost so far (highest seen).
    pub cost: f64,
}

impl Accumulator {
    fn add(&mut self, o: &Accumulator) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.hits += o.hits;
        self.lookups += o.lookups;
        self.samples += o.samples;
        self.instances += o.instances;
        self.load += o.load;
        self.mos_est += o.mos_est;
        self.mos_est_n += o.mos_est_n;
        self.mos_rep += o.mos_rep;
        self.mos_rep_n += o.mos_rep_n;
        self.cost = self.cost.max(o.cost);
    }
}

/// One bucket of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub service: String,
    pub region: String,
    pub step: u64,
    /// Start of the bucket, Unix seconds, a multiple of `step`.
    pub t: u64,
    pub acc: Accumulator,
}

/// The open 10 s buckets, filled by the supervisor's samples.
#[derive(Default)]
pub struct Recorder {
    bucket: u64,
    open: BTreeMap<(String, String), Accumulator>,
}

impl Recorder {
    /// Adds a sample taken at `now` (Unix seconds). When `now` is in a
    /// later bucket than the open one, the open one is returned closed:
    /// its points for every resolution and what to prune (step, drop
    /// buckets before), for [`crate::store::Store::series_add`].
    #[allow(clippy::type_complexity)]
    pub fn add(
        &mut self,
        now: u64,
        service: &str,
        region: &str,
        a: &Accumulator,
    ) -> Option<(Vec<Point>, Vec<(u64, u64)>)> {
        let closed = self.roll(now);
        self.open
            .entry((service.to_string(), region.to_string()))
            .or_default()
            .add(a);
        closed
    }

    /// Closes the open bucket if `now` is past it.
    #[allow(clippy::type_complexity)]
    pub fn roll(&mut self, now: u64) -> Option<(Vec<Point>, Vec<(u64, u64)>)> {
        let bucket = now - now % RESOLUTIONS[0].0;
        if bucket == self.bucket {
            return None;
        }
        let start = std::mem::replace(&mut self.bucket, bucket);
        let open = std::mem::take(&mut self.open);
        if open.is_empty() {
            return None;
        }
        let mut points = Vec::new();
        for ((service, region), acc) in open {
            for (step, _) in RESOLUTIONS {
                points.push(Point {
                    service: service.clone(),
                    region: region.clone(),
                    step,
                    t: start - start % step,
                    acc: acc.clone(),
                });
            }
        }
        let prune = RESOLUTIONS
            .iter()
            .map(|&(step, keep)| (step, now.saturating_sub(keep)))
            .collect();
        Some((points, prune))
    }
}

/// What a caller asks: `from <= t < to` at `step`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub from: u64,
    pub to: u64,
    pub step: u64,
}

/// Reads `from`, `to` (Unix seconds; default the last hour), `step` (10,
/// 300 or 3600; default the finest that still holds `from` and gives at
/// most 1,500 points). Else says what is wrong.
pub fn window(query: &str, now: u64) -> Result<Window, String> {
    let num = |name: &str| -> Result<Option<u64>, String> {
        match crate::api::query_param(query, name) {
            None => Ok(None),
            Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
                format!("{name} must be a whole number of seconds (Unix time for from and to), not {v:?}")
            }),
        }
    };
    let to = num("to")?.unwrap_or(now);
    let from = num("from")?.unwrap_or(to.saturating_sub(3600));
    if from >= to {
        return Err(format!("from ({from}) must be before to ({to})"));
    }
    let longest = RESOLUTIONS[RESOLUTIONS.len() - 1].1;
    if to - from > longest {
        return Err(format!(
            "the window is at most {longest} s (400 days); ask for less"
        ));
    }
    let step = match num("step")? {
        Some(s) if RESOLUTIONS.iter().any(|&(st, _)| st == s) => s,
        Some(s) => {
            return Err(format!(
                "step must be one of 10, 300 or 3600 seconds, not {s}"
            ))
        }
        None => RESOLUTIONS
            .iter()
            .find(|&&(st, keep)| from >= now.saturating_sub(keep) && (to - from) / st <= MAX_POINTS)
            .map_or(RESOLUTIONS[RESOLUTIONS.len() - 1].0, |&(st, _)| st),
    };
    if (to - from) / step > 20_000 {
        return Err(format!(
            "{} points of {step} s are too many; ask for a shorter window or a longer step",
            (to - from) / step
        ));
    }
    Ok(Window { from, to, step })
}

/// The answer: per region, columns of equal length (`t` and the values at
/// each bucket), counts per step and means of the gauges (null where no
/// sample had the value); the service's cost in `total`.
pub fn view(w: Window, points: &[Point]) -> Value {
    let mut regions: BTreeMap<&str, Vec<&Point>> = BTreeMap::new();
    for p in points {
        regions.entry(p.region.as_str()).or_default().push(p);
    }
    let mean = |sum: f64, n: u64| (n > 0).then(|| round2(sum / n as f64));
    let mut out = Vec::new();
    let mut total = json!({"t": [], "cost": []});
    for (region, ps) in regions {
        let col = |f: &dyn Fn(&Accumulator) -> Value| -> Value {
            Value::Array(ps.iter().map(|p| f(&p.acc)).collect())
        };
        let t = Value::Array(ps.iter().map(|p| json!(p.t)).collect());
        if region.is_empty() {
            total = json!({"t": t, "cost": col(&|a| json!(round2(a.cost)))});
            continue;
        }
        out.push(json!({
            "region": region,
            "t": t,
            "requests": col(&|a| json!(a.requests)),
            "bytes": col(&|a| json!(a.bytes)),
            "hit_ratio": col(&|a| json!((a.lookups > 0).then(|| round2(a.hits as f64 / a.lookups as f64)))),
            "instances": col(&|a| json!(mean(a.instances, a.samples))),
            "load": col(&|a| json!(mean(a.load, a.samples))),
            "mos_estimated": col(&|a| json!(mean(a.mos_est, a.mos_est_n))),
            "mos_reported": col(&|a| json!(mean(a.mos_rep, a.mos_rep_n))),
        }));
    }
    json!({
        "from": w.from,
        "to": w.to,
        "step_s": w.step,
        "regions": out,
        "total": total,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(requests: u64, instances: f64) -> Accumulator {
        Accumulator {
            requests,
            samples: 1,
            instances,
            ..Default::default()
        }
    }

    /// A bucket closes when a sample of the next one comes, with a point
    /// for each resolution at the bucket's start rounded to that step.
    #[test]
    fn a_bucket_closes_into_every_resolution_when_the_next_begins() {
        let mut r = Recorder::default();
        assert!(r.add(1_000_000, "s1", "paris", &sample(5, 2.0)).is_none());
        assert!(r.add(1_000_004, "s1", "paris", &sample(7, 3.0)).is_none());
        let (points, prune) = r.add(1_000_011, "s1", "paris", &sample(1, 3.0)).unwrap();
        let steps: Vec<(u64, u64)> = points.iter().map(|p| (p.step, p.t)).collect();
        assert_eq!(steps, [(10, 1_000_000), (300, 999_900), (3600, 997_200)]);
        assert_eq!(points[0].acc.requests, 12);
        assert_eq!(points[0].acc.samples, 2);
        assert_eq!(points[0].acc.instances, 5.0);
        assert_eq!(prune[0], (10, 1_000_011 - 86_400));
        // The third sample is in the next bucket, still open.
        let (points, _) = r.roll(1_000_020).unwrap();
        assert_eq!(points[0].acc.requests, 1);
        assert!(r.roll(1_000_025).is_none(), "nothing open");
    }

    #[test]
    fn windows_default_to_the_last_hour_at_the_finest_step_that_holds_them() {
        let now = 10_000_000;
        let w = window("", now).unwrap();
        assert_eq!((w.from, w.to, w.step), (now - 3600, now, 10));
        let day = window(&format!("from={}", now - 86_400), now).unwrap();
        assert_eq!(
            day.step, 300,
            "8,640 points of 10 s are too many by default"
        );
        let old = window(
            &format!("from={}&to={}", now - 40 * 86_400, now - 39 * 86_400),
            now,
        )
        .unwrap();
        assert_eq!(old.step, 3600, "5 min steps are not kept 40 days");
        assert_eq!(window("step=10&from=1&to=100", now).unwrap().step, 10);
        for bad in [
            "from=abc",
            "from=5&to=5",
            "step=60",
            "step=10&from=0&to=999999",
        ] {
            let e = window(bad, now).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn the_view_gives_columns_per_region_with_means_and_the_cost_apart() {
        let w = Window {
            from: 0,
            to: 100,
            step: 10,
        };
        let p = |region: &str, t: u64, acc: Accumulator| Point {
            service: "s".into(),
            region: region.into(),
            step: 10,
            t,
            acc,
        };
        let v = view(
            w,
            &[
                p(
                    "paris",
                    0,
                    Accumulator {
                        requests: 10,
                        hits: 3,
                        lookups: 4,
                        samples: 2,
                        instances: 4.0,
                        mos_rep: 8.4,
                        mos_rep_n: 2,
                        ..Default::default()
                    },
                ),
                p(
                    "paris",
                    10,
                    Accumulator {
                        requests: 5,
                        samples: 1,
                        instances: 3.0,
                        ..Default::default()
                    },
                ),
                p(
                    "",
                    0,
                    Accumulator {
                        cost: 1.234,
                        ..Default::default()
                    },
                ),
            ],
        );
        let paris = &v["regions"][0];
        assert_eq!(paris["t"], json!([0, 10]));
        assert_eq!(paris["requests"], json!([10, 5]));
        assert_eq!(paris["hit_ratio"], json!([0.75, null]));
        assert_eq!(paris["instances"], json!([2.0, 3.0]));
        assert_eq!(paris["mos_reported"], json!([4.2, null]));
        assert_eq!(v["total"]["cost"], json!([1.23]));
        assert_eq!(v["regions"].as_array().unwrap().len(), 1);
    }
}
