//! Small, dependency-free numerics for the models: adaptive quadrature,
//! bracketed root finding, 1-D minimisation, Riemann ζ and generalised
//! harmonic numbers, least-squares lines.
//!
//! Everything here is deterministic and allocation-light, so a live router can
//! call the models without surprises, and robust rather than fast: the
//! quadrature is QUADPACK's globally adaptive Gauss–Kronrod (15 points), the
//! root finder and the minimiser are Brent's (1973) bracketing methods, which
//! cannot leave their bracket and degrade to bisection / golden section when
//! interpolation misbehaves.

/// Result of [`integrate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quadrature {
    /// Estimated integral.
    pub value: f64,
    /// Estimated absolute error (QUADPACK's heuristic, usually pessimistic).
    pub error: f64,
    /// Number of integrand evaluations.
    pub evals: usize,
}

// Gauss–Kronrod 7/15 nodes and weights (QUADPACK `qk15`). XGK[1], XGK[3],
// XGK[5] and XGK[7] are the 7-point Gauss nodes, weighted by WG.
const XGK: [f64; 8] = [
    0.991_455_371_120_812_6,
    0.949_107_912_342_758_5,
    0.864_864_423_359_769_1,
    0.741_531_185_599_394_4,
    0.586_087_235_467_691_1,
    0.405_845_151_377_397_2,
    0.207_784_955_007_898_5,
    0.0,
];
const WGK: [f64; 8] = [
    0.022_935_322_010_529_22,
    0.063_092_092_629_978_55,
    0.104_790_010_322_250_2,
    0.140_653_259_715_525_9,
    0.169_004_726_639_267_9,
    0.190_350_578_064_785_4,
    0.204_432_940_075_298_9,
    0.209_482_141_084_727_8,
];
const WG: [f64; 4] = [
    0.129_484_966_168_869_7,
    0.279_705_391_489_276_7,
    0.381_830_050_505_118_9,
    0.417_959_183_673_469_4,
];

/// One Gauss–Kronrod 15-point panel on `[a, b]`: (value, error estimate).
fn gk15<F: FnMut(f64) -> f64>(f: &mut F, a: f64, b: f64) -> (f64, f64) {
    let centre = 0.5 * (a + b);
    let half = 0.5 * (b - a);
    let fc = f(centre);
    let mut res_k = fc * WGK[7];
    let mut res_g = fc * WG[3];
    let mut res_abs = res_k.abs();
    let mut fv1 = [0.0; 7];
    let mut fv2 = [0.0; 7];
    for j in 0..7 {
        let dx = half * XGK[j];
        let f1 = f(centre - dx);
        let f2 = f(centre + dx);
        fv1[j] = f1;
        fv2[j] = f2;
        res_k += WGK[j] * (f1 + f2);
        res_abs += WGK[j] * (f1.abs() + f2.abs());
        if j % 2 == 1 {
            res_g += WG[j / 2] * (f1 + f2);
        }
    }
    let mean = res_k * 0.5;
    let mut res_asc = WGK[7] * (fc - mean).abs();
    for j in 0..7 {
        res_asc += WGK[j] * ((fv1[j] - mean).abs() + (fv2[j] - mean).abs());
    }
    let value = res_k * half;
    res_abs *= half.abs();
    res_asc *= half.abs();
    let mut err = ((res_k - res_g) * half).abs();
    if res_asc != 0.0 && err != 0.0 {
        err = res_asc * (200.0 * err / res_asc).powf(1.5).min(1.0);
    }
    if res_abs > f64::MIN_POSITIVE / (50.0 * f64::EPSILON) {
        err = err.max(50.0 * f64::EPSILON * res_abs);
    }
    (value, err)
}

/// Most panels [`integrate`] will hold before giving up on its tolerance.
const MAX_PANELS: usize = 4000;

/// Globally adaptive Gauss–Kronrod quadrature of `f` over the panels given
/// by the sorted `breaks` (at least two points): the panel with the largest
/// error estimate is bisected until the total error is below
/// `max(abs_tol, rel_tol·|value|)` (or 4000 panels are reached, in which case
/// the best estimate is returned with its error).
///
/// Put a break wherever the integrand changes character: a panel whose 15
/// nodes all miss a narrow feature reports a zero error and is never split.
pub fn integrate<F: FnMut(f64) -> f64>(
    mut f: F,
    breaks: &[f64],
    rel_tol: f64,
    abs_tol: f64,
) -> Quadrature {
    assert!(breaks.len() >= 2, "integrate needs at least one panel");
    // (a, b, value, error)
    let mut panels: Vec<(f64, f64, f64, f64)> = Vec::with_capacity(64);
    for w in breaks.windows(2) {
        if w[1] > w[0] {
            let (v, e) = gk15(&mut f, w[0], w[1]);
            panels.push((w[0], w[1], v, e));
        }
    }
    let mut evals = 15 * panels.len();
    loop {
        let (mut value, mut error) = (0.0, 0.0);
        let mut worst = 0;
        for (i, p) in panels.iter().enumerate() {
            value += p.2;
            error += p.3;
            if p.3 > panels[worst].3 {
                worst = i;
            }
        }
        if panels.is_empty()
            || error <= abs_tol.max(rel_tol * value.abs())
            || panels.len() >= MAX_PANELS
        {
            return Quadrature {
                value,
                error,
                evals,
            };
        }
        let (a, b, _, _) = panels[worst];
        let m = 0.5 * (a + b);
        if !(m > a && m < b) {
            // Panel too small to split: accept what we have.
            return Quadrature {
                value,
                error,
                evals,
            };
        }
        let (v1, e1) = gk15(&mut f, a, m);
        let (v2, e2) = gk15(&mut f, m, b);
        evals += 30;
        panels[worst] = (a, m, v1, e1);
        panels.push((m, b, v2, e2));
    }
}

/// Brent's root finder (zeroin) on `[a, b]`, where `f(a)` and `f(b)` must have
/// opposite signs (or one be zero). Stops when the bracket is narrower than
/// `tol` (absolute, plus 2ε relative). Returns `None` without a sign change.
pub fn brent_root<F: FnMut(f64) -> f64>(mut f: F, a: f64, b: f64, tol: f64) -> Option<f64> {
    let (mut a, mut b) = (a, b);
    let (mut fa, mut fb) = (f(a), f(b));
    if fa == 0.0 {
        return Some(a);
    }
    if fb == 0.0 {
        return Some(b);
    }
    if fa.is_nan() || fb.is_nan() || (fa > 0.0) == (fb > 0.0) {
        return None;
    }
    let (mut c, mut fc) = (a, fa);
    let mut d = b - a;
    let mut e = d;
    for _ in 0..200 {
        if (fb > 0.0) == (fc > 0.0) {
            c = a;
            fc = fa;
            d = b - a;
            e = d;
        }
        if fc.abs() < fb.abs() {
            a = b;
            b = c;
            c = a;
            fa = fb;
            fb = fc;
            fc = fa;
        }
        let tol1 = 2.0 * f64::EPSILON * b.abs() + 0.5 * tol;
        let xm = 0.5 * (c - b);
        if xm.abs() <= tol1 || fb == 0.0 {
            return Some(b);
        }
        if e.abs() >= tol1 && fa.abs() > fb.abs() {
            // Inverse quadratic interpolation, or secant when a == c.
            let s = fb / fa;
            let (mut p, mut q);
            if a == c {
                p = 2.0 * xm * s;
                q = 1.0 - s;
            } else {
                let qa = fa / fc;
                let r = fb / fc;
                p = s * (2.0 * xm * qa * (qa - r) - (b - a) * (r - 1.0));
                q = (qa - 1.0) * (r - 1.0) * (s - 1.0);
            }
            if p > 0.0 {
                q = -q;
            }
            p = p.abs();
            if 2.0 * p < (3.0 * xm * q - (tol1 * q).abs()).min((e * q).abs()) {
                e = d;
                d = p / q;
            } else {
                d = xm;
                e = d;
            }
        } else {
            d = xm;
            e = d;
        }
        a = b;
        fa = fb;
        b += if d.abs() > tol1 { d } else { tol1.copysign(xm) };
        fb = f(b);
        if fb.is_nan() {
            return None;
        }
    }
    Some(b)
}

/// Brent's minimiser (localmin) on `[a, b]`: golden-section search with
/// parabolic steps. Finds a local minimum, the global one when `f` is
/// unimodal on the interval. `tol` is the absolute tolerance on x (keep it
/// above √ε·|x|: near a minimum f is flat to second order).
/// Returns `(x_min, f(x_min))`.
pub fn brent_min<F: FnMut(f64) -> f64>(mut f: F, a: f64, b: f64, tol: f64) -> (f64, f64) {
    const CGOLD: f64 = 0.381_966_011_250_105_1; // (3 − √5) / 2
    let (mut a, mut b) = if a < b { (a, b) } else { (b, a) };
    let mut x = a + CGOLD * (b - a);
    let (mut w, mut v) = (x, x);
    let mut fx = f(x);
    let (mut fw, mut fv) = (fx, fx);
    let (mut d, mut e) = (0.0f64, 0.0f64);
    for _ in 0..200 {
        let xm = 0.5 * (a + b);
        let tol1 = f64::EPSILON.sqrt() * x.abs() + tol / 3.0;
        let tol2 = 2.0 * tol1;
        if (x - xm).abs() <= tol2 - 0.5 * (b - a) {
            break;
        }
        let mut golden = true;
        if e.abs() > tol1 {
            let r = (x - w) * (fx - fv);
            let mut q = (x - v) * (fx - fw);
            let mut p = (x - v) * q - (x - w) * r;
            q = 2.0 * (q - r);
            if q > 0.0 {
                p = -p;
            }
            q = q.abs();
            let etemp = e;
            e = d;
            if p.abs() < (0.5 * q * etemp).abs() && p > q * (a - x) && p < q * (b - x) {
                d = p / q;
                let u = x + d;
                if u - a < tol2 || b - u < tol2 {
                    d = tol1.copysign(xm - x);
                }
                golden = false;
            }
        }
        if golden {
            e = if x >= xm { a - x } else { b - x };
            d = CGOLD * e;
        }
        let u = x + if d.abs() >= tol1 { d } else { tol1.copysign(d) };
        let fu = f(u);
        if fu <= fx {
            if u >= x {
                a = x;
            } else {
                b = x;
            }
            v = w;
            fv = fw;
            w = x;
            fw = fx;
            x = u;
            fx = fu;
        } else {
            if u < x {
                a = u;
            } else {
                b = u;
            }
            if fu <= fw || w == x {
                v = w;
                fv = fw;
                w = u;
                fw = fu;
            } else if fu <= fv || v == x || v == w {
                v = u;
                fv = fu;
            }
        }
    }
    (x, fx)
}

/// Euler–Maclaurin correction terms for Σ k^-α over k ≥ m: the part beyond
/// `m^-α / 2` and the integral, i.e. −Σ_j B_2j/(2j)! · f^(2j−1)(m) for
/// f(x) = x^-α, j = 1..4 (error below 1e-16 relative for m ≥ 20).
fn em_tail_terms(alpha: f64, m: f64) -> f64 {
    // f'(m) = −α m^(−α−1); f'''(m) = −α(α+1)(α+2) m^(−α−3); ...
    let fm = m.powf(-alpha);
    let mut deriv = -alpha * fm / m; // f'(m)
    let b = [1.0 / 12.0, -1.0 / 720.0, 1.0 / 30_240.0, -1.0 / 1_209_600.0];
    let mut sum = 0.0;
    let mut k = alpha; // next factors of the derivative
    for (j, bj) in b.iter().enumerate() {
        sum -= bj * deriv;
        if j + 1 < b.len() {
            // two more derivatives: × (−(α+1)/m) × (−(α+2)/m) ...
            deriv *= (k + 1.0) * (k + 2.0) / (m * m);
            k += 2.0;
        }
    }
    sum
}

/// Number of leading terms summed directly by [`zeta`] and [`harmonic`].
const EM_DIRECT: u64 = 32;

/// Riemann's ζ(α) = Σ_{n≥1} n^-α for α > 1, and its analytic continuation
/// (ζ(α) = lim_N [H_{N,α} − N^(1−α)/(1−α)]) for α < 1, by Euler–Maclaurin.
/// Eq. (9) divides by ζ(α) for α > 1; the continuation for α < 1 is the
/// constant term of Σ_{n≤N} n^-α, which is what makes (9) converge slowly
/// (see [`harmonic`]). Returns NaN at α = 1 (pole).
pub fn zeta(alpha: f64) -> f64 {
    if alpha == 1.0 || alpha.is_nan() {
        return f64::NAN;
    }
    let m = EM_DIRECT as f64;
    let mut s = 0.0;
    for k in (1..EM_DIRECT).rev() {
        s += (k as f64).powf(-alpha);
    }
    // Σ_{k≥m} f(k) = ∫_m^∞ f + f(m)/2 − Σ_j B_2j/(2j)! f^(2j−1)(m).
    s + m.powf(1.0 - alpha) / (alpha - 1.0) + 0.5 * m.powf(-alpha) + em_tail_terms(alpha, m)
}

/// Generalised harmonic number H_{n,α} = Σ_{k=1}^{n} k^-α: the normalisation
/// Σ q(n) of the Zipf popularity in eq. (8). Exact sum for small n, otherwise
/// a direct head plus an Euler–Maclaurin tail (relative error ~1e-15).
pub fn harmonic(n: u64, alpha: f64) -> f64 {
    if n <= 4 * EM_DIRECT {
        return (1..=n).rev().map(|k| (k as f64).powf(-alpha)).sum();
    }
    let m = EM_DIRECT as f64;
    let nf = n as f64;
    let mut s = 0.0;
    for k in (1..EM_DIRECT).rev() {
        s += (k as f64).powf(-alpha);
    }
    let integral = if alpha == 1.0 {
        (nf / m).ln()
    } else {
        (nf.powf(1.0 - alpha) - m.powf(1.0 - alpha)) / (1.0 - alpha)
    };
    // Σ_{k=m}^{n} f(k) = ∫_m^n f + (f(m)+f(n))/2 + Σ_j B_2j/(2j)! (f^(2j−1)(n) − f^(2j−1)(m)).
    s + integral + 0.5 * (m.powf(-alpha) + nf.powf(-alpha)) + em_tail_terms(alpha, m)
        - em_tail_terms(alpha, nf)
}

/// Least-squares line `y = slope·x + intercept` with its R².
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LineFit {
    /// Slope.
    pub slope: f64,
    /// Intercept.
    pub intercept: f64,
    /// Coefficient of determination (1 for a perfect fit).
    pub r2: f64,
}

/// Ordinary least squares of `ys` on `xs` (same length, at least two distinct
/// x). NaN fields when the fit is undefined.
pub fn linear_fit(xs: &[f64], ys: &[f64]) -> LineFit {
    assert_eq!(xs.len(), ys.len(), "linear_fit needs as many x as y");
    let n = xs.len() as f64;
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for (&x, &y) in xs.iter().zip(ys) {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (y - my);
        syy += (y - my) * (y - my);
    }
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let mut ss_res = 0.0;
    for (&x, &y) in xs.iter().zip(ys) {
        let r = y - (slope * x + intercept);
        ss_res += r * r;
    }
    let r2 = if syy > 0.0 {
        1.0 - ss_res / syy
    } else {
        f64::NAN
    };
    LineFit {
        slope,
        intercept,
        r2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quadrature_of_smooth_and_peaked_functions() {
        let q = integrate(|x: f64| x.sin(), &[0.0, std::f64::consts::PI], 1e-13, 0.0);
        assert!((q.value - 2.0).abs() < 1e-13, "{q:?}");
        // A narrow Gaussian, found because a break sits on it.
        let g = |x: f64| (-(x - 0.3) * (x - 0.3) / (2.0 * 1e-6)).exp();
        let q = integrate(g, &[0.0, 0.3, 1.0], 1e-12, 0.0);
        let exact = (2.0 * std::f64::consts::PI * 1e-6).sqrt();
        assert!((q.value / exact - 1.0).abs() < 1e-10, "{q:?} vs {exact}");
        // Integrable endpoint singularity x^-0.5 on (0, 1].
        let q = integrate(|x: f64| x.powf(-0.5), &[0.0, 1.0], 1e-10, 0.0);
        assert!((q.value - 2.0).abs() < 1e-7, "{q:?}");
    }

    #[test]
    fn brent_root_finds_roots_and_refuses_without_sign_change() {
        let r = brent_root(|x| x * x * x - 2.0, 0.0, 5.0, 1e-14).unwrap();
        assert!((r - 2f64.cbrt()).abs() < 1e-13);
        let r = brent_root(|x: f64| x.exp() - 10.0, -50.0, 50.0, 1e-14).unwrap();
        assert!((r - 10f64.ln()).abs() < 1e-12);
        assert!(brent_root(|x| x * x + 1.0, -1.0, 1.0, 1e-12).is_none());
    }

    #[test]
    fn brent_min_finds_minima() {
        let (x, fx) = brent_min(|x| (x - 1.234) * (x - 1.234) + 3.0, -10.0, 10.0, 1e-10);
        assert!(
            (x - 1.234).abs() < 1e-7 && (fx - 3.0).abs() < 1e-12,
            "{x} {fx}"
        );
        let (x, _) = brent_min(|x: f64| x.cosh() - 0.5 * x, -3.0, 4.0, 1e-10);
        assert!((x - 0.5f64.asinh()).abs() < 1e-7, "{x}");
    }

    #[test]
    fn zeta_values() {
        let pi = std::f64::consts::PI;
        assert!((zeta(2.0) - pi * pi / 6.0).abs() < 1e-14);
        assert!((zeta(4.0) - pi.powi(4) / 90.0).abs() < 1e-14);
        assert!(
            (zeta(1.1) - 10.584_448_464_950_81).abs() < 1e-11,
            "{}",
            zeta(1.1)
        );
        assert!(
            (zeta(0.5) + 1.460_354_508_809_586_8).abs() < 1e-12,
            "{}",
            zeta(0.5)
        );
        assert!(
            (zeta(0.9) + 9.430_114_019_402_77).abs() < 1e-10,
            "{}",
            zeta(0.9)
        );
        assert!(zeta(1.0).is_nan());
    }

    #[test]
    fn harmonic_matches_direct_sums() {
        for &alpha in &[0.0, 0.5, 0.9, 1.0, 1.1, 2.0] {
            for &n in &[1u64, 7, 128, 129, 1000, 54_321, 1_000_000] {
                let direct: f64 = (1..=n).rev().map(|k| (k as f64).powf(-alpha)).sum();
                let em = harmonic(n, alpha);
                assert!(
                    (em / direct - 1.0).abs() < 1e-13,
                    "α={alpha} n={n}: {em} vs {direct}"
                );
            }
        }
        // H_N − ln N → γ (Euler–Mascheroni).
        let g = harmonic(1_000_000_000_000, 1.0) - (1e12f64).ln();
        assert!((g - 0.577_215_664_901_532_9).abs() < 1e-11, "{g}");
    }

    #[test]
    fn linear_fit_recovers_a_line() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        let ys: Vec<f64> = xs.iter().map(|x| 2.5 * x - 1.0).collect();
        let f = linear_fit(&xs, &ys);
        assert!((f.slope - 2.5).abs() < 1e-12 && (f.intercept + 1.0).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
    }
}
