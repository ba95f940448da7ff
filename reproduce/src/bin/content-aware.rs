//! Re-makes the content-aware data-plane paper's testbed results (§V) on
//! vcdn's SRv6 data path, scaled to one machine (see
//! `reproduce/content-aware/README.md` for what was scaled).
//!
//! ```text
//! cargo build --release -p vcdn && \
//! cargo run --release -p vcdn-reproduce --bin content-aware -- table3|fig9|fig12|edge-cost|dispatcher-cost|compare
//!     [--quick] [--edge-cpus X] [--clients N] [--client-counts 4,8,16] [--client-ms D]
//!     [--alpha 0.8,0.9]
//! ```
//! Needs root. Markdown on stdout, progress on stderr, raw JSON lines in
//! `reproduce/content-aware/raw/`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use vcdn_reproduce::content_aware::{out_dir, run, Form, RunResult, RunSpec};

/// Table III of the paper: α, hit rate (filter, baseline) %, mean chunk
/// load time (filter, baseline) ms, edge CPU (filter, baseline) %.
const PAPER_TABLE3: [(f64, f64, f64, f64, f64, f64, f64); 4] = [
    (0.8, 30.0, 21.9, 379.0, 755.0, 49.0, 83.5),
    (0.9, 47.0, 38.6, 220.0, 345.0, 54.4, 85.9),
    (1.0, 65.3, 59.5, 139.0, 189.0, 56.8, 83.9),
    (1.1, 81.8, 77.8, 85.6, 107.0, 53.8, 74.4),
];

struct Scale {
    edge_cpus: Option<f64>,
    client_ms: u64,
    catalogue: u64,
    cache_chunks: u64,
    object_bytes: u64,
    clients: usize,
    warmup: u64,
    requests: u64,
}

fn scale(quick: bool) -> Scale {
    if quick {
        Scale {
            edge_cpus: None,
            client_ms: 0,
            catalogue: 5_000,
            cache_chunks: 50,
            object_bytes: 20_000,
            clients: 16,
            warmup: 5_000,
            requests: 5_000,
        }
    } else {
        Scale {
            edge_cpus: None,
            client_ms: 0,
            catalogue: 20_000,
            cache_chunks: 200,
            object_bytes: 20_000,
            clients: 16,
            warmup: 20_000,
            requests: 20_000,
        }
    }
}

/// The model's optimal filter size C1 (eq. 11) at this scale.
fn optimal_filter(s: &Scale, alpha: f64) -> u64 {
    vcdn_model::filter::filter_capacity(alpha, s.catalogue as f64, s.cache_chunks as f64) as u64
}

fn spec(s: &Scale, alpha: f64, filter: Option<u64>) -> RunSpec {
    RunSpec {
        alpha,
        catalogue: s.catalogue,
        cache_chunks: s.cache_chunks,
        filter,
        object_bytes: s.object_bytes,
        clients: s.clients,
        edge_cpus: s.edge_cpus,
        warmup: s.warmup,
        requests: s.requests,
        seed: 1,
        dispatcher_flows: 262_144,
        client_ms: s.client_ms,
        form: Form::Srv6,
    }
}

fn vcdn() -> PathBuf {
    std::env::var_os("VCDN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/vcdn"))
}

fn record(name: &str, r: &RunResult) {
    let dir = out_dir().join("raw");
    let _ = std::fs::create_dir_all(&dir);
    let line = serde_json::json!({
        "alpha": r.spec.alpha, "catalogue": r.spec.catalogue, "cache_chunks": r.spec.cache_chunks,
        "filter": r.spec.filter, "object_bytes": r.spec.object_bytes, "clients": r.spec.clients,
        "edge_cpus": r.spec.edge_cpus, "form": format!("{:?}", r.spec.form),
        "client_ms": r.spec.client_ms,
        "warmup": r.spec.warmup, "requests": r.spec.requests,
        "edge_cpu_s": r.edge_cpu_s, "edge_kernel_s": r.edge_kernel_s, "wall_s": r.wall_s,
        "cache_objects": r.cache_objects,
        "report": r.report,
    });
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.jsonl")))
    {
        let _ = writeln!(f, "{line}");
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let what = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_default();
    let mut s = scale(quick);
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(v) = value("--edge-cpus") {
        s.edge_cpus = v.parse().ok();
    }
    if let Some(v) = value("--client-ms") {
        s.client_ms = v.parse().unwrap_or(0);
    }
    if let Some(v) = value("--clients") {
        s.clients = v.parse().unwrap_or(s.clients);
    }
    let alphas: Vec<f64> = value("--alpha").map_or(vec![0.8, 0.9, 1.0, 1.1], |v| {
        v.split(',').filter_map(|a| a.parse().ok()).collect()
    });
    let work = std::env::temp_dir().join(format!("vcdn-content-aware-{}", std::process::id()));
    let go = |name: &str, sp: RunSpec| -> Result<RunResult, String> {
        eprintln!("{name}: α {} filter {:?} …", sp.alpha, sp.filter);
        let r = run(&vcdn(), &sp, &work)?;
        eprintln!(
            "  hit {:.1} %  mean {:.1} ms  edge CPU {:.1} %  ({} objects cached)",
            100.0 * r.hit_rate(),
            r.load_ms("all", "mean_ms"),
            r.edge_cpu_pct(),
            r.cache_objects
        );
        record(name, &r);
        Ok(r)
    };
    let result = match what.as_str() {
        "table3" => (|| -> Result<(), String> {
            println!("| α | C1 (δ1) | hit % filter / baseline | paper | mean load ms filter / baseline | paper | edge CPU % filter / baseline | paper |");
            println!("|---|---|---|---|---|---|---|---|");
            for (alpha, ph_f, ph_b, pl_f, pl_b, pc_f, pc_b) in
                PAPER_TABLE3.into_iter().filter(|r| alphas.contains(&r.0))
            {
                let c1 = optimal_filter(&s, alpha);
                let f = go("table3", spec(&s, alpha, Some(c1)))?;
                let b = go("table3", spec(&s, alpha, None))?;
                println!(
                    "| {alpha} | {c1} ({:.3}) | {:.1} / {:.1} | {ph_f} / {ph_b} | {:.0} / {:.0} | {pl_f} / {pl_b} | {:.1} / {:.1} | {pc_f} / {pc_b} |",
                    c1 as f64 / s.catalogue as f64,
                    100.0 * f.hit_rate(),
                    100.0 * b.hit_rate(),
                    f.load_ms("all", "mean_ms"),
                    b.load_ms("all", "mean_ms"),
                    f.edge_cpu_pct(),
                    b.edge_cpu_pct(),
                );
            }
            Ok(())
        })(),
        "fig9" => (|| -> Result<(), String> {
            // Fig 9 (hit rate vs δ1 beside the model and the IRM simulation
            // of the real LruFilter, `vcdn_reproduce::irm`) and, at α = 0.9,
            // Fig 11 (edge CPU vs δ1): the same runs, and the baseline
            // without a filter last.
            println!("| α | δ1 | C1 | hit % (test bed) | hit % (model) | hit % (simulation) | edge CPU % | mean load ms |");
            println!("|---|---|---|---|---|---|---|---|");
            for alpha in alphas.iter().copied().filter(|a| *a == 0.8 || *a == 0.9) {
                let zipf = vcdn_reproduce::irm::Zipf::new(alpha, s.catalogue as usize);
                for d1 in [0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.10, f64::INFINITY] {
                    let filter = d1
                        .is_finite()
                        .then(|| ((d1 * s.catalogue as f64).round() as u64).max(1));
                    let r = go("fig9", spec(&s, alpha, filter))?;
                    let model = vcdn_model::filter::FiniteModel::new(alpha, s.catalogue as usize)
                        .evaluate(
                            filter.unwrap_or(s.catalogue) as f64,
                            s.cache_chunks as f64,
                        )
                        .hit_rate;
                    let sim = vcdn_reproduce::irm::simulate(
                        &zipf,
                        filter.map_or(vcdn_reproduce::irm::Filter::None, |c| {
                            vcdn_reproduce::irm::Filter::Lru(c as usize)
                        }),
                        s.cache_chunks as usize,
                        1_000_000,
                        2019,
                    )
                    .hit_rate;
                    println!(
                        "| {alpha} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
                        filter.map_or("no filter".to_string(), |_| d1.to_string()),
                        filter.map_or("–".to_string(), |c| c.to_string()),
                        100.0 * r.hit_rate(),
                        100.0 * model,
                        100.0 * sim,
                        r.edge_cpu_pct(),
                        r.load_ms("all", "mean_ms"),
                    );
                }
            }
            Ok(())
        })(),
        "fig12" => (|| -> Result<(), String> {
            // Load time against concurrent clients, the optimal filter
            // against none (the paper: α = 0.9, δ1* = 0.06).
            let alpha = alphas.first().copied().unwrap_or(0.9);
            let c1 = optimal_filter(&s, alpha);
            let counts: Vec<usize> = value("--client-counts").map_or(vec![4, 8, 16, 24, 32, 48, 64], |v| {
                v.split(',').filter_map(|a| a.parse().ok()).collect()
            });
            println!("| clients | filter p10 / p50 / p90 ms | hit % | edge CPU % | no filter p10 / p50 / p90 ms | hit % | edge CPU % |");
            println!("|---|---|---|---|---|---|---|");
            for n in counts {
                let mut sf = spec(&s, alpha, Some(c1));
                sf.clients = n;
                let f = go("fig12", sf)?;
                let mut sb = spec(&s, alpha, None);
                sb.clients = n;
                let b = go("fig12", sb)?;
                let cell = |r: &RunResult| {
                    format!(
                        "{:.0} / {:.0} / {:.0} | {:.1} | {:.1}",
                        r.load_ms("all", "p10_ms"),
                        r.load_ms("all", "p50_ms"),
                        r.load_ms("all", "p90_ms"),
                        100.0 * r.hit_rate(),
                        r.edge_cpu_pct()
                    )
                };
                println!("| {n} | {} | {} |", cell(&f), cell(&b));
            }
            Ok(())
        })(),
        "dispatcher-cost" => (|| -> Result<(), String> {
            let packets: u64 = if quick { 50_000 } else { 400_000 };
            let mut sp = spec(&s, 0.9, Some(100));
            sp.dispatcher_flows = 65_536;
            let r = vcdn_reproduce::content_aware::dispatcher_cost(&vcdn(), &sp, packets, &work)?;
            println!("| SYNs | dispatch runs | ns per packet | packets per CPU-second (program) | machine CPU-s | learnt | flows / capacity | router RSS kB before → after |");
            println!("|---|---|---|---|---|---|---|---|");
            println!(
                "| {} | {} | {:.0} | {:.2e} | {:.1} | {} | {} / {} | {} → {} |",
                r.packets,
                r.runs,
                1e9 * r.program_s / r.runs.max(1) as f64,
                r.program_pps_per_cpu_s(),
                r.machine_cpu_s,
                r.learnt,
                r.flows,
                r.flow_capacity,
                r.rss_before_kb,
                r.rss_after_kb
            );
            Ok(())
        })(),
        "edge-cost" => (|| -> Result<(), String> {
            // What a rejected chunk costs the edge against a proxied miss,
            // for each form, in dedicated runs: every chunk rejected
            // (filter size 0), then every chunk proxied (no filter, a
            // near-uniform (Zipf 0.01) catalogue 100 times the cache: about 1 % hits). The edge's
            // cost is its cache's CPU time plus its agent's programs in the
            // kernel (timed while kernel.bpf_stats_enabled is 1).
            const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
            let before = std::fs::read_to_string(STATS).unwrap_or_else(|_| "0".into());
            std::fs::write(STATS, "1").map_err(|e| format!("{STATS}: {e}"))?;
            let us = |r: &RunResult| {
                let n = r.report["requests"].as_f64().unwrap_or(1.0).max(1.0);
                1e6 * (r.edge_cpu_s + r.edge_kernel_s) / n
            };
            println!("| form | edge µs per rejected chunk (of which kernel) | edge µs per proxied miss | ratio | rejected chunk p50 / p90 ms | origin directly p50 / p90 ms |");
            println!("|---|---|---|---|---|---|");
            let mut direct = spec(&s, 0.01, None);
            direct.form = Form::Direct;
            let d = go("edge-cost", direct)?;
            let result = (|| -> Result<(), String> {
                for (name, form) in [
                    ("SRv6 (kernel)", Form::Srv6),
                    ("router 302", Form::RouterRedirect),
                    ("cache 302", Form::CacheRedirect),
                ] {
                    let mut rejected = spec(&s, 0.01, Some(0));
                    rejected.form = form;
                    let r = go("edge-cost", rejected)?;
                    let mut proxied = spec(&s, 0.01, None);
                    proxied.form = form;
                    let m = go("edge-cost", proxied)?;
                    let n = r.report["requests"].as_f64().unwrap_or(1.0).max(1.0);
                    println!(
                        "| {name} | {:.1} ({:.1}) | {:.1} | {:.1} % | {:.1} / {:.1} | {:.1} / {:.1} |",
                        us(&r),
                        1e6 * r.edge_kernel_s / n,
                        us(&m),
                        100.0 * us(&r) / us(&m).max(1e-9),
                        r.load_ms("all", "p50_ms"),
                        r.load_ms("all", "p90_ms"),
                        d.load_ms("all", "p50_ms"),
                        d.load_ms("all", "p90_ms"),
                    );
                }
                Ok(())
            })();
            let _ = std::fs::write(STATS, before.trim());
            result
        })(),
        "compare" => (|| -> Result<(), String> {
            // The three forms of the filter in one run, same bed and stream,
            // and the origin alone as the yardstick of a rejected chunk.
            let alpha = alphas.first().copied().unwrap_or(0.9);
            let c1 = optimal_filter(&s, alpha);
            println!("| form | hit % | edge hit p50 ms | edge miss p50 / p90 ms | origin p50 / p90 ms | edge CPU ms per 1000 requests | redirects |");
            println!("|---|---|---|---|---|---|---|");
            for (name, form) in [
                ("SRv6 (kernel)", Form::Srv6),
                ("router 302", Form::RouterRedirect),
                ("cache 302", Form::CacheRedirect),
                ("origin only", Form::Direct),
            ] {
                let mut sp = spec(&s, alpha, Some(c1));
                sp.form = form;
                let r = go("compare", sp)?;
                let n = r.report["requests"].as_f64().unwrap_or(1.0).max(1.0);
                println!(
                    "| {name} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.0} | {} |",
                    100.0 * r.hit_rate(),
                    r.load_ms("edge_hit", "p50_ms"),
                    r.load_ms("edge_miss", "p50_ms"),
                    r.load_ms("edge_miss", "p90_ms"),
                    r.load_ms("origin", "p50_ms"),
                    r.load_ms("origin", "p90_ms"),
                    1e6 * r.edge_cpu_s / n,
                    r.report["redirects"]
                );
            }
            Ok(())
        })(),
        _ => Err("usage: content-aware table3|fig9|fig12|edge-cost|dispatcher-cost|compare [--quick] [--edge-cpus X] [--clients N] [--client-counts 4,8,..] [--client-ms D] [--alpha A,..]".into()),
    };
    let _ = std::fs::remove_dir_all(&work);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("content-aware: {e}");
            ExitCode::FAILURE
        }
    }
}
