//! Datasink mode: the agent's roles that need Kafka (§3.2.1 of the thesis).
//!
//! - **datasink (master)**: starts a KRaft broker (controller and broker in
//!   one JVM), creates the telemetry topics, then acts as the sink
//!   authority; when a slave's broker registers, spreads the topics'
//!   partitions over every broker (Kafka's reassignment tool) and announces
//!   CLUSTER_RESIZE.
//! - **datasink-slave**: on CONFIG with its broker id, formats its storage
//!   with the sink's cluster id, starts a broker against the sink's
//!   controller, and registers.
//! - **producer / hybrid**: a Kafka producer that follows the sink; the
//!   agent's `publish` (in-process records and local ingest ports) queues
//!   each datum there without waiting, keyed by the node id so one
//!   producer's data stay in order in one partition.
//! - **consumer / hybrid**: a consumer group member (group `vcdn-<node>`,
//!   stable, so a restarted consumer resumes from its committed offsets)
//!   that delivers every record to the local UDP port its topic maps to.
//!
//! Kafka 4 has no ZooKeeper: CONFIG and RECONFIG carry the bootstrap
//! servers, the cluster id and the controller (`id@host:port`).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast::error::RecvError;

use crate::agent::Agent;
use crate::kafka::{
    Admin, Broker, BrokerSpec, Consumer, ConsumerOptions, KafkaDist, Producer, ProducerOptions,
    TopicSpec,
};
use crate::message::{Authority, AuthorityKind, Subscription};
use crate::node::Event;

/// Where and how this node runs its broker.
#[derive(Clone, Debug)]
pub struct BrokerSetup {
    pub dist: KafkaDist,
    pub data_dir: PathBuf,
    /// The address clients on other nodes reach the broker at.
    pub host: String,
    pub client_port: u16,
    /// The master's controller port.
    pub controller_port: u16,
    pub heap_mib: u32,
    /// The topics the sink creates (and spreads on a resize).
    pub topics: Vec<String>,
    pub partitions: i32,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn parse_controller(s: &str) -> Option<(i32, SocketAddr)> {
    let (id, addr) = s.split_once('@')?;
    Some((id.parse().ok()?, addr.parse().ok()?))
}

/// Runs the datasink master until the task is dropped: the broker, the
/// topics, the authority, and the resizes. The broker is killed when this
/// ends.
pub async fn run_master(agent: Arc<Agent>, setup: BrokerSetup) -> Result<(), String> {
    let mut spec = BrokerSpec::master(
        &setup.host,
        setup.client_port,
        setup.controller_port,
        &setup.data_dir,
    );
    spec.heap_mib = setup.heap_mib;
    spec.default_partitions = setup.partitions.max(1) as u32;
    let dist = setup.dist.clone();
    let broker = tokio::task::spawn_blocking(move || Broker::start(&dist, spec))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the data sink's broker does not start: {e}"))?;
    let bootstrap = broker.bootstrap();
    let controller = broker
        .controller()
        .map(|(id, addr)| format!("{id}@{addr}"))
        .ok_or("the master broker has no controller")?;
    let admin = Admin::new(&bootstrap).map_err(|e| e.to_string())?;
    let topics: Vec<TopicSpec> = setup
        .topics
        .iter()
        .map(|t| TopicSpec {
            name: t.clone(),
            partitions: setup.partitions.max(1),
            replication: 1,
        })
        .collect();
    admin
        .create_topics(&topics)
        .await
        .map_err(|e| format!("creating the telemetry topics: {e}"))?;
    warm_up(&bootstrap).await;
    let mut events = agent.events();
    agent.become_authority(
        AuthorityKind::Datasink,
        Authority {
            epoch: now_ms(),
            bootstrap: Some(bootstrap.clone()),
            cluster_id: Some(broker.cluster_id().to_string()),
            controller: Some(controller),
            generation: 0,
        },
    );
    tracing::info!(%bootstrap, "data sink: broker running, topics created");
    let admin = Arc::new(admin);
    loop {
        match events.recv().await {
            Ok(Event::SlaveRegistered {
                broker_id,
                listener,
            }) => {
                tracing::info!(
                    broker_id,
                    listener,
                    "data sink: a slave joined; spreading partitions"
                );
                let (admin, dist, names) =
                    (admin.clone(), setup.dist.clone(), setup.topics.clone());
                let done = tokio::task::spawn_blocking(move || {
                    let topics: Vec<&str> = names.iter().map(String::as_str).collect();
                    admin.wait_brokers(2, Duration::from_secs(60))?;
                    admin.spread_over_all_brokers(&dist, &topics, Duration::from_secs(120))?;
                    admin.brokers()
                })
                .await
                .map_err(|e| e.to_string())?;
                match done {
                    Ok(brokers) => {
                        let ids: Vec<u32> = brokers.iter().map(|b| b.id as u32).collect();
                        tracing::info!(brokers = ?ids, "data sink: partitions spread; CLUSTER_RESIZE");
                        agent.cluster_resized(ids);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "data sink: the resize failed; the slave will register again")
                    }
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => break,
        }
    }
    drop(broker);
    Ok(())
}

/// Sends one message with an idempotent producer before the sink announces
/// itself, so that the transaction coordinator (which hands out producer
/// ids, and makes its log at the first request) is ready when the first
/// producer comes: discovery is then a matter of milliseconds, not of the
/// broker creating an internal topic.
async fn warm_up(bootstrap: &str) {
    let b = bootstrap.to_string();
    let ok = tokio::task::spawn_blocking(move || {
        let p = Producer::new(&b, ProducerOptions::default()).ok()?;
        p.send(WARM_UP_TOPIC, b"", b"").ok()?;
        p.flush(Duration::from_secs(60)).then_some(())
    })
    .await;
    if !matches!(ok, Ok(Some(()))) {
        tracing::warn!(
            "data sink: the warm-up message was not delivered; the first producer may wait"
        );
    }
}

/// Where [`warm_up`] writes (no consumer reads it).
const WARM_UP_TOPIC: &str = "_vcdn.warmup";

/// Runs a datasink slave: on each broker id assigned, (re)starts the broker
/// and registers it.
pub async fn run_slave(agent: Arc<Agent>, setup: BrokerSetup) -> Result<(), String> {
    let mut events = agent.events();
    let mut broker: Option<Broker> = None;
    loop {
        match events.recv().await {
            Ok(Event::SlaveAssigned {
                broker_id,
                authority,
            }) => {
                let (Some(cluster), Some(controller)) = (
                    authority.cluster_id.clone(),
                    authority.controller.as_deref().and_then(parse_controller),
                ) else {
                    tracing::warn!(
                        "a CONFIG without cluster id or controller; waiting for another"
                    );
                    continue;
                };
                drop(broker.take());
                let mut spec = BrokerSpec::slave(
                    broker_id as i32,
                    &setup.host,
                    setup.client_port,
                    controller,
                    &cluster,
                    &setup.data_dir.join(format!("{cluster}-{broker_id}")),
                );
                spec.heap_mib = setup.heap_mib;
                let dist = setup.dist.clone();
                match tokio::task::spawn_blocking(move || Broker::start(&dist, spec)).await {
                    Ok(Ok(b)) => {
                        agent.slave_ready(b.bootstrap());
                        tracing::info!(broker_id, bootstrap = %b.bootstrap(), "slave broker running");
                        broker = Some(b);
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "the slave broker does not start"),
                    Err(e) => tracing::warn!(error = %e, "the slave broker's start panicked"),
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return Ok(()),
        }
    }
}

/// Whether two bootstrap lists name no server in common (another cluster).
fn other_cluster(a: &str, b: &str) -> bool {
    !a.split(',')
        .any(|x| !x.is_empty() && b.split(',').any(|y| y == x))
}

/// Keeps the agent's Kafka producer pointed at the current sink.
pub async fn follow_sink_producer(agent: Arc<Agent>, options: ProducerOptions) {
    let mut events = agent.events();
    if let Some(a) = agent.sink() {
        point_producer(&agent, &a, &options).await;
    }
    loop {
        match events.recv().await {
            Ok(Event::Sink { authority, .. }) => point_producer(&agent, &authority, &options).await,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

async fn point_producer(agent: &Arc<Agent>, a: &Authority, options: &ProducerOptions) {
    let Some(bootstrap) = a.bootstrap.clone() else {
        return;
    };
    match agent.kafka_producer() {
        None => match Producer::new(&bootstrap, options.clone()) {
            Ok(p) => {
                tracing::info!(%bootstrap, "Kafka producer ready");
                agent.set_kafka_producer(Arc::new(p));
            }
            Err(e) => tracing::warn!(error = %e, "cannot make a Kafka producer"),
        },
        Some(p) if other_cluster(&p.bootstrap(), &bootstrap) => {
            tracing::info!(from = %p.bootstrap(), to = %bootstrap, "re-pointing the Kafka producer");
            let _ =
                tokio::task::spawn_blocking(move || p.repoint(&bootstrap, Duration::from_secs(2)))
                    .await;
        }
        Some(_) => {} // the same cluster, perhaps grown: librdkafka follows its metadata
    }
}

/// Where a consumer delivers a topic on its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub topic: String,
    pub port: u16,
    /// Over TCP (each record's bytes as they are, in order, with
    /// backpressure: nothing is lost while the application is slow or
    /// restarting, Kafka holds the rest) instead of one UDP datagram per
    /// record (as the thesis: a burst larger than the application's
    /// receive buffer is dropped by the kernel).
    pub tcp: bool,
}

impl Delivery {
    /// `TOPIC=PORT` (UDP) or `TOPIC=PORT/tcp`.
    pub fn parse(s: &str) -> Result<Delivery, String> {
        let (t, p) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not TOPIC=PORT"))?;
        let (p, tcp) = match p.strip_suffix("/tcp") {
            Some(p) => (p, true),
            None => (p.strip_suffix("/udp").unwrap_or(p), false),
        };
        let port = p.parse().map_err(|_| format!("{p:?} is not a port"))?;
        if t.is_empty() {
            return Err(format!("{s:?} has no topic"));
        }
        Ok(Delivery {
            topic: t.to_string(),
            port,
            tcp,
        })
    }

    pub fn subscription(&self) -> Subscription {
        Subscription {
            topic: self.topic.clone(),
            port: self.port,
            host: None,
        }
    }
}

/// The local side of deliveries: one UDP socket, one TCP connection per
/// TCP port (reconnected when the application comes back).
struct Local {
    udp: UdpSocket,
    tcp: std::collections::HashMap<u16, tokio::net::TcpStream>,
}

impl Local {
    /// Hands `payload` to the application at `d`; for TCP, waits (retrying
    /// every 200 ms) until the application takes it.
    async fn deliver(&mut self, agent: &Agent, d: &Delivery, payload: &[u8]) {
        use std::sync::atomic::Ordering::Relaxed;
        use tokio::io::AsyncWriteExt;
        let to = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), d.port);
        if !d.tcp {
            let r = self.udp.send_to(payload, to);
            let m = agent.metrics();
            if r.is_ok() {
                &m.data_sent
            } else {
                &m.data_dropped
            }
            .fetch_add(1, Relaxed);
            return;
        }
        loop {
            let s = match self.tcp.entry(d.port) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    match tokio::net::TcpStream::connect(to).await {
                        Ok(s) => v.insert(s),
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    }
                }
            };
            match s.write_all(payload).await {
                Ok(()) => {
                    agent.metrics().data_sent.fetch_add(1, Relaxed);
                    return;
                }
                Err(_) => {
                    // The application went away mid-way: reconnect and send
                    // the record again (at-least-once).
                    self.tcp.remove(&d.port);
                }
            }
        }
    }
}

/// Delivers the subscribed topics from Kafka to local ports, following the
/// sink. A record is marked consumed (and its offset committed) only after
/// it was handed on. Runs until the agent stops.
pub async fn run_consumer(agent: Arc<Agent>, deliveries: Vec<Delivery>) {
    let mut events = agent.events();
    let udp = match UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "consumer relay: no socket");
            return;
        }
    };
    let mut local = Local {
        udp,
        tcp: Default::default(),
    };
    let mut topics: Vec<String> = deliveries.iter().map(|s| s.topic.clone()).collect();
    topics.sort();
    topics.dedup();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let group = format!("vcdn-{}", agent.node_id());
    let mut consumer: Option<Consumer> = None;
    let mut bootstrap = agent.sink().and_then(|a| a.bootstrap);
    loop {
        if consumer.is_none() {
            if let Some(b) = &bootstrap {
                match Consumer::new(b, &names, ConsumerOptions::new(&group)) {
                    Ok(c) => {
                        tracing::info!(bootstrap = %b, group = %group, "Kafka consumer joined");
                        consumer = Some(c);
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot make a Kafka consumer"),
                }
            }
        }
        tokio::select! {
            r = async { consumer.as_mut().expect("checked").recv().await }, if consumer.is_some() => match r {
                Ok(rec) => {
                    for d in deliveries.iter().filter(|d| d.topic == rec.topic) {
                        local.deliver(&agent, d, &rec.payload).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Kafka consumer failed; joining again");
                    consumer = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
            e = events.recv() => match e {
                Ok(Event::Sink { authority, .. }) => {
                    let new = authority.bootstrap.clone();
                    let changed = match (&bootstrap, &new) {
                        (Some(a), Some(b)) => other_cluster(a, b),
                        (None, Some(_)) => true,
                        _ => false,
                    };
                    if changed {
                        bootstrap = new;
                        if let (Some(mut c), Some(b)) = (consumer.take(), bootstrap.clone()) {
                            tracing::info!(to = %b, "re-pointing the Kafka consumer");
                            consumer = tokio::task::block_in_place(|| c.repoint(&b).ok().map(|_| c));
                        }
                    }
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_differ_when_no_server_is_shared() {
        assert!(!other_cluster("a:1", "a:1,b:2"));
        assert!(!other_cluster("a:1,b:2", "b:2"));
        assert!(other_cluster("a:1", "c:3"));
        assert_eq!(
            parse_controller("1@127.0.0.1:9093"),
            Some((1, "127.0.0.1:9093".parse().unwrap()))
        );
        assert_eq!(parse_controller("x@y"), None);
    }

    #[test]
    fn deliveries_parse() {
        assert_eq!(
            Delivery::parse("m=9").unwrap(),
            Delivery {
                topic: "m".into(),
                port: 9,
                tcp: false
            }
        );
        assert!(Delivery::parse("m=9/tcp").unwrap().tcp);
        assert!(Delivery::parse("=9").is_err());
        assert!(Delivery::parse("m=x").is_err());
    }
}
