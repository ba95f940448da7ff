//! A small, fast version of the Fig. 5 reproduction: the real LruFilter in an
//! IRM simulation peaks near the model's optimal filter size, and the optimal
//! filter beats no filter.

use std::time::Instant;

use vcdn_model::filter::{optimal_filter_size, FiniteModel};
use vcdn_reproduce::irm::{simulate, Filter, Zipf};
use vcdn_reproduce::lru_filter::parabola_peak;

#[test]
fn simulated_optimum_is_near_the_model_and_beats_no_filter() {
    let start = Instant::now();
    let (alpha, n, d2) = (0.9, 50_000usize, 0.01);
    let c2 = (d2 * n as f64) as usize;
    let requests = 300_000;
    let seed = 11;

    let d_star = optimal_filter_size(alpha, d2);
    assert!((d_star - 0.067).abs() < 0.001, "{d_star}");
    let mut model = FiniteModel::new(alpha, n);
    let (c1_che, _) = model.optimal_filter(c2 as f64);
    // At this N the finite Che optimum is already the asymptotic one.
    assert!((c1_che / n as f64 / d_star - 1.0).abs() < 0.02, "{c1_che}");

    let zipf = Zipf::new(alpha, n);
    let sims: Vec<(f64, f64)> = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0]
        .iter()
        .map(|f| {
            let c1 = (f * d_star * n as f64).round() as usize;
            (
                c1 as f64 / n as f64,
                simulate(&zipf, Filter::Lru(c1), c2, requests, seed).hit_rate,
            )
        })
        .collect();
    let (best, best_hit) = sims
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert!(
        best >= d_star / 2.0 && best <= 2.0 * d_star,
        "best {best}: {sims:?}"
    );
    let peak = parabola_peak(&sims).expect("an interior maximum");
    assert!(
        peak >= d_star / 1.6 && peak <= 1.6 * d_star,
        "peak {peak}: {sims:?}"
    );

    // The optimally sized filter beats no filter by far more than the noise
    // (~0.1 % here); the model predicts +18 % relative at this N.
    let none = simulate(&zipf, Filter::None, c2, requests, seed);
    let at_star = sims[3].1;
    assert!(
        at_star > none.hit_rate * 1.10,
        "{at_star} vs no filter {}",
        none.hit_rate
    );
    assert!(best_hit >= at_star);
    // And the simulation agrees with Che where the filter does not matter.
    let che_none = model.hit_rate_no_filter(c2 as f64);
    assert!(
        (none.hit_rate - che_none).abs() < 0.005,
        "{} vs {che_none}",
        none.hit_rate
    );
    eprintln!(
        "{sims:?}, no filter {:.4}, {:?}",
        none.hit_rate,
        start.elapsed()
    );
}
