//! Re-makes the ANDy thesis's evaluation (seed 004, chapter 5, Tables
//! 5.1–5.9) with vcdn's telemetry agent, on the layer-2 test bed
//! (`vcdn_netem::lan`): one network namespace per VM, bridges for the
//! clouds, a user-space link for the multi-cloud VPN, a CPU quota per VM
//! flavor. Needs root.
//!
//! ```text
//! sudo target/release/andy --vcdn target/release/vcdn [--seconds 10] [--out reproduce/andy]
//!     [--modes direct,p2p,datasink-1,...] [--clouds single,multi] [--rates 256,512,1024,2048] [--no-respawn] [--warmup 5]
//! ```
//! Markdown on stdout, progress on stderr, raw CSV in `--out`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use vcdn_netem::lan::{Flavor, Lan, LanSpec, LinkSpec};
use vcdn_reproduce::andy::{self, Sink, Stats};

const USAGE: &str = "usage: andy --vcdn PATH [--seconds N] [--out DIR] [--modes LIST] [--clouds LIST] [--rates LIST] [--no-respawn] [--warmup S]
  --vcdn PATH     the vcdn binary (a release build)
  --seconds N     length of each latency run (default 10)
  --out DIR       where the raw CSV goes (default reproduce/andy)
  --modes LIST    direct, p2p, datasink-N (N medium sinks, N = 1..4),
                  datasink-large, datasink-xlarge (default direct,p2p)
  --clouds LIST   single,multi (default both)
  --rates LIST    KiB/s of the latency runs (default 256,512,1024,2048)
  --no-respawn    leave out the sink's and the tracker's respawn
  --warmup S      unmeasured seconds at the highest rate through a new data sink (default 5)
The agents log at warn; ANDY_AGENT_LOG replaces their VCDN_LOG filter (with
VCDN_KAFKA_DEBUG=eos,broker for librdkafka's own debug lines).";

/// The multi-cloud link: the thesis's direct UDP across its VPN showed a
/// 2 ms median one-way latency and 58.3 Mbit/s (Tables 5.1, 5.7).
const MULTI_DELAY: Duration = Duration::from_millis(2);
const MULTI_RATE_BPS: u64 = 58_000_000;
const TOPIC: &str = "metrics";
const APP_PORT: u16 = 8086; // InfluxDB's UDP port in the thesis
const INGEST_PORT: u16 = 2003;
const METRICS_PORT: u16 = 9100;

struct Args {
    vcdn: PathBuf,
    seconds: u64,
    out: PathBuf,
    modes: Vec<String>,
    clouds: Vec<String>,
    rates: Vec<u64>,
    /// Leave out the respawn measurements (sink and tracker).
    no_respawn: bool,
    /// Seconds of unmeasured traffic at the highest rate through a new
    /// data sink before its latency runs.
    warmup: u64,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        vcdn: PathBuf::new(),
        seconds: 10,
        out: PathBuf::from("reproduce/andy"),
        modes: vec!["direct".into(), "p2p".into()],
        clouds: vec!["single".into(), "multi".into()],
        rates: vec![256, 512, 1024, 2048],
        no_respawn: false,
        warmup: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--vcdn" => a.vcdn = v()?.into(),
            "--seconds" => a.seconds = v()?.parse().map_err(|_| "--seconds N")?,
            "--out" => a.out = v()?.into(),
            "--no-respawn" => a.no_respawn = true,
            "--warmup" => a.warmup = v()?.parse().map_err(|_| "--warmup SECONDS")?,
            "--modes" => a.modes = v()?.split(',').map(str::to_string).collect(),
            "--clouds" => a.clouds = v()?.split(',').map(str::to_string).collect(),
            "--rates" => {
                a.rates = v()?
                    .split(',')
                    .map(|r| r.parse().map_err(|_| "--rates N,N"))
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {k}\n{USAGE}")),
        }
    }
    if a.vcdn.as_os_str().is_empty() {
        return Err(USAGE.into());
    }
    Ok(a)
}

/// A process in a node, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    /// SIGTERM first, so that a sink's agent stops its broker.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One test bed: producer, consumer and the authority nodes, in one cloud
/// or across two.
struct Bed {
    lan: Lan,
    vcdn: PathBuf,
    /// Keys and the brokers' logs and data (hundreds of MB per run),
    /// removed with the bed.
    dir: PathBuf,
    keys: PathBuf,
    member: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bed {
    fn start(vcdn: &PathBuf, multi: bool, authorities: &[(&str, Flavor)]) -> Result<Bed, String> {
        let (a, b) = ("cloud-1", "cloud-2");
        let mut spec =
            LanSpec::new(if multi { vec![a, b] } else { vec![a] }).map_err(|e| e.to_string())?;
        if multi {
            spec = spec.link(LinkSpec::delay(MULTI_DELAY).with_rate_bps(MULTI_RATE_BPS));
        }
        let other = if multi { b } else { a };
        // Producer m1.medium, consumer m1.xlarge (§4.3.1); the consumer
        // and the authorities in the other cloud when there are two.
        spec = spec
            .node("producer", a)
            .and_then(|s| s.flavor("producer", Flavor::M1Medium))
            .and_then(|s| s.node("consumer", other))
            .and_then(|s| s.flavor("consumer", Flavor::M1Xlarge))
            .map_err(|e| e.to_string())?;
        for (name, flavor) in authorities {
            spec = spec
                .node(name, other)
                .and_then(|s| s.flavor(name, *flavor))
                .map_err(|e| e.to_string())?;
        }
        let lan =
            Lan::start(spec).map_err(|e| format!("the test bed does not start (root?): {e}"))?;
        let dir = std::env::temp_dir().join(format!("andy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (keys, member) = (dir.join("keys.json"), dir.join("member.json"));
        if let Err(e) = vcdn_telemetry_keys(vcdn, &keys, &member) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        Ok(Bed {
            lan,
            vcdn: vcdn.clone(),
            dir,
            keys,
            member,
        })
    }

    /// Starts `vcdn agent` in `node`.
    fn agent(&self, node: &str, args: &[&str]) -> Result<Proc, String> {
        let authority = args
            .windows(2)
            .any(|w| w[0] == "--role" && matches!(w[1], "tracker" | "datasink"));
        let keys = if authority { &self.keys } else { &self.member };
        let mut cmd = self
            .lan
            .command(node, &self.vcdn)
            .map_err(|e| e.to_string())?;
        cmd.arg("agent")
            .args(["--node", node])
            .args(args)
            .arg("--keys")
            .arg(keys)
            .args([
                "--broadcast",
                &self.lan.broadcast().to_string(),
                "--allow",
                "10.78.0.0/16",
            ])
            .args(["--metrics-listen", &format!("127.0.0.1:{METRICS_PORT}")])
            .env(
                "VCDN_LOG",
                std::env::var("ANDY_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("vcdn agent in {node}: {e}"))?;
        // Wait for the line that says where it listens.
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        if !line.contains("vcdn agent") {
            let _ = child.kill();
            return Err(format!("vcdn agent in {node} did not start: {line}"));
        }
        // Keep reading what it prints: a closed pipe would end the agent at
        // its next line (its ingest ports are printed after the first).
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Ok(Proc(child))
    }

    /// Reads a counter from an agent's /metrics.
    fn metric(&self, node: &str, name: &str) -> f64 {
        let text = self
            .lan
            .run_in(node, || -> std::io::Result<String> {
                let mut s = TcpStream::connect(("127.0.0.1", METRICS_PORT))?;
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")?;
                let mut t = String::new();
                s.read_to_string(&mut t)?;
                Ok(t)
            })
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn consumer_addr(&self) -> SocketAddr {
        SocketAddr::from((self.lan.addr("consumer").expect("node"), APP_PORT))
    }
}

fn vcdn_telemetry_keys(vcdn: &PathBuf, keys: &PathBuf, member: &PathBuf) -> Result<(), String> {
    let st = std::process::Command::new(vcdn)
        .args(["telemetry", "keys", "--out"])
        .arg(keys)
        .arg("--member-out")
        .arg(member)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", vcdn.display()))?;
    st.success()
        .then_some(())
        .ok_or_else(|| "vcdn telemetry keys failed".into())
}

/// One measured run: the receiver in the consumer's namespace, the
/// generator in the producer's.
fn run(
    bed: &Bed,
    tcp_to_agent: bool,
    rate: Option<u64>,
    seconds: u64,
) -> Result<(andy::Sent, Stats), String> {
    let max = rate.map_or(u64::MAX / 2, |r| {
        r * seconds / andy::MESSAGE_BYTES as u64 + 1
    });
    let expect = max.min(200_000_000);
    let limit = Duration::from_secs(seconds);
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            bed.lan.run_in("consumer", || {
                let sock = UdpSocket::bind(("0.0.0.0", APP_PORT)).map_err(|e| e.to_string())?;
                let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(8 << 20);
                andy::receive(
                    &sock,
                    expect,
                    Duration::from_secs(2),
                    limit + Duration::from_secs(30),
                )
                .map_err(|e| e.to_string())
            })
        });
        std::thread::sleep(Duration::from_millis(200));
        let to = bed.consumer_addr();
        let sent = bed
            .lan
            .run_in("producer", || {
                let mut sink = if tcp_to_agent {
                    Sink::tcp(SocketAddr::from(([127, 0, 0, 1], INGEST_PORT)))
                } else {
                    Sink::udp(to)
                }
                .map_err(|e| e.to_string())?;
                andy::generate(&mut sink, rate, expect, limit).map_err(|e| e.to_string())
            })
            .map_err(|e| e.to_string())??;
        let got = rx
            .join()
            .map_err(|_| "receiver panicked")?
            .map_err(|e| e.to_string())??;
        Ok((sent, got.stats(sent.messages)))
    })
}

/// Time from starting a producer's agent to the first datum delivered
/// (authority and consumer already running and warm).
fn discovery(bed: &Bed, producer_args: &[&str]) -> Result<(Proc, Duration), String> {
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<Instant>();
        let h = s.spawn(move || {
            bed.lan.run_in("consumer", || {
                let sock = UdpSocket::bind(("0.0.0.0", APP_PORT)).ok()?;
                sock.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
                let mut b = [0u8; 200];
                sock.recv_from(&mut b).ok()?;
                let _ = tx.send(Instant::now());
                Some(())
            })
        });
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        let p = bed.agent("producer", producer_args)?;
        // Probe every millisecond until one arrives.
        let got = bed
            .lan
            .run_in("producer", move || {
                let mut sink = loop {
                    if let Ok(s) = Sink::tcp(SocketAddr::from(([127, 0, 0, 1], INGEST_PORT))) {
                        break s;
                    }
                    if t0.elapsed() > Duration::from_secs(15) {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                let mut id = 0;
                while t0.elapsed() < Duration::from_secs(15) {
                    if let Ok(at) = rx.try_recv() {
                        return Some(at);
                    }
                    if let Sink::Tcp(t) = &mut sink {
                        let _ = t.write_all(&andy::message(id, 0));
                    }
                    id += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                None
            })
            .map_err(|e| e.to_string())?;
        let _ = h.join();
        let at = got.ok_or("no datum arrived within 15 s")?;
        Ok((p, at - t0))
    })
}

#[derive(Default)]
struct Report {
    latency: BTreeMap<(String, String, u64), Stats>,
    throughput: BTreeMap<(String, String), f64>,
    discovery: BTreeMap<(String, String), Duration>,
    gap: BTreeMap<(String, String), Duration>,
    control: BTreeMap<(String, String), f64>,
}

fn p2p_bed(a: &Args, multi: bool) -> Result<(Bed, Vec<Proc>), String> {
    let bed = Bed::start(
        &a.vcdn,
        multi,
        &[
            ("tracker", Flavor::M1Medium),
            ("tracker-2", Flavor::M1Medium),
        ],
    )?;
    let t = bed.agent("tracker", &["--role", "tracker"])?;
    let port = APP_PORT.to_string();
    let c = bed.agent(
        "consumer",
        &[
            "--role",
            "p2p-consumer",
            "--subscribe",
            &format!("{TOPIC}={port}"),
        ],
    )?;
    // The tracker's warm-up (2.25 s), so that discovery is measured as a
    // producer joining a running system.
    std::thread::sleep(Duration::from_millis(2600));
    Ok((bed, vec![t, c]))
}

fn p2p_producer_args() -> Vec<String> {
    vec![
        "--role".into(),
        "p2p-producer".into(),
        "--ingest".into(),
        format!("{INGEST_PORT}={TOPIC}/tcp"),
    ]
}

fn measure(a: &Args, report: &mut Report) -> Result<(), String> {
    for cloud in &a.clouds {
        let multi = cloud == "multi";
        for mode in &a.modes {
            eprintln!("== {mode}, {cloud} cloud");
            let key = (mode.clone(), cloud.clone());
            match mode.as_str() {
                "direct" => {
                    let bed = Bed::start(&a.vcdn, multi, &[])?;
                    // ARP and the first packet across the link.
                    let _ = run(&bed, false, Some(64 * 1024), 1);
                    for r in &a.rates {
                        let (_, st) = run(&bed, false, Some(r * 1024), a.seconds)?;
                        eprintln!("   {r} KiB/s: {st:?}");
                        report.latency.insert((mode.clone(), cloud.clone(), *r), st);
                    }
                    let (_, st) = run(&bed, false, None, a.seconds)?;
                    eprintln!("   unthrottled: {:.1} Mbit/s", st.throughput_mbit);
                    report.throughput.insert(key, st.throughput_mbit);
                }
                "p2p" => {
                    let (bed, mut procs) = p2p_bed(a, multi)?;
                    let args = p2p_producer_args();
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let (p, took) = discovery(&bed, &args)?;
                    eprintln!("   discovery: {took:?}");
                    report.discovery.insert(key.clone(), took);
                    procs.push(p);
                    std::thread::sleep(Duration::from_millis(500));
                    let c0: f64 = ["producer", "consumer", "tracker"]
                        .iter()
                        .map(|n| bed.metric(n, "vcdn_telemetry_control_bytes_sent_total"))
                        .sum();
                    let t0 = Instant::now();
                    for r in &a.rates {
                        let (_, st) = run(&bed, true, Some(r * 1024), a.seconds)?;
                        eprintln!("   {r} KiB/s: {st:?}");
                        report.latency.insert((mode.clone(), cloud.clone(), *r), st);
                    }
                    let (_, st) = run(&bed, true, None, a.seconds)?;
                    eprintln!("   unthrottled: {:.1} Mbit/s", st.throughput_mbit);
                    report.throughput.insert(key.clone(), st.throughput_mbit);
                    let c1: f64 = ["producer", "consumer", "tracker"]
                        .iter()
                        .map(|n| bed.metric(n, "vcdn_telemetry_control_bytes_sent_total"))
                        .sum();
                    report
                        .control
                        .insert(key.clone(), (c1 - c0) / 3.0 / t0.elapsed().as_secs_f64());
                    // Reconfiguration: 1 datum/ms, the tracker killed, a new
                    // one on another node.
                    if a.no_respawn {
                        continue;
                    }
                    let gap = respawn_gap(
                        &bed,
                        ("tracker", &mut procs[0]),
                        "tracker-2",
                        &["--role", "tracker"],
                        Duration::from_secs(8),
                    )?;
                    eprintln!("   tracker respawn: largest gap {gap:?}");
                    report.gap.insert(key, gap);
                }
                m if m.starts_with("datasink-") => {
                    let (n, flavor) = match &m["datasink-".len()..] {
                        "large" => (1, Flavor::M1Large),
                        "xlarge" => (1, Flavor::M1Xlarge),
                        k => (
                            k.parse::<usize>()
                                .map_err(|_| format!("unknown mode {m}"))?,
                            Flavor::M1Medium,
                        ),
                    };
                    datasink(a, multi, n, flavor, &key, report)?;
                }
                m => return Err(format!("unknown mode {m}")),
            }
        }
    }
    Ok(())
}

/// Waits until `node`'s agent reports `metric` at least `min`.
fn wait_metric(
    bed: &Bed,
    node: &str,
    metric: &str,
    min: f64,
    limit: Duration,
) -> Result<(), String> {
    let t0 = Instant::now();
    while bed.metric(node, metric) < min {
        if t0.elapsed() > limit {
            return Err(format!("{node}: {metric} not {min} within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The sink nodes' agent arguments: the master on `sink-1`, slaves after.
fn sink_args(bed: &Bed, node: &str, master: bool) -> Vec<String> {
    let ip = bed.lan.addr(node).expect("node").to_string();
    let dir = bed.dir.join(format!("kafka-{node}"));
    let _ = std::fs::remove_dir_all(&dir);
    vec![
        "--role".into(),
        if master { "datasink" } else { "datasink-slave" }.into(),
        "--kafka-host".into(),
        ip,
        "--kafka-dir".into(),
        dir.display().to_string(),
        "--kafka-heap-mib".into(),
        "256".into(),
        "--sink-topic".into(),
        TOPIC.into(),
    ]
}

/// Datasink mode with `n` sink nodes of `flavor` (the master and n−1
/// slaves): Tables 5.3–5.6 and 5.8–5.9.
fn datasink(
    a: &Args,
    multi: bool,
    n: usize,
    flavor: Flavor,
    key: &(String, String),
    report: &mut Report,
) -> Result<(), String> {
    let names: Vec<String> = (1..=n).map(|i| format!("sink-{i}")).collect();
    let mut auth: Vec<(&str, Flavor)> = names.iter().map(|s| (s.as_str(), flavor)).collect();
    auth.push(("sink-x", flavor));
    let bed = Bed::start(&a.vcdn, multi, &auth)?;
    let mut procs = Vec::new();
    for (i, node) in names.iter().enumerate() {
        let args = sink_args(&bed, node, i == 0);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        procs.push(bed.agent(node, &args)?);
        if i == 0 {
            // The master's broker runs and it beacons.
            wait_metric(
                &bed,
                node,
                "vcdn_telemetry_messages_sent_total{type=\"reconfig\"}",
                1.0,
                Duration::from_secs(180),
            )?;
        }
    }
    if n > 1 {
        // Every slave joined and the partitions were spread.
        wait_metric(
            &bed,
            "sink-1",
            "vcdn_telemetry_messages_sent_total{type=\"clusterresize\"}",
            (n - 1) as f64,
            Duration::from_secs(300),
        )?;
    }
    let c = bed.agent(
        "consumer",
        &[
            "--role",
            "consumer",
            "--subscribe",
            &format!("{TOPIC}={APP_PORT}"),
        ],
    )?;
    procs.push(c);
    wait_metric(
        &bed,
        "consumer",
        "vcdn_telemetry_configured",
        1.0,
        Duration::from_secs(30),
    )?;
    // The consumer's group join.
    std::thread::sleep(Duration::from_secs(5));
    let ingest = format!("{INGEST_PORT}={TOPIC}/tcp");
    let (p, took) = discovery(&bed, &["--role", "producer", "--ingest", &ingest])?;
    eprintln!("   discovery: {took:?}");
    report.discovery.insert(key.clone(), took);
    procs.push(p);
    std::thread::sleep(Duration::from_secs(1));
    let mut all: Vec<&str> = names.iter().map(String::as_str).collect();
    all.extend(["producer", "consumer"]);
    let c0: f64 = all
        .iter()
        .map(|n| bed.metric(n, "vcdn_telemetry_control_bytes_sent_total"))
        .sum();
    let t0 = Instant::now();
    // The brokers' JIT has compiled nothing of the data path yet: the first
    // seconds of a new cluster of 0.5 CPU brokers are slower (p99 235 ms at
    // the first rate through four of them) than every later second, and
    // the thesis's tables are of a running sink.
    if a.warmup > 0 {
        let top = a.rates.iter().max().copied().unwrap_or(2048);
        run(&bed, true, Some(top * 1024), a.warmup)?;
    }
    for r in &a.rates {
        let (_, st) = run(&bed, true, Some(r * 1024), a.seconds)?;
        eprintln!("   {r} KiB/s: {st:?}");
        report
            .latency
            .insert((key.0.clone(), key.1.clone(), *r), st);
    }
    let (_, st) = run(&bed, true, None, a.seconds)?;
    eprintln!(
        "   unthrottled: {:.1} Mbit/s ({:.1} MB/s), lost {}",
        st.throughput_mbit,
        st.throughput_mbit / 8.0,
        st.lost
    );
    report.throughput.insert(key.clone(), st.throughput_mbit);
    let c1: f64 = all
        .iter()
        .map(|n| bed.metric(n, "vcdn_telemetry_control_bytes_sent_total"))
        .sum();
    report.control.insert(
        key.clone(),
        (c1 - c0) / all.len() as f64 / t0.elapsed().as_secs_f64(),
    );
    if n == 1 && matches!(flavor, Flavor::M1Medium) && !a.no_respawn {
        // The sink respawned on another node (another address, a new
        // cluster): the largest gap at 1 datum/ms.
        let args = sink_args(&bed, "sink-x", true);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let gap = respawn_gap(
            &bed,
            ("sink-1", &mut procs[0]),
            "sink-x",
            &args,
            Duration::from_secs(90),
        )?;
        eprintln!("   sink respawn: largest gap {gap:?}");
        report.gap.insert(key.clone(), gap);
    }
    Ok(())
}

/// Sends 1 datum/ms; after 2 s kills `old` and starts an authority on
/// `new_node`. Returns the largest time without a datum at the consumer,
/// counting from the crash as well (a consumer that got nothing before the
/// crash must not hide the outage).
fn respawn_gap(
    bed: &Bed,
    old: (&str, &mut Proc),
    new_node: &str,
    args: &[&str],
    window: Duration,
) -> Result<Duration, String> {
    let (old_node, old) = old;
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            bed.lan.run_in("consumer", || {
                let sock = UdpSocket::bind(("0.0.0.0", APP_PORT)).ok()?;
                sock.set_read_timeout(Some(
                    window
                        .saturating_sub(Duration::from_secs(4))
                        .max(Duration::from_secs(3)),
                ))
                .ok()?;
                let mut b = [0u8; 65536];
                let mut arrivals = Vec::new();
                while sock.recv_from(&mut b).is_ok() {
                    arrivals.push(Instant::now());
                }
                Some(arrivals)
            })
        });
        std::thread::sleep(Duration::from_millis(200));
        let tx = s.spawn(|| {
            bed.lan.run_in("producer", || {
                let mut sink = Sink::tcp(SocketAddr::from(([127, 0, 0, 1], INGEST_PORT))).ok()?;
                andy::generate(
                    &mut sink,
                    Some(1000 * andy::MESSAGE_BYTES as u64),
                    u64::MAX / 2,
                    window,
                )
                .ok()
            })
        });
        std::thread::sleep(Duration::from_secs(2));
        // A crash: the agent and everything it started in its node (a
        // sink's broker) are killed at once.
        let crash = Instant::now();
        let _ = old.0.kill();
        let _ = old.0.wait();
        if let Ok(Some(g)) = bed.lan.cgroup(old_node) {
            for pid in g.pids() {
                // SAFETY: kill(2) of a process in the test bed's own node.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let new = bed.agent(new_node, args)?;
        let _ = tx.join();
        let arrivals = rx
            .join()
            .map_err(|_| "receiver panicked")?
            .map_err(|e| e.to_string())?
            .ok_or("no data")?;
        *old = new;
        let before = arrivals.iter().filter(|&&t| t < crash).count();
        // No datum after the crash at all: the outage lasted the rest of
        // the window (reported as such, the run goes on).
        let end = crash + window.saturating_sub(Duration::from_secs(2));
        let after = arrivals.iter().find(|&&t| t >= crash).unwrap_or(&end);
        let between = arrivals
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        eprintln!(
            "   {before} data before the crash, {} after",
            arrivals.len() - before
        );
        Ok(between.max(*after - crash))
    })
}

/// The thesis's latency rows (Tables 5.1–5.6): mean ms, median ms, lost,
/// duplicates, at 256, 512, 1024 and 2048 KiB/s. Its "Std" column of the
/// datasink tables repeats the mean (an error), so it is left out.
fn thesis_latency(mode: &str, cloud: &str, rate: u64) -> Option<(f64, f64, u64, u64)> {
    type Row = [(f64, f64, u64, u64); 4];
    let row: Row = match (mode, cloud) {
        ("direct", "single") => [
            (-0.04, 0.0, 1, 0),
            (-0.17, 0.0, 0, 0),
            (0.17, 0.0, 323, 0),
            (-0.17, 0.0, 0, 0),
        ],
        ("direct", "multi") => [
            (1.98, 2.0, 1, 0),
            (1.95, 2.0, 23, 0),
            (1.89, 2.0, 0, 0),
            (2.38, 2.0, 0, 0),
        ],
        ("p2p", "single") => [
            (-0.32, 0.0, 0, 0),
            (1.56, 0.0, 0, 0),
            (1.85, 0.0, 231, 0),
            (-0.31, 0.0, 0, 0),
        ],
        ("p2p", "multi") => [
            (2.37, 2.0, 98, 185),
            (1.86, 2.0, 424, 96),
            (2.16, 2.0, 1678, 125),
            (2.00, 2.0, 1332, 170),
        ],
        ("datasink-1", "single") => [
            (33.85, 5.0, 0, 0),
            (5.17, 3.0, 0, 0),
            (44.67, 46.0, 21, 0),
            (83.57, 84.0, 2, 0),
        ],
        ("datasink-large", "single") => [
            (2.45, 2.0, 0, 0),
            (4.09, 2.0, 0, 0),
            (28.2, 25.0, 0, 0),
            (68.41, 70.0, 21, 0),
        ],
        ("datasink-xlarge", "single") => [
            (26.96, 2.0, 0, 0),
            (4.23, 2.0, 0, 0),
            (33.03, 33.0, 0, 0),
            (59.54, 60.0, 2, 0),
        ],
        ("datasink-2", "single") => [
            (1.75, 1.0, 0, 0),
            (2.99, 2.0, 0, 0),
            (24.09, 19.0, 0, 0),
            (64.3, 64.0, 307, 0),
        ],
        ("datasink-3", "single") => [
            (5.42, 3.0, 0, 0),
            (6.43, 5.0, 0, 0),
            (29.32, 23.0, 191, 0),
            (76.8, 80.0, 0, 0),
        ],
        ("datasink-4", "single") => [
            (67.2, 56.0, 172, 0),
            (113.13, 91.0, 488, 0),
            (87.7, 56.0, 0, 0),
            (58.1, 57.0, 2, 0),
        ],
        ("datasink-1", "multi") => [
            (45.4, 4.0, 0, 0),
            (49.15, 11.0, 0, 0),
            (375.98, 416.0, 0, 0),
            (558.78, 545.0, 1, 0),
        ],
        ("datasink-large", "multi") => [
            (8.88, 8.0, 0, 0),
            (117.24, 52.0, 0, 0),
            (639.54, 758.0, 0, 0),
            (1057.91, 936.0, 32, 0),
        ],
        ("datasink-xlarge", "multi") => [
            (12.6, 12.0, 0, 0),
            (455.57, 423.0, 0, 0),
            (306.19, 305.0, 0, 0),
            (586.64, 603.0, 1, 0),
        ],
        ("datasink-2", "multi") => [
            (23.05, 22.0, 0, 0),
            (438.07, 86.0, 0, 0),
            (1508.52, 953.0, 0, 0),
            (1829.39, 611.0, 1, 0),
        ],
        ("datasink-3", "multi") => [
            (14.74, 12.0, 0, 0),
            (243.78, 234.5, 0, 0),
            (620.59, 486.0, 0, 0),
            (1387.49, 1281.0, 0, 0),
        ],
        ("datasink-4", "multi") => [
            (175.67, 147.0, 1951, 0),
            (515.84, 561.0, 3598, 0),
            (800.46, 820.0, 812, 0),
            (923.34, 706.0, 127, 0),
        ],
        _ => return None,
    };
    let i = [256, 512, 1024, 2048].iter().position(|r| *r == rate)?;
    Some(row[i])
}

/// The thesis's unthrottled throughput, Mbit/s (Tables 5.7–5.9).
fn thesis_throughput(mode: &str, cloud: &str) -> Option<f64> {
    let single = cloud == "single";
    Some(match mode {
        "direct" => {
            if single {
                109.3
            } else {
                58.3
            }
        }
        "p2p" => {
            if single {
                182.1
            } else {
                15.0
            }
        }
        "datasink-1" => {
            if single {
                167.3
            } else {
                7.7
            }
        }
        "datasink-large" => {
            if single {
                168.6
            } else {
                8.0
            }
        }
        "datasink-xlarge" => {
            if single {
                173.2
            } else {
                8.1
            }
        }
        "datasink-2" => {
            if single {
                167.1
            } else {
                15.2
            }
        }
        "datasink-3" => {
            if single {
                153.9
            } else {
                20.2
            }
        }
        "datasink-4" => {
            if single {
                105.7
            } else {
                23.7
            }
        }
        _ => return None,
    })
}

fn markdown(r: &Report) -> String {
    let mut s = String::from(
        "| mode | cloud | KiB/s | mean ms | p50 ms | p99 ms | max ms | std ms | lost | dup | thesis mean / median ms | thesis lost / dup |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for ((m, c, rate), st) in &r.latency {
        let (tm, tl) = thesis_latency(m, c, *rate).map_or(("–".into(), "–".into()), |t| {
            (format!("{} / {}", t.0, t.1), format!("{} / {}", t.2, t.3))
        });
        s.push_str(&format!(
            "| {m} | {c} | {rate} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {tm} | {tl} |\n",
            st.mean_ms, st.p50_ms, st.p99_ms, st.max_ms, st.std_ms, st.lost, st.duplicates
        ));
    }
    s.push_str(
        "\n| mode | cloud | unthrottled Mbit/s | thesis Mbit/s | discovery ms | respawn gap ms | control B/s per node |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    let ms = |d: Option<&Duration>| {
        d.map_or("–".to_string(), |d| {
            format!("{:.0}", d.as_secs_f64() * 1000.0)
        })
    };
    for (k, t) in &r.throughput {
        s.push_str(&format!(
            "| {} | {} | {t:.1} | {} | {} | {} | {} |\n",
            k.0,
            k.1,
            thesis_throughput(&k.0, &k.1).map_or("–".into(), |t| format!("{t}")),
            ms(r.discovery.get(k)),
            ms(r.gap.get(k)),
            r.control.get(k).map_or("–".into(), |c| format!("{c:.0}"))
        ));
    }
    s
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut report = Report::default();
    let result = measure(&a, &mut report);
    let md = markdown(&report);
    println!("{md}");
    let _ = std::fs::create_dir_all(&a.out);
    let _ = std::fs::write(a.out.join("last-run.md"), &md);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("andy: {e}");
            ExitCode::FAILURE
        }
    }
}
