//! vcdn's cache sites in the simulator: a site's instances bound what its
//! viewers get, and vcdn's own autoscaler (`vcdn-policy`) sizes the site
//! from the load as the control plane does live.

use std::collections::HashMap;

use vcdn_policy::autoscale::Autoscaler;
use vcdn_sim::engine::{CachePolicy, Config, Outcome, Scaling, Sim, Sites};
use vcdn_sim::graph::AsGraph;
use vcdn_sim::workload::Workload;

/// One viewer a second for `arrivals_s`, 60–600 s sessions: about 320
/// concurrent viewers and 1.7 Gb/s of video at the steady state.
fn config(arrivals_s: f64, sites: Sites) -> Config {
    Config {
        workload: Workload {
            rate: 1.0,
            arrivals_s,
            session_s: (60.0, 300.0, 600.0),
            ..Workload::paper()
        },
        caches: CachePolicy {
            boot_ns: 1_000_000_000,
            sites: Some(sites),
            ..CachePolicy::default()
        },
        sample_ns: 1_000_000_000,
        ..Config::default()
    }
}

fn fixed(instances: u32, per_instance_bps: f64) -> Sites {
    let access = 2; // the access AS's node
    Sites {
        per_instance_bps,
        instance_link_bps: per_instance_bps,
        scaling: Scaling::Fixed(HashMap::from([(access, instances)])),
    }
}

fn run(cfg: Config) -> Outcome {
    Sim::new(&AsGraph::chain(), cfg).unwrap().run(0, |_| {})
}

fn stalled_share(out: &Outcome) -> f64 {
    out.sessions.iter().filter(|s| s.stalls > 0).count() as f64 / out.sessions.len() as f64
}

#[test]
fn a_fixed_site_carries_no_more_than_its_instances_and_enough_of_them_never_stall() {
    let per = 500e6;
    let small = run(config(900.0, fixed(1, per)));
    let big = run(config(900.0, fixed(8, per)));
    assert_eq!(small.unfinished + big.unfinished, 0);
    assert!(small.sessions.iter().all(|s| s.from_cache));
    // One instance of 500 Mb/s against ~1.7 Gb/s: it is full, never over.
    let carried: Vec<f64> = small.timeline.iter().map(|s| s.viewer_bps).collect();
    let max = carried.iter().cloned().fold(0.0, f64::max);
    assert!(max <= per * (1.0 + 1e-9), "carried {max} > {per}");
    assert!(max > per * 0.99, "the site never filled: {max}");
    assert!(stalled_share(&small) > 0.5, "{}", stalled_share(&small));
    // Eight: 4 Gb/s, over twice the demand: nobody stalls, nobody starts
    // sooner than its line hop and buffer at the line rate allow, and a
    // viewer whose channel and quality the site already fetches starts
    // exactly then (the others wait for the site's feed to fill first).
    assert_eq!(big.sessions.iter().map(|s| s.stalls).sum::<u32>(), 0);
    let floor = |s: &vcdn_sim::qoe::SessionQoe| 0.010 + 10.0 * s.quality_bps / 25e6;
    assert!(big.sessions.iter().all(|s| s.start_s() >= floor(s) - 1e-6));
    let on_time = big
        .sessions
        .iter()
        .filter(|s| (s.start_s() - floor(s)).abs() < 1e-6)
        .count();
    assert!(
        on_time * 2 > big.sessions.len(),
        "{on_time}/{}",
        big.sessions.len()
    );
    // A fixed site runs from the start to the end.
    let secs = big.end_ns as f64 / 1e9;
    assert!(
        (big.vm_seconds - 8.0 * secs).abs() < 1e-6 * secs,
        "{}",
        big.vm_seconds
    );
}

#[test]
fn the_autoscaler_keeps_a_site_within_its_band_and_costs_less_than_the_peak() {
    let per = 200e6;
    let a = Autoscaler::default();
    let sites = Sites {
        per_instance_bps: per,
        instance_link_bps: per,
        scaling: Scaling::Autoscaled {
            autoscaler: a,
            every_ns: 1_000_000_000,
            phase_ns: 0,
            min: 1,
            max: 64,
        },
    };
    let out = run(config(1_200.0, sites.clone()));
    assert_eq!(out.unfinished, 0);
    // The steady state: utilisation of the running instances (demand over
    // their capacity) inside the autoscaler's band almost always, and
    // never far over capacity.
    let steady: Vec<f64> = out
        .timeline
        .iter()
        .filter(|s| (400e9..1_100e9).contains(&(s.at_ns as f64)))
        .map(|s| s.site_demand_bps / (s.vms as f64 * per))
        .collect();
    let inside = steady
        .iter()
        .filter(|&&u| (a.low..=a.high).contains(&u))
        .count();
    assert!(
        inside as f64 >= 0.9 * steady.len() as f64,
        "{inside}/{} inside [{}, {}]",
        steady.len(),
        a.low,
        a.high
    );
    let worst = steady.iter().cloned().fold(0.0, f64::max);
    assert!(worst < 1.0, "utilisation reached {worst}");
    let peak = out.timeline.iter().map(|s| s.vms).max().unwrap();
    assert!(
        (10..=20).contains(&peak),
        "peak {peak} instances for ~1.7 Gb/s"
    );
    // Few viewers stall: the band leaves a quarter of the capacity free.
    assert!(stalled_share(&out) < 0.05, "{}", stalled_share(&out));
    // Instance-seconds: the timeline (1 s samples) integrates to them, and
    // they are well under the peak held for the whole run.
    let integral: f64 = out.timeline.iter().map(|s| s.vms as f64).sum();
    assert!(
        (integral - out.vm_seconds).abs() < 0.02 * out.vm_seconds,
        "{integral} vs {}",
        out.vm_seconds
    );
    let secs = out.end_ns as f64 / 1e9;
    assert!(
        out.vm_seconds < 0.8 * peak as f64 * secs,
        "{} vs peak {peak}",
        out.vm_seconds
    );
    // The run drained: the site stopped with its last viewer.
    assert_eq!(out.timeline.last().unwrap().sessions, 0);
    // Deterministic for a seed.
    let again = run(config(1_200.0, sites));
    assert_eq!(again.vm_seconds, out.vm_seconds);
    assert_eq!(again.events, out.events);
}
