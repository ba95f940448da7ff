//! A Kafka broker in KRaft mode run as a child JVM: the datasink master is
//! controller and broker in one process; a datasink slave is a broker only
//! that joins the master's quorum (CLUSTER_RESIZE), then partitions are
//! spread over both with [`crate::kafka::Admin`].
//!
//! Everything the JVM writes (data, metadata log, `server.log`, the JVM's own
//! output) goes to the spec's data directory, never to the working directory.
//! Layout of the data directory:
//!
//! ```text
//! server.properties   written at every start from the spec
//! log4j2.properties   the logging configuration (server.log only)
//! data/               log.dirs: partitions and the KRaft metadata log
//! logs/server.log     the broker's log (its tail is in start errors)
//! logs/stdout.log     the JVM's stdout and stderr
//! ```
//!
//! Starting waits for readiness (the client port accepts and the broker lists
//! itself in the metadata it serves), never a fixed sleep. Dropping a
//! [`Broker`] kills its process group; [`Broker::stop`] and
//! [`Broker::restart`] keep the data directory so that a restarted broker has
//! its topics and committed offsets. All methods block (process start and
//! readiness take seconds): call them from `spawn_blocking` in async code.

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;

use super::dist::KafkaDist;

/// What a broker is in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerRole {
    /// The datasink master: KRaft controller and broker in one process; the
    /// controller listens on `controller_port` (same host as the clients).
    Master { controller_port: u16 },
    /// A datasink slave: a broker only, registering with the quorum of the
    /// master's controller `controller_id@controller` (a static voter set
    /// of one, the master's).
    Slave {
        controller_id: i32,
        controller: SocketAddr,
    },
}

/// How to run one broker.
#[derive(Debug, Clone)]
pub struct BrokerSpec {
    /// `node.id`: unique in the cluster.
    pub node_id: i32,
    pub role: BrokerRole,
    /// The address the client listener binds to and advertises (and the
    /// controller listener, for a master). An IP address, so that what is
    /// advertised is what a client on another node reaches.
    pub host: String,
    /// The plaintext client (and inter-broker) listener's port.
    pub client_port: u16,
    /// The cluster id: a master makes one when `None`; a slave must be
    /// given the master's (the discovery protocol carries it).
    pub cluster_id: Option<String>,
    /// Where everything of this broker lives; created if absent, kept by
    /// stop and restart.
    pub data_dir: PathBuf,
    /// JVM heap (`-Xms` = `-Xmx`), MiB.
    pub heap_mib: u32,
    /// Replication factor of the internal topics (consumer offsets,
    /// transaction state, share-group state) and the default of new topics;
    /// 1 for a one-node datasink. Min ISR of the internal topics follows
    /// (at most 2).
    pub replication: u16,
    /// Partitions of auto-created topics.
    pub default_partitions: u32,
    /// Partitions of `__consumer_offsets` (Kafka's default 50 makes the
    /// first group join of a fresh cluster slow; 10 is plenty here).
    pub offsets_partitions: u32,
    /// How long start and restart wait for readiness.
    pub start_timeout: Duration,
    /// How long records are kept (`log.retention.ms`): telemetry is
    /// consumed within seconds; Kafka's 7 days at 2 MiB/s would be 1.2 TB.
    pub retention: Duration,
    /// At most this much is kept per partition (`log.retention.bytes`).
    pub retention_bytes_per_partition: u64,
}

impl BrokerSpec {
    /// A one-node datasink master on `host`, ports `client_port` and
    /// `controller_port`, with replication 1.
    pub fn master(host: &str, client_port: u16, controller_port: u16, data_dir: &Path) -> Self {
        BrokerSpec {
            node_id: 1,
            role: BrokerRole::Master { controller_port },
            host: host.to_string(),
            client_port,
            cluster_id: None,
            data_dir: data_dir.to_path_buf(),
            heap_mib: 384,
            replication: 1,
            default_partitions: 4,
            offsets_partitions: 10,
            start_timeout: Duration::from_secs(120),
            retention: Duration::from_secs(6 * 3600),
            retention_bytes_per_partition: 1 << 30,
        }
    }

    /// A datasink slave `node_id` that joins the cluster `cluster_id` whose
    /// controller is `master` (see [`Broker::controller`]).
    pub fn slave(
        node_id: i32,
        host: &str,
        client_port: u16,
        master: (i32, SocketAddr),
        cluster_id: &str,
        data_dir: &Path,
    ) -> Self {
        BrokerSpec {
            node_id,
            role: BrokerRole::Slave {
                controller_id: master.0,
                controller: master.1,
            },
            cluster_id: Some(cluster_id.to_string()),
            ..BrokerSpec::master(host, client_port, 0, data_dir)
        }
    }

    /// The heap the JVM gets: `heap_mib`, at least 128 MiB.
    fn heap(&self) -> u32 {
        self.heap_mib.max(128)
    }

    /// `server.properties` for this spec.
    pub fn server_properties(&self) -> String {
        let data = self.data_dir.join("data");
        let host = &self.host;
        let mut p = String::new();
        let _ = writeln!(p, "node.id={}", self.node_id);
        match &self.role {
            BrokerRole::Master { controller_port } => {
                let _ = writeln!(p, "process.roles=broker,controller");
                let _ = writeln!(
                    p,
                    "controller.quorum.voters={}@{host}:{controller_port}",
                    self.node_id
                );
                let _ = writeln!(
                    p,
                    "listeners=PLAINTEXT://{host}:{},CONTROLLER://{host}:{controller_port}",
                    self.client_port
                );
            }
            BrokerRole::Slave {
                controller_id,
                controller,
            } => {
                let _ = writeln!(p, "process.roles=broker");
                let _ = writeln!(p, "controller.quorum.voters={controller_id}@{controller}");
                let _ = writeln!(p, "listeners=PLAINTEXT://{host}:{}", self.client_port);
            }
        }
        let _ = writeln!(
            p,
            "advertised.listeners=PLAINTEXT://{host}:{}",
            self.client_port
        );
        p.push_str(
            "controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n",
        );
        let _ = writeln!(p, "log.dirs={}", data.display());
        let rf = self.replication.max(1);
        let min_isr = rf.min(2);
        let _ = writeln!(p, "num.partitions={}", self.default_partitions.max(1));
        let _ = writeln!(p, "default.replication.factor={rf}");
        let _ = writeln!(p, "offsets.topic.replication.factor={rf}");
        let _ = writeln!(
            p,
            "offsets.topic.num.partitions={}",
            self.offsets_partitions.max(1)
        );
        // Idempotent producers (acks=all) get their producer id from the
        // transaction coordinator, whose log is made at the first request:
        // 50 partitions (the default) take seconds on a small node.
        let _ = writeln!(p, "transaction.state.log.num.partitions=4");
        let _ = writeln!(p, "transaction.state.log.replication.factor={rf}");
        let _ = writeln!(p, "transaction.state.log.min.isr={min_isr}");
        let _ = writeln!(p, "share.coordinator.state.topic.replication.factor={rf}");
        let _ = writeln!(p, "share.coordinator.state.topic.min.isr={min_isr}");
        let _ = writeln!(p, "log.retention.ms={}", self.retention.as_millis().max(1));
        let _ = writeln!(
            p,
            "log.retention.bytes={}",
            self.retention_bytes_per_partition.max(1)
        );
        // The log cleaner (compaction of the offsets and transaction
        // topics) allocates its dedupe buffer on the heap at start: Kafka's
        // 128 MiB default left a 256 MiB heap half full for good, so the
        // broker ran a full collection every two seconds (170-320 ms each
        // on half a CPU). An eighth of the heap is plenty for internal
        // topics of a few MiB.
        let dedupe_mib = (self.heap() / 8).clamp(4, 128);
        let _ = writeln!(p, "log.cleaner.dedupe.buffer.size={}", dedupe_mib << 20);
        // Segments small enough for retention to act on (whole segments go).
        p.push_str("log.segment.bytes=67108864\n");
        // A new consumer group starts at once instead of waiting 3 s for
        // more members: the issue's discovery and reconfiguration budgets
        // are below a second.
        p.push_str("group.initial.rebalance.delay.ms=0\n");
        // A broker that crashed can register again only once the controller
        // declared its old session dead: 4 s instead of Kafka's 9 s shortens
        // a restart after a crash by 5 s (the datasink's outage), with
        // heartbeats every second still leaving room for GC pauses.
        p.push_str("broker.session.timeout.ms=4000\nbroker.heartbeat.interval.ms=1000\n");
        p
    }
}

/// The broker JVM's collector and compiler flags: `VCDN_KAFKA_JVM_OPTS`
/// (split at whitespace) when set, else G1 with 20 ms pause goals and the
/// C1 compiler only (`-XX:TieredStopAtLevel=1`). A data sink is often a
/// small node: on half a CPU, C2 compiling the broker's hot paths took half
/// its CPU for minutes after start and held the p99 delivery at 120-160 ms;
/// with C1 alone it was 46-60 ms from the first second, and throughput rose
/// (75 MB/s against 68).
fn jvm_options() -> Vec<String> {
    match std::env::var("VCDN_KAFKA_JVM_OPTS") {
        Ok(v) => v.split_whitespace().map(str::to_string).collect(),
        Err(_) => [
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:TieredStopAtLevel=1",
        ]
        .map(String::from)
        .to_vec(),
    }
}

/// Why a broker could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("broker data directory {0}: {1}")]
    DataDir(PathBuf, std::io::Error),
    #[error("a datasink slave needs the master's cluster id")]
    NoClusterId,
    /// The data directory belongs to another cluster (e.g. a slave whose
    /// master was respawned with a new cluster): the caller decides whether
    /// its data may go (remove the directory) or the broker must not start.
    #[error("{dir} holds cluster {formatted}, not {wanted}")]
    OtherCluster {
        dir: PathBuf,
        formatted: String,
        wanted: String,
    },
    #[error("formatting the storage of node {node} failed ({status}): {output}")]
    Format {
        node: i32,
        status: String,
        output: String,
    },
    #[error("could not launch java for node {0}: {1}")]
    Spawn(i32, std::io::Error),
    #[error(
        "broker node {node} exited during start ({status}); server.log ends with:\n{log_tail}"
    )]
    Exited {
        node: i32,
        status: String,
        log_tail: String,
    },
    #[error("broker node {node} not ready after {waited:?}; server.log ends with:\n{log_tail}")]
    StartTimeout {
        node: i32,
        waited: Duration,
        log_tail: String,
    },
}

/// A running (or stopped, data kept) broker; dropping it kills the JVM.
#[derive(Debug)]
pub struct Broker {
    dist: KafkaDist,
    spec: BrokerSpec,
    cluster_id: String,
    child: Option<Child>,
}

impl Broker {
    /// Formats the data directory once (a directory that already holds a
    /// formatted `meta.properties` is kept as it is), starts the JVM and
    /// waits until the broker serves metadata naming itself.
    pub fn start(dist: &KafkaDist, mut spec: BrokerSpec) -> Result<Broker, BrokerError> {
        // The JVM runs in another working directory: a relative data
        // directory would name another place there.
        spec.data_dir = std::path::absolute(&spec.data_dir)
            .map_err(|e| BrokerError::DataDir(spec.data_dir.clone(), e))?;
        let dir = &spec.data_dir;
        for sub in ["data", "logs"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| BrokerError::DataDir(dir.clone(), e))?;
        }
        let formatted = formatted_cluster_id(dir);
        let cluster_id = match (&spec.role, &spec.cluster_id, formatted) {
            (_, Some(wanted), Some(formatted)) if *wanted != formatted => {
                return Err(BrokerError::OtherCluster {
                    dir: dir.clone(),
                    formatted,
                    wanted: wanted.clone(),
                })
            }
            (_, Some(id), _) => id.clone(),
            (BrokerRole::Master { .. }, None, Some(formatted)) => formatted,
            (BrokerRole::Master { .. }, None, None) => random_cluster_id(),
            (BrokerRole::Slave { .. }, None, _) => return Err(BrokerError::NoClusterId),
        };
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).map_err(|e| BrokerError::DataDir(dir.clone(), e))
        };
        write("server.properties", spec.server_properties())?;
        write("log4j2.properties", LOG4J2.to_string())?;
        let mut broker = Broker {
            dist: dist.clone(),
            spec,
            cluster_id,
            child: None,
        };
        broker.format()?;
        broker.launch()?;
        Ok(broker)
    }

    /// The cluster id (give it to slaves).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// `node.id`.
    pub fn node_id(&self) -> i32 {
        self.spec.node_id
    }

    /// The spec it runs with.
    pub fn spec(&self) -> &BrokerSpec {
        &self.spec
    }

    /// `host:port` of the client listener, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("{}:{}", self.spec.host, self.spec.client_port)
    }

    /// For a master, its controller `(node id, address)` that slaves join;
    /// `None` for a slave.
    pub fn controller(&self) -> Option<(i32, SocketAddr)> {
        match self.spec.role {
            BrokerRole::Master { controller_port } => {
                let addr = (self.spec.host.as_str(), controller_port)
                    .to_socket_addrs()
                    .ok()?
                    .next()?;
                Some((self.spec.node_id, addr))
            }
            BrokerRole::Slave { .. } => None,
        }
    }

    /// Whether the JVM is still running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The JVM's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Stops the broker cleanly (SIGTERM: Kafka flushes and closes its logs),
    /// killing it if it is not gone within 30 s. The data directory stays.
    pub fn stop(&mut self) {
        self.signal_and_reap(libc::SIGTERM, Duration::from_secs(30));
    }

    /// Kills the broker at once (SIGKILL to its process group), as a crash
    /// would. The data directory stays.
    pub fn kill(&mut self) {
        self.signal_and_reap(libc::SIGKILL, Duration::from_secs(10));
    }

    /// Starts a stopped or killed broker again on the same data directory
    /// (same topics, offsets and cluster id) and waits for readiness.
    pub fn start_again(&mut self) -> Result<(), BrokerError> {
        if self.is_running() {
            return Ok(());
        }
        self.launch()
    }

    /// [`Broker::stop`] then [`Broker::start_again`].
    pub fn restart(&mut self) -> Result<(), BrokerError> {
        self.stop();
        self.launch()
    }

    /// The last `lines` lines of `logs/server.log` (or of the JVM's output
    /// when there is no server.log yet).
    pub fn log_tail(&self, lines: usize) -> String {
        let logs = self.spec.data_dir.join("logs");
        let server = tail(&logs.join("server.log"), lines);
        if server.trim().is_empty() {
            tail(&logs.join("stdout.log"), lines)
        } else {
            server
        }
    }

    fn format(&self) -> Result<(), BrokerError> {
        if formatted_cluster_id(&self.spec.data_dir).is_some() {
            return Ok(());
        }
        let out = self
            .dist
            .java_command()
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                self.spec.data_dir.join("log4j2.properties").display()
            ))
            .arg(format!(
                "-Dkafka.logs.dir={}",
                self.spec.data_dir.join("logs").display()
            ))
            .arg("kafka.tools.StorageTool")
            .arg("format")
            .arg("--ignore-formatted")
            .arg("-t")
            .arg(&self.cluster_id)
            .arg("-c")
            .arg(self.spec.data_dir.join("server.properties"))
            .current_dir(&self.spec.data_dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BrokerError::Spawn(self.spec.node_id, e))?;
        if !out.status.success() {
            return Err(BrokerError::Format {
                node: self.spec.node_id,
                status: out.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    fn launch(&mut self) -> Result<(), BrokerError> {
        let dir = &self.spec.data_dir;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("logs/stdout.log"))
            .map_err(|e| BrokerError::DataDir(dir.clone(), e))?;
        let err = out
            .try_clone()
            .map_err(|e| BrokerError::DataDir(dir.clone(), e))?;
        let heap = self.spec.heap();
        let mut cmd = self.dist.java_command();
        cmd.arg(format!("-Xms{heap}m"))
            .arg(format!("-Xmx{heap}m"))
            .args(jvm_options())
            .args(["-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"])
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                dir.join("log4j2.properties").display()
            ))
            .arg(format!("-Dkafka.logs.dir={}", dir.join("logs").display()))
            .arg("kafka.Kafka")
            .arg(dir.join("server.properties"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group, so that drop kills whatever the JVM
            // started too.
            .process_group(0);
        reap_orphan(dir);
        let child = cmd
            .spawn()
            .map_err(|e| BrokerError::Spawn(self.spec.node_id, e))?;
        // Written so that the next start can stop a broker whose agent was
        // killed (SIGKILL leaves no chance to run Drop).
        let _ = std::fs::write(dir.join(PID_FILE), child.id().to_string());
        self.child = Some(child);
        if let Err(e) = self.wait_ready() {
            self.signal_and_reap(libc::SIGKILL, Duration::from_secs(10));
            return Err(e);
        }
        Ok(())
    }

    fn wait_ready(&mut self) -> Result<(), BrokerError> {
        let started = Instant::now();
        let deadline = started + self.spec.start_timeout;
        let addr = (self.spec.host.as_str(), self.spec.client_port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next());
        let mut client: Option<BaseConsumer> = None;
        loop {
            if let Some(c) = &mut self.child {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(BrokerError::Exited {
                        node: self.spec.node_id,
                        status: status.to_string(),
                        log_tail: self.log_tail(40),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(BrokerError::StartTimeout {
                    node: self.spec.node_id,
                    waited: started.elapsed(),
                    log_tail: self.log_tail(40),
                });
            }
            let open = addr.is_some_and(|a| {
                TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok()
            });
            if open {
                if client.is_none() {
                    client = ClientConfig::new()
                        .set("bootstrap.servers", self.bootstrap())
                        .set("client.id", "vcdn-readiness")
                        .create()
                        .ok();
                }
                if let Some(c) = &client {
                    if let Ok(md) = c.fetch_metadata(None, Duration::from_secs(2)) {
                        if md.brokers().iter().any(|b| b.id() == self.spec.node_id) {
                            return Ok(());
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal_and_reap(&mut self, signal: i32, grace: Duration) {
        let _ = std::fs::remove_file(self.spec.data_dir.join(PID_FILE));
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let pgid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals our own child's group.
        unsafe { libc::kill(-pgid, signal) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.signal_and_reap(libc::SIGKILL, Duration::from_secs(10));
    }
}

/// Logging to `${kafka.logs.dir}/server.log` only (Kafka's own
/// configuration also writes controller, state-change and request logs),
/// rolled at 10 MB with 3 old files kept, so a long-running datasink's log
/// stays bounded.
const LOG4J2: &str = "\
status = warn
appender.file.type = RollingFile
appender.file.name = server
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = info
rootLogger.appenderRef.file.ref = server
";

/// The cluster id of an already formatted data directory.
fn formatted_cluster_id(dir: &Path) -> Option<String> {
    let meta = std::fs::read_to_string(dir.join("data/meta.properties")).ok()?;
    meta.lines()
        .find_map(|l| l.strip_prefix("cluster.id="))
        .map(|s| s.trim().to_string())
}

/// A cluster id as Kafka's `Uuid.randomUuid().toString()` makes one: 16
/// random bytes in unpadded URL-safe base64 (22 characters), not starting
/// with '-' (Kafka's tools would read it as an option).
/// The broker's process id, in its data directory while it runs.
const PID_FILE: &str = "broker.pid";

/// Kills the broker a previous agent left running on `dir` (the agent was
/// killed without running Drop): the process named by the pid file, only if
/// it is a JVM started with this directory's `server.properties`. Waits up
/// to 10 s for it to go, so its ports and locks are free.
fn reap_orphan(dir: &Path) {
    let Some(pid) = std::fs::read_to_string(dir.join(PID_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<libc::pid_t>().ok())
        .filter(|p| *p > 1)
    else {
        return;
    };
    let ours = dir.join("server.properties");
    let is_ours = |pid: libc::pid_t| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                c.split(|b| *b == 0)
                    .any(|a| a == ours.as_os_str().as_encoded_bytes())
            })
            .unwrap_or(false)
    };
    if !is_ours(pid) {
        return;
    }
    tracing::warn!(pid, dir = %dir.display(), "a broker left running by a killed agent: stopping it");
    // SAFETY: kill(2) of the process group the orphan leads (it was started
    // with process_group(0)), checked above to be our broker.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_ours(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn random_cluster_id() -> String {
    use aws_lc_rs::rand::{SecureRandom, SystemRandom};
    let rng = SystemRandom::new();
    loop {
        let mut b = [0u8; 16];
        if rng.fill(&mut b).is_err() {
            continue;
        }
        let id = base64url(&b);
        if !id.starts_with('-') && b != [0u8; 16] {
            return id;
        }
    }
}

fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The last `lines` lines of a file, reading at most its last 64 KiB.
fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_look_like_kafka_uuids() {
        for _ in 0..100 {
            let id = random_cluster_id();
            assert_eq!(id.len(), 22, "{id}");
            assert!(!id.starts_with('-'));
            assert!(id
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        }
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64url(b"Man"), "TWFu");
    }

    #[test]
    fn the_log_cleaner_takes_an_eighth_of_a_small_heap_not_128_mib() {
        let mut s = BrokerSpec::master("127.0.0.1", 9092, 9093, Path::new("/tmp/x"));
        s.heap_mib = 256;
        let p = s.server_properties();
        assert!(
            p.contains("log.cleaner.dedupe.buffer.size=33554432\n"),
            "{p}"
        );
        s.heap_mib = 4096;
        let p = s.server_properties();
        assert!(
            p.contains("log.cleaner.dedupe.buffer.size=134217728\n"),
            "{p}"
        );
    }

    #[test]
    fn slave_properties_name_the_masters_controller() {
        let s = BrokerSpec::slave(
            2,
            "127.0.0.1",
            9094,
            (1, "127.0.0.1:9093".parse().unwrap()),
            "abc",
            Path::new("/tmp/x"),
        );
        let p = s.server_properties();
        assert!(p.contains("process.roles=broker\n"), "{p}");
        assert!(p.contains("controller.quorum.voters=1@127.0.0.1:9093\n"));
        assert!(p.contains("listeners=PLAINTEXT://127.0.0.1:9094\n"));
        assert!(!p.contains("CONTROLLER://"));
    }
}
