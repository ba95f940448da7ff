//! The content-aware data-plane paper's test bed (§IV-B), scaled to one
//! machine, with vcdn's cache in place of Apache Traffic Server: a client,
//! the dispatcher (`vcdn router` with `[srv6]`), an edge (`vcdn cache` behind
//! `vcdn srv6-agent`) and an origin (`vcdn origin` behind an agent that
//! accepts everything), each in an IPv6-only namespace of
//! `vcdn_netem::testbed`, 40 ms added on the origin's egress. The query
//! generator is `vcdn player --chunks` in the client's namespace.
//!
//! One [`run`] is one configuration on a fresh bed (empty cache, empty
//! filter): warm-up requests, then measured ones.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use vcdn_netem::testbed::{Testbed, TestbedSpec};

/// The service's chunk /64.
pub const CHUNKS: &str = "2001:db8:c::";

/// The edge's cgroup: `vcdnca-<pid>-edge` (a crashed run's is removed by
/// the next).
const CGROUP_PREFIX: &str = "vcdnca-";

/// Where the LRU filter is applied (the three forms vcdn has), or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// In the edge host's kernel, on the SYN (`vcdn srv6-agent`); clients
    /// connect to chunk addresses.
    Srv6,
    /// The router's HTTP routing answers 302 to the edge or the origin.
    RouterRedirect,
    /// The cache answers 302 to the origin itself (`--admission-filter`).
    CacheRedirect,
    /// No edge: every chunk straight from the origin (the yardstick of a
    /// rejected chunk's load time).
    Direct,
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub alpha: f64,
    /// Catalogue size N.
    pub catalogue: u64,
    /// The edge's capacity in chunks, C2 (its memory is C2 chunks).
    pub cache_chunks: u64,
    /// The LRU filter's size C1; `None`: no filter (every connection to
    /// the edge, the paper's baseline).
    pub filter: Option<u64>,
    pub object_bytes: u64,
    pub clients: usize,
    /// CPUs the edge's cache may use (a CFS quota), so that a load this
    /// machine can generate loads it as the paper's 1,400 clients loaded
    /// ATS; `None`: unlimited.
    pub edge_cpus: Option<f64>,
    pub warmup: u64,
    pub requests: u64,
    pub seed: u64,
    /// The dispatcher's flow table.
    pub dispatcher_flows: u32,
    /// Delay added to every packet the client sends, ms: the client's
    /// distance from the PoP (0: the paper's single fabric). A 302 costs a
    /// round trip of it, the SRv6 path none.
    pub client_ms: u64,
    pub form: Form,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub spec: RunSpec,
    /// `vcdn player --chunks`'s report.
    pub report: serde_json::Value,
    /// CPU seconds of the edge's cache process during the measured phase.
    pub edge_cpu_s: f64,
    /// Wall time of the measured phase.
    pub wall_s: f64,
    /// Objects the cache held at the end (the effective C2).
    pub cache_objects: u64,
    /// CPU seconds of the edge agent's programs in the kernel during the
    /// measured phase (0 unless `kernel.bpf_stats_enabled` is 1).
    pub edge_kernel_s: f64,
}

impl RunResult {
    /// Edge CPU load over the measured phase, in % of what the edge may
    /// use (its quota, as the paper's % of its VM; one core without one).
    pub fn edge_cpu_pct(&self) -> f64 {
        100.0 * self.edge_cpu_s / self.wall_s.max(1e-9) / self.spec.edge_cpus.unwrap_or(1.0)
    }

    pub fn hit_rate(&self) -> f64 {
        self.report["hit_rate"].as_f64().unwrap_or(0.0)
    }

    pub fn load_ms(&self, class: &str, stat: &str) -> f64 {
        self.report[class][stat].as_f64().unwrap_or(0.0)
    }
}

/// Processes killed when dropped.
pub struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sid(tb: &Testbed, node: &str) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(tb.addr6(node).expect("node")) | 0x100)
}

/// Starts `vcdn ARGS` in `node`, waiting for the line that says it serves.
fn start(
    tb: &Testbed,
    vcdn: &Path,
    node: &str,
    args: &[String],
    log: &Path,
) -> Result<Child, String> {
    use std::io::{BufRead, BufReader};
    let mut c = tb
        .command(node, vcdn)
        .map_err(|e| e.to_string())?
        .args(args)
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("start vcdn {args:?}: {e}"))?;
    let out = c.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.contains("listening on") || l.contains("admin on") => return Ok(c),
            Ok(_) => {}
            Err(_) => {
                let _ = c.kill();
                return Err(format!(
                    "vcdn {args:?} in {node} did not start (see {})",
                    log.display()
                ));
            }
        }
    }
}

/// utime + stime of `pid`, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = 100.0; // USER_HZ
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (n(11) + n(12)) / tick
}

/// A running bed with its processes (killed, and the bed torn down, when
/// dropped).
pub struct Plane {
    /// First to go: the processes, then the quota, then the bed.
    _procs: Procs,
    _quota: Option<vcdn_netem::cgroup::CpuGroup>,
    pub cache_pid: u32,
    pub router_pid: u32,
    pub tb: Testbed,
}

impl Plane {
    /// A counter or gauge (first line that starts with `name`) from the
    /// /metrics of `node`'s process on 127.0.0.1:9464.
    pub fn metric(&self, node: &str, name: &str) -> Option<f64> {
        let name = name.to_string();
        self.tb
            .run_in(node, move || {
                let body = http_get("127.0.0.1:9464", "/metrics")?;
                body.lines().find_map(|l| {
                    l.strip_prefix(name.as_str())?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
            })
            .ok()
            .flatten()
    }
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    c.read_to_string(&mut raw).ok()?;
    Some(raw.split_once("\r\n\r\n")?.1.to_string())
}

/// One configuration on a fresh bed.
pub fn run(vcdn: &Path, spec: &RunSpec, work: &Path) -> Result<RunResult, String> {
    let plane = start_plane(vcdn, spec, work)?;
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let tb = &plane.tb;
    let addr = |node: &str| tb.addr6(node).map_err(|e| e.to_string());
    let target = match spec.form {
        Form::Srv6 => s(&["--chunk-prefix", CHUNKS]),
        Form::RouterRedirect => vec![
            "--url".into(),
            format!("http://[{}]:8053", addr("dispatcher")?),
        ],
        Form::CacheRedirect => vec!["--url".into(), format!("http://[{}]:80", addr("edge")?)],
        Form::Direct => vec!["--url".into(), format!("http://[{}]:80", addr("origin")?)],
    };
    let gen = |requests: u64, warm: bool| -> Result<serde_json::Value, String> {
        let report = work.join(if warm { "warmup.json" } else { "report.json" });
        let out = tb
            .command("client", vcdn)
            .map_err(|e| e.to_string())?
            .args(s(&[
                "player",
                "--chunks",
                "--quiet",
                "--host",
                "video.example",
            ]))
            .args(&target)
            .args([
                "--catalogue".into(),
                spec.catalogue.to_string(),
                "--zipf".into(),
                spec.alpha.to_string(),
            ])
            .args(["--object-bytes".into(), spec.object_bytes.to_string()])
            .args([
                "--clients".into(),
                spec.clients.to_string(),
                "--requests".into(),
                requests.to_string(),
            ])
            .args([
                "--seed".into(),
                (spec.seed + warm as u64).to_string(),
                "--duration".into(),
                "3600".into(),
            ])
            .args(["--request-timeout", "30", "--report"])
            .arg(&report)
            .stdout(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "the generator failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&std::fs::read(&report).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    };
    if spec.warmup > 0 {
        gen(spec.warmup, true)?;
    }
    let kernel = || {
        ["agent", "steer_reply"]
            .iter()
            .filter_map(|p| {
                plane.metric(
                    "edge",
                    &format!("vcdn_srv6_agent_program_seconds_total{{program=\"{p}\"}}"),
                )
            })
            .sum::<f64>()
    };
    let (cpu0, kernel0, t0) = (cpu_seconds(plane.cache_pid), kernel(), Instant::now());
    let report = gen(spec.requests, false)?;
    let (edge_cpu_s, wall_s) = (
        cpu_seconds(plane.cache_pid) - cpu0,
        t0.elapsed().as_secs_f64(),
    );
    let edge_kernel_s = kernel() - kernel0;
    let cache_objects = tb
        .run_in("edge", || {
            let v: serde_json::Value =
                serde_json::from_str(&http_get("127.0.0.1:9090", "/healthz")?).ok()?;
            v["memory_objects"].as_u64()
        })
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    drop(plane);
    Ok(RunResult {
        spec: spec.clone(),
        report,
        edge_cpu_s,
        wall_s,
        cache_objects,
        edge_kernel_s,
    })
}

/// Starts the bed and every process of `spec`, and waits until the
/// dispatcher has the edge among its candidates.
pub fn start_plane(vcdn: &Path, spec: &RunSpec, work: &Path) -> Result<Plane, String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    let mut bed = TestbedSpec::new(["client", "dispatcher", "edge", "origin"])
        .map_err(|e| e.to_string())?
        .ipv6()
        .owns("dispatcher", CHUNKS.parse().expect("prefix"))
        .map_err(|e| e.to_string())?;
    for to in ["client", "dispatcher", "edge"] {
        bed = bed
            .one_way("origin", to, Duration::from_millis(40))
            .map_err(|e| e.to_string())?;
    }
    if spec.client_ms > 0 {
        for to in ["dispatcher", "edge", "origin"] {
            bed = bed
                .one_way("client", to, Duration::from_millis(spec.client_ms))
                .map_err(|e| e.to_string())?;
        }
    }
    let tb = Testbed::start(bed).map_err(|e| format!("the test bed (needs root): {e}"))?;
    let (d_sid, e_sid, o_sid) = (sid(&tb, "dispatcher"), sid(&tb, "edge"), sid(&tb, "origin"));
    let origin = tb.addr6("origin").map_err(|e| e.to_string())?;
    let edge = tb.addr6("edge").map_err(|e| e.to_string())?;
    let config = work.join("router.toml");
    std::fs::write(
        &config,
        format!(
            "[health]\ninterval_ms = 200\ntimeout_ms = 400\n\
             [srv6]\nsid = \"{d_sid}\"\ndevice = \"{}\"\nflows = {}\n\
             [[services]]\nname = \"video\"\nhostname = \"video.example\"\n\
             origin = \"http://[{origin}]:80\"\nsrv6 = {{ prefix = \"{CHUNKS}\", origin_sid = \"{o_sid}\" }}\n\
             admission = {}\n\
             [[services.regions]]\nregion = \"pop\"\n\
             caches = [{{ address = \"[{edge}]:80\", sid = \"{e_sid}\" }}]\n",
            tb.device("dispatcher").map_err(|e| e.to_string())?,
            spec.dispatcher_flows,
            match (spec.form, spec.filter) {
                (Form::RouterRedirect, Some(n)) => format!("{{ filter = \"lru\", size = {n} }}"),
                _ => "{ filter = \"none\" }".to_string(),
            },
        ),
    )
    .map_err(|e| e.to_string())?;
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let agent = |node: &str, me: Ipv6Addr, filter: String| -> Result<Child, String> {
        let dev = tb.device(node).map_err(|e| e.to_string())?;
        let mut a = s(&["srv6-agent", "--sid", &me.to_string(), "--prefix", CHUNKS]);
        a.extend(s(&[
            "--dispatcher",
            &d_sid.to_string(),
            "--device",
            &dev,
            "--filter",
            &filter,
        ]));
        a.extend(s(&["--admin", "127.0.0.1:9464"]));
        start(&tb, vcdn, node, &a, &work.join(format!("{node}-agent.log")))
    };
    let memory = spec.cache_chunks * spec.object_bytes;
    let mut procs = Procs(Vec::new());
    procs.0.push(start(
        &tb,
        vcdn,
        "origin",
        &s(&["origin", "--listen", "[::]:80"]),
        &work.join("origin.log"),
    )?);
    procs.0.push(agent("origin", o_sid, "none".into())?);
    let filter = match (spec.form, spec.filter) {
        (Form::Srv6, Some(n)) => n.to_string(),
        _ => "none".to_string(),
    };
    procs.0.push(agent("edge", e_sid, filter)?);
    let cache = start(
        &tb,
        vcdn,
        "edge",
        &s(&[
            "cache",
            "--listen",
            "[::]:80",
            "--admin",
            "127.0.0.1:9090",
            "--admin-token",
            "content-aware-reproduction-0123456789abcdef",
            "--threads",
            "1",
        ])
        .into_iter()
        .chain(s(&[
            "--memory",
            &memory.to_string(),
            "--upstream",
            &format!("http://[{origin}]:80"),
        ]))
        .chain(match (spec.form, spec.filter) {
            (Form::CacheRedirect, Some(n)) => s(&["--admission-filter", &n.to_string()]),
            // Each request must name the chunk its address names (421).
            (Form::Srv6, _) => s(&["--chunk-prefix", CHUNKS]),
            _ => Vec::new(),
        })
        .collect::<Vec<_>>(),
        &work.join("cache.log"),
    )?;
    let cache_pid = cache.id();
    procs.0.push(cache);
    let _quota = match spec.edge_cpus {
        Some(cpus) => {
            let h = vcdn_netem::cgroup::Hierarchy::detect().map_err(|e| format!("cgroups: {e}"))?;
            vcdn_netem::cgroup::remove_stale(&h, CGROUP_PREFIX);
            let name = format!("{CGROUP_PREFIX}{}-edge", std::process::id());
            let g =
                vcdn_netem::cgroup::CpuGroup::create(&h, &name, cpus).map_err(|e| e.to_string())?;
            g.add(cache_pid).map_err(|e| e.to_string())?;
            Some(g)
        }
        None => None,
    };
    procs.0.push(start(
        &tb,
        vcdn,
        "dispatcher",
        &s(&[
            "router",
            "--no-dns",
            "--http",
            "[::]:8053",
            "--admin",
            "127.0.0.1:9464",
            "--config",
        ])
        .into_iter()
        .chain([config.to_string_lossy().into_owned()])
        .collect::<Vec<_>>(),
        &work.join("router.log"),
    )?);
    // Health checks put the edge in the candidates.
    std::thread::sleep(Duration::from_millis(1500));
    let router_pid = procs.0.last().map(|c| c.id()).unwrap_or(0);
    Ok(Plane {
        _procs: procs,
        _quota,
        cache_pid,
        router_pid,
        tb,
    })
}

/// The dispatcher under a flood of SYNs to new chunk addresses.
#[derive(Clone, Debug)]
pub struct FloodResult {
    pub packets: u64,
    pub wall_s: f64,
    /// Runs of the `dispatch` program and the CPU time they took.
    pub runs: u64,
    pub program_s: f64,
    /// Connections learnt (a server answered), and the table at the end.
    pub learnt: u64,
    pub flows: u64,
    pub flow_capacity: u64,
    /// The router's resident memory before and after, kB.
    pub rss_before_kb: u64,
    pub rss_after_kb: u64,
    /// CPU seconds of the whole machine during the flood (generator,
    /// forwarder, every namespace's kernel path).
    pub machine_cpu_s: f64,
}

impl FloodResult {
    /// Packets the dispatch program handles per CPU-second of its own.
    pub fn program_pps_per_cpu_s(&self) -> f64 {
        self.runs as f64 / self.program_s.max(1e-12)
    }
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Busy jiffies of the whole machine (/proc/stat), in seconds.
fn machine_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = f
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    busy / 100.0
}

/// Floods the dispatcher with `packets` SYNs to new chunk addresses from
/// sources nobody answers to, with the kernel's BPF run-time statistics on
/// (restored after).
pub fn dispatcher_cost(
    vcdn: &Path,
    spec: &RunSpec,
    packets: u64,
    work: &Path,
) -> Result<FloodResult, String> {
    const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let plane = start_plane(vcdn, spec, work)?;
    let before_stats = std::fs::read_to_string(STATS).unwrap_or_else(|_| "0".into());
    std::fs::write(STATS, "1").map_err(|e| format!("{STATS}: {e}"))?;
    let m = |name: &str| plane.metric("dispatcher", name).unwrap_or(0.0);
    let (runs0, secs0) = (
        m("vcdn_router_srv6_program_runs_total{program=\"dispatch\"}"),
        m("vcdn_router_srv6_program_seconds_total{program=\"dispatch\"}"),
    );
    let rss_before_kb = rss_kb(plane.router_pid);
    // Sources in a /64 no node has: answers to them go nowhere.
    let base = 0xfd77_0000_0000_0099u128 << 64;
    let prefix: Ipv6Addr = CHUNKS.parse().expect("prefix");
    let batch: Vec<Vec<u8>> = (0..packets)
        .map(|i| {
            let src = Ipv6Addr::from(base | (i as u128 + 1));
            let dst = Ipv6Addr::from(u128::from(prefix) | (0x1_0000_0000 + i as u128));
            vcdn_srv6::packet::syn(src, dst, 1024 + (i % 60_000) as u16)
        })
        .collect();
    let (busy0, t0) = (machine_busy_s(), Instant::now());
    plane
        .tb
        .run_in("client", move || {
            vcdn_srv6::packet::send_raw(&batch, 500, Duration::from_millis(5))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("raw SYNs: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let (wall_s, machine_cpu_s) = (t0.elapsed().as_secs_f64(), machine_busy_s() - busy0);
    let r = FloodResult {
        packets,
        wall_s,
        runs: (m("vcdn_router_srv6_program_runs_total{program=\"dispatch\"}") - runs0) as u64,
        program_s: m("vcdn_router_srv6_program_seconds_total{program=\"dispatch\"}") - secs0,
        learnt: m("vcdn_router_srv6_learnt_total") as u64,
        flows: m("vcdn_router_srv6_flows") as u64,
        flow_capacity: m("vcdn_router_srv6_flow_capacity") as u64,
        rss_before_kb,
        rss_after_kb: rss_kb(plane.router_pid),
        machine_cpu_s,
    };
    let _ = std::fs::write(STATS, before_stats.trim());
    Ok(r)
}

/// Where the reproduction's files go.
pub fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("content-aware")
}
