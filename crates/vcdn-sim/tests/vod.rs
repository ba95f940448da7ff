//! The sites' VoD layer against Che's approximation: Zipf requests through
//! vcdn's LRU admission filter and an LRU store, run by the engine, hit as
//! often as `vcdn_model::filter::FiniteModel` (the numbers of
//! reproduce/lru-filter) says.

use std::collections::HashMap;

use vcdn_model::filter::FiniteModel;
use vcdn_sim::cache::Served;
use vcdn_sim::engine::{CachePolicy, Config, Outcome, Scaling, Sim, Sites, VodPolicy};
use vcdn_sim::graph::AsGraph;
use vcdn_sim::workload::{Vod, Workload};

const ALPHA: f64 = 0.9;
const TITLES: u32 = 10_000;
const STORE: usize = 100; // δ2 = 1 %

fn run(filter: Option<usize>) -> Outcome {
    let g = AsGraph::chain();
    let cfg = Config {
        // 200 short VoD sessions a second for 600 s: 120,000 requests.
        workload: Workload {
            rate: 200.0,
            arrivals_s: 600.0,
            session_s: (1.0, 2.0, 3.0),
            vod: Some(Vod {
                share: 1.0,
                titles: TITLES,
                zipf: ALPHA,
            }),
            ..Workload::paper()
        },
        caches: CachePolicy {
            sites: Some(Sites {
                per_instance_bps: 1e12,
                instance_link_bps: 1e12,
                scaling: Scaling::Fixed(HashMap::from([(2, 1)])),
            }),
            vod: Some(VodPolicy {
                cache_titles: STORE,
                filter_titles: filter,
            }),
            ..CachePolicy::default()
        },
        ..Config::default()
    };
    Sim::new(&g, cfg).unwrap().run(0, |_| {})
}

/// Share of hits among the requests after the first 100 s (warm-up).
fn hit_rate(out: &Outcome) -> (f64, f64) {
    let measured: Vec<_> = out
        .sessions
        .iter()
        .filter(|s| s.request_ns >= 100_000_000_000)
        .collect();
    assert!(measured.len() > 90_000, "{}", measured.len());
    assert!(measured.iter().all(|s| s.title.is_some()));
    let n = measured.len() as f64;
    let hits = measured
        .iter()
        .filter(|s| s.vod == Some(Served::Hit))
        .count() as f64;
    let edge = measured
        .iter()
        .filter(|s| matches!(s.vod, Some(Served::Hit | Served::Miss)))
        .count() as f64;
    (hits / n, edge / n)
}

#[test]
fn the_vod_cache_hits_as_che_predicts_with_and_without_the_filter() {
    let mut che = FiniteModel::new(ALPHA, TITLES as usize);
    // Tolerance 1 point: the binomial standard error of ~100,000 requests
    // is ~0.15 point, and Che's own error at these sizes is below 0.2
    // point where it applies (reproduce/lru-filter/tables.md).
    // No filter and small filters (δ1 ≤ δ2: Che's regime) …
    for filter in [None, Some(10), Some(100)] {
        let out = run(filter);
        let (hit, edge) = hit_rate(&out);
        let want = che.evaluate(filter.map_or(f64::INFINITY, |c| c as f64), STORE as f64);
        assert!(
            (hit - want.hit_rate).abs() < 0.01,
            "filter {filter:?}: simulated {hit:.4}, Che {:.4}",
            want.hit_rate
        );
        assert!(
            (edge - want.edge_share).abs() < 0.01,
            "filter {filter:?}: to the edge {edge:.4}, Che {:.4}",
            want.edge_share
        );
    }
    // … and a large one (δ1 = 10 %), where the filter's bursty output
    // needs the renewal variant.
    let out = run(Some(1_000));
    let (hit, _) = hit_rate(&out);
    let want = che
        .evaluate_renewal(1_000.0, STORE as f64)
        .expect("t2 ≤ t1 at δ1 = 10 %");
    assert!(
        (hit - want.hit_rate).abs() < 0.01,
        "filter 1000: simulated {hit:.4}, renewal {:.4}",
        want.hit_rate
    );
}
