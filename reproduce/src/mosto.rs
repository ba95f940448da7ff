//! MOSTO's Fig. 3 and runtime claim (Sciancalepore et al., JSAC 2017,
//! §V-A) with `vcdn_policy::chains`: on real topologies completed to full
//! meshes, how much slower the shortest-path and the minimax-path chains
//! are than MOSTO's choice at 1, 5 and 10 slow-start rounds, how many
//! proxies MOSTO's choice uses against minimax's, and how long the
//! all-pairs computation takes.

use std::fmt::Write;
use std::path::Path;
use std::time::Instant;

use vcdn_policy::chains::{ChainTable, RttMatrix};

use crate::svg::{Chart, Series, Style};

/// The rounds of the paper's Fig. 3 a, b, c.
pub const ROUNDS: [u32; 3] = [1, 5, 10];

/// One topology's results.
#[derive(Debug, Clone)]
pub struct Graph {
    pub name: String,
    /// Nodes with at least one link.
    pub nodes: usize,
    /// Connected components.
    pub components: usize,
    /// Ordered pairs with a path (the ones compared).
    pub pairs: usize,
    /// Directed links of the completed mesh.
    pub links: usize,
    /// Best of a few `ChainTable::build` runs, ms.
    pub build_ms: f64,
    /// Mean and largest Pareto front size over the pairs.
    pub front_mean: f64,
    pub front_max: usize,
}

/// Per rounds class: relative slowdowns (%) of the other algorithms'
/// chains against MOSTO's, over every pair of every graph, and proxy counts.
#[derive(Debug, Clone, Default)]
pub struct Class {
    pub rounds: u32,
    /// (T_shortest − T_mosto) / T_mosto × 100, shortest = min Σ with the
    /// fewest hops (in a shortest-path closure: the direct link).
    pub shortest: Vec<f64>,
    /// The same with the min-Σ path of least max RTT (a generous
    /// tie-break for the shortest path).
    pub shortest_split: Vec<f64>,
    /// Minimax: least max RTT, ties by Σ, then fewest hops.
    pub minimax: Vec<f64>,
    /// Transport proxies (nodes between the ends) of MOSTO's and
    /// minimax's chains, summed over the pairs.
    pub proxies_mosto: u64,
    pub proxies_minimax: u64,
    /// Pairs where MOSTO's chain uses fewer / more proxies than minimax's.
    pub fewer: u64,
    pub more: u64,
}

/// Everything the figure and tables need.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub graphs: Vec<Graph>,
    pub classes: Vec<Class>,
    /// Pairs left out because MOSTO's time is 0 (zero-delay links).
    pub zero_pairs: u64,
    /// Edge lists skipped as exact duplicates of an earlier one.
    pub duplicates: Vec<String>,
    /// Edge lists that could not be used (e.g. no links).
    pub unreadable: Vec<String>,
}

fn time_of(sum: f64, max: f64, r: u32) -> f64 {
    sum / 2.0 + (r - 1) as f64 * max
}

/// Runs the comparison on every `PREFIX*.edges.csv` of `dir` whose graph
/// has `min_nodes ..= max_nodes` nodes.
pub fn run(
    dir: &Path,
    prefix: &str,
    min_nodes: usize,
    max_nodes: usize,
) -> Result<Results, String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let f = p.file_name().unwrap_or_default().to_string_lossy();
            f.starts_with(prefix) && f.ends_with(".edges.csv")
        })
        .collect();
    files.sort();
    let mut res = Results {
        classes: ROUNDS
            .iter()
            .map(|&rounds| Class {
                rounds,
                ..Class::default()
            })
            .collect(),
        ..Results::default()
    };
    let mut seen = std::collections::HashMap::new();
    for path in files {
        let name = path
            .file_name()
            .map(|f| {
                f.to_string_lossy()
                    .trim_end_matches(".edges.csv")
                    .to_string()
            })
            .unwrap_or_default();
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let m = match RttMatrix::from_topology(&text) {
            Ok(m) => m,
            Err(e) => {
                res.unreadable.push(format!("{name} ({e})"));
                continue;
            }
        };
        if !(min_nodes..=max_nodes).contains(&m.len()) {
            continue;
        }
        if let Some(first) = seen.insert(text.clone(), name.clone()) {
            res.duplicates.push(format!("{name} (= {first})"));
            continue;
        }
        res.graphs.push(compare(
            &name,
            &m,
            Some((&mut res.classes, &mut res.zero_pairs)),
        ));
    }
    Ok(res)
}

/// Best of `runs` builds of `m`'s table, ms.
pub fn build_ms(m: &RttMatrix, runs: usize) -> f64 {
    (0..runs.max(1))
        .map(|_| {
            let t0 = Instant::now();
            let t = ChainTable::build(m);
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            std::hint::black_box(t);
            ms
        })
        .fold(f64::INFINITY, f64::min)
}

/// One graph's statistics, and its pairs added to `fig3` when given.
pub fn compare(name: &str, m: &RttMatrix, mut fig3: Option<(&mut Vec<Class>, &mut u64)>) -> Graph {
    let n = m.len();
    let build = build_ms(m, 3);
    let t = ChainTable::build(m);
    let (mut pairs, mut fronts, mut front_max) = (0, 0, 0);
    for s in 0..n {
        for d in (0..n).filter(|&d| d != s) {
            let Ok(front) = t.front(s, d) else { continue };
            if front.is_empty() {
                continue;
            }
            pairs += 1;
            fronts += front.len();
            front_max = front_max.max(front.len());
            let minimax = &front[0];
            let split = &front[front.len() - 1];
            // Shortest with the fewest hops: MOSTO's own one-round choice.
            let Ok(direct) = t.lookup_rounds(s, d, 1) else {
                continue;
            };
            let Some((classes, zero_pairs)) = fig3.as_mut() else {
                continue;
            };
            for c in classes.iter_mut() {
                let Ok(mine) = t.lookup_rounds(s, d, c.rounds) else {
                    continue;
                };
                if mine.predicted_ms <= 0.0 {
                    **zero_pairs += 1;
                    continue;
                }
                let worse = |sum: f64, max: f64| {
                    100.0 * (time_of(sum, max, c.rounds) - mine.predicted_ms) / mine.predicted_ms
                };
                c.shortest.push(worse(direct.sum_ms, direct.max_ms));
                c.shortest_split.push(worse(split.sum_ms, split.max_ms));
                c.minimax.push(worse(minimax.sum_ms, minimax.max_ms));
                let mp = mine.nodes.len().saturating_sub(2);
                c.proxies_mosto += mp as u64;
                c.proxies_minimax += minimax.proxies as u64;
                c.fewer += u64::from(mp < minimax.proxies);
                c.more += u64::from(mp > minimax.proxies);
            }
        }
    }
    let links = (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .filter(|&(i, j)| i != j && m.rtt(i, j).is_finite())
        .count();
    Graph {
        name: name.to_string(),
        nodes: n,
        components: m.components().len(),
        pairs,
        links,
        build_ms: build,
        front_mean: fronts as f64 / pairs.max(1) as f64,
        front_max,
    }
}

/// The share of `v` strictly above `x`.
pub fn share_above(v: &[f64], x: f64) -> f64 {
    v.iter().filter(|&&y| y > x).count() as f64 / v.len().max(1) as f64
}

/// The q-quantile of `v` (sorted copy, nearest rank).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

/// An empirical CDF as at most ~400 points.
fn cdf(v: &[f64], x_max: f64) -> Vec<(f64, f64)> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let step = (n / 400).max(1);
    let mut pts = vec![(0.0, 0.0)];
    for k in (0..n).step_by(step).chain([n - 1]) {
        pts.push((s[k].min(x_max), (k + 1) as f64 / n as f64));
    }
    pts
}

/// Fig. 3a/b/c: CDFs of how much slower each other algorithm's chain is.
pub fn fig3_svg(c: &Class) -> String {
    let x_max = if c.rounds == 1 { 150.0 } else { 100.0 };
    let series = |name: &str, color: &str, style, v: &[f64]| Series {
        name: name.into(),
        color: color.into(),
        style,
        points: cdf(v, x_max),
        errors: None,
    };
    Chart {
        title: format!(
            "Fig. 3: {} round{} — how much slower than MOSTO's chain",
            c.rounds,
            if c.rounds == 1 { "" } else { "s" }
        ),
        x_label: format!("transfer time increase over MOSTO's choice, % (clipped at {x_max})"),
        y_label: "CDF over ordered pairs of all graphs".into(),
        log_x: false,
        x_range: (0.0, x_max),
        y_range: (0.0, 1.0),
        series: vec![
            series("minimax path", "#d62728", Style::Line, &c.minimax),
            series(
                "shortest path (fewest hops: direct)",
                "#1f77b4",
                Style::Line,
                &c.shortest,
            ),
            series(
                "shortest path (least max RTT)",
                "#1f77b4",
                Style::Dashed,
                &c.shortest_split,
            ),
        ],
        markers: vec![],
    }
    .render()
}

/// Runtime of `ChainTable::build` against node count.
pub fn runtime_svg(graphs: &[Graph], extra: &[Graph]) -> String {
    let mut series = vec![Series {
        name: "topologies (shortest-path closures)".into(),
        color: "#1f77b4".into(),
        style: Style::Points,
        points: graphs
            .iter()
            .map(|g| (g.nodes as f64, g.build_ms))
            .collect(),
        errors: None,
    }];
    for (k, g) in extra.iter().enumerate() {
        series.push(Series {
            name: g.name.clone(),
            color: ["#d62728", "#2ca02c", "#9467bd"][k % 3].into(),
            style: Style::Points,
            points: vec![(g.nodes as f64, g.build_ms)],
            errors: None,
        });
    }
    let y_max = graphs
        .iter()
        .map(|g| g.build_ms)
        .chain(extra.iter().map(|g| g.build_ms))
        .fold(1.0, f64::max);
    Chart {
        title: "All-pairs chain computation, one core (paper: < 1 s at 115 nodes)".into(),
        x_label: "nodes (full mesh)".into(),
        y_label: "ChainTable::build, ms (best of 3)".into(),
        log_x: false,
        x_range: (0.0, 120.0),
        y_range: (0.0, (y_max * 1.1).ceil()),
        series,
        markers: vec![],
    }
    .render()
}

/// A random full mesh of `n` nodes: points in a 100 × 100 ms square with
/// RTT = Euclidean distance (`metric`), or independent uniform RTTs in
/// 1 .. 100 ms (no triangle inequality: many more Pareto points).
pub fn random_mesh(n: usize, metric: bool, seed: u64) -> RttMatrix {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let pos: Vec<(f64, f64)> = (0..n).map(|_| (100.0 * next(), 100.0 * next())).collect();
    let mut m = RttMatrix::new((0..n).map(|k| k.to_string()).collect()).expect("n ≤ MAX_NODES");
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let d = if metric {
                    ((pos[i].0 - pos[j].0).powi(2) + (pos[i].1 - pos[j].1).powi(2)).sqrt()
                } else {
                    1.0 + 99.0 * next()
                };
                m.set(i, j, (d * 1000.0).round() / 1000.0)
                    .expect("valid RTT");
            }
        }
    }
    m
}

/// The tables as markdown: Fig. 3 and proxies, then every graph.
pub fn markdown(r: &Results, extra: &[Graph]) -> String {
    markdown_fig3(r) + &markdown_graphs(r, extra)
}

/// Fig. 3's and the proxy count's tables.
pub fn markdown_fig3(r: &Results) -> String {
    let mut s = String::new();
    let pairs: usize = r.graphs.iter().map(|g| g.pairs).sum();
    let _ = writeln!(
        s,
        "{} graphs ({} Rocketfuel, {} Topology Zoo), {}–{} nodes, {} ordered pairs; {} pair-classes \
         with a 0 ms chain left out; duplicates skipped: {}; unusable: {}.\n",
        r.graphs.len(),
        r.graphs.iter().filter(|g| g.name.starts_with("rocketfuel")).count(),
        r.graphs.iter().filter(|g| g.name.starts_with("zoo")).count(),
        r.graphs.iter().map(|g| g.nodes).min().unwrap_or(0),
        r.graphs.iter().map(|g| g.nodes).max().unwrap_or(0),
        pairs,
        r.zero_pairs,
        if r.duplicates.is_empty() { "none".to_string() } else { r.duplicates.join(", ") },
        if r.unreadable.is_empty() { "none".to_string() } else { r.unreadable.join(", ") }
    );
    let _ = writeln!(s, "| rounds | other algorithm | pairs > 0 % worse | > 10 % | > 15 % | > 40 % | p90 | p99 | max |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for c in &r.classes {
        for (name, v) in [
            ("minimax", &c.minimax),
            ("shortest (direct)", &c.shortest),
            ("shortest (least max)", &c.shortest_split),
        ] {
            let _ = writeln!(
                s,
                "| {} | {name} | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % |",
                c.rounds,
                100.0 * share_above(v, 1e-9),
                100.0 * share_above(v, 10.0),
                100.0 * share_above(v, 15.0),
                100.0 * share_above(v, 40.0),
                quantile(v, 0.9),
                quantile(v, 0.99),
                quantile(v, 1.0),
            );
        }
    }
    let _ = writeln!(s, "\n| rounds | mean proxies, MOSTO | mean proxies, minimax | MOSTO fewer by | pairs with fewer / more |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for c in &r.classes {
        let k = c.minimax.len().max(1) as f64;
        let (a, b) = (c.proxies_mosto as f64 / k, c.proxies_minimax as f64 / k);
        let _ = writeln!(
            s,
            "| {} | {a:.3} | {b:.3} | {:.1} % | {:.1} % / {:.1} % |",
            c.rounds,
            100.0 * (1.0 - a / b),
            100.0 * c.fewer as f64 / k,
            100.0 * c.more as f64 / k
        );
    }
    s
}

/// Per graph: size, runtime, front sizes.
fn markdown_graphs(r: &Results, extra: &[Graph]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n| graph | nodes | components | ordered pairs | links | build ms | mean front | max front |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for g in r.graphs.iter().chain(extra) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {} |",
            g.name, g.nodes, g.components, g.pairs, g.links, g.build_ms, g.front_mean, g.front_max
        );
    }
    s
}
