//! Seeded random numbers: one generator per purpose and per session, so a
//! run is fixed by its seed and two runs that differ in one policy see the
//! same users (common random numbers).

/// xoshiro256++ (Blackman & Vigna), seeded through SplitMix64: fast, small,
/// and good enough for Monte Carlo; reproducible from one `u64`.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n) (Lemire's multiply-shift; the bias, below
    /// n / 2^64, is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Zipf(α) over object ids `0..n` (id 0 the most popular, rate `(id+1)^-α`),
/// sampled in O(1) with Walker's alias method (Vose's construction). Each
/// column packs its threshold and alias so a draw touches one cache line.
#[derive(Debug, Clone)]
pub struct Zipf {
    columns: Vec<(f64, u32)>,
    rates: Vec<f64>,
}

impl Zipf {
    /// The distribution of rank `k ∈ 1..=n` ∝ `k^-α`, as ids `k − 1`.
    pub fn new(alpha: f64, n: usize) -> Self {
        assert!(n >= 1 && n <= u32::MAX as usize, "Zipf needs 1 ≤ n < 2^32");
        let rates: Vec<f64> = (1..=n).map(|k| (-alpha * (k as f64).ln()).exp()).collect();
        let total: f64 = rates.iter().rev().sum();
        let mut scaled: Vec<f64> = rates.iter().map(|r| r * n as f64 / total).collect();
        let mut columns = vec![(1.0, 0u32); n];
        let (mut small, mut large): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
        for (i, &p) in scaled.iter().enumerate() {
            if p < 1.0 {
                small.push(i as u32);
            } else {
                large.push(i as u32);
            }
        }
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            columns[s as usize] = (scaled[s as usize], l);
            scaled[l as usize] -= 1.0 - scaled[s as usize];
            if scaled[l as usize] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Leftovers (rounding) keep probability 1 of themselves.
        for i in small.into_iter().chain(large) {
            columns[i as usize] = (1.0, i);
        }
        Zipf { columns, rates }
    }

    /// Catalogue size.
    pub fn n(&self) -> usize {
        self.columns.len()
    }

    /// Un-normalised request rate of `id`: `(id + 1)^-α`.
    pub fn rate(&self, id: u32) -> f64 {
        self.rates[id as usize]
    }

    /// One object id.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let i = rng.below(self.columns.len() as u64) as usize;
        let (threshold, alias) = self.columns[i];
        if rng.next_f64() < threshold {
            i as u32
        } else {
            alias
        }
    }
}

/// The generator of item `id` in stream `purpose` of a run seeded `seed`:
/// independent of how many other items were drawn before it, so adding a
/// policy that changes event order changes no user's choices.
pub fn stream(seed: u64, purpose: u64, id: u64) -> Rng {
    let mut x = seed ^ purpose.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x = mix(x ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    Rng::new(mix(x))
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_frequencies_follow_the_law() {
        let (alpha, n) = (0.9, 1000);
        let z = Zipf::new(alpha, n);
        let mut rng = Rng::new(7);
        let mut counts = vec![0u64; n];
        let draws = 2_000_000;
        for _ in 0..draws {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        let total: f64 = (1..=n).map(|k| (k as f64).powf(-alpha)).sum();
        for &id in &[0usize, 1, 9, 99, 999] {
            let p = ((id + 1) as f64).powf(-alpha) / total;
            let expected = p * draws as f64;
            let sd = expected.sqrt();
            assert!(
                (counts[id] as f64 - expected).abs() < 5.0 * sd,
                "id {id}: {} vs {expected}",
                counts[id]
            );
        }
    }

    #[test]
    fn streams_are_fixed_by_seed_and_id_and_differ_between_ids() {
        assert_eq!(stream(1, 2, 3).next_u64(), stream(1, 2, 3).next_u64());
        assert_ne!(stream(1, 2, 3).next_u64(), stream(1, 2, 4).next_u64());
        assert_ne!(stream(1, 2, 3).next_u64(), stream(1, 3, 3).next_u64());
        assert_ne!(stream(1, 2, 3).next_u64(), stream(2, 2, 3).next_u64());
    }
}
