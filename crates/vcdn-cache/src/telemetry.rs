//! The cache's telemetry agent (issue 19, ANDy peer-to-peer mode): with a
//! key file from the control plane, the cache runs an agent (role
//! p2p-producer, node id = its instance id) on a thread of its own, so
//! that neither discovery nor publishing ever runs on a serving thread.
//!
//! - `edge.stats`: every `telemetry_interval_ms` the same document as
//!   `GET /stats` (cumulative counters), as a [`Record`] with the boot time
//!   as incarnation and an increasing sequence number: a lost record costs
//!   freshness only, a duplicated or late one is recognised by the
//!   supervisor, and a restart is a new incarnation, never a negative delta.
//! - `edge.events`: `{"event": "start"}` (repeated until the tracker has
//!   named a destination for it, so that it is not lost before discovery)
//!   and `{"event": "drain"}` when the cache starts to shut down.
//!
//! [`Agent::publish`] sends without waiting: a full socket buffer drops
//! the datagram and counts it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vcdn_telemetry::agent::{Agent, AgentConfig};
use vcdn_telemetry::keys::{KeyFile, Keyring};
use vcdn_telemetry::message::Role;
use vcdn_telemetry::record::{self, Record, TOPIC_EDGE_EVENTS, TOPIC_EDGE_STATS};

use crate::proxy::Cache;

/// The shortest publication interval accepted (10 records per second per
/// cache at most would already be the default).
const MIN_INTERVAL_MS: u64 = 10;

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The cache's publisher: the agent and what every record carries.
pub struct Publisher {
    agent: Arc<Agent>,
    keys: Arc<Keyring>,
    node: String,
    boot_ms: u64,
    seq: AtomicU64,
}

impl Publisher {
    /// Seals `data` as this cache's next record and sends it to the
    /// topic's destinations without waiting (callable from any thread);
    /// returns how many it went to.
    pub fn publish(&self, topic: &str, data: serde_json::Value) -> usize {
        let r = Record {
            source: self.node.clone(),
            service: None,
            inc: self.boot_ms,
            seq: self.seq.fetch_add(1, Relaxed) + 1,
            ts: wall_ms(),
            data,
        };
        let f = record::seal(&self.keys, &r);
        if f.len() > record::MAX_RECORD {
            tracing::warn!(
                topic,
                bytes = f.len(),
                "telemetry record too large; not sent"
            );
            return 0;
        }
        self.agent.publish(topic, &f)
    }

    pub fn agent(&self) -> &Agent {
        &self.agent
    }
}

/// Starts the agent's thread if the cache was given telemetry keys. The key
/// file is read here, so that a bad one stops the start with a message.
pub fn start(cache: &Arc<Cache>) -> Result<Option<std::thread::JoinHandle<()>>, String> {
    let cfg = &cache.cfg;
    let Some(path) = &cfg.telemetry_keys else {
        return Ok(None);
    };
    let keys = KeyFile::load(path)
        .and_then(|f| f.keyring())
        .map_err(|e| e.to_string())?;
    let node = cfg
        .telemetry_node
        .clone()
        .or_else(|| {
            cfg.instance_id
                .as_ref()
                .map(|i| i.split('.').next().unwrap_or(i).to_string())
        })
        .ok_or("--telemetry-keys needs --telemetry-node (or --instance-id)")?;
    if !vcdn_telemetry::message::valid_node_id(&node) {
        return Err(format!(
            "--telemetry-node {node:?} must be 1-64 of [A-Za-z0-9._:-]"
        ));
    }
    // With `telemetry_kafka` (vcdn up --kafka), both paths: p2p datagrams
    // to the tracker's consumers (fast: scaling) and, once the data sink
    // answers, Kafka with acks from all replicas (billing). Without it no
    // producer role: a node that follows a sink is not configured until
    // one answers, and holds up to `early_bytes` for it.
    let mut roles = vec![Role::P2pProducer];
    if cfg.telemetry_kafka {
        roles.push(Role::Producer);
    }
    let kafka = cfg.telemetry_kafka;
    let mut acfg = AgentConfig::loopback(&node, roles);
    acfg.publish = vec![TOPIC_EDGE_STATS.into(), TOPIC_EDGE_EVENTS.into()];
    acfg.discovery_port = cfg.telemetry_discovery_port;
    acfg.broadcast = cfg.telemetry_broadcast;
    let interval = Duration::from_millis(cfg.telemetry_interval_ms.max(MIN_INTERVAL_MS));
    let cache = cache.clone();
    let keys = Arc::new(keys);
    std::thread::Builder::new()
        .name("vcdn-cache-telemetry".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the telemetry runtime");
                    return;
                }
            };
            rt.block_on(async move {
                let agent = match Agent::start(acfg, keys.clone()).await {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the telemetry agent");
                        return;
                    }
                };
                let p = Arc::new(Publisher {
                    agent: Arc::new(agent),
                    keys,
                    node,
                    boot_ms: cache.boot_ms,
                    seq: AtomicU64::new(0),
                });
                let _ = cache.telemetry.set(p.clone());
                if kafka {
                    tokio::spawn(vcdn_telemetry::datasink::follow_sink_producer(
                        p.agent.clone(),
                        vcdn_telemetry::kafka::ProducerOptions::default(),
                    ));
                }
                publish_loop(&cache, &p, interval).await;
            });
        })
        .map(Some)
        .map_err(|e| format!("cannot start the telemetry thread: {e}"))
}

async fn publish_loop(cache: &Cache, p: &Publisher, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut started_sent = false;
    loop {
        tick.tick().await;
        if !started_sent {
            started_sent = p.publish(
                TOPIC_EDGE_EVENTS,
                serde_json::json!({"event": "start", "boot_ms": cache.boot_ms}),
            ) > 0;
        }
        p.publish(TOPIC_EDGE_STATS, crate::admin::stats(cache));
    }
}

/// The `drain` event, sent at once from the thread that starts the drain
/// (the process may exit right after).
pub fn drain_event(cache: &Cache) {
    if let Some(p) = cache.telemetry.get() {
        p.publish(TOPIC_EDGE_EVENTS, serde_json::json!({"event": "drain"}));
    }
}

/// Leaves the telemetry network with a BYE once the drain is over (the
/// process exits next), so the tracker drops this cache at once instead
/// of when its lease runs out.
pub fn leave(cache: &Cache) {
    if let Some(p) = cache.telemetry.get() {
        p.agent().shutdown_blocking(Duration::from_secs(1));
    }
}

/// The agent's lines for the cache's `/metrics`.
pub fn render(cache: &Cache, out: &mut String) {
    if let Some(p) = cache.telemetry.get() {
        p.agent().metrics().render(out);
    }
}
