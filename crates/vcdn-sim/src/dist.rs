//! The distributions a workload draws from, sampled from [`Rng`] so that
//! every draw is reproducible.

use crate::rng::Rng;

/// Exponential with this mean.
pub fn exponential(rng: &mut Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.next_f64()).ln()
}

/// Standard normal (Box–Muller; one of the pair is dropped for simplicity).
pub fn normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Gamma(shape k, scale θ): mean kθ, variance kθ². Marsaglia and Tsang's
/// method; shapes below 1 through the boost Gamma(k) = Gamma(k+1)·U^(1/k).
pub fn gamma(rng: &mut Rng, shape: f64, scale: f64) -> f64 {
    assert!(
        shape > 0.0 && scale > 0.0,
        "gamma needs positive parameters"
    );
    if shape < 1.0 {
        let u = 1.0 - rng.next_f64();
        return gamma(rng, shape + 1.0, scale) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = 1.0 - rng.next_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

/// Triangular on [min, max] with its mode at `mode` (inverse CDF).
pub fn triangular(rng: &mut Rng, min: f64, mode: f64, max: f64) -> f64 {
    assert!(
        min <= mode && mode <= max && min < max,
        "triangular needs min ≤ mode ≤ max"
    );
    let u = rng.next_f64();
    let f = (mode - min) / (max - min);
    if u < f {
        min + (u * (max - min) * (mode - min)).sqrt()
    } else {
        max - ((1.0 - u) * (max - min) * (max - mode)).sqrt()
    }
}

/// Mean of [`triangular`].
pub fn triangular_mean(min: f64, mode: f64, max: f64) -> f64 {
    (min + mode + max) / 3.0
}

/// A distribution over `0..n` given by weights, sampled by binary search
/// of the cumulative sums (for short lists: qualities, roles).
#[derive(Debug, Clone)]
pub struct Discrete {
    cumulative: Vec<f64>,
}

impl Discrete {
    pub fn new(weights: &[f64]) -> Self {
        assert!(!weights.is_empty() && weights.iter().all(|w| *w >= 0.0));
        let mut sum = 0.0;
        let cumulative: Vec<f64> = weights
            .iter()
            .map(|w| {
                sum += w;
                sum
            })
            .collect();
        assert!(sum > 0.0, "weights must not all be zero");
        Discrete {
            cumulative: cumulative.into_iter().map(|c| c / sum).collect(),
        }
    }

    /// Poisson(mean) restricted to `0..n` (drawn again while ≥ n, as the
    /// original does), as a table.
    pub fn truncated_poisson(mean: f64, n: usize) -> Self {
        let mut p = (-mean).exp();
        let mut weights = Vec::with_capacity(n);
        for k in 0..n {
            weights.push(p);
            p *= mean / (k + 1) as f64;
        }
        Discrete::new(&weights)
    }

    pub fn len(&self) -> usize {
        self.cumulative.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cumulative.is_empty()
    }

    /// Probability of `i`.
    pub fn p(&self, i: usize) -> f64 {
        self.cumulative[i] - if i == 0 { 0.0 } else { self.cumulative[i - 1] }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.next_f64();
        self.cumulative
            .partition_point(|&c| c <= u)
            .min(self.cumulative.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var)
    }

    #[test]
    fn gamma_has_its_mean_and_variance_for_large_and_small_shapes() {
        for &(k, theta) in &[(3.0, 2.0), (1.0, 5.0), (0.3, 1.0), (40.0, 0.1)] {
            let mut rng = Rng::new(11);
            let xs: Vec<f64> = (0..200_000).map(|_| gamma(&mut rng, k, theta)).collect();
            let (mean, var) = moments(&xs);
            let (m, v) = (k * theta, k * theta * theta);
            // 5 standard errors of the mean; 5 % on the variance.
            assert!(
                (mean - m).abs() < 5.0 * (v / xs.len() as f64).sqrt(),
                "k={k}: mean {mean} vs {m}"
            );
            assert!((var - v).abs() < 0.05 * v, "k={k}: var {var} vs {v}");
        }
    }

    #[test]
    fn triangular_has_its_mean_and_bounds() {
        let mut rng = Rng::new(5);
        let xs: Vec<f64> = (0..200_000)
            .map(|_| triangular(&mut rng, 60.0, 1800.0, 2700.0))
            .collect();
        let (mean, _) = moments(&xs);
        assert!((mean - 1520.0).abs() < 5.0, "{mean}");
        assert!(xs.iter().all(|&x| (60.0..=2700.0).contains(&x)));
        // The mode is the densest bin.
        let mut bins = [0u32; 27];
        for x in &xs {
            bins[((x / 100.0) as usize).min(26)] += 1;
        }
        let densest = (0..27).max_by_key(|&i| bins[i]).unwrap();
        assert!((17..=18).contains(&densest), "{densest}");
    }

    #[test]
    fn truncated_poisson_matches_the_originals_quality_shares() {
        // Poisson(2) drawn again until ≤ 5: 13.8 / 27.5 / 27.5 / 18.3 / 9.2 / 3.7 %.
        let d = Discrete::truncated_poisson(2.0, 6);
        let want = [0.138, 0.275, 0.275, 0.183, 0.092, 0.037];
        for (i, w) in want.iter().enumerate() {
            assert!((d.p(i) - w).abs() < 0.001, "{i}: {}", d.p(i));
        }
        let mut rng = Rng::new(9);
        let mut counts = [0u32; 6];
        let n = 300_000;
        for _ in 0..n {
            counts[d.sample(&mut rng)] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let expected = d.p(i) * n as f64;
            assert!((c as f64 - expected).abs() < 5.0 * expected.sqrt(), "{i}");
        }
    }

    #[test]
    fn exponential_has_its_mean() {
        let mut rng = Rng::new(1);
        let xs: Vec<f64> = (0..200_000).map(|_| exponential(&mut rng, 3.0)).collect();
        let (mean, var) = moments(&xs);
        assert!(
            (mean - 3.0).abs() < 0.05 && (var - 9.0).abs() < 0.5,
            "{mean} {var}"
        );
    }
}
