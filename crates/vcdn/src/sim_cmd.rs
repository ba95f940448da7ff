//! `vcdn sim`: a country-scale elastic CDN in the flow-level simulator
//! (CDNSim, MiniCache paper §3) with vcdn's policies; prints the QoE and
//! the load it puts on caches and ASes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use vcdn_model::capacity::CapacityModel;
use vcdn_policy::autoscale::Autoscaler;
use vcdn_policy::dimensioning::{self, Demand, Quality, DEFAULT_CHUNK_S};
use vcdn_sim::cache::Served;
use vcdn_sim::engine::{
    expected_viewers, BootSemantics, CachePolicy, Config, Outcome, Scaling, Sim, Sites, VodPolicy,
};
use vcdn_sim::graph::{AsGraph, Capacities, CountrySize};
use vcdn_sim::qoe::{Cdf, Histogram, QoeHistograms, SessionQoe};
use vcdn_sim::share::Mode;
use vcdn_sim::workload::{Vod, Workload};

/// Largest input file read.
const MAX_FILE: u64 = 256 << 20;

#[derive(Clone, Copy, ValueEnum)]
pub enum Preset {
    /// The paper's §3.2 as written (unstated values documented).
    Paper,
    /// What the authors' published code draws.
    Original,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Boot {
    /// Requests wait for their booting cache (the original code).
    Wait,
    /// Requests go to the origin while the cache boots (the paper's text).
    Origin,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SiteMode {
    /// Sized ahead by vcdn's dimensioning from the forecast peak of each
    /// access AS, running all the time.
    Fixed,
    /// Started on demand and sized by vcdn's autoscaler from the load.
    Autoscaled,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Sharing {
    /// Exact max-min fairness with per-flow caps.
    MaxMin,
    /// The original's local fair share, freed capacity taken up every 1 s.
    Original,
}

#[derive(Args)]
pub struct SimArgs {
    /// A synthetic country graph of the size of the paper's Table 2: US,
    /// DE, RU, FR, ES or KR.
    #[arg(long, default_value = "DE", conflicts_with_all = ["topology", "caida"])]
    country: String,
    /// Seed of the synthetic graph.
    #[arg(long, default_value_t = 1)]
    graph_seed: u64,
    /// An open topology: PREFIX with PREFIX.nodes.csv and PREFIX.edges.csv
    /// (shared/data/topologies), roles assigned by rule.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// CAIDA AS relationships (a|b|rel) …
    #[arg(long, requires = "roles")]
    caida: Option<PathBuf>,
    /// … with a roles/weights CSV asn,role,weight[,country].
    #[arg(long, requires = "caida")]
    roles: Option<PathBuf>,
    /// Keep only the roles rows of this country.
    #[arg(long, requires = "roles")]
    roles_country: Option<String>,

    #[arg(long, value_enum, default_value = "paper")]
    preset: Preset,
    /// Requests per second (overrides the preset).
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds during which requests arrive (overrides the preset).
    #[arg(long)]
    arrivals_s: Option<f64>,
    #[arg(long)]
    channels: Option<u32>,

    /// Start a cache per (AS, channel) on demand.
    #[arg(long)]
    on_demand: bool,
    /// Share of access ASes (heaviest first) with static caches.
    #[arg(long, default_value_t = 0.0)]
    static_share: f64,
    /// Requests for (AS, channel) that start its cache.
    #[arg(long, default_value_t = 1)]
    threshold: u32,
    /// Boot time of an on-demand cache (ms).
    #[arg(long, default_value_t = 100.0)]
    boot_ms: f64,
    #[arg(long, value_enum, default_value = "wait")]
    boot: Boot,
    /// Keep an idle cache this long (s; 0: tear down at once).
    #[arg(long, default_value_t = 0.0)]
    idle_s: f64,

    /// vcdn's cache sites instead of the paper's VM per (AS, channel):
    /// one site per access AS serving every channel, its instances
    /// counted by vcdn's dimensioning or autoscaler.
    #[arg(long, value_enum, conflicts_with_all = ["on_demand", "static_share"])]
    sites: Option<SiteMode>,
    /// The quality target instances are sized for (mean MOS).
    #[arg(long, default_value_t = 4.0)]
    min_mos: f64,
    /// vCPUs of one instance.
    #[arg(long, default_value_t = 1)]
    vcpus_per_instance: u32,
    /// A capacity model (TOML, as `vcdn calibrate` writes and `vcdn up
    /// --capacity-model` reads); default: the paper's measurements.
    #[arg(long)]
    capacity_model: Option<PathBuf>,
    /// What one instance serves at the quality target (Mb/s), instead of
    /// the capacity model's figure.
    #[arg(long)]
    instance_mbps: Option<f64>,
    /// What one instance can send (Mb/s), shared by its viewers; default:
    /// what it serves at the quality target (it saturates there).
    #[arg(long)]
    instance_link_mbps: Option<f64>,
    /// Fixed sites: size for the forecast mean plus this many standard
    /// deviations of concurrent viewers (Poisson).
    #[arg(long, default_value_t = 3.0)]
    forecast_sigmas: f64,
    #[arg(long, default_value_t = 1)]
    min_instances: u32,
    #[arg(long, default_value_t = 64)]
    max_instances: u32,
    /// How often the autoscaler decides (s), as the control plane's
    /// supervisor does once a second.
    #[arg(long, default_value_t = 1.0)]
    scale_every_s: f64,

    /// Share of sessions that watch a VoD title instead of a live channel.
    #[arg(long, default_value_t = 0.0)]
    vod_share: f64,
    /// Titles in the VoD catalogue (picked by Zipf).
    #[arg(long, default_value_t = 1_000_000)]
    vod_titles: u32,
    #[arg(long, default_value_t = 0.9)]
    vod_zipf: f64,
    /// Titles a site's store holds (with --sites).
    #[arg(long, default_value_t = 10_000)]
    vod_cache_titles: usize,
    /// The LRU admission filter in front of it: "auto" (vcdn's own sizing,
    /// the IM 2019 paper's optimum for the catalogue's α and N), "none", or
    /// a number of identifiers.
    #[arg(long, default_value = "auto")]
    vod_filter: String,

    #[arg(long, value_enum, default_value = "max-min")]
    sharing: Sharing,
    /// Settle rates once per epoch instead of at every instant (ms; 0: exact).
    #[arg(long, default_value_t = 0.0)]
    epoch_ms: f64,
    /// Route only over valley-free paths (CAIDA relationships).
    #[arg(long)]
    valley_free: bool,
    #[arg(long, default_value_t = 10.0)]
    hop_delay_ms: f64,
    #[arg(long, default_value_t = 40.0)]
    core_gbps: f64,
    #[arg(long, default_value_t = 10.0)]
    access_gbps: f64,
    #[arg(long, default_value_t = 25.0)]
    line_mbps: f64,
    /// Seconds of video buffered before playing.
    #[arg(long, default_value_t = 10.0)]
    buffer_s: f64,

    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop at this simulated time (s).
    #[arg(long)]
    until_s: Option<f64>,
    /// Write one CSV line per session here.
    #[arg(long)]
    sessions_csv: Option<PathBuf>,
    /// Write the summary as JSON here ("-": standard output).
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress line on standard error.
    #[arg(long)]
    quiet: bool,
}

fn read(path: &Path) -> Result<String, String> {
    crate::chains_cmd::read_limited(path, MAX_FILE)
}

fn graph(a: &SimArgs) -> Result<(AsGraph, String), String> {
    if let Some(prefix) = &a.topology {
        let p = prefix.display().to_string();
        let g = AsGraph::from_topology(
            &read(Path::new(&format!("{p}.nodes.csv")))?,
            &read(Path::new(&format!("{p}.edges.csv")))?,
        )
        .map_err(|e| format!("{p}: {e}"))?;
        return Ok((g, p));
    }
    if let (Some(rel), Some(roles)) = (&a.caida, &a.roles) {
        let g = AsGraph::from_caida(&read(rel)?, &read(roles)?, a.roles_country.as_deref())
            .map_err(|e| e.to_string())?;
        return Ok((g, format!("CAIDA {}", rel.display())));
    }
    let size = CountrySize::table2(&a.country).ok_or_else(|| {
        format!(
            "--country {:?}: Table 2 has US, DE, RU, FR, ES and KR",
            a.country
        )
    })?;
    Ok((
        AsGraph::synthetic(size, a.graph_seed),
        format!(
            "synthetic {} ({} ASes)",
            a.country.to_uppercase(),
            size.total()
        ),
    ))
}

fn ns(ms: f64, what: &str) -> Result<u64, String> {
    if ms.is_finite() && ms >= 0.0 {
        Ok((ms * 1e6) as u64)
    } else {
        Err(format!("{what} must be a number ≥ 0"))
    }
}

fn config(a: &SimArgs) -> Result<Config, String> {
    let mut w = match a.preset {
        Preset::Paper => Workload::paper(),
        Preset::Original => Workload::original(),
    };
    if let Some(r) = a.rate {
        // The original's gap shape follows its rate.
        if matches!(a.preset, Preset::Original) {
            w.gap_shape = 1.0 / r;
        }
        w.rate = r;
    }
    if let Some(s) = a.arrivals_s {
        w.arrivals_s = s;
    }
    if let Some(c) = a.channels {
        w.channels = c;
    }
    if a.vod_share > 0.0 {
        w.vod = Some(Vod {
            share: a.vod_share,
            titles: a.vod_titles,
            zipf: a.vod_zipf,
        });
    }
    w.validate()?;
    if !(0.0..=1.0).contains(&a.static_share) {
        return Err("--static-share is a share between 0 and 1".into());
    }
    for (v, what) in [
        (a.core_gbps, "--core-gbps"),
        (a.access_gbps, "--access-gbps"),
        (a.line_mbps, "--line-mbps"),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(format!("{what} must be > 0"));
        }
    }
    Ok(Config {
        workload: w,
        caches: CachePolicy {
            on_demand: a.on_demand,
            static_share: a.static_share,
            start_threshold: a.threshold.max(1),
            boot_ns: ns(a.boot_ms, "--boot-ms")?,
            boot: match a.boot {
                Boot::Wait => BootSemantics::Wait,
                Boot::Origin => BootSemantics::Origin,
            },
            idle_ns: ns(a.idle_s * 1e3, "--idle-s")?,
            sites: None,
            vod: None,
        },
        capacities: Capacities {
            core_bps: a.core_gbps * 1e9,
            access_bps: a.access_gbps * 1e9,
            line_bps: a.line_mbps * 1e6,
        },
        hop_delay_ns: ns(a.hop_delay_ms, "--hop-delay-ms")?,
        buffer_s: a.buffer_s,
        sharing: match a.sharing {
            Sharing::MaxMin => Mode::MaxMin,
            Sharing::Original => Mode::LocalFairShare,
        },
        epoch_ns: ns(a.epoch_ms, "--epoch-ms")?,
        valley_free: a.valley_free,
        seed: a.seed,
        until_ns: a.until_s.map(|s| ns(s * 1e3, "--until-s")).transpose()?,
        ..Config::default()
    })
}

/// Peak resident memory of this process (bytes), from /proc.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn quantiles(c: &Cdf) -> serde_json::Value {
    json!({"mean": c.mean(), "p50": c.quantile(0.5), "p90": c.quantile(0.9), "p99": c.quantile(0.99), "max": c.max()})
}

/// vcdn's cache sites: what an instance serves, from the capacity model
/// at the workload's mean bitrate, and how many run, from vcdn-policy's
/// dimensioning (fixed) or autoscaler.
fn sites(a: &SimArgs, g: &AsGraph, cfg: &Config) -> Result<Option<(Sites, String)>, String> {
    let Some(mode) = a.sites else {
        return Ok(None);
    };
    let model = match &a.capacity_model {
        Some(p) => {
            CapacityModel::from_toml(&read(p)?).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => CapacityModel::default(),
    };
    if !(1.0..=5.0).contains(&a.min_mos) {
        return Err("--min-mos is a mean opinion score between 1 and 5".into());
    }
    let quality = Quality::MinMos(a.min_mos);
    let kbps = cfg.workload.mean_bitrate_bps() / 1e3;
    let per_instance_bps = match a.instance_mbps {
        Some(m) if m > 0.0 && m.is_finite() => m * 1e6,
        Some(_) => return Err("--instance-mbps must be > 0".into()),
        None => {
            dimensioning::instance_bps(kbps, DEFAULT_CHUNK_S, quality, &model, a.vcpus_per_instance)
                .map_err(|e| e.to_string())?
        }
    };
    let (scaling, how) = match mode {
        SiteMode::Fixed => {
            let mut sizes = std::collections::HashMap::new();
            for (node, mean) in expected_viewers(g, cfg) {
                let peak = (mean + a.forecast_sigmas * mean.sqrt()).ceil() as u64;
                let n = if a.instance_mbps.is_some() {
                    // Sized in bit/s at the mean bitrate.
                    ((peak as f64 * kbps * 1e3 / per_instance_bps - 1e-9).ceil() as u32).max(1)
                } else {
                    let demand = Demand {
                        peak_users: Some(peak),
                        bitrate_kbps: Some(kbps),
                        chunk_s: Some(DEFAULT_CHUNK_S),
                        ..Demand::default()
                    };
                    let vcpus =
                        dimensioning::vcpus(&demand, quality, &model).map_err(|e| e.to_string())?;
                    dimensioning::instances(vcpus, a.vcpus_per_instance, a.min_instances.max(1))
                };
                sizes.insert(node, n.min(a.max_instances));
            }
            let total: u32 = sizes.values().sum();
            (
                Scaling::Fixed(sizes),
                format!(
                    "fixed sites, {total} instances sized for the forecast + {}σ",
                    a.forecast_sigmas
                ),
            )
        }
        SiteMode::Autoscaled => (
            Scaling::Autoscaled {
                autoscaler: Autoscaler::default(),
                every_ns: ns(a.scale_every_s * 1e3, "--scale-every-s")?.max(1),
                phase_ns: 0,
                min: a.min_instances.max(1),
                max: a.max_instances,
            },
            format!(
                "autoscaled sites ({}–{} instances, a decision every {} s)",
                a.min_instances.max(1),
                a.max_instances,
                a.scale_every_s
            ),
        ),
    };
    Ok(Some((
        Sites {
            per_instance_bps,
            instance_link_bps: match a.instance_link_mbps {
                Some(m) if m > 0.0 && m.is_finite() => m * 1e6,
                Some(_) => return Err("--instance-link-mbps must be > 0".into()),
                None => per_instance_bps,
            },
            scaling,
        },
        format!("{how}, {:.0} Mb/s per instance", per_instance_bps / 1e6),
    )))
}

/// `vcdn sim`, or `vcdn sim sweep`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SimCmd {
    #[command(subcommand)]
    sweep: Option<SweepCmd>,
    #[command(flatten)]
    args: SimArgs,
}

#[derive(Subcommand)]
enum SweepCmd {
    /// Run every combination of some parameters, one simulation per core
    /// at a time: `vcdn sim sweep --vary boot-ms=0,1130,11500 --vary
    /// boot=wait,origin --out DIR -- --country DE --on-demand`.
    Sweep(SweepArgs),
}

#[derive(Args)]
struct SweepArgs {
    /// FLAG=V1,V2,…: a `vcdn sim` flag (without its dashes) and the
    /// values it takes; repeat for a product.
    #[arg(long, required = true)]
    vary: Vec<String>,
    /// Simulations at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Where each run's JSON summary goes (FLAG=V,….json) and sweep.csv.
    #[arg(long)]
    out: PathBuf,
    /// The `vcdn sim` flags every run shares (after `--`).
    #[arg(last = true)]
    base: Vec<String>,
}

/// `vcdn sim`'s flags parsed alone, for each run of a sweep.
#[derive(clap::Parser)]
#[command(name = "vcdn sim")]
struct OneRun {
    #[command(flatten)]
    args: SimArgs,
}

pub fn main(c: SimCmd) -> Result<(), String> {
    match c.sweep {
        Some(SweepCmd::Sweep(s)) => sweep(s),
        None => run(c.args),
    }
}

fn sweep(s: SweepArgs) -> Result<(), String> {
    use clap::Parser;
    // The product of every --vary, as (flag, value) lists.
    let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for v in &s.vary {
        let (flag, values) = v
            .split_once('=')
            .ok_or_else(|| format!("--vary {v:?}: FLAG=V1,V2,…"))?;
        let flag = flag.trim_start_matches('-');
        let values: Vec<&str> = values.split(',').filter(|x| !x.is_empty()).collect();
        if values.is_empty() {
            return Err(format!("--vary {v:?}: no values"));
        }
        combos = combos
            .into_iter()
            .flat_map(|c| {
                values.iter().map(move |x| {
                    let mut c = c.clone();
                    c.push((flag.to_string(), x.to_string()));
                    c
                })
            })
            .collect();
    }
    std::fs::create_dir_all(&s.out).map_err(|e| format!("{}: {e}", s.out.display()))?;
    // Parse every run before starting any: a typo fails at once.
    let mut runs = Vec::new();
    for c in &combos {
        let name = c
            .iter()
            .map(|(f, v)| format!("{f}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut argv = vec!["vcdn sim".to_string()];
        argv.extend(s.base.iter().cloned());
        for (f, v) in c {
            argv.push(format!("--{f}"));
            argv.push(v.clone());
        }
        let mut one = OneRun::try_parse_from(&argv)
            .map_err(|e| format!("run {name}: {}", e.render()))?
            .args;
        one.quiet = true;
        one.json = None;
        if one.sessions_csv.is_some() {
            one.sessions_csv = Some(s.out.join(format!("{name}.sessions.csv")));
        }
        runs.push((name, one));
    }
    let jobs = s
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, runs.len().max(1));
    let total = runs.len();
    eprintln!(
        "vcdn sim sweep: {total} runs, {jobs} at a time, into {}",
        s.out.display()
    );
    // Popped from the end: reversed, so runs start in the order given.
    let queue = std::sync::Mutex::new(runs.into_iter().enumerate().rev().collect::<Vec<_>>());
    let rows = std::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let Some((i, (name, a))) = queue.lock().unwrap().pop() else {
                    return;
                };
                let result = execute(&a).and_then(|report| {
                    let path = s.out.join(format!("{name}.json"));
                    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap())
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    Ok(report)
                });
                let mut rows = rows.lock().unwrap();
                rows.push((i, name.clone(), result));
                eprintln!(
                    "  [{}/{total}] {name} ({:.0} s into the sweep)",
                    rows.len(),
                    started.elapsed().as_secs_f64()
                );
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by_key(|r| r.0);
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let mut csv = String::from(
        "run,sessions,start_mean_s,start_p90_s,buffering_ratio_mean,stalled_share,served_by_caches,vm_or_instance_s,wall_s\n",
    );
    let mut failed = 0;
    for (_, name, r) in &rows {
        match r {
            Ok(r) => {
                let q = &r["qoe"];
                csv += &format!(
                    "\"{name}\",{},{:.4},{:.4},{:.5},{:.5},{:.4},{:.0},{:.2}\n",
                    r["sessions"],
                    f(&q["start_s"]["mean"]),
                    f(&q["start_s"]["p90"]),
                    f(&q["buffering_ratio"]["mean"]),
                    f(&q["stalled_share"]),
                    f(&q["served_by_caches"]),
                    f(&r["vms"]["vm_seconds"]),
                    f(&r["wall_s"])
                );
            }
            Err(e) => {
                failed += 1;
                eprintln!("  {name}: {e}");
            }
        }
    }
    let path = s.out.join("sweep.csv");
    std::fs::write(&path, &csv).map_err(|e| format!("{}: {e}", path.display()))?;
    print!("{csv}");
    if failed > 0 {
        return Err(format!("{failed} of {total} runs failed"));
    }
    Ok(())
}

pub fn run(a: SimArgs) -> Result<(), String> {
    let report = execute(&a)?;
    print_report(&report);
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report).unwrap();
        if path == Path::new("-") {
            println!("{text}");
        } else {
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// One simulation, its sessions streamed into histograms (and the CSV):
/// its summary.
fn execute(a: &SimArgs) -> Result<serde_json::Value, String> {
    let (g, mut described) = graph(a)?;
    let mut cfg = config(a)?;
    if let Some((s, how)) = sites(a, &g, &cfg)? {
        cfg.caches.sites = Some(s);
        described = format!("{described}; {how}");
        if let Some(v) = cfg.workload.vod {
            let filter = match a.vod_filter.as_str() {
                "none" => None,
                "auto" => Some(vcdn_model::filter::filter_capacity(
                    v.zipf,
                    v.titles as f64,
                    a.vod_cache_titles as f64,
                )),
                n => Some(n.parse::<usize>().map_err(|_| {
                    format!("--vod-filter {n:?}: auto, none or a number of identifiers")
                })?),
            };
            cfg.caches.vod = Some(VodPolicy {
                cache_titles: a.vod_cache_titles,
                filter_titles: filter,
            });
            described = format!(
                "{described}; VoD store {} titles, filter {}",
                a.vod_cache_titles,
                filter.map_or("none".into(), |f| f.to_string())
            );
        }
    } else if a.vod_share > 0.0 {
        described = format!("{described}; VoD from the origin (caches need --sites)");
    }
    let expected = cfg.workload.expected_sessions();
    let sim = Sim::new(&g, cfg.clone())?;
    let access = sim.access_nodes().len();
    if !a.quiet {
        eprintln!("vcdn sim: {described}, {access} access ASes reachable, ~{expected:.0} sessions");
    }
    let mut csv = match &a.sessions_csv {
        Some(path) => {
            let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut w = std::io::BufWriter::new(f);
            writeln!(w, "{}", SessionQoe::CSV_HEADER)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Some((w, path))
        }
        None => None,
    };
    let mut csv_error = None;
    let mut qoe = QoeHistograms::default();
    let mut vod = VodCounts::default();
    let wall = Instant::now();
    let mut last = Instant::now();
    let quiet = a.quiet;
    let on_session = |q: SessionQoe| {
        qoe.add(&q);
        vod.add(&q);
        if let Some((w, path)) = &mut csv {
            if let Err(e) = writeln!(w, "{}", q.csv()) {
                csv_error.get_or_insert_with(|| format!("{}: {e}", path.display()));
            }
        }
    };
    let out = sim.run_streaming(50_000, |p| {
        if !quiet && last.elapsed().as_millis() >= 1000 {
            last = Instant::now();
            let t = p.now_ns as f64 / 1e9;
            eprint!(
                "\r  {t:7.0} s simulated ({:.0}× real time), {} of ~{expected:.0} sessions started, {} done, {} flows   ",
                t / wall.elapsed().as_secs_f64(),
                p.sessions_started,
                p.sessions_done,
                p.active_flows
            );
        }
    }, on_session);
    let secs = wall.elapsed().as_secs_f64();
    if !a.quiet {
        eprintln!();
    }
    if let Some(e) = csv_error {
        return Err(e);
    }
    if let Some((mut w, path)) = csv {
        w.flush().map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report(
        &out,
        &qoe,
        &vod,
        secs,
        &described,
        cfg.caches.sites.is_some(),
    ))
}

/// What the sites' VoD caches did with each VoD session.
#[derive(Default)]
struct VodCounts {
    sessions: u64,
    hit: u64,
    miss: u64,
    bypass: u64,
}

impl VodCounts {
    fn add(&mut self, q: &SessionQoe) {
        if q.title.is_none() {
            return;
        }
        self.sessions += 1;
        match q.vod {
            Some(Served::Hit) => self.hit += 1,
            Some(Served::Miss) => self.miss += 1,
            Some(Served::Bypass) => self.bypass += 1,
            None => {}
        }
    }

    fn report(&self) -> serde_json::Value {
        let n = self.sessions.max(1) as f64;
        json!({
            "sessions": self.sessions,
            "hit": self.hit as f64 / n,
            "miss": self.miss as f64 / n,
            "bypass": self.bypass as f64 / n,
            "no_cache": (self.sessions - self.hit - self.miss - self.bypass) as f64 / n,
        })
    }
}

/// 101 points of a CDF, for plots.
fn cdf_points(c: &Cdf) -> Vec<f64> {
    (0..=100).map(|i| c.quantile(i as f64 / 100.0)).collect()
}

fn hist_points(h: &Histogram) -> Vec<f64> {
    h.cdf_points(100).into_iter().map(|p| p.0).collect()
}

fn report(
    out: &Outcome,
    q: &QoeHistograms,
    vod: &VodCounts,
    secs: f64,
    graph: &str,
    sites: bool,
) -> serde_json::Value {
    let vm_mbps = Cdf::new(out.vms.iter().map(|v| v.2 / 1e6).collect());
    let vm_conn = Cdf::new(out.vms.iter().map(|v| v.3 as f64).collect());
    let peaks = out.peaks.per_as.values();
    let as_gbps = Cdf::new(peaks.clone().map(|p| p.rate_bps / 1e9).collect());
    let as_conn = Cdf::new(peaks.clone().map(|p| p.connections as f64).collect());
    let as_vms = Cdf::new(peaks.map(|p| p.vms as f64).collect());
    let rss = peak_rss();
    let n = q.sessions.max(1) as f64;
    json!({
        "sites": sites,
        "graph": graph,
        "sessions": q.sessions,
        "unfinished": out.unfinished,
        "simulated_s": out.end_ns as f64 / 1e9,
        "wall_s": secs,
        "events": out.events,
        "events_per_s": out.events as f64 / secs,
        "max_active_flows": out.max_active_flows,
        "peak_rss_bytes": rss,
        "rss_per_peak_flow_bytes": rss.map(|r| r as f64 / out.max_active_flows.max(1) as f64),
        "filled_flows": out.filled_flows,
        "qoe": {
            "start_s": hist_quantiles(&q.start_s),
            "buffering_ratio": hist_quantiles(&q.buffering_ratio),
            "buffering_events": hist_quantiles(&q.stalls),
            "playback_ratio": hist_quantiles(&q.playback_ratio),
            "served_by_caches": q.from_cache as f64 / n,
            "stalled_share": q.stalled as f64 / n,
        },
        "vod": vod.report(),
        "vms": {
            "count": out.vms.len(),
            "vm_seconds": out.vm_seconds,
            "peak_concurrent": out.timeline.iter().map(|s| s.vms).max().unwrap_or(0),
            "peak_mbps": quantiles(&vm_mbps),
            "peak_connections": quantiles(&vm_conn),
            "under_100_mbps": vm_mbps.at(100.0),
            "under_10_connections": vm_conn.at(10.0),
        },
        "ases": {
            "count": out.peaks.per_as.len(),
            "peak_gbps": quantiles(&as_gbps),
            "peak_connections": quantiles(&as_conn),
            "peak_vms": quantiles(&as_vms),
            "under_10_gbps": as_gbps.at(10.0),
            "under_40_gbps": as_gbps.at(40.0),
            "over_50_vms": 1.0 - as_vms.at(50.0),
            "over_150_vms": 1.0 - as_vms.at(150.0),
        },
        // Values at the shares 0, 0.01, …, 1 (the CDFs of Figs 1 and 2).
        "cdfs": {
            "vm_peak_mbps": cdf_points(&vm_mbps),
            "vm_peak_connections": cdf_points(&vm_conn),
            "as_peak_gbps": cdf_points(&as_gbps),
            "as_peak_connections": cdf_points(&as_conn),
            "as_peak_vms": cdf_points(&as_vms),
            "start_s": hist_points(&q.start_s),
            "buffering_ratio": hist_points(&q.buffering_ratio),
            "buffering_events": hist_points(&q.stalls),
            "playback_ratio": hist_points(&q.playback_ratio),
        },
    })
}

fn hist_quantiles(h: &Histogram) -> serde_json::Value {
    json!({"mean": h.mean(), "p50": h.quantile(0.5), "p90": h.quantile(0.9), "p99": h.quantile(0.99), "max": h.max()})
}

fn print_report(r: &serde_json::Value) {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let qoe = &r["qoe"];
    println!(
        "{} sessions ({} unfinished) on {}; {:.0} s simulated in {:.2} s ({} events, {:.0}/s); peak {} flows, {:.0} bytes of memory per peak flow",
        r["sessions"], r["unfinished"], r["graph"].as_str().unwrap_or(""), f(&r["simulated_s"]), f(&r["wall_s"]),
        r["events"], f(&r["events_per_s"]), r["max_active_flows"], f(&r["rss_per_peak_flow_bytes"])
    );
    for (name, key) in [
        ("start time (s)", "start_s"),
        ("buffering ratio", "buffering_ratio"),
        ("buffering events", "buffering_events"),
        ("playback ratio", "playback_ratio"),
    ] {
        let q = &qoe[key];
        println!(
            "  {name:<17} mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
            f(&q["mean"]),
            f(&q["p50"]),
            f(&q["p90"]),
            f(&q["p99"]),
            f(&q["max"])
        );
    }
    println!(
        "  served by caches  {:.1} %; {:.2} % of sessions stalled at least once",
        100.0 * f(&qoe["served_by_caches"]),
        100.0 * f(&qoe["stalled_share"])
    );
    let vod = &r["vod"];
    if vod["sessions"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  VoD {} sessions: {:.1} % hits, {:.1} % misses, {:.1} % sent to the origin by the filter, {:.1} % with no cache ready",
            vod["sessions"],
            100.0 * f(&vod["hit"]),
            100.0 * f(&vod["miss"]),
            100.0 * f(&vod["bypass"]),
            100.0 * f(&vod["no_cache"])
        );
    }
    let vms = &r["vms"];
    let sites = r["sites"].as_bool() == Some(true);
    if sites {
        println!(
            "  instances: {:.0} instance-s, at most {} at once",
            f(&vms["vm_seconds"]),
            vms["peak_concurrent"]
        );
    }
    println!(
        "  {} {}{}: peak Mb/s p50 {:.1} p99 {:.1} max {:.1}; peak connections p50 {:.0} max {:.0}; {:.1} % under 100 Mb/s, {:.1} % under 10 connections",
        if sites { "channel feeds" } else { "VMs" }, vms["count"],
        if sites { String::new() } else { format!(" ({:.0} VM-s)", f(&vms["vm_seconds"])) },
        f(&vms["peak_mbps"]["p50"]), f(&vms["peak_mbps"]["p99"]), f(&vms["peak_mbps"]["max"]),
        f(&vms["peak_connections"]["p50"]), f(&vms["peak_connections"]["max"]),
        100.0 * f(&vms["under_100_mbps"]), 100.0 * f(&vms["under_10_connections"])
    );
    let ases = &r["ases"];
    println!(
        "  ASes {}: peak Gb/s p50 {:.2} max {:.2}; peak connections p50 {:.0} max {:.0}; concurrent {} p50 {:.0} max {:.0}",
        ases["count"], f(&ases["peak_gbps"]["p50"]), f(&ases["peak_gbps"]["max"]),
        f(&ases["peak_connections"]["p50"]), f(&ases["peak_connections"]["max"]),
        if sites { "instances" } else { "VMs" }, f(&ases["peak_vms"]["p50"]), f(&ases["peak_vms"]["max"])
    );
}
