//! Online estimates of content popularity: the Zipf exponent α and the
//! catalogue size N, from nothing but the stream of requested identifiers.
//!
//! The paper sizes its LRU filter from α and N given in advance; an operator
//! rarely knows them, so vcdn estimates both as requests arrive:
//! - **N** with a HyperLogLog distinct counter (2^12 registers, ~1.6 %
//!   standard error, 4 KiB);
//! - **α** from exact counts of a hash-selected sample of identifiers
//!   ([`SampledCounts`]): under Zipf `count(rank r) ∝ r^-α`, and the j-th
//!   most requested sampled identifier sits near catalogue rank `j·2^level`,
//!   so α is minus the slope of a least-squares line through
//!   `(ln rank, ln count)`.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64;

const HLL_BITS: u32 = 12;
const EULER_GAMMA: f64 = 0.577_215_664_901_532_9;
const HLL_M: usize = 1 << HLL_BITS;

/// HyperLogLog distinct counter (Flajolet et al. 2007, with the small-range
/// linear-counting correction).
#[derive(Debug, Clone)]
pub struct DistinctCounter {
    registers: Box<[u8; HLL_M]>,
}

impl Default for DistinctCounter {
    fn default() -> Self {
        DistinctCounter {
            registers: Box::new([0; HLL_M]),
        }
    }
}

impl DistinctCounter {
    /// Records one identifier.
    pub fn insert(&mut self, id: u64) {
        let h = xxh3_64(&id.to_le_bytes());
        let idx = (h >> (64 - HLL_BITS)) as usize;
        let rest = h << HLL_BITS;
        let rank = (rest.leading_zeros() + 1).min(64 - HLL_BITS + 1) as u8;
        if self.registers[idx] < rank {
            self.registers[idx] = rank;
        }
    }

    /// Estimated number of distinct identifiers recorded.
    pub fn estimate(&self) -> f64 {
        let m = HLL_M as f64;
        let alpha_m = 0.7213 / (1.0 + 1.079 / m);
        let (mut sum, mut zeros) = (0.0, 0usize);
        for &r in self.registers.iter() {
            sum += 2f64.powi(-(r as i32));
            if r == 0 {
                zeros += 1;
            }
        }
        let raw = alpha_m * m * m / sum;
        if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        }
    }
}

/// Exact request counts for a uniform sample of the catalogue.
///
/// An identifier is in the sample when its hash has at least `level` leading
/// zero bits (probability 2^-level). When the sample outgrows its bound the
/// level rises and the identifiers no longer selected are dropped, so memory
/// stays bounded and every identifier kept has been counted since the start
/// (adaptive "distinct sampling", Gibbons 2001). Unlike a top-k summary, the
/// counts carry no over-estimate, which matters for the flat heads of
/// α < 1 distributions.
#[derive(Debug, Clone)]
pub struct SampledCounts {
    level: u32,
    max: usize,
    counts: HashMap<u64, u64>,
}

impl SampledCounts {
    /// A sample of at most `max` identifiers.
    pub fn new(max: usize) -> Self {
        SampledCounts {
            level: 0,
            max: max.max(16),
            counts: HashMap::with_capacity(max.max(16)),
        }
    }

    fn selected(level: u32, id: u64) -> bool {
        xxh3_64(&id.to_be_bytes()).leading_zeros() >= level
    }

    /// Counts one request for `id` if `id` is in the sample.
    pub fn insert(&mut self, id: u64) {
        if !Self::selected(self.level, id) {
            return;
        }
        *self.counts.entry(id).or_insert(0) += 1;
        while self.counts.len() > self.max && self.level < 63 {
            self.level += 1;
            let level = self.level;
            self.counts.retain(|&id, _| Self::selected(level, id));
        }
    }

    /// 2^level: how many catalogue ranks one sampled identifier stands for.
    pub fn scale(&self) -> f64 {
        2f64.powi(self.level as i32)
    }

    /// The sampled counts, highest first.
    pub fn counts_desc(&self) -> Vec<u64> {
        let mut c: Vec<u64> = self.counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        c
    }
}

/// What the estimator currently believes about the request stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Popularity {
    /// Zipf exponent α.
    pub alpha: f64,
    /// Catalogue size N (distinct identifiers requested).
    pub catalogue: f64,
    /// Requests observed.
    pub requests: u64,
}

/// The size of the LRU filter in front of one of `caches` caches that share
/// a stream by consistent hashing, from what the estimator believes: each
/// cache sees a Zipf stream with the same α over about N/k objects, so its
/// filter gets δ1*(α, δ2 = C2·k/N)·N/k identifiers (the paper's optimum,
/// `vcdn_model::filter::filter_capacity`). The router's HTTP filters and
/// the SRv6 agents' kernel filters are both sized by this rule.
pub fn filter_size(pop: &Popularity, caches: usize, cache_objects: u64) -> usize {
    let share = (pop.catalogue / caches.max(1) as f64).max(1.0);
    vcdn_model::filter::filter_capacity(pop.alpha, share, cache_objects as f64)
}

/// Whether a filter of `now` identifiers should become `size`: estimates
/// jitter, so changes under 5 % are ignored.
pub fn worth_resizing(now: usize, size: usize) -> bool {
    (size as f64 - now as f64).abs() > 0.05 * now as f64
}

/// Estimates α and N online from identifiers.
#[derive(Debug, Clone)]
pub struct PopularityEstimator {
    distinct: DistinctCounter,
    sample: SampledCounts,
    requests: u64,
}

/// 32,768 sampled identifiers (about 1 MiB): enough that catalogues of up
/// to ~30,000 requested objects are counted exactly, and that larger ones
/// keep a few hundred well-counted ranks for the fit. One estimator per
/// service (popularity is a property of the content, not of a cache).
impl Default for PopularityEstimator {
    fn default() -> Self {
        Self::new(32_768)
    }
}

impl PopularityEstimator {
    /// An estimator that counts a sample of at most `sample` identifiers.
    pub fn new(sample: usize) -> Self {
        PopularityEstimator {
            distinct: DistinctCounter::default(),
            sample: SampledCounts::new(sample),
            requests: 0,
        }
    }

    /// Records one request.
    pub fn observe(&mut self, id: u64) {
        self.requests += 1;
        self.distinct.insert(id);
        self.sample.insert(id);
    }

    /// Requests observed so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// The current estimate, or `None` until enough of the distribution is
    /// visible (at least 8 sampled identifiers counted 8 times or more).
    pub fn estimate(&self) -> Option<Popularity> {
        let counts = self.sample.counts_desc();
        let scale = self.sample.scale();
        // The j-th sampled identifier stands for catalogue rank ~ j * scale;
        // counts under 8 are mostly Poisson noise and are left out.
        let counted = counts.iter().take_while(|&&c| c >= 8).count();
        // The last ranks above the cut are biased upwards (an identifier
        // just below the threshold is kept only if it fluctuated up), which
        // would flatten the slope: fit the upper half only.
        // The k-th sampled identifier's catalogue rank is a sum of k
        // geometric gaps of mean `scale`; its expected *logarithm* is
        // ln(scale) + ψ(k) (digamma, = H_{k-1} - γ), not ln(k·scale), and the
        // difference matters for the first ranks, where the slope is read.
        let mut harmonic = 0.0;
        let usable: Vec<(f64, f64)> = counts[..counted.div_ceil(2)]
            .iter()
            .enumerate()
            .map(|(j, &c)| {
                let k = (j + 1) as f64;
                let x = if scale > 1.0 {
                    scale.ln() + harmonic - EULER_GAMMA
                } else {
                    k.ln()
                };
                harmonic += 1.0 / k;
                (x, (c as f64).ln())
            })
            .collect();
        if usable.len() < 8 {
            return None;
        }
        let n = usable.len() as f64;
        let mx = usable.iter().map(|p| p.0).sum::<f64>() / n;
        let my = usable.iter().map(|p| p.1).sum::<f64>() / n;
        let sxy: f64 = usable.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = usable.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let alpha = (-sxy / sxx).max(0.0);
        Some(Popularity {
            alpha,
            catalogue: self.distinct.estimate(),
            requests: self.requests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zipf(α) sampler over 1..=n by inverse CDF on a precomputed table.
    fn zipf_stream(alpha: f64, n: usize, len: usize, mut seed: u64) -> Vec<u64> {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for i in 1..=n {
            acc += 1.0 / (i as f64).powf(alpha);
            cdf.push(acc);
        }
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let u = (seed >> 11) as f64 / (1u64 << 53) as f64 * acc;
                cdf.partition_point(|&c| c < u) as u64 + 1
            })
            .collect()
    }

    #[test]
    fn distinct_counter_is_within_a_few_percent() {
        for n in [100u64, 10_000, 1_000_000] {
            let mut d = DistinctCounter::default();
            for i in 0..n {
                d.insert(i * 7919);
                d.insert(i * 7919); // duplicates do not count
            }
            let e = d.estimate();
            assert!(
                (e - n as f64).abs() / (n as f64) < 0.05,
                "n={n} estimate={e}"
            );
        }
    }

    #[test]
    fn sample_stays_bounded_and_counts_exactly() {
        let mut t = SampledCounts::new(100);
        for round in 0..3 {
            for i in 0..10_000u64 {
                t.insert(i);
            }
            assert!(t.counts.len() <= 100);
            assert!(t.counts_desc().iter().all(|&c| c == round + 1));
        }
        // ~10,000 / 2^level identifiers kept.
        let kept = t.counts.len() as f64 * t.scale();
        assert!((5_000.0..20_000.0).contains(&kept), "{kept}");
    }

    #[test]
    fn estimates_alpha_and_catalogue_of_a_zipf_stream() {
        for alpha in [0.8, 1.0, 1.2] {
            let mut e = PopularityEstimator::default();
            for id in zipf_stream(alpha, 100_000, 400_000, 0x1234_5678) {
                e.observe(id);
            }
            let p = e.estimate().expect("enough data");
            assert!(
                (p.alpha - alpha).abs() < 0.08,
                "alpha {alpha}: estimated {}",
                p.alpha
            );
            assert!(
                p.catalogue > 10_000.0 && p.catalogue <= 105_000.0,
                "N {}",
                p.catalogue
            );
        }
    }

    #[test]
    fn too_little_data_gives_no_estimate() {
        let mut e = PopularityEstimator::default();
        for id in 0..100 {
            e.observe(id);
        }
        assert_eq!(e.estimate(), None);
    }
}
