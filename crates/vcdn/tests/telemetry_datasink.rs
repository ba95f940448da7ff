//! Datasink mode end to end: `vcdn agent` processes on loopback, a real
//! Kafka broker started by the data sink's agent, data from a producer's
//! local port through Kafka to a consumer's application. Every start order,
//! a consumer killed and restarted, the sink restarted, and a sink
//! respawned on another address.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;
use support::{spawn, tempdir, Proc, TempDir};

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One deployment: keys, a discovery port, a directory.
struct Deployment {
    dir: TempDir,
    discovery: String,
    keys: String,
    member: String,
}

/// An agent stopped with SIGTERM when dropped, so a sink's broker goes too.
struct Agent(Option<Proc>);

impl Agent {
    fn sigkill(mut self) {
        if let Some(p) = self.0.take() {
            p.kill();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut p) = self.0.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = p.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Deployment {
    fn new(name: &str) -> Deployment {
        let dir = tempdir(name);
        let keys = dir.0.join("keys.json").display().to_string();
        let member = dir.0.join("member.json").display().to_string();
        let st = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
            .args(["telemetry", "keys", "--out", &keys, "--member-out", &member])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
        Deployment {
            dir,
            discovery: free_udp().to_string(),
            keys,
            member,
        }
    }

    fn agent(&self, node: &str, keys: &str, args: &[&str]) -> Agent {
        let mut a = vec![
            "agent",
            "--node",
            node,
            "--keys",
            keys,
            "--discovery-port",
            &self.discovery,
        ];
        a.extend_from_slice(args);
        Agent(Some(spawn(&a)))
    }

    /// A data sink with its broker on `host` and fresh ports.
    fn sink(&self, node: &str, host: &str, ports: (u16, u16)) -> Agent {
        let dir = self
            .dir
            .0
            .join(format!("kafka-{node}"))
            .display()
            .to_string();
        let (p, c) = (ports.0.to_string(), ports.1.to_string());
        self.agent(
            node,
            &self.keys,
            &[
                "--role",
                "datasink",
                "--kafka-dir",
                &dir,
                "--kafka-host",
                host,
                "--kafka-port",
                &p,
                "--kafka-controller-port",
                &c,
            ],
        )
    }

    fn producer(&self, ingest: u16) -> Agent {
        self.agent(
            "producer",
            &self.member,
            &[
                "--role",
                "producer",
                "--ingest",
                &format!("{ingest}=metrics/tcp"),
            ],
        )
    }

    fn consumer(&self, app: u16) -> Agent {
        self.agent(
            "consumer",
            &self.member,
            &[
                "--role",
                "consumer",
                "--subscribe",
                &format!("metrics={app}"),
            ],
        )
    }

    /// A consumer that delivers over TCP (lossless, with backpressure).
    fn tcp_consumer(&self, app: u16) -> Agent {
        let to = format!("metrics={app}/tcp");
        self.agent(
            "consumer",
            &self.member,
            &["--role", "consumer", "--subscribe", &to],
        )
    }
}

/// Feeds numbered lines to the ingest port every `every` until stopped,
/// reconnecting if the agent is not up yet. Returns how many were written.
fn feed(ingest: u16, every: Duration, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut s = loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", ingest)) {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            writeln!(s, "m {i}").unwrap();
            i += 1;
            std::thread::sleep(every);
        }
        i
    })
}

/// Collects the numbers an application listening on TCP receives, until
/// stopped (the consumer agent reconnects after its restart).
fn collect_tcp(
    app: TcpListener,
    seen: Arc<Mutex<BTreeSet<u64>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        use std::io::BufRead;
        app.set_nonblocking(true).unwrap();
        let mut lines = 0;
        let mut conns: Vec<std::io::BufReader<TcpStream>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok((s, _)) = app.accept() {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                conns.push(std::io::BufReader::new(s));
            }
            let mut idle = true;
            conns.retain_mut(|c| {
                let mut l = String::new();
                loop {
                    l.clear();
                    match c.read_line(&mut l) {
                        Ok(0) => return false,
                        Ok(_) if l.ends_with('\n') => {
                            idle = false;
                            seen.lock()
                                .unwrap()
                                .insert(l.trim().trim_start_matches("m ").parse().unwrap());
                            lines += 1;
                        }
                        // A partial line at a timeout: BufReader keeps
                        // nothing of it, so read it to its end.
                        Ok(_) => {
                            let mut rest = String::new();
                            while !rest.ends_with('\n') {
                                if c.read_line(&mut rest).unwrap_or(0) == 0 {
                                    return false;
                                }
                            }
                            l.push_str(&rest);
                            seen.lock()
                                .unwrap()
                                .insert(l.trim().trim_start_matches("m ").parse().unwrap());
                            lines += 1;
                        }
                        Err(_) => return true,
                    }
                }
            });
            if idle {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        lines
    })
}

/// Collects the numbers the application receives, until stopped.
fn collect(
    app: UdpSocket,
    seen: Arc<Mutex<BTreeSet<u64>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        app.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = vec![0u8; 65536];
        let mut lines = 0;
        while !stop.load(Ordering::Relaxed) {
            if let Ok((n, _)) = app.recv_from(&mut b) {
                for l in String::from_utf8_lossy(&b[..n]).lines() {
                    seen.lock()
                        .unwrap()
                        .insert(l.trim_start_matches("m ").parse().unwrap());
                    lines += 1;
                }
            }
        }
        lines
    })
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No broker JVM of this test is left behind.
/// (A broker being stopped gets a few seconds for its controlled shutdown.)
fn assert_no_broker_left(d: &Deployment) {
    let needle = d.dir.0.display().to_string();
    let left = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains("kafka.Kafka") && c.contains(&needle))
            .collect()
    };
    let t0 = Instant::now();
    while !left().is_empty() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(left().is_empty(), "brokers left running: {:?}", left());
}

#[test]
fn sink_producer_and_consumer_in_any_start_order_deliver_through_kafka() {
    for order in ["spc", "scp", "psc", "pcs", "csp", "cps"] {
        let d = Deployment::new(&format!("order-{order}"));
        let (ingest, app) = (free_tcp(), UdpSocket::bind("127.0.0.1:0").unwrap());
        let app_port = app.local_addr().unwrap().port();
        let mut agents = Vec::new();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let rx = collect(app, seen.clone(), stop.clone());
        let mut tx = None;
        for who in order.chars() {
            agents.push(match who {
                's' => d.sink("sink", "127.0.0.1", (free_tcp(), free_tcp())),
                'p' => {
                    let a = d.producer(ingest);
                    tx = Some(feed(ingest, Duration::from_millis(5), stop.clone()));
                    a
                }
                _ => d.consumer(app_port),
            });
            std::thread::sleep(Duration::from_millis(300));
        }
        // Data written before the sink was known wait in the producer.
        wait_until(
            &format!("order {order}: data through Kafka"),
            Duration::from_secs(90),
            || seen.lock().unwrap().len() > 200,
        );
        stop.store(true, Ordering::Relaxed);
        tx.unwrap().join().unwrap();
        rx.join().unwrap();
        let seen = seen.lock().unwrap();
        assert!(
            seen.contains(&0),
            "order {order}: the first data, sent before discovery, arrive too"
        );
        drop(agents);
        assert_no_broker_left(&d);
    }
}

#[test]
fn nothing_is_lost_across_a_consumer_killed_and_a_sink_restarted() {
    let d = Deployment::new("restarts");
    // The application takes its data over TCP: the consumer holds back
    // when it cannot deliver, so nothing is dropped on the last hop.
    let (ingest, app) = (free_tcp(), TcpListener::bind("127.0.0.1:0").unwrap());
    let app_port = app.local_addr().unwrap().port();
    let ports = (free_tcp(), free_tcp());
    let mut sink = d.sink("sink", "127.0.0.1", ports);
    let _p = d.producer(ingest);
    let mut consumer = d.tcp_consumer(app_port);
    let (stop_feed, stop_rx) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let rx = collect_tcp(app, seen.clone(), stop_rx.clone());
    let tx = feed(ingest, Duration::from_millis(2), stop_feed.clone());
    let count = || seen.lock().unwrap().len();
    wait_until("data flow", Duration::from_secs(90), || count() > 500);

    // The consumer is killed (no goodbye, no final commit) and comes back
    // with the same node id: its group resumes from the committed offsets.
    consumer.sigkill();
    std::thread::sleep(Duration::from_secs(2));
    consumer = d.tcp_consumer(app_port);
    let before = count();
    wait_until(
        "data after the consumer's restart",
        Duration::from_secs(60),
        || count() > before + 500,
    );

    // The sink stops (its broker with it) and starts again on the same
    // ports and data: the producer holds what comes meanwhile.
    drop(sink);
    std::thread::sleep(Duration::from_secs(3));
    sink = d.sink("sink", "127.0.0.1", ports);
    let before = count();
    wait_until(
        "data after the sink's restart",
        Duration::from_secs(90),
        || count() > before + 500,
    );

    stop_feed.store(true, Ordering::Relaxed);
    let written = tx.join().unwrap();
    // Everything written arrives (duplicates allowed: at-least-once).
    let t0 = Instant::now();
    while (count() as u64) < written && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_rx.store(true, Ordering::Relaxed);
    let lines = rx.join().unwrap();
    let seen = seen.lock().unwrap();
    let missing: Vec<u64> = (0..written).filter(|i| !seen.contains(i)).collect();
    let runs: Vec<(u64, u64)> = missing
        .iter()
        .fold(Vec::new(), |mut r: Vec<(u64, u64)>, &i| {
            match r.last_mut() {
                Some(last) if last.1 + 1 == i => last.1 = i,
                _ => r.push((i, i)),
            }
            r
        });
    assert!(
        missing.is_empty(),
        "{} of {written} lost, in runs {:?}",
        missing.len(),
        &runs[..runs.len().min(20)]
    );
    eprintln!(
        "{written} written, all received, {} duplicates",
        lines - written
    );
    drop(consumer);
    drop(sink);
    assert_no_broker_left(&d);
}

#[test]
fn every_node_follows_a_sink_respawned_on_another_address() {
    let d = Deployment::new("respawn");
    let (ingest, app) = (free_tcp(), UdpSocket::bind("127.0.0.1:0").unwrap());
    let app_port = app.local_addr().unwrap().port();
    let sink_a = d.sink("sink-a", "127.0.0.1", (free_tcp(), free_tcp()));
    let _p = d.producer(ingest);
    let _c = d.consumer(app_port);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let rx = collect(app, seen.clone(), stop.clone());
    let tx = feed(ingest, Duration::from_millis(5), stop.clone());
    wait_until("data through sink A", Duration::from_secs(90), || {
        seen.lock().unwrap().len() > 100
    });
    // Sink A dies; sink B starts on another address (127.0.0.2), another
    // cluster. Data can now only arrive through B.
    sink_a.sigkill();
    let _b = d.sink("sink-b", "127.0.0.2", (free_tcp(), free_tcp()));
    let before = *seen.lock().unwrap().iter().next_back().unwrap();
    wait_until("data through sink B", Duration::from_secs(90), || {
        seen.lock().unwrap().range(before + 1..).count() > 300
    });
    stop.store(true, Ordering::Relaxed);
    tx.join().unwrap();
    rx.join().unwrap();
    drop(_b);
    // Sink A's broker was left running by SIGKILL: its agent is gone, so
    // kill it by its pid file, as a restarted agent would.
    let pid_file = d.dir.0.join("kafka-sink-a/broker.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        // SAFETY: the orphaned broker's process group, started by this test.
        unsafe { libc::kill(-pid.trim().parse::<i32>().unwrap(), libc::SIGKILL) };
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_no_broker_left(&d);
}

#[test]
fn a_slave_joins_the_sinks_cluster_and_data_keep_flowing() {
    let d = Deployment::new("slave");
    let (ingest, app) = (free_tcp(), UdpSocket::bind("127.0.0.1:0").unwrap());
    let app_port = app.local_addr().unwrap().port();
    let sink = d.sink("sink", "127.0.0.1", (free_tcp(), free_tcp()));
    let _p = d.producer(ingest);
    let _c = d.consumer(app_port);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let rx = collect(app, seen.clone(), stop.clone());
    let tx = feed(ingest, Duration::from_millis(5), stop.clone());
    wait_until("data through the sink", Duration::from_secs(90), || {
        seen.lock().unwrap().len() > 100
    });
    // A slave comes: it gets broker id 2 in the CONFIG, starts its broker
    // against the sink's controller and registers; the sink spreads the
    // partitions over both brokers and broadcasts CLUSTER_RESIZE.
    let dir = d.dir.0.join("kafka-slave").display().to_string();
    let port = free_tcp().to_string();
    let slave = d.agent(
        "slave",
        &d.member,
        &[
            "--role",
            "datasink-slave",
            "--kafka-dir",
            &dir,
            "--kafka-port",
            &port,
        ],
    );
    let metrics = sink.0.as_ref().unwrap().addr;
    // At least one: a slave whose first registration timed out on a
    // loaded machine registers again, and the sink may spread twice.
    wait_until("CLUSTER_RESIZE", Duration::from_secs(180), || {
        support::raw(
            metrics,
            b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            Duration::from_secs(2),
        )
        .lines()
        .find_map(|l| {
            l.strip_prefix("vcdn_telemetry_messages_sent_total{type=\"clusterresize\"} ")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .is_some_and(|n| n >= 1)
    });
    let before = *seen.lock().unwrap().iter().next_back().unwrap();
    wait_until("data after the resize", Duration::from_secs(60), || {
        seen.lock().unwrap().range(before + 1..).count() > 300
    });
    // An operator watches the topic live from Kafka.
    let tail = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "telemetry",
            "tail",
            "metrics",
            "--kafka",
            "--count",
            "5",
            "--keys",
            &d.member,
        ])
        .args(["--discovery-port", &d.discovery])
        .env("VCDN_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::thread::spawn(move || tail.wait_with_output().unwrap());
    let t0 = Instant::now();
    while !out.is_finished() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "vcdn telemetry tail --kafka printed 5 data"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = out.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert_eq!(
        text.lines().filter(|l| l.starts_with("m ")).count(),
        5,
        "{text}"
    );
    stop.store(true, Ordering::Relaxed);
    tx.join().unwrap();
    rx.join().unwrap();
    drop(slave);
    drop(sink);
    assert_no_broker_left(&d);
}
