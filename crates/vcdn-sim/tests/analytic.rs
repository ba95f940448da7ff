//! The simulator against closed forms: start times without congestion,
//! Little's law, the number of concurrent caches per AS, the two boot
//! semantics, capacity never exceeded, and determinism.

use vcdn_sim::engine::{BootSemantics, CachePolicy, Config, Outcome, Sim};
use vcdn_sim::graph::{AsGraph, Capacities};
use vcdn_sim::workload::{Workload, QUALITIES_BPS};

fn workload(rate: f64, arrivals_s: f64) -> Workload {
    Workload {
        rate,
        arrivals_s,
        session_s: (60.0, 300.0, 600.0),
        ..Workload::paper()
    }
}

fn run(g: &AsGraph, cfg: Config) -> Outcome {
    Sim::new(g, cfg).unwrap().run(0, |_| {})
}

/// Two viewers a second behind a 1 Gb/s access link: it saturates.
fn congested() -> Config {
    Config {
        workload: workload(2.0, 600.0),
        capacities: Capacities {
            access_bps: 1e9,
            ..Capacities::default()
        },
        ..Config::default()
    }
}

/// Time-average of a timeline column over [from, to] seconds.
fn mean_over(
    out: &Outcome,
    from: f64,
    to: f64,
    f: impl Fn(&vcdn_sim::engine::Sample) -> f64,
) -> f64 {
    let xs: Vec<f64> = out
        .timeline
        .iter()
        .filter(|s| (from * 1e9..=to * 1e9).contains(&(s.at_ns as f64)))
        .map(f)
        .collect();
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn uncongested_start_time_is_the_buffer_over_the_line_rate() {
    let g = AsGraph::chain();
    let out = run(
        &g,
        Config {
            workload: workload(1.0, 600.0),
            ..Config::default()
        },
    );
    assert!(out.sessions.len() > 500, "{}", out.sessions.len());
    assert_eq!(out.unfinished, 0);
    // Two AS hops and the user's line at 10 ms each, then 10 s of video at 25 Mb/s.
    for s in &out.sessions {
        let want = 0.030 + 10.0 * s.quality_bps / 25e6;
        assert!(
            (s.start_s() - want).abs() < 1e-6,
            "{} vs {want}",
            s.start_s()
        );
        assert_eq!(s.stalls, 0);
        assert_eq!(
            s.buffering_ns, s.start_ns,
            "no stall: only the start-up wait"
        );
        assert!(s.playback_ratio() >= 1.0 - 1e-9, "{}", s.playback_ratio());
        assert!(!s.from_cache);
    }
    // Every quality occurs: 0.4, 1, 2, 3.2, 4 and 8 s (+ 30 ms).
    for v in QUALITIES_BPS {
        assert!(out.sessions.iter().any(|s| s.quality_bps == v), "{v}");
    }
}

#[test]
fn concurrent_sessions_follow_littles_law() {
    let g = AsGraph::chain();
    let w = workload(10.0, 3_000.0);
    // ~3,200 viewers at 5.3 Mb/s on average: give the access link room.
    let out = run(
        &g,
        Config {
            workload: w.clone(),
            capacities: Capacities {
                access_bps: 100e9,
                ..Capacities::default()
            },
            ..Config::default()
        },
    );
    // L = λ W, with W the mean session length plus the mean start time.
    let mean_start: f64 =
        out.sessions.iter().map(|s| s.start_s()).sum::<f64>() / out.sessions.len() as f64;
    let want = w.rate * (w.mean_session_s() + mean_start);
    let got = mean_over(&out, 700.0, 3_000.0, |s| s.sessions as f64);
    assert!((got / want - 1.0).abs() < 0.03, "L {got} vs λW {want}");
}

#[test]
fn concurrent_caches_per_as_match_the_occupancy_formula() {
    let g = AsGraph::chain();
    for rate in [0.3, 3.0] {
        let w = workload(rate, 3_000.0);
        let sim = Sim::new(
            &g,
            Config {
                workload: w.clone(),
                caches: CachePolicy {
                    on_demand: true,
                    boot_ns: 0,
                    ..CachePolicy::default()
                },
                ..Config::default()
            },
        )
        .unwrap();
        let p: Vec<f64> = (0..w.channels)
            .map(|c| sim.requests().channel_p(c))
            .collect();
        let out = sim.run(0, |_| {});
        let viewers = mean_over(&out, 700.0, 3_000.0, |s| s.sessions as f64);
        // A channel's viewers in the AS are Poisson with mean Λ p_c (M/G/∞);
        // its cache runs while there is at least one.
        let want: f64 = p.iter().map(|pc| 1.0 - (-viewers * pc).exp()).sum();
        let got = mean_over(&out, 700.0, 3_000.0, |s| s.vms as f64);
        assert!(
            (got / want - 1.0).abs() < 0.04,
            "rate {rate}: Λ {viewers:.0}, VMs {got:.1} vs {want:.1}"
        );
        assert!(out.sessions.iter().all(|s| s.from_cache));
    }
}

#[test]
fn while_a_cache_boots_requests_wait_or_go_to_the_origin() {
    let g = AsGraph::chain();
    let cfg = |boot| Config {
        workload: workload(2.0, 300.0),
        caches: CachePolicy {
            on_demand: true,
            boot_ns: 5_000_000_000,
            boot,
            ..CachePolicy::default()
        },
        ..Config::default()
    };
    let wait = run(&g, cfg(BootSemantics::Wait));
    let origin = run(&g, cfg(BootSemantics::Origin));
    // The first request waits for the boot, then for the cache to hold
    // 10 s of video, then fills its own buffer.
    let first = &wait.sessions[0];
    assert!(first.from_cache && first.start_s() > 5.0, "{first:?}");
    assert!(wait.sessions.iter().all(|s| s.from_cache));
    let first = &origin.sessions[0];
    let uncongested = 0.030 + 10.0 * first.quality_bps / 25e6;
    assert!(
        !first.from_cache && (first.start_s() - uncongested).abs() < 1e-6,
        "{first:?}"
    );
    let by_origin = origin.sessions.iter().filter(|s| !s.from_cache).count();
    assert!(by_origin > 0 && by_origin < origin.sessions.len());
    // Same users either way.
    assert_eq!(wait.sessions.len(), origin.sessions.len());
    for (a, b) in wait.sessions.iter().zip(&origin.sessions) {
        assert_eq!(
            (a.request_ns, a.channel, a.quality_bps),
            (b.request_ns, b.channel, b.quality_bps)
        );
    }
}

#[test]
fn a_congested_access_link_never_carries_more_than_its_capacity_and_players_stall() {
    let g = AsGraph::chain();
    let cfg = Config {
        sample_ns: 1_000_000_000,
        ..congested()
    };
    let out = run(&g, cfg.clone());
    let peak = out
        .timeline
        .iter()
        .map(|s| s.viewer_bps)
        .fold(0.0, f64::max);
    assert!(peak <= 1e9 * (1.0 + 1e-9), "{peak}");
    assert!(peak > 0.99e9, "the link is saturated: {peak}");
    assert!(out.sessions.iter().any(|s| s.stalls > 0));
    assert!(out.sessions.iter().any(|s| s.playback_ratio() < 1.0));
    // Deterministic for a seed.
    let again = run(&g, cfg);
    assert_eq!(out.sessions, again.sessions);
    assert_eq!(out.events, again.events);
}

#[test]
fn settling_once_per_epoch_ends_and_stays_close_to_exact() {
    let g = AsGraph::chain();
    let cfg = congested();
    let exact = run(&g, cfg.clone());
    let epoch = run(
        &g,
        Config {
            epoch_ns: 10_000_000,
            ..cfg
        },
    );
    assert_eq!(epoch.unfinished, 0);
    assert_eq!(epoch.sessions.len(), exact.sessions.len());
    // It ends when the last session does, not later.
    let last = |o: &Outcome| {
        o.sessions
            .iter()
            .map(|s| s.request_ns + s.buffering_ns + s.playing_ns)
            .max()
            .unwrap()
    };
    assert!(
        epoch.end_ns <= last(&epoch) + 20_000_000_000,
        "{} vs {}",
        epoch.end_ns,
        last(&epoch)
    );
    let mean =
        |o: &Outcome| o.sessions.iter().map(|s| s.start_s()).sum::<f64>() / o.sessions.len() as f64;
    assert!(
        (mean(&epoch) / mean(&exact) - 1.0).abs() < 0.05,
        "{} vs {}",
        mean(&epoch),
        mean(&exact)
    );
}

#[test]
fn static_caches_stay_and_idle_caches_wait_before_teardown() {
    let g = AsGraph::chain();
    let base = Config {
        workload: workload(0.2, 1_200.0),
        ..Config::default()
    };
    // Every access AS static: every session from a cache, one VM per
    // channel seen, never torn down before the end.
    let fixed = run(
        &g,
        Config {
            caches: CachePolicy {
                static_share: 1.0,
                ..CachePolicy::default()
            },
            ..base.clone()
        },
    );
    let channels: std::collections::BTreeSet<u32> =
        fixed.sessions.iter().map(|s| s.channel).collect();
    assert!(fixed.sessions.iter().all(|s| s.from_cache));
    assert_eq!(fixed.vms.len(), channels.len());
    assert!(fixed
        .vms
        .iter()
        .all(|v| v.4 >= fixed.end_ns - 1_200_000_000_000));
    // On demand: an idle time keeps VMs for returning viewers, so fewer
    // are started, and each lives longer.
    let on_demand = |idle_ns| {
        run(
            &g,
            Config {
                caches: CachePolicy {
                    on_demand: true,
                    idle_ns,
                    ..CachePolicy::default()
                },
                ..base.clone()
            },
        )
    };
    let (at_once, idle) = (on_demand(0), on_demand(600_000_000_000));
    assert!(
        idle.vms.len() < at_once.vms.len(),
        "{} vs {}",
        idle.vms.len(),
        at_once.vms.len()
    );
    assert!(idle.vm_seconds > at_once.vm_seconds);
    assert_eq!(idle.sessions.len(), at_once.sessions.len());
}
