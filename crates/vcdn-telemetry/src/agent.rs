//! The agent: the discovery state machine ([`crate::node`]) on real UDP
//! sockets, and the peer-to-peer data path.
//!
//! Sockets: the discovery socket is bound to the well-known port (12555, as
//! the thesis's prototype) with `SO_REUSEADDR`, so every agent on a host
//! receives each broadcast; the unicast socket (any port, named in every
//! message's envelope) sends everything and receives the answers. On one
//! host every sender is 127.0.0.1, which is why nodes are known by node id.
//!
//! Data in peer-to-peer mode: [`Agent::publish`] (in-process producers, e.g.
//! the cache) and local ingest ports (UDP datagrams, or newline-framed TCP
//! lines, on 127.0.0.1 only) send each datum as one UDP datagram to every
//! destination of its topic, without waiting: a full socket buffer drops
//! and counts, it never blocks a serving thread.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket as StdUdp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{broadcast, mpsc};

use crate::envelope::{self, Freshness, Reject, MAX_DATAGRAM};
use crate::keys::Keyring;
use crate::message::{Authority, AuthorityKind, Body, Message, Role, Subscription, VERSION};
use crate::node::{Event, Net, Node, NodeConfig, Out, Timers};

/// The thesis prototype's broadcast port.
pub const DISCOVERY_PORT: u16 = 12555;
/// The largest datum relayed (one UDP datagram).
pub const MAX_DATUM: usize = 65_000;
/// Longest line a TCP ingest port takes (and the most relayed as one
/// datum: under [`MAX_DATUM`]).
pub const MAX_LINE: usize = 60 * 1024;

/// A local port whose data goes to a topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingest {
    pub port: u16,
    pub topic: String,
    pub tcp: bool,
}

impl Ingest {
    /// `PORT=TOPIC` or `PORT=TOPIC/tcp`.
    pub fn parse(s: &str) -> Result<Ingest, String> {
        let (p, t) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not PORT=TOPIC"))?;
        let port = p.parse().map_err(|_| format!("{p:?} is not a port"))?;
        let (topic, tcp) = match t.strip_suffix("/tcp") {
            Some(t) => (t, true),
            None => (t.strip_suffix("/udp").unwrap_or(t), false),
        };
        if topic.is_empty() {
            return Err(format!("{s:?} has no topic"));
        }
        Ok(Ingest {
            port,
            topic: topic.to_string(),
            tcp,
        })
    }
}

/// What an agent is and where it talks.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node: String,
    pub roles: Vec<Role>,
    /// Topics this node publishes (in-process or through `ingest`).
    pub publish: Vec<String>,
    /// p2p consumer: topic → local UDP port.
    pub subscribe: Vec<Subscription>,
    pub ingest: Vec<Ingest>,
    pub discovery_port: u16,
    /// Where broadcasts go: 127.255.255.255 on one host, the subnet's
    /// broadcast address on a LAN.
    pub broadcast: IpAddr,
    /// Address the sockets bind to.
    pub bind: IpAddr,
    pub allowed: Vec<Net>,
    pub timers: Timers,
    /// Datasink producers: bytes of data held before the first sink is
    /// known (the oldest dropped beyond it).
    pub early_bytes: usize,
}

impl AgentConfig {
    /// A node on one host's loopback with the default timers.
    pub fn loopback(node: &str, roles: Vec<Role>) -> AgentConfig {
        AgentConfig {
            node: node.to_string(),
            roles,
            publish: Vec::new(),
            subscribe: Vec::new(),
            ingest: Vec::new(),
            discovery_port: DISCOVERY_PORT,
            broadcast: IpAddr::V4(Ipv4Addr::new(127, 255, 255, 255)),
            bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            allowed: vec![Net::parse("127.0.0.0/8").expect("valid")],
            timers: Timers::default(),
            early_bytes: 1 << 20,
        }
    }
}

/// Counters of one agent, for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub received: Mutex<HashMap<&'static str, u64>>,
    pub sent: Mutex<HashMap<&'static str, u64>>,
    pub rejected: [AtomicU64; 6],
    pub data_sent: AtomicU64,
    pub data_dropped: AtomicU64,
    pub data_ingested: AtomicU64,
    pub ingest_oversize: AtomicU64,
    pub discovery_ms: AtomicU64,
    pub configured: AtomicBool,
    pub authority_changes: AtomicU64,
    pub tracker_producers: AtomicU64,
    pub tracker_consumers: AtomicU64,
    pub control_bytes_sent: AtomicU64,
    pub control_bytes_received: AtomicU64,
}

impl Metrics {
    fn reject(&self, r: Reject) {
        let i = Reject::ALL.iter().position(|x| *x == r).expect("listed");
        self.rejected[i].fetch_add(1, Relaxed);
    }

    pub fn rejected(&self, r: Reject) -> u64 {
        let i = Reject::ALL.iter().position(|x| *x == r).expect("listed");
        self.rejected[i].load(Relaxed)
    }

    /// Prometheus text lines, `vcdn_telemetry_*`.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# TYPE vcdn_telemetry_messages_received_total counter");
        let mut r: Vec<_> = self.received.lock().iter().map(|(k, v)| (*k, *v)).collect();
        r.sort();
        for (k, v) in r {
            let _ = writeln!(
                out,
                "vcdn_telemetry_messages_received_total{{type=\"{k}\"}} {v}"
            );
        }
        let _ = writeln!(out, "# TYPE vcdn_telemetry_messages_sent_total counter");
        let mut s: Vec<_> = self.sent.lock().iter().map(|(k, v)| (*k, *v)).collect();
        s.sort();
        for (k, v) in s {
            let _ = writeln!(
                out,
                "vcdn_telemetry_messages_sent_total{{type=\"{k}\"}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP vcdn_telemetry_rejected_total Discovery datagrams dropped, by reason."
        );
        let _ = writeln!(out, "# TYPE vcdn_telemetry_rejected_total counter");
        for r in Reject::ALL {
            let _ = writeln!(
                out,
                "vcdn_telemetry_rejected_total{{reason=\"{}\"}} {}",
                r.label(),
                self.rejected(r)
            );
        }
        for (name, v) in [
            ("data_sent_total", &self.data_sent),
            ("data_dropped_total", &self.data_dropped),
            ("data_ingested_total", &self.data_ingested),
            ("ingest_oversize_total", &self.ingest_oversize),
            ("authority_changes_total", &self.authority_changes),
            ("control_bytes_sent_total", &self.control_bytes_sent),
            ("control_bytes_received_total", &self.control_bytes_received),
        ] {
            let _ = writeln!(
                out,
                "# TYPE vcdn_telemetry_{name} counter\nvcdn_telemetry_{name} {}",
                v.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# TYPE vcdn_telemetry_configured gauge\nvcdn_telemetry_configured {}",
            u8::from(self.configured.load(Relaxed))
        );
        let _ = writeln!(
            out,
            "# TYPE vcdn_telemetry_discovery_seconds gauge\nvcdn_telemetry_discovery_seconds {}",
            self.discovery_ms.load(Relaxed) as f64 / 1000.0
        );
        let _ = writeln!(
            out,
            "# TYPE vcdn_telemetry_tracker_leases gauge\nvcdn_telemetry_tracker_leases{{kind=\"producer\"}} {}\nvcdn_telemetry_tracker_leases{{kind=\"consumer\"}} {}",
            self.tracker_producers.load(Relaxed),
            self.tracker_consumers.load(Relaxed)
        );
    }
}

/// What the embedding code tells the running node.
enum Cmd {
    BecomeAuthority(AuthorityKind, Authority),
    SlaveReady(String),
    ClusterResized(Vec<u32>),
    Shutdown(tokio::sync::oneshot::Sender<()>),
}

/// State shared between the driver task and the data path.
struct Shared {
    dests: RwLock<HashMap<String, Arc<Vec<SocketAddr>>>>,
    /// Datasink mode: the producer following the sink (`datasink`).
    kafka: RwLock<Option<Arc<crate::kafka::Producer>>>,
    /// Datasink mode before the first sink is known: data wait here,
    /// bounded, for the producer (`None`: not a datasink producer).
    early: Option<Mutex<Early>>,
    early_bytes: usize,
    node: String,
    data: StdUdp,
    metrics: Metrics,
    sink: RwLock<Option<Authority>>,
}

/// A running agent. Dropping it stops its tasks (without BYE: call
/// [`Agent::shutdown`] for a clean leave).
pub struct Agent {
    shared: Arc<Shared>,
    cmd: mpsc::UnboundedSender<Cmd>,
    events: broadcast::Sender<Event>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    unicast: SocketAddr,
    node: String,
    ingest: Vec<SocketAddr>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn udp(bind: SocketAddr, reuse: bool) -> io::Result<StdUdp> {
    let s = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))?;
    if reuse {
        s.set_reuse_address(true)?;
    }
    s.set_broadcast(true)?;
    s.set_nonblocking(true)?;
    s.bind(&bind.into())?;
    Ok(s.into())
}

impl Agent {
    /// Binds the sockets and starts the agent; HELLOs start at once.
    pub async fn start(cfg: AgentConfig, keys: Arc<Keyring>) -> io::Result<Agent> {
        if !crate::message::valid_node_id(&cfg.node) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node id {:?} must be 1-64 of [A-Za-z0-9._:-]", cfg.node),
            ));
        }
        let disc = UdpSocket::from_std(udp(SocketAddr::new(cfg.bind, cfg.discovery_port), true)?)?;
        let uni = UdpSocket::from_std(udp(SocketAddr::new(cfg.bind, 0), false)?)?;
        let unicast = uni.local_addr()?;
        let data = udp(SocketAddr::new(cfg.bind, 0), false)?;
        let sink_producer = cfg
            .roles
            .iter()
            .any(|r| matches!(r, Role::Producer | Role::Hybrid));
        let shared = Arc::new(Shared {
            dests: RwLock::new(HashMap::new()),
            kafka: RwLock::new(None),
            early: sink_producer.then(|| Mutex::new(Early::default())),
            early_bytes: cfg.early_bytes,
            node: cfg.node.clone(),
            data,
            metrics: Metrics::default(),
            sink: RwLock::new(None),
        });
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(256);
        let now = Instant::now();
        let mut publish = cfg.publish.clone();
        for i in &cfg.ingest {
            if !publish.contains(&i.topic) {
                publish.push(i.topic.clone());
            }
        }
        let node = Node::new(
            NodeConfig {
                node: cfg.node.clone(),
                roles: cfg.roles.clone(),
                publish,
                subscribe: cfg.subscribe.clone(),
                allowed: cfg.allowed.clone(),
                timers: cfg.timers.clone(),
                seed: wall_ms() ^ u64::from(unicast.port()) << 32,
            },
            now,
        );
        let driver = Driver {
            node,
            keys,
            fresh: Freshness::new(crate::node::MAX_NODES),
            disc,
            uni,
            broadcast: SocketAddr::new(cfg.broadcast, cfg.discovery_port),
            port: unicast.port(),
            name: cfg.node.clone(),
            inc: wall_ms(),
            seq: 0,
            shared: shared.clone(),
            events: events.clone(),
            started: now,
        };
        let mut tasks = vec![tokio::spawn(driver.run(cmd_rx))];
        let mut ingest = Vec::new();
        for i in &cfg.ingest {
            let at = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), i.port);
            if i.tcp {
                let l = TcpListener::bind(at).await?;
                ingest.push(l.local_addr()?);
                tasks.push(tokio::spawn(ingest_tcp(l, i.topic.clone(), shared.clone())));
            } else {
                let s = UdpSocket::bind(at).await?;
                ingest.push(s.local_addr()?);
                tasks.push(tokio::spawn(ingest_udp(s, i.topic.clone(), shared.clone())));
            }
        }
        Ok(Agent {
            shared,
            cmd: cmd_tx,
            events,
            tasks,
            unicast,
            node: cfg.node,
            ingest,
        })
    }

    pub fn node_id(&self) -> &str {
        &self.node
    }

    /// The unicast socket's address (named in every message).
    pub fn unicast_addr(&self) -> SocketAddr {
        self.unicast
    }

    /// The ingest ports' addresses, in the order configured.
    pub fn ingest_addrs(&self) -> &[SocketAddr] {
        &self.ingest
    }

    /// Events as they happen (a new sink, new destinations, ...).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Prometheus lines of the agent, its Kafka producer included.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        self.shared.metrics.render(out);
        if let Some(k) = self.kafka_producer() {
            let c = k.counters();
            let _ = writeln!(out, "# TYPE vcdn_telemetry_kafka_messages_total counter");
            for (what, v) in [
                ("sent", c.sent),
                ("delivered", c.delivered),
                ("failed", c.failed),
                ("dropped_full", c.dropped_full),
                ("handed_over", c.handed_over),
            ] {
                let _ = writeln!(
                    out,
                    "vcdn_telemetry_kafka_messages_total{{outcome=\"{what}\"}} {v}"
                );
            }
            let _ = writeln!(
                out,
                "# TYPE vcdn_telemetry_kafka_in_flight gauge\nvcdn_telemetry_kafka_in_flight {}",
                k.in_flight()
            );
        }
    }

    /// Whether every authority this node follows has configured it.
    pub fn configured(&self) -> bool {
        self.shared.metrics.configured.load(Relaxed)
    }

    /// The data sink this node follows now, if any.
    pub fn sink(&self) -> Option<Authority> {
        self.shared.sink.read().clone()
    }

    /// The p2p destinations of a topic now.
    pub fn destinations(&self, topic: &str) -> Vec<SocketAddr> {
        self.shared
            .dests
            .read()
            .get(topic)
            .map(|d| d.to_vec())
            .unwrap_or_default()
    }

    /// Sends `datum` to every p2p destination of `topic` and, in datasink
    /// mode, queues it for Kafka; never waits. Returns how many p2p
    /// destinations it went to.
    pub fn publish(&self, topic: &str, datum: &[u8]) -> usize {
        publish(&self.shared, topic, datum)
    }

    /// The Kafka producer that follows the sink, once there is one.
    pub fn kafka_producer(&self) -> Option<Arc<crate::kafka::Producer>> {
        self.shared.kafka.read().clone()
    }

    /// Installs the Kafka producer `publish` queues data to, and hands it
    /// what waited for it.
    pub fn set_kafka_producer(&self, p: Arc<crate::kafka::Producer>) {
        let mut k = self.shared.kafka.write();
        if let Some(early) = &self.shared.early {
            let mut e = early.lock();
            for (topic, datum) in e.data.drain(..) {
                if p.send(&topic, self.shared.node.as_bytes(), &datum).is_err() {
                    self.shared.metrics.data_dropped.fetch_add(1, Relaxed);
                }
            }
            e.bytes = 0;
        }
        *k = Some(p);
    }

    /// Makes this node the data sink (once its broker runs) or the tracker.
    pub fn become_authority(&self, kind: AuthorityKind, authority: Authority) {
        let _ = self.cmd.send(Cmd::BecomeAuthority(kind, authority));
    }

    /// A slave's broker runs: register it with the sink.
    pub fn slave_ready(&self, listener: String) {
        let _ = self.cmd.send(Cmd::SlaveReady(listener));
    }

    /// The sink reassigned partitions over these brokers.
    pub fn cluster_resized(&self, brokers: Vec<u32>) {
        let _ = self.cmd.send(Cmd::ClusterResized(brokers));
    }

    /// Leaves cleanly: BYE to the authorities (and a broadcast one if this
    /// node is an authority), then stops. Takes `&self` because the
    /// agent is usually shared (a metrics handler holds it too).
    pub async fn shutdown(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.cmd.send(Cmd::Shutdown(tx)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(1), rx).await;
        }
    }

    /// [`Agent::shutdown`] from a thread outside the agent's runtime (a
    /// draining server's): waits up to `timeout` for the BYE to be sent.
    pub fn shutdown_blocking(&self, timeout: Duration) {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        if self.cmd.send(Cmd::Shutdown(tx)).is_err() {
            return;
        }
        let until = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < until {
            match rx.try_recv() {
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                _ => return,
            }
        }
    }
}

/// What a datasink producer holds before it knows a sink.
#[derive(Default)]
struct Early {
    data: std::collections::VecDeque<(String, Vec<u8>)>,
    bytes: usize,
}

fn publish(shared: &Shared, topic: &str, datum: &[u8]) -> usize {
    match shared.kafka.read().as_ref() {
        // Keyed by node: one producer's data stay in order in one partition.
        Some(k) => {
            if k.send(topic, shared.node.as_bytes(), datum).is_err() {
                shared.metrics.data_dropped.fetch_add(1, Relaxed);
            }
        }
        None => {
            if let Some(early) = &shared.early {
                let mut e = early.lock();
                e.bytes += datum.len();
                e.data.push_back((topic.to_string(), datum.to_vec()));
                while e.bytes > shared.early_bytes {
                    let Some((_, d)) = e.data.pop_front() else {
                        break;
                    };
                    e.bytes -= d.len();
                    shared.metrics.data_dropped.fetch_add(1, Relaxed);
                }
            }
        }
    }
    let dests = shared.dests.read().get(topic).cloned();
    let Some(dests) = dests else { return 0 };
    let mut n = 0;
    for d in dests.iter() {
        match shared.data.send_to(datum, d) {
            Ok(_) => {
                n += 1;
                shared.metrics.data_sent.fetch_add(1, Relaxed);
            }
            Err(_) => {
                shared.metrics.data_dropped.fetch_add(1, Relaxed);
            }
        }
    }
    n
}

async fn ingest_udp(sock: UdpSocket, topic: String, shared: Arc<Shared>) {
    let mut buf = vec![0u8; MAX_DATUM + 1];
    loop {
        let Ok((n, _)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        if n > MAX_DATUM {
            shared.metrics.ingest_oversize.fetch_add(1, Relaxed);
            continue;
        }
        shared.metrics.data_ingested.fetch_add(1, Relaxed);
        publish(&shared, &topic, &buf[..n]);
    }
}

async fn ingest_tcp(l: TcpListener, topic: String, shared: Arc<Shared>) {
    loop {
        let Ok((s, _)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        tokio::spawn(ingest_lines(s, topic.clone(), shared.clone()));
    }
}

/// Relays newline-framed lines from one local TCP connection. What one read
/// brings, as many whole lines as there are, goes on as one datum (as the
/// thesis's prototype sent each TCP chunk as one message): at low rates
/// that is a line a datum, under load the batching that keeps the relay
/// ahead. A line longer than [`MAX_LINE`] ends the connection.
async fn ingest_lines(mut s: tokio::net::TcpStream, topic: String, shared: Arc<Shared>) {
    let mut buf: Vec<u8> = Vec::with_capacity(MAX_LINE);
    let mut chunk = vec![0u8; MAX_LINE];
    loop {
        let room = MAX_LINE - buf.len();
        let n = match s.read(&mut chunk[..room.max(1)]).await {
            Ok(0) | Err(_) => {
                if !buf.is_empty() {
                    shared.metrics.data_ingested.fetch_add(1, Relaxed);
                    publish(&shared, &topic, &buf);
                }
                return;
            }
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        match buf.iter().rposition(|b| *b == b'\n') {
            Some(last) => {
                shared.metrics.data_ingested.fetch_add(1, Relaxed);
                publish(&shared, &topic, &buf[..=last]);
                buf.drain(..=last);
            }
            None if buf.len() >= MAX_LINE => {
                shared.metrics.ingest_oversize.fetch_add(1, Relaxed);
                return;
            }
            None => {}
        }
    }
}

struct Driver {
    node: Node,
    keys: Arc<Keyring>,
    fresh: Freshness,
    disc: UdpSocket,
    uni: UdpSocket,
    broadcast: SocketAddr,
    port: u16,
    name: String,
    inc: u64,
    seq: u64,
    shared: Arc<Shared>,
    events: broadcast::Sender<Event>,
    started: Instant,
}

impl Driver {
    async fn run(mut self, mut cmd: mpsc::UnboundedReceiver<Cmd>) {
        let mut a = vec![0u8; MAX_DATAGRAM + 1];
        let mut b = vec![0u8; MAX_DATAGRAM + 1];
        self.node.tick(Instant::now());
        self.flush().await;
        loop {
            let deadline = self.node.next_deadline(Instant::now());
            tokio::select! {
                r = self.disc.recv_from(&mut a) => {
                    if let Ok((n, from)) = r { self.datagram(&a[..n], from); }
                }
                r = self.uni.recv_from(&mut b) => {
                    if let Ok((n, from)) = r { self.datagram(&b[..n], from); }
                }
                _ = tokio::time::sleep_until(deadline.into()) => {}
                c = cmd.recv() => match c {
                    None => return,
                    Some(Cmd::BecomeAuthority(k, auth)) => self.node.become_authority(k, auth, Instant::now()),
                    Some(Cmd::SlaveReady(l)) => self.node.slave_ready(l, Instant::now()),
                    Some(Cmd::ClusterResized(b)) => self.node.cluster_resized(b, Instant::now()),
                    Some(Cmd::Shutdown(done)) => {
                        self.node.shutdown();
                        self.flush().await;
                        let _ = done.send(());
                        return;
                    }
                },
            }
            self.node.tick(Instant::now());
            self.flush().await;
        }
    }

    fn datagram(&mut self, frame: &[u8], from: SocketAddr) {
        let m = &self.shared.metrics;
        m.control_bytes_received
            .fetch_add(frame.len() as u64, Relaxed);
        let msg = match envelope::open(&self.keys, frame) {
            Ok(msg) => msg,
            Err(r) => {
                m.reject(r);
                tracing::debug!(%from, reason = r.label(), "discovery datagram dropped");
                return;
            }
        };
        if msg.node == self.name {
            return; // our own broadcast
        }
        if let Err(r) = self.fresh.check(wall_ms(), &msg) {
            m.reject(r);
            tracing::debug!(%from, node = %msg.node, reason = r.label(), "discovery datagram dropped");
            return;
        }
        *m.received.lock().entry(msg.body.kind()).or_default() += 1;
        if matches!(msg.body, Body::Bye { .. }) {
            self.fresh.forget(&msg.node);
        }
        self.node.handle(Instant::now(), from, &msg);
    }

    async fn flush(&mut self) {
        while let Some(out) = self.node.poll_out() {
            let (to, body) = match out {
                Out::Broadcast(b) => (self.broadcast, b),
                Out::Unicast(a, b) => (a, b),
            };
            self.seq += 1;
            let kind = body.kind();
            let msg = Message {
                v: VERSION,
                node: self.name.clone(),
                inc: self.inc,
                seq: self.seq,
                ts: wall_ms(),
                port: self.port,
                body,
            };
            let frame = envelope::seal(&self.keys, &msg);
            match self.uni.send_to(&frame, to).await {
                Ok(_) => {
                    *self.shared.metrics.sent.lock().entry(kind).or_default() += 1;
                    self.shared
                        .metrics
                        .control_bytes_sent
                        .fetch_add(frame.len() as u64, Relaxed);
                }
                Err(e) => tracing::debug!(%to, error = %e, "discovery send failed"),
            }
        }
        while let Some(e) = self.node.poll_event() {
            let m = &self.shared.metrics;
            match &e {
                Event::Destinations { topic, dests } => {
                    tracing::info!(topic, dests = ?dests, "p2p destinations");
                    self.shared
                        .dests
                        .write()
                        .insert(topic.clone(), Arc::new(dests.clone()));
                }
                Event::Sink { node, authority } => {
                    tracing::info!(sink = %node, epoch = authority.epoch, bootstrap = ?authority.bootstrap, "data sink");
                    m.authority_changes.fetch_add(1, Relaxed);
                    *self.shared.sink.write() = Some(authority.clone());
                }
                Event::Tracker { node, epoch } => {
                    tracing::info!(tracker = %node, epoch, "tracker");
                    m.authority_changes.fetch_add(1, Relaxed);
                }
                Event::AuthorityLost(k) => {
                    tracing::warn!(kind = ?k, "authority not heard: looking for one again")
                }
                Event::SteppedDown(k) => {
                    tracing::warn!(kind = ?k, "a higher authority of this kind runs: standing by")
                }
                Event::Active(k) => tracing::info!(kind = ?k, "acting as the authority"),
                Event::SlaveAssigned { broker_id, .. } => {
                    tracing::info!(broker_id, "broker id assigned")
                }
                Event::SlaveRegistered {
                    broker_id,
                    listener,
                } => {
                    tracing::info!(broker_id, listener, "slave broker registered")
                }
            }
            let _ = self.events.send(e);
        }
        let m = &self.shared.metrics;
        let configured = self.node.configured();
        if configured && !m.configured.swap(true, Relaxed) && m.discovery_ms.load(Relaxed) == 0 {
            m.discovery_ms
                .store(self.started.elapsed().as_millis().max(1) as u64, Relaxed);
        } else if !configured {
            m.configured.store(false, Relaxed);
        }
        let (p, c) = self.node.tracker_size();
        m.tracker_producers.store(p as u64, Relaxed);
        m.tracker_consumers.store(c as u64, Relaxed);
    }
}
