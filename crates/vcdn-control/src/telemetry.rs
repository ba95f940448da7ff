//! The control plane's side of the telemetry (issue 19, ANDy peer-to-peer
//! mode): the deployment's keys, the tracker, and the consumer of what the
//! caches publish.
//!
//! - **Keys.** At first start the key file (MAC key and the authority's
//!   Ed25519 key pair) is made in the data directory and kept across
//!   restarts, like the internal CA; every cache is started with a copy
//!   without the private key ([`Telemetry::member_keys_json`]), so a cache
//!   can publish but never act as the tracker.
//! - **Tracker and consumer.** Two agents: the tracker, and a p2p-consumer
//!   of `edge.stats` and `edge.events`, each into a UDP socket of this
//!   process (a node does not hear its own datagrams, so the tracker could
//!   not serve a subscription of its own node). Every datagram is checked with [`record::open`] (MAC under
//!   the deployment's key), then offered to a [`Latest`] table: a record
//!   not newer than the held one by `(incarnation, sequence)` is a
//!   duplicate or late and is refused, and only sources that are instances
//!   of the store are kept (the table is bounded).
//! - **Use.** The supervisor takes an instance's freshest `edge.stats`
//!   ([`Telemetry::fresh_stats`]) in place of `GET /stats`; polling stays
//!   the fallback and the liveness check (`docs/ARCHITECTURE.md`).
//!
//! Another transport (the Kafka datasink, for billing with acks from all
//! replicas, [`crate::billing`]) hands its messages to
//! [`Telemetry::offer_via`]: the same checks, the same table (a record
//! that arrives both ways is kept once, from whichever path was faster),
//! counted apart with `via="kafka"`.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::UdpSocket;
use vcdn_telemetry::agent::{Agent, AgentConfig};
use vcdn_telemetry::envelope::Reject;
use vcdn_telemetry::keys::{KeyFile, Keyring};
use vcdn_telemetry::message::{Authority, AuthorityKind, Role, Subscription};
use vcdn_telemetry::record::{
    self, Latest, Record, TOPIC_EDGE_EVENTS, TOPIC_EDGE_STATS, TOPIC_QOE_REPORTS,
    TOPIC_ROUTER_DECISIONS,
};

/// The key file in the data directory.
pub const KEY_FILE: &str = "telemetry-keys.json";

/// A record older than this (by arrival) is not used in place of a poll:
/// the supervisor samples once a second, and a cache publishes every
/// 100 ms, so 1.5 s means "several records in a row were lost".
pub const FRESH: Duration = Duration::from_millis(1500);

/// At most this many sources are held per topic (the store's instances;
/// records of other sources are not kept at all).
const MAX_SOURCES: usize = 100_000;

/// Where the agent talks.
#[derive(Debug, Clone, Copy)]
pub struct TelemetryOptions {
    pub discovery_port: u16,
    pub broadcast: IpAddr,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        TelemetryOptions {
            discovery_port: vcdn_telemetry::agent::DISCOVERY_PORT,
            broadcast: IpAddr::V4(Ipv4Addr::new(127, 255, 255, 255)),
        }
    }
}

/// What became of the records received, by topic (for `/metrics`).
#[derive(Default)]
pub struct RecordCounters {
    /// Kept as the source's newest.
    pub accepted: AtomicU64,
    /// Not newer than what is held (duplicate, late, old incarnation).
    pub duplicate: AtomicU64,
    /// A source that is no instance of the store.
    pub unknown_source: AtomicU64,
    /// Refused by [`record::open`]: bad MAC, unknown key, malformed.
    pub bad_mac: AtomicU64,
    pub unknown_key: AtomicU64,
    pub malformed: AtomicU64,
}

impl RecordCounters {
    fn rejected(&self, r: Reject) {
        match r {
            Reject::BadMac => &self.bad_mac,
            Reject::UnknownKey => &self.unknown_key,
            _ => &self.malformed,
        }
        .fetch_add(1, Relaxed);
    }
}

/// The path a record came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A datagram from the cache's agent (peer-to-peer mode).
    P2p,
    /// The Kafka data sink (`vcdn up --kafka`, see [`crate::billing`]).
    Kafka,
}

struct Table {
    latest: Latest,
    /// When each held record arrived here.
    arrived: HashMap<String, Instant>,
}

struct State {
    known: HashSet<String>,
    stats: Table,
    events: Table,
}

/// The control plane's telemetry: keys, agents, received records.
pub struct Telemetry {
    pub options: TelemetryOptions,
    member_json: String,
    tracker: Agent,
    consumer: Agent,
    keys: Arc<Keyring>,
    state: Mutex<State>,
    pub stats_counters: RecordCounters,
    pub events_counters: RecordCounters,
    /// `edge.stats` records that came through Kafka.
    pub kafka_stats_counters: RecordCounters,
    /// Events received, by kind (`start`, `drain`, other).
    events_by_kind: Mutex<HashMap<String, u64>>,
    /// This process's incarnation (its records' `inc`).
    boot_ms: u64,
    /// The last sequence number of each source this process publishes as
    /// (`control` for QoE reports, `router` for routing decisions).
    seqs: Mutex<HashMap<&'static str, u64>>,
}

/// The deployment's key file in `dir`: read, or made and written (0600)
/// on first start.
pub fn deployment_keys(dir: &Path) -> Result<KeyFile, String> {
    let path = dir.join(KEY_FILE);
    if path.exists() {
        return KeyFile::load(&path).map_err(|e| e.to_string());
    }
    let k = KeyFile::generate();
    k.save(&path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(k)
}

impl Telemetry {
    /// Starts the agents (tracker; consumer of `edge.stats` and
    /// `edge.events`) and the receiving tasks on the current runtime.
    pub async fn start(
        keys: &KeyFile,
        options: TelemetryOptions,
    ) -> Result<Arc<Telemetry>, String> {
        let keyring = Arc::new(keys.keyring().map_err(|e| e.to_string())?);
        let member_json = serde_json::to_string(&keys.member_only()).map_err(|e| e.to_string())?;
        let bind = |()| async {
            UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
                .await
                .map_err(|e| format!("cannot bind a telemetry socket: {e}"))
        };
        let stats_sock = bind(()).await?;
        let events_sock = bind(()).await?;
        let port = |s: &UdpSocket| s.local_addr().map(|a| a.port()).map_err(|e| e.to_string());
        // Two agents: the tracker does not hear its own node's SUBSCRIBE
        // (a node ignores its own datagrams), so the consumer is a node of
        // its own, as it would be on another host.
        let mut tcfg = AgentConfig::loopback("control-tracker", vec![Role::Tracker]);
        tcfg.discovery_port = options.discovery_port;
        tcfg.broadcast = options.broadcast;
        let tracker = Agent::start(tcfg, keyring.clone())
            .await
            .map_err(|e| format!("cannot start the telemetry tracker: {e}"))?;
        tracker.become_authority(
            AuthorityKind::Tracker,
            Authority {
                epoch: crate::control::now_ms(),
                bootstrap: None,
                cluster_id: None,
                controller: None,
                generation: 0,
            },
        );
        let mut cfg = AgentConfig::loopback("control", vec![Role::P2pConsumer, Role::P2pProducer]);
        cfg.publish = vec![TOPIC_QOE_REPORTS.into(), TOPIC_ROUTER_DECISIONS.into()];
        cfg.discovery_port = options.discovery_port;
        cfg.broadcast = options.broadcast;
        cfg.subscribe = vec![
            Subscription {
                topic: TOPIC_EDGE_STATS.into(),
                port: port(&stats_sock)?,
                host: None,
            },
            Subscription {
                topic: TOPIC_EDGE_EVENTS.into(),
                port: port(&events_sock)?,
                host: None,
            },
        ];
        let consumer = Agent::start(cfg, keyring.clone())
            .await
            .map_err(|e| format!("cannot start the telemetry agent: {e}"))?;
        let table = || Table {
            latest: Latest::new(MAX_SOURCES),
            arrived: HashMap::new(),
        };
        let t = Arc::new(Telemetry {
            options,
            member_json,
            tracker,
            consumer,
            keys: keyring,
            state: Mutex::new(State {
                known: HashSet::new(),
                stats: table(),
                events: table(),
            }),
            stats_counters: RecordCounters::default(),
            events_counters: RecordCounters::default(),
            kafka_stats_counters: RecordCounters::default(),
            events_by_kind: Mutex::new(HashMap::new()),
            boot_ms: crate::control::now_ms(),
            seqs: Mutex::new(HashMap::new()),
        });
        tokio::spawn(receive(Arc::downgrade(&t), stats_sock, TOPIC_EDGE_STATS));
        tokio::spawn(receive(Arc::downgrade(&t), events_sock, TOPIC_EDGE_EVENTS));
        Ok(t)
    }

    /// The key file a cache is started with (no private key), as JSON.
    pub fn member_keys_json(&self) -> &str {
        &self.member_json
    }

    /// Records of these sources (the store's instance ids) are kept; the
    /// others' are dropped, and what is held of them is forgotten.
    pub fn set_known(&self, ids: HashSet<String>) {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        for t in [&mut s.stats, &mut s.events] {
            t.latest.retain(|k| ids.contains(k));
            t.arrived.retain(|k, _| ids.contains(k));
        }
        s.known = ids;
    }

    /// One more known source (an instance being launched).
    pub fn add_known(&self, id: &str) {
        self.state.lock().known.insert(id.to_string());
    }

    /// Checks a frame received on `topic` and keeps it if it is its
    /// source's newest: the entry point for every transport. Says whether
    /// it was kept.
    pub fn offer(&self, topic: &str, frame: &[u8]) -> bool {
        self.offer_via(topic, frame, Via::P2p)
    }

    /// [`Telemetry::offer`] of a frame that came by `via` (counted apart).
    pub fn offer_via(&self, topic: &str, frame: &[u8], via: Via) -> bool {
        let (counters, stats) = match (topic, via) {
            (TOPIC_EDGE_STATS, Via::P2p) => (&self.stats_counters, true),
            (TOPIC_EDGE_STATS, Via::Kafka) => (&self.kafka_stats_counters, true),
            (TOPIC_EDGE_EVENTS, Via::P2p) => (&self.events_counters, false),
            _ => return false,
        };
        let r = match record::open(&self.keys, frame) {
            Ok(r) => r,
            Err(e) => {
                counters.rejected(e);
                tracing::debug!(topic, reason = e.label(), "telemetry record refused");
                return false;
            }
        };
        let kept = {
            let mut s = self.state.lock();
            if !s.known.contains(&r.source) {
                counters.unknown_source.fetch_add(1, Relaxed);
                return false;
            }
            let source = r.source.clone();
            let event = (!stats).then(|| r.data["event"].as_str().unwrap_or("other").to_string());
            let t = if stats { &mut s.stats } else { &mut s.events };
            let kept = t.latest.offer(r);
            if kept {
                t.arrived.insert(source, Instant::now());
                if let Some(e) = event {
                    let e = if matches!(e.as_str(), "start" | "drain") {
                        e
                    } else {
                        "other".into()
                    };
                    *self.events_by_kind.lock().entry(e).or_default() += 1;
                }
            }
            kept
        };
        if kept {
            counters.accepted.fetch_add(1, Relaxed);
        } else {
            counters.duplicate.fetch_add(1, Relaxed);
        }
        kept
    }

    /// Publishes a record on `topic` as `source` (without waiting: no
    /// destination yet, or a full socket buffer, drops it). Returns how
    /// many destinations it went to.
    pub fn publish(
        &self,
        topic: &str,
        source: &'static str,
        service: Option<String>,
        data: serde_json::Value,
    ) -> usize {
        let seq = {
            let mut seqs = self.seqs.lock();
            let s = seqs.entry(source).or_default();
            *s += 1;
            *s
        };
        let r = Record {
            source: source.to_string(),
            service,
            inc: self.boot_ms,
            seq,
            ts: crate::control::now_ms(),
            data,
        };
        let frame = record::seal(&self.keys, &r);
        if frame.len() > record::MAX_RECORD {
            tracing::warn!(
                topic,
                bytes = frame.len(),
                "telemetry record too large; not sent"
            );
            return 0;
        }
        self.consumer.publish(topic, &frame)
    }

    /// A player's QoE report (`POST /v1/services/{id}/qoe`) as a
    /// `qoe.reports` record, for whoever subscribes (the supervisor takes
    /// the report from the API directly, so it does not consume these).
    pub fn publish_qoe(&self, service: &str, region: &str, mos: f64) {
        self.publish(
            TOPIC_QOE_REPORTS,
            "control",
            Some(service.to_string()),
            serde_json::json!({"region": region, "mos": mos}),
        );
    }

    /// An instance's newest `edge.stats` record, if it arrived within
    /// `max_age`.
    pub fn fresh_stats(&self, id: &str, max_age: Duration) -> Option<Record> {
        let s = self.state.lock();
        let at = s.stats.arrived.get(id)?;
        if at.elapsed() > max_age {
            return None;
        }
        s.stats.latest.get(id).cloned()
    }

    /// The last event an instance published, if any.
    pub fn last_event(&self, id: &str) -> Option<Record> {
        self.state.lock().events.latest.get(id).cloned()
    }

    /// Prometheus lines: the agents' (label `agent`), and what became of
    /// the records.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        for (i, (name, a)) in [("tracker", &self.tracker), ("consumer", &self.consumer)]
            .into_iter()
            .enumerate()
        {
            let mut text = String::new();
            a.metrics().render(&mut text);
            labelled(&text, name, i == 0, out);
        }
        let _ = writeln!(
            out,
            "# HELP vcdn_control_telemetry_records_total Telemetry records received, by topic and what became of them.\n# TYPE vcdn_control_telemetry_records_total counter"
        );
        for (topic, c) in [
            (TOPIC_EDGE_STATS, &self.stats_counters),
            (TOPIC_EDGE_EVENTS, &self.events_counters),
        ] {
            for (result, v) in [
                ("accepted", &c.accepted),
                ("duplicate", &c.duplicate),
                ("unknown_source", &c.unknown_source),
                ("bad_mac", &c.bad_mac),
                ("unknown_key", &c.unknown_key),
                ("malformed", &c.malformed),
            ] {
                let _ = writeln!(
                    out,
                    "vcdn_control_telemetry_records_total{{topic=\"{topic}\",result=\"{result}\"}} {}",
                    v.load(Relaxed)
                );
            }
        }
        for (result, v) in [
            ("accepted", &self.kafka_stats_counters.accepted),
            ("duplicate", &self.kafka_stats_counters.duplicate),
            ("unknown_source", &self.kafka_stats_counters.unknown_source),
            ("bad_mac", &self.kafka_stats_counters.bad_mac),
            ("unknown_key", &self.kafka_stats_counters.unknown_key),
            ("malformed", &self.kafka_stats_counters.malformed),
        ] {
            let _ = writeln!(
                out,
                "vcdn_control_telemetry_records_total{{topic=\"{TOPIC_EDGE_STATS}\",result=\"{result}\",via=\"kafka\"}} {}",
                v.load(Relaxed)
            );
        }
        let _ = writeln!(out, "# TYPE vcdn_control_telemetry_events_total counter");
        let mut ev: Vec<_> = self
            .events_by_kind
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        ev.sort();
        for (k, v) in ev {
            let _ = writeln!(
                out,
                "vcdn_control_telemetry_events_total{{event=\"{k}\"}} {v}"
            );
        }
        let s = self.state.lock();
        let _ = writeln!(
            out,
            "# TYPE vcdn_control_telemetry_sources gauge\nvcdn_control_telemetry_sources {}",
            s.stats.latest.len()
        );
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How often the embedded router's decisions are published.
pub const ROUTER_DECISIONS_EVERY: Duration = Duration::from_secs(1);

/// Publishes the embedded router's routing decisions as `router.decisions`
/// records (source `router`), one per service every
/// [`ROUTER_DECISIONS_EVERY`]: cumulative counts per region and cache
/// ([`vcdn_router::metrics::decisions`]), never one datagram per request.
pub async fn publish_router_decisions(
    t: std::sync::Weak<Telemetry>,
    router: Arc<vcdn_router::state::Router>,
) {
    let mut tick = tokio::time::interval(ROUTER_DECISIONS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(t) = t.upgrade() else { return };
        for d in vcdn_router::metrics::decisions(&router.snapshot()) {
            let service = d["service"].as_str().map(str::to_string);
            t.publish(TOPIC_ROUTER_DECISIONS, "router", service, d);
        }
    }
}

/// `text`'s samples with an `agent` label (its `#` lines only if
/// `comments`, so that each series is declared once).
fn labelled(text: &str, agent: &str, comments: bool, out: &mut String) {
    for l in text.lines() {
        if l.starts_with('#') {
            if comments {
                out.push_str(l);
                out.push('\n');
            }
            continue;
        }
        match (l.find('{'), l.find(' ')) {
            (Some(b), _) => {
                out.push_str(&l[..=b]);
                out.push_str(&format!("agent=\"{agent}\","));
                out.push_str(&l[b + 1..]);
            }
            (None, Some(sp)) => {
                out.push_str(&l[..sp]);
                out.push_str(&format!("{{agent=\"{agent}\"}}"));
                out.push_str(&l[sp..]);
            }
            (None, None) => out.push_str(l),
        }
        out.push('\n');
    }
}

/// Receives one topic's datagrams until the telemetry is dropped.
async fn receive(t: std::sync::Weak<Telemetry>, sock: UdpSocket, topic: &'static str) {
    let mut buf = vec![0u8; record::MAX_RECORD + 1];
    loop {
        let n = match sock.recv_from(&mut buf).await {
            Ok((n, _)) => n,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(t) = t.upgrade() else { return };
        t.offer(topic, &buf[..n]);
    }
}

/// Where `vcdn up --kafka` runs its Kafka broker (the data sink).
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// The broker's directory (data, logs, pid file).
    pub data_dir: std::path::PathBuf,
    pub host: String,
    pub port: u16,
    pub controller_port: u16,
}

/// The control plane's data sink: a third agent (`control-sink`, role
/// datasink) whose task runs the Kafka broker and answers the producers'
/// HELLOs with its bootstrap servers. Stopping it ([`Sink::stop`], or
/// dropping the runtime) kills the broker.
pub struct Sink {
    pub agent: Arc<Agent>,
    /// `host:port` of the broker.
    pub bootstrap: String,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    /// Stops the broker and waits until it is gone.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

impl Telemetry {
    /// Starts the data sink (see [`Sink`]). The Kafka distribution must be
    /// there (`scripts/kafka.sh`); the broker itself starts in the
    /// background (seconds): producers keep what they publish meanwhile.
    pub async fn start_sink(&self, o: &KafkaOptions) -> Result<Sink, String> {
        use vcdn_telemetry::datasink::{self, BrokerSetup};
        let dist =
            vcdn_telemetry::kafka::KafkaDist::locate().map_err(|e| format!("--kafka: {e}"))?;
        let mut cfg = AgentConfig::loopback("control-sink", vec![Role::Datasink]);
        cfg.discovery_port = self.options.discovery_port;
        cfg.broadcast = self.options.broadcast;
        let agent = Arc::new(
            Agent::start(cfg, self.keys.clone())
                .await
                .map_err(|e| format!("cannot start the data sink's agent: {e}"))?,
        );
        let setup = BrokerSetup {
            dist,
            data_dir: o.data_dir.clone(),
            host: o.host.clone(),
            client_port: o.port,
            controller_port: o.controller_port,
            heap_mib: 384,
            topics: [
                TOPIC_EDGE_STATS,
                TOPIC_EDGE_EVENTS,
                TOPIC_ROUTER_DECISIONS,
                TOPIC_QOE_REPORTS,
            ]
            .iter()
            .map(|t| t.to_string())
            .collect(),
            partitions: 4,
        };
        let a = agent.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = datasink::run_master(a, setup).await {
                tracing::error!(error = %e, "the Kafka data sink stopped; billing waits for it");
            }
        });
        Ok(Sink {
            agent,
            bootstrap: format!("{}:{}", o.host, o.port),
            task,
        })
    }

    /// The deployment's keys (records are opened with them).
    pub fn keyring(&self) -> Arc<Keyring> {
        self.keys.clone()
    }
}
