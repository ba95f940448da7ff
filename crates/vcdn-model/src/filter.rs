//! Hit rate of an LRU filter in front of an LRU cache, and the filter size
//! that maximises it (Desmouceaux et al., "A Content-aware Data-plane for
//! Efficient and Scalable Video Delivery", IM 2019, §III-B and §III-C).
//!
//! Setting: a catalogue of `N` objects with Zipf(α) popularity
//! `q(n) = n^-α`, requested independently (IRM). An LRU *filter* of `C1 = δ1·N`
//! identifiers sends a request to the edge only if its object is already in
//! the filter; the edge is an LRU *cache* of `C2 = δ2·N` objects. The global
//! hit rate is the share of requests that pass the filter *and* hit the cache.
//!
//! Two models, both from the paper:
//! - **finite N** ([`FiniteModel`], [`che_time`]): Che's approximation applied
//!   twice, eqs. (1)–(5), and the hit rate (8). Exact sums over the catalogue.
//! - **N → ∞** ([`psi`], [`big_psi`], [`i_integral`], [`hit_rate_asymptotic`]):
//!   the characteristic times become `ψ^-1(δ1)·N^α` and
//!   `Ψ^-1_{ψ^-1(δ1)}(δ2)·N^α` (eqs. 6–7), and the miss rate is a constant
//!   `I(δ1, δ2)` times a factor that depends only on α and N (eq. 9). The
//!   optimal filter size minimises `I` (eq. 10) and is independent of N.
//!
//! The integrals over `x ∈ (0, 1]` all have the shape `f(c / x^α)`: flat near
//! 0, a transition around `x = c^(1/α)`, which is tiny when `c` is. They are
//! computed in `u = ln x`, where every transition has a width of order `1/α`,
//! with breaks on each transition and adaptive Gauss–Kronrod quadrature
//! ([`crate::numeric::integrate`]) to a relative tolerance of 1e-12.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::numeric::{brent_min, brent_root, harmonic, integrate, linear_fit, zeta};

/// Table II of the paper: slope `C` of the regression `A(α) = C·α + D`.
pub const PAPER_C: f64 = 0.342;
/// Table II of the paper: intercept `D` of the regression `A(α) = C·α + D`.
pub const PAPER_D: f64 = 0.422;
/// Table II of the paper: `B̂`, the mean of the `B` column of Table I.
pub const PAPER_B_HAT: f64 = 1.938;
/// The α values of the paper's Table I.
pub const TABLE_ALPHAS: [f64; 8] = [0.75, 0.80, 0.85, 0.90, 0.95, 1.00, 1.05, 1.10];
/// The cache sizes δ2 over which Table I fits `δ1* = B·δ2^A`.
pub const TABLE_DELTA2: [f64; 9] = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09];

/// Relative tolerance of every integral.
const REL_TOL: f64 = 1e-12;
/// Absolute tolerance, in `ln β`, of the inverse functions ψ^-1 and Ψ^-1.
const LN_TOL: f64 = 1e-12;

fn alpha_ok(alpha: f64) -> bool {
    alpha.is_finite() && alpha >= 0.0
}

/// Quadrature breaks on `[u_min, 0]`: the transition points `marks` that fall
/// inside, and no panel longer than `4 / max(α, 1)` (a transition of
/// `exp(-c·e^{-αu})` spans a few units of `1/α`).
fn u_breaks(u_min: f64, alpha: f64, marks: &[f64]) -> Vec<f64> {
    let u_min = u_min.min(-1.0);
    let max_len = 4.0 / alpha.max(1.0);
    let mut pts = vec![u_min, 0.0];
    pts.extend(
        marks
            .iter()
            .copied()
            .filter(|m| m.is_finite() && *m > u_min && *m < 0.0),
    );
    pts.sort_by(f64::total_cmp);
    pts.dedup();
    let mut out = Vec::with_capacity(48);
    out.push(pts[0]);
    for w in pts.windows(2) {
        let k = ((w[1] - w[0]) / max_len).ceil().max(1.0) as usize;
        for i in 1..k {
            out.push(w[0] + (w[1] - w[0]) * i as f64 / k as f64);
        }
        out.push(w[1]);
    }
    out
}

/// ψ(β) = ∫₀¹ (1 − e^{−β/x^α}) dx (the definition under eq. 6, from Fricker
/// et al. 2012): the normalised occupancy of an LRU cache whose characteristic
/// time is `β·N^α`, as N → ∞. Increasing from ψ(0) = 0 to ψ(∞) = 1.
pub fn psi(alpha: f64, beta: f64) -> f64 {
    if !alpha_ok(alpha) || beta.is_nan() {
        return f64::NAN;
    }
    if beta <= 0.0 {
        return 0.0;
    }
    if beta.is_infinite() {
        return 1.0;
    }
    let lb = beta.ln();
    // The integrand is at most 1 = e^u·(dx/du)⁻¹, so dropping u < u_min costs
    // at most e^{u_min}, and ψ(β) ≳ min(β, 1).
    let u_min = -40.0 + lb.min(0.0);
    let br = u_breaks(u_min, alpha, &[lb / alpha]);
    integrate(
        |u| u.exp() * -(-(lb - alpha * u).exp()).exp_m1(),
        &br,
        REL_TOL,
        0.0,
    )
    .value
}

/// Finds `s` with `g(s) = target` for an increasing `g`, given an `s_hi`
/// known to satisfy `g(s_hi) ≥ target`: walks down until below, then Brent.
fn invert_increasing(g: impl Fn(f64) -> f64, target: f64, s_hi: f64) -> f64 {
    let mut hi = s_hi;
    let mut step = 2.0;
    let mut lo = hi - step;
    let mut guard = 0;
    while g(lo) > target {
        hi = lo;
        step *= 2.0;
        lo -= step;
        guard += 1;
        if guard > 12 {
            // g ≥ target even at e^{-8000}: the answer is 0 for all purposes.
            return f64::NEG_INFINITY;
        }
    }
    brent_root(|s| g(s) - target, lo, hi, LN_TOL).unwrap_or(0.5 * (lo + hi))
}

/// ψ^-1(δ): the normalised characteristic time `t / N^α` of an LRU of size
/// `δ·N` (eq. 6). 0 for δ ≤ 0, +∞ for δ ≥ 1.
pub fn psi_inv(alpha: f64, delta: f64) -> f64 {
    if !alpha_ok(alpha) || delta.is_nan() {
        return f64::NAN;
    }
    if delta <= 0.0 {
        return 0.0;
    }
    if delta >= 1.0 {
        return f64::INFINITY;
    }
    // 1/x^α ≥ 1 on (0, 1], so ψ(β) ≥ 1 − e^{−β}: β = −ln(1 − δ) is an upper bound.
    let s_hi = (-(-delta).ln_1p()).ln();
    invert_increasing(|s| psi(alpha, s.exp()), delta, s_hi).exp()
}

/// Ψ_γ(β) = ∫₀¹ (1 − exp[−β/x^α · (1 − e^{−γ/x^α})]) dx (under eq. 7): the
/// normalised occupancy of an LRU cache of characteristic time `β·N^α` fed by
/// an LRU filter of characteristic time `γ·N^α` (the filter thins object `x`'s
/// requests by its filter hit ratio, eq. 3). Ψ_∞ = ψ; Ψ_γ ≤ ψ.
pub fn big_psi(alpha: f64, gamma: f64, beta: f64) -> f64 {
    if !alpha_ok(alpha) || beta.is_nan() || gamma.is_nan() {
        return f64::NAN;
    }
    if beta <= 0.0 || gamma <= 0.0 {
        return 0.0;
    }
    if gamma.is_infinite() {
        return psi(alpha, beta);
    }
    if beta.is_infinite() {
        return 1.0;
    }
    let (lb, lg) = (beta.ln(), gamma.ln());
    // Integrand ≤ 1 per unit x; Ψ_γ(β) ≳ min(βγ, 1) (its value near x = 1).
    let u_min = -40.0 + lb.min(0.0) + lg.min(0.0);
    let br = u_breaks(
        u_min,
        alpha,
        &[lb / alpha, lg / alpha, 0.5 * (lb + lg) / alpha],
    );
    let f = |u: f64| {
        let h1 = -(-(lg - alpha * u).exp()).exp_m1();
        u.exp() * -(-(lb - alpha * u).exp() * h1).exp_m1()
    };
    integrate(f, &br, REL_TOL, 0.0).value
}

/// Ψ_γ^-1(δ): the normalised characteristic time of a cache of size `δ·N`
/// behind a filter of normalised characteristic time `γ` (eq. 7).
/// 0 for δ ≤ 0, +∞ for δ ≥ 1 or γ ≤ 0 (nothing reaches the cache).
pub fn big_psi_inv(alpha: f64, gamma: f64, delta: f64) -> f64 {
    if !alpha_ok(alpha) || delta.is_nan() || gamma.is_nan() {
        return f64::NAN;
    }
    if delta <= 0.0 {
        return 0.0;
    }
    if delta >= 1.0 || gamma <= 0.0 {
        return f64::INFINITY;
    }
    if gamma.is_infinite() {
        return psi_inv(alpha, delta);
    }
    // Both 1/x^α and the filter hit ratio are smallest at x = 1, so
    // Ψ_γ(β) ≥ 1 − exp(−β(1 − e^{−γ})): an upper bound on the root.
    let s_hi = (-(-delta).ln_1p()).ln() - (-(-gamma).exp_m1()).ln();
    invert_increasing(|s| big_psi(alpha, gamma, s.exp()), delta, s_hi).exp()
}

/// The miss integral of eq. (9) for given normalised characteristic times:
/// `∫₀¹ x^-α [1 − h1(x)·h2(x)] dx`, with filter hit `h1 = 1 − e^{−γ/x^α}` and
/// cache hit `h2 = 1 − exp(−β·h1/x^α)`. `γ = ∞` is no filter, `β = ∞` a cache
/// that holds everything. +∞ when α ≥ 1 and everything misses.
pub fn miss_integral(alpha: f64, gamma: f64, beta: f64) -> f64 {
    if !alpha_ok(alpha) || beta.is_nan() || gamma.is_nan() {
        return f64::NAN;
    }
    if gamma <= 0.0 || beta <= 0.0 {
        return if alpha < 1.0 {
            1.0 / (1.0 - alpha)
        } else {
            f64::INFINITY
        };
    }
    if gamma.is_infinite() && beta.is_infinite() {
        return 0.0;
    }
    let (lg, lb) = (gamma.ln(), beta.ln());
    // Below u_sat both e^{−γ/x^α} and e^{−β/x^α} are < e^{-800}: the integrand
    // is exactly 0 in floating point. For α < 1 the weight e^{(1−α)u} also
    // decays, so the tail below −60/(1−α) is negligible.
    let c = lg.min(lb);
    let u_sat = (c - 800f64.ln()) / alpha;
    let u_min = if alpha < 1.0 {
        u_sat.max(-60.0 / (1.0 - alpha))
    } else {
        u_sat
    };
    let br = u_breaks(
        u_min,
        alpha,
        &[lg / alpha, lb / alpha, 0.5 * (lg + lb) / alpha],
    );
    let f = |u: f64| {
        let a1 = (lg - alpha * u).exp();
        let e1 = (-a1).exp(); // filter miss
        let h1 = -(-a1).exp_m1();
        let e2 = (-(lb - alpha * u).exp() * h1).exp(); // cache miss of an admitted request
                                                       // 1 − (1 − e1)(1 − e2) without cancellation.
        ((1.0 - alpha) * u).exp() * (e1 + e2 - e1 * e2)
    };
    integrate(f, &br, REL_TOL, 0.0).value
}

/// I(δ1, δ2) of eq. (9): the first-order miss term of a filter of size δ1·N
/// in front of a cache of size δ2·N, as N → ∞. δ1 ≥ 1 means no filter.
pub fn i_integral(alpha: f64, d1: f64, d2: f64) -> f64 {
    let gamma = psi_inv(alpha, d1);
    let beta = big_psi_inv(alpha, gamma, d2);
    miss_integral(alpha, gamma, beta)
}

/// I for a single LRU cache of size δ2·N, without filter (δ1 = 1).
pub fn i_no_filter(alpha: f64, d2: f64) -> f64 {
    miss_integral(alpha, f64::INFINITY, psi_inv(alpha, d2))
}

fn is_one(alpha: f64) -> bool {
    (alpha - 1.0).abs() < 1e-9
}

/// The factor `m(α, N)` of eq. (9), `E[H] ≈ 1 − m·I`: `1 − α` for α < 1,
/// `1/ln N` for α = 1, `1/(ζ(α)·N^{α−1})` for α > 1. It is
/// `N^{1−α} / Σ_{n≤N} n^-α` with the sum replaced by its leading term.
pub fn miss_factor(alpha: f64, n: f64) -> f64 {
    if is_one(alpha) {
        1.0 / n.ln()
    } else if alpha < 1.0 {
        1.0 - alpha
    } else {
        1.0 / (zeta(alpha) * n.powf(alpha - 1.0))
    }
}

/// Global hit rate `E[H]` by eq. (9) for a catalogue of `n` objects, clamped to
/// [0, 1]. For α < 1 it does not depend on `n`; this is the curve of Fig. 5.
///
/// Beware: for α < 1 the neglected term is not O(1/N) as printed but
/// O(N^{α−1}) relative, because Σ n^-α = N^{1−α}/(1−α) + ζ(α) + …, and ζ(α) is
/// large near α = 1 (ζ(0.9) ≈ −9.43). At α = 0.9 and N = 10^6 the miss rate
/// of a finite catalogue is ~30 % above (9)'s. [`hit_rate_normalised`] keeps
/// the exact sum and agrees with the finite model to O(1/N).
pub fn hit_rate_asymptotic(alpha: f64, d1: f64, d2: f64, n: f64) -> f64 {
    (1.0 - miss_factor(alpha, n) * i_integral(alpha, d1, d2)).clamp(0.0, 1.0)
}

/// Eq. (9)'s hit rate for a single LRU cache of size δ2·N (no filter).
pub fn hit_rate_asymptotic_no_filter(alpha: f64, d2: f64, n: f64) -> f64 {
    (1.0 - miss_factor(alpha, n) * i_no_filter(alpha, d2)).clamp(0.0, 1.0)
}

/// Like [`hit_rate_asymptotic`], but dividing the first-order miss mass
/// `N^{1−α}·I` by the exact popularity sum `Σ_{n≤N} n^-α` (eq. 8's
/// denominator) instead of its leading term; `d1 ≥ 1` is no filter.
pub fn hit_rate_normalised(alpha: f64, d1: f64, d2: f64, n: f64) -> f64 {
    let i = if d1 >= 1.0 {
        i_no_filter(alpha, d2)
    } else {
        i_integral(alpha, d1, d2)
    };
    let norm = harmonic(n.round().max(1.0) as u64, alpha);
    (1.0 - n.powf(1.0 - alpha) * i / norm).clamp(0.0, 1.0)
}

/// The optimum of eq. (10) for one (α, δ2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FilterOptimum {
    /// δ1*: the filter size (fraction of the catalogue) minimising I;
    /// 1 when no filter beats every filter.
    pub delta1: f64,
    /// I(δ1*, δ2).
    pub i_value: f64,
    /// I without filter, for comparison.
    pub i_no_filter: f64,
    /// Evaluations of I spent.
    pub evals: usize,
}

/// Solves eq. (10), `min_{δ1 ∈ (0,1)} I(δ1, δ2)`, for `0 < δ2 < 1`.
///
/// The search runs over `s = ln ψ^-1(δ1)` (δ1 = ψ(e^s) is monotone, and this
/// spares one root finding per evaluation): start at the paper's guideline
/// (11), walk downhill with growing steps until the minimum is bracketed,
/// then Brent's minimiser. If I keeps decreasing until δ1 ≈ 1, or the interior
/// minimum is not below the no-filter value, the answer is δ1 = 1 (no filter).
/// I is unimodal in δ1 over the ranges we tested (see the tests), so the local
/// minimum is the global one. 13–20 evaluations of I: 2–3 ms in release for
/// α ≈ 1, up to ~8 ms at α = 3.
pub fn filter_optimum(alpha: f64, d2: f64) -> FilterOptimum {
    let nan = FilterOptimum {
        delta1: f64::NAN,
        i_value: f64::NAN,
        i_no_filter: f64::NAN,
        evals: 0,
    };
    if !alpha_ok(alpha) || d2.is_nan() || d2 <= 0.0 {
        return nan;
    }
    let i0 = i_no_filter(alpha, d2);
    if d2 >= 1.0 {
        return FilterOptimum {
            delta1: 1.0,
            i_value: i0,
            i_no_filter: i0,
            evals: 0,
        };
    }
    let mut evals = 0;
    let mut j = |s: f64| {
        evals += 1;
        let gamma = s.exp();
        miss_integral(alpha, gamma, big_psi_inv(alpha, gamma, d2))
    };
    // Beyond this the filter holds (1 − 1e-9) of the catalogue: no filter.
    let s_max = psi_inv(alpha, 1.0 - 1e-9).ln();
    let s_min = psi_inv(alpha, 1e-300f64.max(d2 * 1e-12)).ln();
    let guess = guideline(alpha, d2).clamp(d2 * 1e-3, 0.5);
    let s0 = psi_inv(alpha, guess).ln().clamp(s_min, s_max);
    let h = 0.5;
    let (f0, fp) = (j(s0), j(s0 + h));
    let boundary = |i_value: f64, evals: usize| FilterOptimum {
        delta1: 1.0,
        i_value: i0.min(i_value),
        i_no_filter: i0,
        evals,
    };
    let (lo, hi);
    if fp < f0 {
        // Downhill to the right: larger filters.
        let (mut a, mut b, mut fb, mut step) = (s0, s0 + h, fp, h);
        loop {
            step *= 1.618;
            let c = b + step;
            if c >= s_max {
                let fc = j(s_max);
                if fc <= fb {
                    return boundary(fc, evals);
                }
                (lo, hi) = (a, s_max);
                break;
            }
            let fc = j(c);
            if fc >= fb {
                (lo, hi) = (a, c);
                break;
            }
            (a, b, fb) = (b, c, fc);
        }
    } else {
        let fm = j(s0 - h);
        if fm < f0 {
            let (mut a, mut b, mut fb, mut step) = (s0, s0 - h, fm, h);
            loop {
                step *= 1.618;
                let c = (b - step).max(s_min);
                let fc = j(c);
                if fc >= fb || c <= s_min {
                    (lo, hi) = (c, a);
                    break;
                }
                (a, b, fb) = (b, c, fc);
            }
        } else {
            (lo, hi) = (s0 - h, s0 + h);
        }
    }
    let (s_star, i_star) = brent_min(&mut j, lo, hi, 1e-9);
    if i0 <= i_star {
        return boundary(i_star, evals);
    }
    FilterOptimum {
        delta1: psi(alpha, s_star.exp()),
        i_value: i_star,
        i_no_filter: i0,
        evals,
    }
}

/// δ1*(α, δ2): the optimal normalised filter size of eq. (10); 1 means "no
/// filter" (the cache is big enough, or popularity too flat, for filtering to
/// help); NaN for invalid input (δ2 ≤ 0 or NaN, α < 0 or non-finite).
pub fn optimal_filter_size(alpha: f64, d2: f64) -> f64 {
    filter_optimum(alpha, d2).delta1
}

/// The paper's guideline (11): δ1*g = B̂·δ2^(C·α + D) with Table II's
/// constants. Fitted for α ∈ [0.75, 1.1] and δ2 ∈ [0.01, 0.09].
pub fn guideline(alpha: f64, d2: f64) -> f64 {
    PAPER_B_HAT * d2.powf(PAPER_C * alpha + PAPER_D)
}

/// A power law `δ1* = B·δ2^A` fitted by least squares in log-log space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerLawFit {
    /// Exponent A.
    pub a: f64,
    /// Prefactor B.
    pub b: f64,
    /// 1 − R² of the log-log regression.
    pub one_minus_r2: f64,
}

/// Fits `d1 = B·d2^A` (a row of Table I) by linear regression of ln d1 on
/// ln d2.
pub fn fit_power_law(d2s: &[f64], d1s: &[f64]) -> PowerLawFit {
    let lx: Vec<f64> = d2s.iter().map(|x| x.ln()).collect();
    let ly: Vec<f64> = d1s.iter().map(|y| y.ln()).collect();
    let fit = linear_fit(&lx, &ly);
    PowerLawFit {
        a: fit.slope,
        b: fit.intercept.exp(),
        one_minus_r2: 1.0 - fit.r2,
    }
}

/// One row of Table I from our own optimum: δ1*(α, δ2) for each of `d2s`,
/// and the power law fitted through them.
pub fn table_one_row(alpha: f64, d2s: &[f64]) -> (Vec<f64>, PowerLawFit) {
    let d1s: Vec<f64> = d2s
        .iter()
        .map(|&d2| optimal_filter_size(alpha, d2))
        .collect();
    let fit = fit_power_law(d2s, &d1s);
    (d1s, fit)
}

/// Table II: the regression `A(α) = C·α + D` and `B̂ = mean(B)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuidelineFit {
    /// Slope C.
    pub c: f64,
    /// Intercept D.
    pub d: f64,
    /// 1 − R² of the regression of A on α.
    pub one_minus_r2: f64,
    /// Mean of the B values.
    pub b_hat: f64,
}

/// Table II from rows of Table I (`alphas[i]` goes with `rows[i]`).
pub fn fit_guideline(alphas: &[f64], rows: &[PowerLawFit]) -> GuidelineFit {
    let a: Vec<f64> = rows.iter().map(|r| r.a).collect();
    let fit = linear_fit(alphas, &a);
    let b_hat = rows.iter().map(|r| r.b).sum::<f64>() / rows.len() as f64;
    GuidelineFit {
        c: fit.slope,
        d: fit.intercept,
        one_minus_r2: 1.0 - fit.r2,
        b_hat,
    }
}

/// The largest capacity [`filter_capacity`] returns: `vcdn_policy`'s
/// `LruFilter` indexes its entries with `u32`.
pub const MAX_FILTER_CAPACITY: usize = (u32::MAX - 1) as usize;
/// α assumed when the estimate is NaN. Low on purpose: δ1*
/// decreases with α, and the paper (§III-C) advises erring on the large side,
/// where the hit rate falls slowly.
pub const FALLBACK_ALPHA: f64 = 0.8;
/// Largest α optimised for; above it the result for this α is used (the hit
/// rate is then close to 1 for any reasonable filter).
pub const MAX_ALPHA: f64 = 3.0;
/// Catalogues smaller than this get a filter as large as the catalogue (no
/// filtering): the N → ∞ model says little there, and the memory is trivial.
pub const MIN_CATALOGUE: f64 = 1000.0;
/// δ2 assumed when the catalogue size is unknown: the paper's operating
/// point (§IV-B, δ2 = 1 %).
pub const FALLBACK_DELTA2: f64 = 0.01;

type MemoKey = (i64, i64);
fn memo() -> &'static Mutex<HashMap<MemoKey, f64>> {
    static MEMO: OnceLock<Mutex<HashMap<MemoKey, f64>>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(HashMap::new()))
}

/// δ1*(α, δ2) on a grid (α to 0.001, δ2 to 0.5 % relative), memoised: live
/// estimates of α and N jitter, and the grid keeps both the cost and the
/// filter size from jittering with them.
fn optimal_filter_size_memo(alpha: f64, d2: f64) -> f64 {
    let ka = (alpha * 1000.0).round() as i64;
    let kd = (d2.ln() / 0.005).round() as i64;
    if let Some(&v) = memo()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(ka, kd))
    {
        return v;
    }
    let v = optimal_filter_size(ka as f64 / 1000.0, (kd as f64 * 0.005).exp());
    let mut m = memo().lock().unwrap_or_else(|e| e.into_inner());
    if m.len() >= 4096 {
        m.clear();
    }
    m.insert((ka, kd), v);
    v
}

/// The LRU filter capacity C1 (identifiers) a live router should use for a
/// catalogue of `catalogue` objects with Zipf exponent `alpha` in front of a
/// cache holding `cache_objects` objects, when the operator sets none:
/// `C1 = δ1*(α, C2/N)·N` by eq. (10). Never panics; every input gets an answer:
///
/// - `cache_objects` NaN, infinite or negative (unknown cache): no filtering,
///   i.e. `ceil(catalogue)` (or [`MAX_FILTER_CAPACITY`] if that is unknown
///   too) — the filter then admits everything it has seen, the baseline.
/// - `cache_objects < 1` (no cache): 0, everything goes to the origin (the
///   paper's C1 = 0), since the edge could only proxy.
/// - `catalogue` NaN, infinite or < 1 (unknown): δ2 = [`FALLBACK_DELTA2`],
///   i.e. `C1 = δ1*(α, 0.01)/0.01 · C2`.
/// - `catalogue < MIN_CATALOGUE` or `cache_objects ≥ catalogue`:
///   `ceil(catalogue)`, no filtering.
/// - `alpha` NaN: [`FALLBACK_ALPHA`]; `alpha ≤ 0` (no skew to exploit): no
///   filtering; `alpha > MAX_ALPHA` (or +∞): `MAX_ALPHA`. Outside the paper's
///   [0.75, 1.1] the numerical optimum is used, not the guideline (11).
/// - δ2 below 1e-12 is computed at 1e-12.
///
/// Cost (release build): ~2 ms for a new (α, δ2) grid point near α = 0.9
/// (up to ~8 ms at α = 3), ~0.4 µs when memoised (see
/// `optimal_filter_size_memo`); fine to call every few seconds.
pub fn filter_capacity(alpha: f64, catalogue: f64, cache_objects: f64) -> usize {
    let cat_ok = catalogue.is_finite() && catalogue >= 1.0;
    let whole = |n: f64| (n.ceil().min(MAX_FILTER_CAPACITY as f64)) as usize;
    let no_filter = if cat_ok {
        whole(catalogue)
    } else {
        MAX_FILTER_CAPACITY
    };
    if !(cache_objects.is_finite() && cache_objects >= 0.0) {
        return no_filter;
    }
    if cache_objects < 1.0 {
        return 0;
    }
    if alpha <= 0.0 {
        return no_filter;
    }
    let alpha = if alpha.is_nan() {
        FALLBACK_ALPHA
    } else {
        alpha.min(MAX_ALPHA)
    };
    if !cat_ok {
        let d1 = optimal_filter_size_memo(alpha, FALLBACK_DELTA2);
        return whole(d1 / FALLBACK_DELTA2 * cache_objects);
    }
    if catalogue < MIN_CATALOGUE || cache_objects >= catalogue {
        return no_filter;
    }
    let d2 = (cache_objects / catalogue).max(1e-12);
    let d1 = optimal_filter_size_memo(alpha, d2);
    if d1.is_nan() || d1 >= 1.0 {
        return no_filter;
    }
    whole(d1 * catalogue).clamp(1, no_filter)
}

/// Che's characteristic time of an LRU cache of `capacity` objects under IRM
/// with (un-normalised) request rates `popularity`: the root `t` of
/// `Σ_n (1 − e^{−t·q(n)}) = C` (eqs. 2 and 5). 0 if `capacity ≤ 0`, +∞ if the
/// cache holds every object with a positive rate.
pub fn che_time(popularity: &[f64], capacity: f64) -> f64 {
    let positive = popularity.iter().filter(|&&p| p > 0.0).count() as f64;
    if capacity >= positive {
        return f64::INFINITY;
    }
    let total: f64 = popularity.iter().sum();
    solve_che(popularity, None, capacity, capacity / total)
}

/// One pass over the rates: `(Σ w·(1 − e^{−t·p}), Σ w·p·e^{−t·p})`, the
/// occupancy and its derivative in t (`w ≡ 1` when `weights` is `None`).
/// Four independent accumulators let the CPU overlap the exponentials.
fn occupancy(p: &[f64], weights: Option<&[f64]>, t: f64) -> (f64, f64) {
    let mut s = [0.0f64; 4];
    let mut d = [0.0f64; 4];
    match weights {
        None => {
            let chunks = p.chunks_exact(4);
            let rest = chunks.remainder();
            for c in chunks {
                for k in 0..4 {
                    let x = -t * c[k];
                    s[k] -= x.exp_m1();
                    d[k] += c[k] * x.exp();
                }
            }
            for &q in rest {
                let x = -t * q;
                s[0] -= x.exp_m1();
                d[0] += q * x.exp();
            }
        }
        Some(w) => {
            for (i, (&q, &wi)) in p.iter().zip(w).enumerate() {
                let x = -t * q;
                s[i & 3] -= wi * x.exp_m1();
                d[i & 3] += wi * q * x.exp();
            }
        }
    }
    (s.iter().sum(), d.iter().sum())
}

/// Safeguarded Newton for Σ w·(1 − e^{−t·p}) = c from `guess`. The occupancy
/// is increasing and concave in t, so Newton never overshoots from below; a
/// bracket [lo, hi] and geometric bisection catch everything else. With the
/// asymptotic guess (relative error O(1/N)) it takes 2–3 passes.
fn solve_che(p: &[f64], weights: Option<&[f64]>, c: f64, guess: f64) -> f64 {
    if c.is_nan() || c <= 0.0 {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, f64::INFINITY);
    let mut t = if guess.is_finite() && guess > 0.0 {
        guess
    } else {
        1.0
    };
    for _ in 0..200 {
        let (s, d) = occupancy(p, weights, t);
        if s < c {
            lo = t;
        } else {
            hi = t;
        }
        if s == c || d <= 0.0 {
            return t;
        }
        let mut next = t - (s - c) / d;
        if !(next > lo && next < hi) {
            next = if hi.is_finite() {
                if lo > 0.0 {
                    (lo * hi).sqrt()
                } else {
                    0.25 * hi
                }
            } else {
                4.0 * t
            };
        }
        if (next - t).abs() <= 1e-11 * t {
            return next;
        }
        t = next;
    }
    t
}

/// Result of [`FiniteModel::evaluate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FiniteHit {
    /// Global hit rate `E[H]`, eq. (8): filter hit and cache hit.
    pub hit_rate: f64,
    /// Share of requests the filter sends to the edge, `Σ q·h1 / Σ q`.
    pub edge_share: f64,
    /// Filter characteristic time t1 (eq. 2); +∞ without filter.
    pub t1: f64,
    /// Cache characteristic time t2 (eq. 5); +∞ if the cache holds all.
    pub t2: f64,
}

/// Che's approximation of filter + cache for a finite catalogue of `n`
/// objects with Zipf(α) popularity: eqs. (1)–(5) and (8), summed exactly over
/// the catalogue. Keeps `q(n) = n^-α` and a scratch buffer, so repeated
/// evaluations cost a handful of passes over `n` values (N = 10^7: ~0.6 s).
#[derive(Debug, Clone)]
pub struct FiniteModel {
    alpha: f64,
    q: Vec<f64>,
    q_sum: f64,
    q2: Vec<f64>,
}

impl FiniteModel {
    /// Precomputes the popularity of a catalogue of `n ≥ 1` objects.
    ///
    /// # Panics
    /// If `n = 0` or α is negative or not finite.
    pub fn new(alpha: f64, n: usize) -> Self {
        assert!(
            n >= 1 && alpha_ok(alpha),
            "FiniteModel needs n ≥ 1 and α ≥ 0"
        );
        let q: Vec<f64> = (1..=n).map(|k| (-alpha * (k as f64).ln()).exp()).collect();
        let q_sum = q.iter().rev().sum();
        FiniteModel {
            alpha,
            q,
            q_sum,
            q2: Vec::new(),
        }
    }

    /// α.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// N.
    pub fn n(&self) -> usize {
        self.q.len()
    }

    /// The un-normalised popularity `q(n) = n^-α`, most popular first.
    pub fn popularity(&self) -> &[f64] {
        &self.q
    }

    fn scale(&self) -> f64 {
        (self.q.len() as f64).powf(self.alpha)
    }

    /// Filter of `c1` identifiers in front of a cache of `c2` objects.
    /// `c1 ≥ N` is no filter (every object passes, h1 = 1), `c1 ≤ 0` sends
    /// everything to the origin.
    pub fn evaluate(&mut self, c1: f64, c2: f64) -> FiniteHit {
        let n = self.q.len() as f64;
        let zero = FiniteHit {
            hit_rate: 0.0,
            edge_share: 0.0,
            t1: 0.0,
            t2: 0.0,
        };
        if c1.is_nan() || c1 <= 0.0 {
            return zero;
        }
        let scale = self.scale();
        let t1 = if c1 >= n {
            f64::INFINITY
        } else {
            let guess = psi_inv(self.alpha, c1 / n) * scale;
            solve_che(&self.q, None, c1, guess)
        };
        // Eq. (3): popularity seen by the cache.
        self.q2.clear();
        if t1.is_infinite() {
            self.q2.extend_from_slice(&self.q);
        } else {
            self.q2
                .extend(self.q.iter().map(|&q| q * -(-t1 * q).exp_m1()));
        }
        let edge: f64 = self.q2.iter().sum();
        let edge_share = edge / self.q_sum;
        if c2.is_nan() || c2 <= 0.0 {
            return FiniteHit {
                hit_rate: 0.0,
                edge_share,
                t1,
                t2: 0.0,
            };
        }
        if c2 >= n {
            return FiniteHit {
                hit_rate: edge_share,
                edge_share,
                t1,
                t2: f64::INFINITY,
            };
        }
        let gamma = if t1.is_infinite() {
            f64::INFINITY
        } else {
            t1 / scale
        };
        let guess = big_psi_inv(self.alpha, gamma, c2 / n) * scale;
        let t2 = solve_che(&self.q2, None, c2, guess);
        // Eqs. (4) and (8).
        let hits: f64 = self.q2.iter().map(|&q2| q2 * -(-t2 * q2).exp_m1()).sum();
        FiniteHit {
            hit_rate: hits / self.q_sum,
            edge_share,
            t1,
            t2,
        }
    }

    /// A refinement of [`evaluate`](Self::evaluate) that is *not* in the
    /// paper: the filter's output is treated as what it is, not as IRM.
    ///
    /// Eqs. (3)–(5) assume the cache sees object n as an independent Poisson
    /// stream of rate `q·h1`. But a request passes the filter only if the
    /// previous request for the same object came less than t1 earlier, so the
    /// admitted requests come in bursts and the cache hits more often than
    /// IRM predicts. Keeping Che's characteristic times but following one
    /// object's own Poisson requests (gaps X1, X2, … backwards from a request):
    /// it is admitted iff X1 < t1, and finds the object cached iff some earlier
    /// admitted request lies within t2. When t2 ≤ t1 only the previous request
    /// can be that one (any other admitted request needs a gap < t1 after a gap
    /// ≥ t1 ≥ t2), so, with `a = 1 − e^{−q·t1}`:
    ///
    /// - P(in cache) = P(hit and admitted) = `a·(1 − e^{−q·t2})`,
    /// - t2 solves `Σ a(n)·(1 − e^{−q(n)·t2}) = C2`,
    ///
    /// instead of the paper's `1 − e^{−q·a·t2}`. Returns `None` when the
    /// resulting t2 exceeds t1 (small filters), where this closed form does not
    /// hold. Without filter it is plain Che, like `evaluate`.
    pub fn evaluate_renewal(&mut self, c1: f64, c2: f64) -> Option<FiniteHit> {
        let base = self.evaluate(c1, c2);
        if (c1.is_nan() || c1 <= 0.0)
            || (c2.is_nan() || c2 <= 0.0)
            || base.t2.is_infinite()
            || base.t1.is_infinite()
        {
            return Some(base);
        }
        let t1 = base.t1;
        // h1(n) = q2(n) / q(n); rebuild it in the scratch buffer.
        for (h, &q) in self.q2.iter_mut().zip(&self.q) {
            *h = -(-t1 * q).exp_m1();
        }
        let t2 = solve_che(&self.q, Some(&self.q2), c2, base.t2);
        if t2 > t1 {
            return None;
        }
        let hits: f64 = self
            .q
            .iter()
            .zip(&self.q2)
            .map(|(&q, &h1)| q * h1 * -(-t2 * q).exp_m1())
            .sum();
        Some(FiniteHit {
            hit_rate: hits / self.q_sum,
            edge_share: base.edge_share,
            t1,
            t2,
        })
    }

    /// Global hit rate (eq. 8) of a filter of `c1` in front of a cache of `c2`.
    pub fn hit_rate(&mut self, c1: f64, c2: f64) -> f64 {
        self.evaluate(c1, c2).hit_rate
    }

    /// Hit rate of a single LRU cache of `c2` objects (no filter).
    pub fn hit_rate_no_filter(&mut self, c2: f64) -> f64 {
        self.evaluate(f64::INFINITY, c2).hit_rate
    }

    /// The filter size maximising the finite-N hit rate for a cache of `c2`:
    /// `(c1*, hit rate)`. Brent's minimiser on ln c1, bracketed around the
    /// asymptotic δ1* (a factor 4 either side), widened if the optimum sits on
    /// an edge. Some 20–30 evaluations.
    pub fn optimal_filter(&mut self, c2: f64) -> (f64, f64) {
        let n = self.q.len() as f64;
        let d1 = optimal_filter_size(self.alpha, c2 / n);
        if d1.is_nan() || d1 >= 1.0 {
            return (n, self.hit_rate_no_filter(c2));
        }
        let centre = (d1 * n).ln();
        let (mut lo, mut hi) = (centre - 4f64.ln(), (centre + 4f64.ln()).min(n.ln()));
        for _ in 0..8 {
            let (s, neg_hit) = brent_min(|s| -self.hit_rate(s.exp(), c2), lo, hi, 1e-6);
            let width = hi - lo;
            if s - lo < 0.02 * width && lo > 0.0 {
                lo -= width;
            } else if hi - s < 0.02 * width && hi < n.ln() {
                hi = (hi + width).min(n.ln());
            } else {
                return (s.exp(), -neg_hit);
            }
        }
        let s = 0.5 * (lo + hi);
        (s.exp(), self.hit_rate(s.exp(), c2))
    }
}

/// Eq. (8) for a finite catalogue: global hit rate of a filter of `c1` in
/// front of a cache of `c2`, catalogue of `n` objects with Zipf(α). Builds a
/// [`FiniteModel`]; keep one instead when evaluating many sizes.
pub fn hit_rate_finite(alpha: f64, n: usize, c1: f64, c2: f64) -> f64 {
    FiniteModel::new(alpha, n).hit_rate(c1, c2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    #[test]
    fn psi_limits_and_small_beta() {
        for &alpha in &[0.5, 0.9, 1.0, 1.1, 2.0] {
            assert_eq!(psi(alpha, 0.0), 0.0);
            assert_eq!(psi(alpha, f64::INFINITY), 1.0);
            assert!(psi(alpha, 1e6) > 0.999_999);
            let mut prev = 0.0;
            for k in -30..10 {
                let v = psi(alpha, 10f64.powi(k));
                // Strictly increasing until it rounds to 1.
                assert!(
                    v > prev || (k > 0 && v > 1.0 - 1e-15),
                    "ψ increasing, α={alpha}"
                );
                prev = v;
            }
        }
        // α = 0: ψ(β) = 1 − e^{−β}.
        assert!(close(psi(0.0, 0.7), 1.0 - (-0.7f64).exp(), 1e-12));
        // With s = 1/α non-integer, 1 − ψ(β) = e^{−β} − β^s·Γ(1 − s, β), i.e.
        // ψ(β) = 1 − e^{−β} + Γ(1−s)·β^s − Σ_k (−1)^k β^{k+1} / (k!·(k+1−s)).
        // Reference values from that series (Python: math.gamma, math.expm1); for α = 2
        // also 1 − e^{−β} + √(πβ)·erfc(√β).
        for &(alpha, beta, exact) in &[
            (0.9, 1e-9, 9.030_017_050_804_852e-9),
            (0.9, 0.0175, 0.066_901_929_380_800_28),
            (0.75, 0.3, 0.470_719_615_501_060_7),
            (1.1, 0.05, 0.190_760_406_649_04),
            (2.0, 0.01, 0.167_262_018_483_316_23),
            (2.0, 0.5, 0.791_159_085_710_718),
        ] {
            assert!(
                close(psi(alpha, beta), exact, 1e-11),
                "α={alpha} β={beta}: {}",
                psi(alpha, beta)
            );
        }
    }

    #[test]
    fn psi_against_a_riemann_sum() {
        // ψ(β) is the limit of (1/N) Σ (1 − e^{−β (N/n)^α}); the sum's error is ≤ 1/N.
        let n = 1_000_000usize;
        for &(alpha, beta) in &[(0.9, 0.003), (1.0, 0.01), (1.2, 0.5)] {
            let sum: f64 = (1..=n)
                .map(|k| -(-beta * (n as f64 / k as f64).powf(alpha)).exp_m1())
                .sum::<f64>()
                / n as f64;
            assert!((psi(alpha, beta) - sum).abs() < 2.0 / n as f64, "α={alpha}");
        }
    }

    #[test]
    fn psi_inverse_round_trips() {
        for &alpha in &[0.3, 0.75, 0.9, 1.0, 1.1, 1.5, 3.0] {
            for &d in &[1e-9, 1e-4, 0.01, 0.067, 0.3, 0.9, 0.999_999] {
                let b = psi_inv(alpha, d);
                assert!(
                    close(psi(alpha, b), d, 1e-10),
                    "α={alpha} δ={d}: {}",
                    psi(alpha, b)
                );
            }
        }
        assert_eq!(psi_inv(0.9, 0.0), 0.0);
        assert_eq!(psi_inv(0.9, 1.0), f64::INFINITY);
        assert!(psi_inv(0.9, f64::NAN).is_nan());
    }

    #[test]
    fn big_psi_is_psi_without_filter_and_inverts() {
        for &alpha in &[0.8, 1.0, 1.1] {
            let b = 0.02;
            assert!(close(
                big_psi(alpha, f64::INFINITY, b),
                psi(alpha, b),
                1e-14
            ));
            assert!(close(big_psi(alpha, 1e9, b), psi(alpha, b), 1e-10));
            assert!(big_psi(alpha, 0.01, b) < psi(alpha, b));
            for &g in &[1e-6, 1e-3, 0.05, 2.0] {
                for &d in &[1e-5, 0.01, 0.09, 0.5] {
                    let beta = big_psi_inv(alpha, g, d);
                    assert!(
                        close(big_psi(alpha, g, beta), d, 1e-10),
                        "α={alpha} γ={g} δ={d}: {}",
                        big_psi(alpha, g, beta)
                    );
                    // Ψ_γ ≤ ψ, so a filtered cache needs a longer time.
                    assert!(beta >= psi_inv(alpha, d) * (1.0 - 1e-9));
                }
            }
        }
    }

    #[test]
    fn paper_fig5_optimum() {
        // §III-B4: α = 0.9, δ2 = 0.01, maximum at δ1 = 0.067.
        let opt = filter_optimum(0.9, 0.01);
        assert!((opt.delta1 - 0.067).abs() < 0.001, "{opt:?}");
        assert!(opt.i_value < opt.i_no_filter);
    }

    #[test]
    fn i_is_unimodal_in_delta1() {
        for &alpha in &[0.75, 0.9, 1.1] {
            for &d2 in &[0.01, 0.09] {
                let opt = optimal_filter_size(alpha, d2);
                let grid: Vec<f64> = (0..40)
                    .map(|k| 10f64.powf(-4.0 + 4.0 * k as f64 / 40.0))
                    .collect();
                let vals: Vec<f64> = grid.iter().map(|&d1| i_integral(alpha, d1, d2)).collect();
                let minima = (1..vals.len() - 1)
                    .filter(|&k| vals[k] < vals[k - 1] && vals[k] < vals[k + 1])
                    .count();
                assert_eq!(minima, 1, "α={alpha} δ2={d2}: {vals:?}");
                let i_opt = i_integral(alpha, opt, d2);
                assert!(
                    vals.iter().all(|&v| v >= i_opt - 1e-12),
                    "α={alpha} δ2={d2}"
                );
            }
        }
    }

    #[test]
    fn table_one_reproduced() {
        // Paper, Table I: (α, A, B). Our optimum is computed to ~1e-6 relative;
        // the paper's differ from ours by at most 0.002 in A and 0.016 in B
        // (its δ1* were presumably found on a coarser grid).
        let paper = [
            (0.75, 0.680, 1.950),
            (0.80, 0.694, 1.924),
            (0.85, 0.710, 1.911),
            (0.90, 0.729, 1.919),
            (0.95, 0.748, 1.937),
            (1.00, 0.763, 1.936),
            (1.05, 0.780, 1.950),
            (1.10, 0.799, 1.979),
        ];
        let mut rows = Vec::new();
        for &(alpha, a, b) in &paper {
            let (_, fit) = table_one_row(alpha, &TABLE_DELTA2);
            assert!((fit.a - a).abs() < 0.005, "α={alpha}: A={} vs {a}", fit.a);
            assert!((fit.b - b).abs() < 0.025, "α={alpha}: B={} vs {b}", fit.b);
            assert!(fit.one_minus_r2 < 1e-3, "α={alpha}: {fit:?}");
            rows.push(fit);
        }
        // Table II: C = 0.342, D = 0.422, B̂ = 1.938.
        let g = fit_guideline(&TABLE_ALPHAS, &rows);
        assert!(
            (g.c - PAPER_C).abs() < 0.015 && (g.d - PAPER_D).abs() < 0.015,
            "{g:?}"
        );
        assert!((g.b_hat - PAPER_B_HAT).abs() < 0.01, "{g:?}");
    }

    #[test]
    fn guideline_matches_paper_example() {
        // §V-A: equation (11) gives 0.067 at α = 0.9, δ2 = 0.01.
        assert!((guideline(0.9, 0.01) - 0.067).abs() < 0.0005);
        let fit = fit_power_law(&[0.01, 0.04, 0.09], &[0.1, 0.4f64.sqrt() * 0.5, 0.15]);
        assert!(fit.a.is_finite() && fit.b > 0.0);
    }

    #[test]
    fn hit_rate_limits_in_delta1() {
        let (alpha, d2) = (0.9, 0.01);
        let single = hit_rate_asymptotic_no_filter(alpha, d2, 1e6);
        assert!(single > 0.2 && single < 0.6, "{single}");
        let near_one = hit_rate_asymptotic(alpha, 1.0 - 1e-9, d2, 1e6);
        assert!((near_one - single).abs() < 1e-6, "{near_one} vs {single}");
        // Towards δ1 → 0 it vanishes, but slowly: the top δ1·N objects carry
        // a share δ1^{1−α} of the requests as N → ∞.
        let mut prev = 1.0;
        for k in [3, 6, 10, 20, 40] {
            let h = hit_rate_asymptotic(alpha, 10f64.powi(-k), d2, 1e6);
            assert!(h < prev, "δ1=1e-{k}: {h}");
            prev = h;
        }
        assert!(prev < 1e-3, "{prev}");
        assert_eq!(hit_rate_asymptotic(alpha, 0.0, d2, 1e6), 0.0);
        let mut m = FiniteModel::new(alpha, 100_000);
        let single = m.hit_rate_no_filter(1000.0);
        assert!((m.hit_rate(100_000.0 - 0.5, 1000.0) - single).abs() < 1e-3);
        assert_eq!(m.hit_rate(1e9, 1000.0), single);
        // A filter of c1 ≪ 1 "objects" passes object 1 with probability ~c1.
        assert!(m.hit_rate(1e-6, 1000.0) < 1e-6);
        assert_eq!(m.hit_rate(0.0, 1000.0), 0.0);
    }

    #[test]
    fn finite_model_approaches_the_asymptote() {
        let (alpha, d1, d2) = (0.9, 0.067, 0.01);
        let mut prev_gap = f64::INFINITY;
        for &n in &[10_000usize, 100_000, 1_000_000] {
            let nf = n as f64;
            let finite = hit_rate_finite(alpha, n, d1 * nf, d2 * nf);
            // With the exact normalisation the gap is O(1/N)...
            let norm = hit_rate_normalised(alpha, d1, d2, nf);
            assert!(
                (finite - norm).abs() < 20.0 / nf,
                "N={n}: {finite} vs {norm}"
            );
            // ...and eq. (9) is approached from below, like N^{α−1}.
            let gap = hit_rate_asymptotic(alpha, d1, d2, nf) - finite;
            assert!(gap > 0.0 && gap < prev_gap, "N={n}: gap {gap}");
            prev_gap = gap;
        }
        // α > 1 and α = 1 use ζ(α) and ln N.
        for &alpha in &[1.0, 1.2] {
            let n = 1_000_000usize;
            let nf = n as f64;
            let finite = hit_rate_finite(alpha, n, 0.05 * nf, 0.01 * nf);
            let norm = hit_rate_normalised(alpha, 0.05, 0.01, nf);
            assert!(
                (finite - norm).abs() < 1e-4,
                "α={alpha}: {finite} vs {norm}"
            );
            let asym = hit_rate_asymptotic(alpha, 0.05, 0.01, nf);
            assert!(
                (finite - asym).abs() < 0.05,
                "α={alpha}: {finite} vs {asym}"
            );
        }
    }

    #[test]
    fn renewal_variant_is_above_irm_and_equal_without_filter() {
        let mut m = FiniteModel::new(0.9, 100_000);
        let plain = m.evaluate(1e9, 1000.0);
        assert_eq!(m.evaluate_renewal(1e9, 1000.0), Some(plain));
        let irm = m.evaluate(6630.0, 1000.0);
        let ren = m
            .evaluate_renewal(6630.0, 1000.0)
            .expect("t2 ≤ t1 at the optimum");
        assert!(ren.t2 <= ren.t1 && ren.t2 > irm.t2);
        assert!(ren.hit_rate > irm.hit_rate && ren.hit_rate < irm.edge_share);
        // A filter much smaller than the cache: t2 > t1, no closed form.
        assert!(m.evaluate_renewal(50.0, 1000.0).is_none());
    }

    #[test]
    fn che_time_solves_its_equation() {
        let q: Vec<f64> = (1..=5000).map(|k| (k as f64).powf(-0.8)).collect();
        for &c in &[1.0, 50.0, 2500.0, 4999.0] {
            let t = che_time(&q, c);
            let occ: f64 = q.iter().map(|&p| 1.0 - (-t * p).exp()).sum();
            assert!(close(occ, c, 1e-9), "C={c}: {occ}");
        }
        assert_eq!(che_time(&q, 0.0), 0.0);
        assert_eq!(che_time(&q, 5000.0), f64::INFINITY);
    }

    #[test]
    fn filter_capacity_edge_cases() {
        // Nominal: the paper's testbed, N = 10^7, C2 = 10^5, α = 0.9 → δ1 ≈ 0.067.
        let c1 = filter_capacity(0.9, 1e7, 1e5);
        assert!((600_000..740_000).contains(&c1), "{c1}");
        // Memoised second call agrees.
        assert_eq!(filter_capacity(0.9, 1e7, 1e5), c1);
        // Cache at least as large as the catalogue, or a tiny catalogue: no filtering.
        assert_eq!(filter_capacity(0.9, 1e4, 2e4), 10_000);
        assert_eq!(filter_capacity(0.9, 1e4, 1e4), 10_000);
        assert_eq!(filter_capacity(0.9, 500.4, 5.0), 501);
        // Unknown cache: no filtering; no cache: all to origin.
        assert_eq!(filter_capacity(0.9, 1e6, f64::NAN), 1_000_000);
        assert_eq!(filter_capacity(0.9, 1e6, -3.0), 1_000_000);
        assert_eq!(
            filter_capacity(0.9, f64::NAN, f64::NAN),
            MAX_FILTER_CAPACITY
        );
        assert_eq!(filter_capacity(0.9, 1e6, 0.0), 0);
        // Unknown catalogue: δ2 = 1 %, so about 6.7 × C2 at α = 0.9.
        let c = filter_capacity(0.9, f64::NAN, 1e5);
        assert!((600_000..740_000).contains(&c), "{c}");
        assert_eq!(filter_capacity(0.9, 0.0, 1e5), c);
        assert_eq!(filter_capacity(0.9, f64::INFINITY, 1e5), c);
        // Unknown α: the (larger) filter of α = 0.8.
        assert_eq!(
            filter_capacity(f64::NAN, 1e7, 1e5),
            filter_capacity(0.8, 1e7, 1e5)
        );
        assert!(filter_capacity(0.8, 1e7, 1e5) > c1);
        // No skew: no filtering. Huge α: clamped, still a sane size.
        assert_eq!(filter_capacity(0.0, 1e6, 1e4), 1_000_000);
        assert_eq!(filter_capacity(-1.0, 1e6, 1e4), 1_000_000);
        // Nearly flat popularity: the optimum itself is "no filter".
        assert_eq!(filter_capacity(1e-4, 1e6, 1e4), 1_000_000);
        assert_eq!(filter_capacity(0.2, 1e6, 1e4), 1_000_000);
        let big = filter_capacity(50.0, 1e6, 1e4);
        assert!((1..=1_000_000).contains(&big));
        assert_eq!(big, filter_capacity(MAX_ALPHA, 1e6, 1e4));
        assert_eq!(big, filter_capacity(f64::INFINITY, 1e6, 1e4));
        assert_eq!(filter_capacity(f64::NEG_INFINITY, 1e6, 1e4), 1_000_000);
        // Out of the fitted range: still the numerical optimum, between cache and catalogue.
        for &alpha in &[0.3, 0.6, 1.4, 2.0] {
            let c = filter_capacity(alpha, 1e8, 1e5);
            assert!((1..=100_000_000).contains(&c), "α={alpha}: {c}");
        }
        // A huge catalogue with a tiny cache.
        let c = filter_capacity(0.9, 1e13, 1.0);
        assert!((1..1_000_000).contains(&c), "{c}");
    }
}
