//! `vcdn agent` (the telemetry agent every node runs, ANDy) and
//! `vcdn telemetry` (keys, and watching a topic live).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use vcdn_http::serve::{Response, ServeConfig};
use vcdn_telemetry::agent::{Agent, AgentConfig, Ingest, DISCOVERY_PORT};
use vcdn_telemetry::datasink;
use vcdn_telemetry::kafka::ProducerOptions;
use vcdn_telemetry::keys::KeyFile;
use vcdn_telemetry::message::{Authority, AuthorityKind, Role, Subscription};
use vcdn_telemetry::node::Net;

/// Where an agent talks: shared by `vcdn agent` and `vcdn telemetry tail`.
#[derive(Args, Clone)]
pub struct Discovery {
    /// The deployment's telemetry key file (JSON; `vcdn telemetry keys`).
    #[arg(long, env = "VCDN_TELEMETRY_KEYS")]
    keys: PathBuf,
    /// UDP port of discovery broadcasts.
    #[arg(long, default_value_t = DISCOVERY_PORT, env = "VCDN_TELEMETRY_DISCOVERY_PORT")]
    discovery_port: u16,
    /// Where broadcasts go: 127.255.255.255 on one host, the subnet's
    /// broadcast address on a LAN.
    #[arg(
        long,
        default_value = "127.255.255.255",
        env = "VCDN_TELEMETRY_BROADCAST"
    )]
    broadcast: IpAddr,
    /// Address the agent's sockets bind to.
    #[arg(long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Networks data may be sent to (repeatable) [default: 127.0.0.0/8].
    #[arg(long = "allow", value_parser = Net::parse)]
    allow: Vec<Net>,
}

impl Discovery {
    fn config(&self, node: &str, roles: Vec<Role>) -> AgentConfig {
        let mut c = AgentConfig::loopback(node, roles);
        c.discovery_port = self.discovery_port;
        c.broadcast = self.broadcast;
        c.bind = self.bind;
        if !self.allow.is_empty() {
            c.allowed = self.allow.clone();
        }
        c
    }

    fn keys(&self) -> Result<KeyFile, String> {
        KeyFile::load(&self.keys).map_err(|e| e.to_string())
    }
}

fn parse_role(s: &str) -> Result<Role, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        format!(
            "unknown role {s:?}: one of datasink, datasink-slave, producer, consumer, hybrid, \
             tracker, p2p-producer, p2p-consumer"
        )
    })
}

#[derive(Args)]
pub struct AgentArgs {
    /// This node's id: 1-64 of [A-Za-z0-9._:-] [default: agent-PID].
    #[arg(long, env = "VCDN_TELEMETRY_NODE")]
    node: Option<String>,
    /// A role (repeatable): tracker, p2p-producer, p2p-consumer, datasink,
    /// datasink-slave, producer, consumer, hybrid.
    #[arg(long = "role", required = true, value_parser = parse_role)]
    roles: Vec<Role>,
    /// Relay a local port to a topic: PORT=TOPIC (UDP) or PORT=TOPIC/tcp
    /// (newline-framed lines), on 127.0.0.1 (repeatable).
    #[arg(long = "ingest", value_parser = Ingest::parse)]
    ingest: Vec<Ingest>,
    /// Deliver a topic to a local port: TOPIC=PORT (UDP, a datagram per
    /// datum) or TOPIC=PORT/tcp (datasink consumers: in order, with
    /// backpressure, nothing dropped) (repeatable).
    #[arg(long = "subscribe", value_parser = datasink::Delivery::parse)]
    subscribe: Vec<datasink::Delivery>,
    /// Serve /metrics and /healthz here.
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_listen: SocketAddr,
    #[command(flatten)]
    discovery: Discovery,
    #[command(flatten)]
    kafka: KafkaArgs,
}

/// The broker of a datasink or datasink-slave node.
#[derive(Args)]
pub struct KafkaArgs {
    /// Where the broker keeps its data and logs [default: ./kafka-NODE].
    #[arg(long)]
    kafka_dir: Option<PathBuf>,
    /// The address other nodes reach this node's broker at.
    #[arg(long, default_value = "127.0.0.1")]
    kafka_host: String,
    #[arg(long, default_value_t = 9092)]
    kafka_port: u16,
    /// The datasink master's controller port.
    #[arg(long, default_value_t = 9093)]
    kafka_controller_port: u16,
    #[arg(long, default_value_t = 384)]
    kafka_heap_mib: u32,
    /// Partitions of each topic the sink creates.
    #[arg(long, default_value_t = 4)]
    kafka_partitions: i32,
    /// A topic the sink creates at start (repeatable) [default: vcdn's
    /// topics and `metrics`].
    #[arg(long = "sink-topic")]
    sink_topics: Vec<String>,
}

impl KafkaArgs {
    fn setup(&self, node: &str) -> Result<vcdn_telemetry::datasink::BrokerSetup, String> {
        use vcdn_telemetry::record::*;
        let dist = vcdn_telemetry::kafka::KafkaDist::locate().map_err(|e| e.to_string())?;
        let mut topics = self.sink_topics.clone();
        if topics.is_empty() {
            topics = [
                TOPIC_EDGE_STATS,
                TOPIC_EDGE_EVENTS,
                TOPIC_ROUTER_DECISIONS,
                TOPIC_QOE_REPORTS,
                "metrics",
            ]
            .map(String::from)
            .to_vec();
        }
        Ok(vcdn_telemetry::datasink::BrokerSetup {
            dist,
            data_dir: self
                .kafka_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("kafka-{node}"))),
            host: self.kafka_host.clone(),
            client_port: self.kafka_port,
            controller_port: self.kafka_controller_port,
            heap_mib: self.kafka_heap_mib,
            topics,
            partitions: self.kafka_partitions,
        })
    }
}

pub async fn agent(a: AgentArgs) -> Result<(), String> {
    let mut stop = vcdn_http::stop::StopSignal::install()?;
    let node = a
        .node
        .clone()
        .unwrap_or_else(|| format!("agent-{}", std::process::id()));
    let file = a.discovery.keys()?;
    let keys = Arc::new(file.keyring().map_err(|e| e.to_string())?);
    let authority_roles: Vec<&Role> = a
        .roles
        .iter()
        .filter(|r| matches!(r, Role::Tracker | Role::Datasink))
        .collect();
    if !authority_roles.is_empty() && !keys.can_sign() {
        return Err(format!(
            "the role {:?} needs the authority's private key, which {} does not hold",
            authority_roles[0],
            a.discovery.keys.display()
        ));
    }
    let broker_setup = if a
        .roles
        .iter()
        .any(|r| matches!(r, Role::Datasink | Role::DatasinkSlave))
    {
        Some(a.kafka.setup(&node)?)
    } else {
        None
    };
    let mut cfg = a.discovery.config(&node, a.roles.clone());
    cfg.ingest = a.ingest.clone();
    // A relay of local applications holds more before the sink is known
    // than an embedded agent (1 MiB).
    cfg.early_bytes = 16 << 20;
    if a.roles.contains(&Role::P2pConsumer) && a.subscribe.iter().any(|d| d.tcp) {
        return Err("a p2p consumer's data come over UDP straight from producers: /tcp is for datasink consumers".into());
    }
    cfg.subscribe = a
        .subscribe
        .iter()
        .map(datasink::Delivery::subscription)
        .collect();
    let agent = Arc::new(
        Agent::start(cfg, keys)
            .await
            .map_err(|e| format!("cannot start the agent: {e}"))?,
    );
    if a.roles.contains(&Role::Tracker) {
        agent.become_authority(
            AuthorityKind::Tracker,
            Authority {
                epoch: now_ms(),
                bootstrap: None,
                cluster_id: None,
                controller: None,
                generation: 0,
            },
        );
    }
    let mut tasks = Vec::new();
    if let Some(setup) = broker_setup {
        // One task, aborted at shutdown: dropping it drops the broker,
        // whose Drop stops the JVM before this process exits.
        let (agent, master) = (agent.clone(), a.roles.contains(&Role::Datasink));
        tasks.push(tokio::spawn(async move {
            let r = if master {
                datasink::run_master(agent, setup).await
            } else {
                datasink::run_slave(agent, setup).await
            };
            if let Err(e) = r {
                eprintln!("vcdn agent: {e}");
                std::process::exit(1);
            }
        }));
    }
    if a.roles
        .iter()
        .any(|r| matches!(r, Role::Producer | Role::Hybrid))
    {
        tasks.push(tokio::spawn(datasink::follow_sink_producer(
            agent.clone(),
            ProducerOptions::default(),
        )));
    }
    if a.roles
        .iter()
        .any(|r| matches!(r, Role::Consumer | Role::Hybrid))
    {
        tasks.push(tokio::spawn(datasink::run_consumer(
            agent.clone(),
            a.subscribe.clone(),
        )));
    }
    let listener = tokio::net::TcpListener::bind(a.metrics_listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", a.metrics_listen))?;
    let metrics_at = listener.local_addr().map_err(|e| e.to_string())?;
    let m = agent.clone();
    let handler: vcdn_http::serve::Handler = Arc::new(move |req| {
        let m = m.clone();
        Box::pin(async move {
            match req.head.path() {
                b"/metrics" => {
                    let mut text = String::new();
                    m.render_metrics(&mut text);
                    Response::new(200, "text/plain; version=0.0.4", text)
                }
                b"/healthz" => Response::new(200, "text/plain", "ok\n"),
                _ => Response::problem(404, "this agent serves /metrics and /healthz"),
            }
        })
    });
    tokio::spawn(vcdn_http::serve::serve(
        listener,
        ServeConfig::default(),
        handler,
    ));
    println!(
        "vcdn agent {node} listening on http://{metrics_at} (/metrics, /healthz), udp/{} (discovery, broadcast to {}), udp/{} (unicast)",
        a.discovery.discovery_port,
        a.discovery.broadcast,
        agent.unicast_addr().port()
    );
    for (i, at) in a.ingest.iter().zip(agent.ingest_addrs()) {
        println!("  ingest {} → topic {}", at, i.topic);
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    stop.recv().await;
    for t in tasks {
        t.abort();
        let _ = t.await;
    }
    if let Some(k) = agent.kafka_producer() {
        let _ = tokio::task::spawn_blocking(move || k.flush(Duration::from_secs(5))).await;
    }
    // The metrics handler still holds the agent; BYE goes out regardless.
    agent.shutdown().await;
    Ok(())
}

/// Runs `f` on a small runtime of its own (the agent is light).
pub fn run(f: impl std::future::Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(f)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Subcommand)]
pub enum TelemetryCmd {
    /// Make a deployment's key file (MAC key and the authority's key pair),
    /// and optionally the copy without the private key that nodes get.
    Keys {
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        member_out: Option<PathBuf>,
    },
    /// Watch a topic live: join discovery as a p2p consumer and print each
    /// datum (a vcdn record as its JSON, after checking its MAC).
    Tail {
        topic: String,
        /// Stop after this many data.
        #[arg(long)]
        count: Option<u64>,
        /// Read the topic from the data sink's Kafka (found by discovery),
        /// from now on, instead of joining as a peer-to-peer consumer.
        #[arg(long)]
        kafka: bool,
        #[command(flatten)]
        discovery: Discovery,
    },
}

/// One datum as a line: a vcdn record as its JSON (after its MAC is
/// checked), anything else as text.
fn tail_line(keys: &vcdn_telemetry::keys::Keyring, datum: &[u8]) -> String {
    match vcdn_telemetry::record::open(keys, datum) {
        Ok(r) => serde_json::to_string(&r).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(datum).trim_end().to_string(),
    }
}

/// `vcdn telemetry tail --kafka`: a consumer of its own (a fresh group that
/// starts at the end), pointed at the sink discovery finds.
async fn tail_kafka(topic: &str, count: Option<u64>, discovery: &Discovery) -> Result<(), String> {
    let keys = Arc::new(
        discovery
            .keys()?
            .member_only()
            .keyring()
            .map_err(|e| e.to_string())?,
    );
    let mut stop = vcdn_http::stop::StopSignal::install()?;
    let node = format!("tail-{}", std::process::id());
    let agent = Agent::start(discovery.config(&node, vec![Role::Consumer]), keys.clone())
        .await
        .map_err(|e| format!("cannot start the agent: {e}"))?;
    eprintln!("tail {topic}: looking for the data sink (Ctrl-C stops)");
    let bootstrap = loop {
        if let Some(b) = agent.sink().and_then(|a| a.bootstrap) {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut opts = vcdn_telemetry::kafka::ConsumerOptions::new(&node);
    opts.extra
        .push(("auto.offset.reset".into(), "latest".into()));
    opts.extra
        .push(("enable.auto.commit".into(), "false".into()));
    let mut c = vcdn_telemetry::kafka::Consumer::new(&bootstrap, &[topic], opts)
        .map_err(|e| e.to_string())?;
    eprintln!("tail {topic}: reading from Kafka at {bootstrap}");
    let mut n = 0u64;
    let mut out = std::io::stdout();
    while count.is_none_or(|c| n < c) {
        tokio::select! {
            r = c.recv() => {
                let rec = r.map_err(|e| e.to_string())?;
                if std::io::Write::write_all(&mut out, format!("{}\n", tail_line(&keys, &rec.payload)).as_bytes()).is_err() {
                    break;
                }
                n += 1;
            }
            _ = stop.recv() => break,
        }
    }
    drop(c);
    agent.shutdown().await;
    Ok(())
}

pub async fn telemetry(cmd: TelemetryCmd) -> Result<(), String> {
    match cmd {
        TelemetryCmd::Keys { out, member_out } => {
            let f = KeyFile::generate();
            f.save(&out)
                .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
            println!(
                "wrote {} (keep it secret: it holds the authority's private key)",
                out.display()
            );
            if let Some(m) = member_out {
                f.member_only()
                    .save(&m)
                    .map_err(|e| format!("cannot write {}: {e}", m.display()))?;
                println!("wrote {} (for nodes that are not authorities)", m.display());
            }
            Ok(())
        }
        TelemetryCmd::Tail {
            topic,
            count,
            kafka: true,
            discovery,
        } => tail_kafka(&topic, count, &discovery).await,
        TelemetryCmd::Tail {
            topic,
            count,
            kafka: false,
            discovery,
        } => {
            let file = discovery.keys()?;
            let keys = Arc::new(file.member_only().keyring().map_err(|e| e.to_string())?);
            let inbox = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let port = inbox.local_addr().map_err(|e| e.to_string())?.port();
            let node = format!("tail-{}", std::process::id());
            let mut cfg = discovery.config(&node, vec![Role::P2pConsumer]);
            cfg.subscribe = vec![Subscription {
                topic: topic.clone(),
                port,
                host: None,
            }];
            let agent = Agent::start(cfg, keys.clone())
                .await
                .map_err(|e| format!("cannot start the agent: {e}"))?;
            eprintln!(
                "tail {topic}: waiting for the tracker and data on udp/{port} (Ctrl-C stops)"
            );
            let n = tokio::task::spawn_blocking(move || {
                inbox
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .ok();
                let mut buf = vec![0u8; 65_536];
                let mut n = 0u64;
                let mut out = std::io::stdout().lock();
                while count.is_none_or(|c| n < c) {
                    let Ok((len, _)) = inbox.recv_from(&mut buf) else {
                        continue;
                    };
                    let line = tail_line(&keys, &buf[..len]);
                    if std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes()).is_err()
                    {
                        break;
                    }
                    n += 1;
                }
                n
            });
            tokio::select! {
                r = n => { r.map_err(|e| e.to_string())?; }
                _ = tokio::signal::ctrl_c() => {}
            }
            agent.shutdown().await;
            Ok(())
        }
    }
}
