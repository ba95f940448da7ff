//! The VIM driver: how instances come to life (the paper's resource
//! orchestrator talks to OpenStack; ours talks to a [`Vim`]). The `local`
//! driver runs each cache instance as a process on this host.

use std::collections::HashMap;
use std::ffi::CString;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;

/// Everything a driver needs to start one instance: a cache, or (with
/// [`InstanceSpec::proxy`]) an acceleration proxy.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub id: String,
    /// The region it serves (which VIM starts it), its service and the
    /// service's customer (labels of a pod).
    pub region: String,
    pub service: String,
    pub customer: String,
    /// The host (a node, for a pod) the planner placed it on.
    pub host: String,
    /// What the process is started with and proves in `/healthz`
    /// ([`crate::types::Instance::identity`]).
    pub identity: String,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub admin_token: String,
    pub upstream: String,
    /// The service's origin policy (text form) the cache enforces at every
    /// upstream connect; empty for none.
    pub origin_policy: String,
    /// PEM CA certificates an `https://` upstream is verified against
    /// (the service's `origin_ca_pem`); a cache gets them as a file.
    pub origin_ca_pem: Option<String>,
    pub vcpus: u32,
    /// CPU time the quota allows, in CPUs (normally `vcpus`; a fraction
    /// for calibration runs).
    pub cpu_quota: f64,
    pub memory_mib: u64,
    /// Set for a proxy (`vcdn proxy`); `upstream` is then the origin.
    pub proxy: Option<ProxySpec>,
    /// Where a cache serves HTTPS (`--tls-listen`), with the certificates
    /// the control plane pushes to its admin API.
    pub tls_listen: Option<SocketAddr>,
    /// The admin API's certificate (of the control plane's internal CA)
    /// and key: the instance serves its admin API over HTTPS with them
    /// (`--admin-tls-cert/--admin-tls-key`); none: plain HTTP.
    pub admin_tls: Option<AdminCert>,
    /// The name `admin_tls` carries instead of the admin IP (a pod, whose
    /// IP is known only once it runs).
    pub admin_name: Option<String>,
    /// The telemetry agent's key file and discovery settings (caches only);
    /// none: the cache runs no agent.
    pub telemetry: Option<InstanceTelemetry>,
    /// Chunk addresses of a service routed with SRv6 (caches only): the
    /// instance is a node of the host's SR domain, with its own namespace
    /// and agent; none: DNS and HTTP routing only.
    pub srv6: Option<InstanceSrv6>,
}

/// A cache's part in the SR domain (`vcdn_srv6::domain`).
#[derive(Debug, Clone)]
pub struct InstanceSrv6 {
    pub node: vcdn_srv6::domain::Node,
    /// The service's chunk /64 (`fd76:6364:c:N::/64`).
    pub prefix: String,
    /// An edge's filter sizes itself (`auto`); the origin gateway accepts
    /// every connection (`none`).
    pub filter: &'static str,
}

/// The port chunk addresses are served on, in each node's namespace.
pub const CHUNK_PORT: u16 = 80;

/// What a cache needs to publish telemetry: the deployment's key file
/// without the authority's private key (JSON, a secret the driver hands
/// over as a file readable by the owner only), its node id, and where
/// discovery runs.
#[derive(Clone)]
pub struct InstanceTelemetry {
    pub keys_json: String,
    pub node: String,
    pub discovery_port: u16,
    pub broadcast: std::net::IpAddr,
    /// Also produce to the Kafka data sink (`vcdn up --kafka`: billing).
    pub kafka: bool,
}

impl std::fmt::Debug for InstanceTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceTelemetry")
            .field("node", &self.node)
            .field("discovery_port", &self.discovery_port)
            .field("broadcast", &self.broadcast)
            .finish_non_exhaustive()
    }
}

/// An instance admin API's certificate chain and private key (PEM). The
/// driver hands them to the process as files readable by its owner only.
#[derive(Clone)]
pub struct AdminCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for AdminCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminCert { key: <secret> }")
    }
}

/// Where a driver wrote an instance's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct InstanceFiles<'a> {
    /// The spec's `origin_ca_pem`.
    pub origin_ca: Option<&'a Path>,
    /// The spec's `admin_tls`: certificate, key.
    pub admin_tls: Option<(&'a Path, &'a Path)>,
    /// The spec's telemetry key file.
    pub telemetry_keys: Option<&'a Path>,
}

/// What a `vcdn proxy` is started with besides what every instance gets.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxySpec {
    /// Its location name (its region), as peers and chains name it.
    pub location: String,
    /// The service it relays for (the service id).
    pub service: String,
    /// Every other proxy of the service: location → listen address.
    pub peers: Vec<(String, SocketAddr)>,
    /// The location of the proxy that connects to the origin.
    pub egress: String,
    /// Authenticates chain hops between the service's proxies (secret).
    pub hop_key: String,
    /// Warm connections per next hop, if ordered.
    pub warm: Option<u32>,
    /// Where RTT changes are reported, and with what bearer token
    /// (secret), once a chain controller runs.
    pub controller: Option<(String, String)>,
    /// The controller's certificate fingerprint (an https API).
    pub controller_fingerprint: Option<String>,
}

/// The environment variables that carry a proxy's secrets (never its
/// command line, which every local user can read).
pub const PROXY_ADMIN_TOKEN_ENV: &str = "VCDN_PROXY_ADMIN_TOKEN";
pub const PROXY_HOP_KEY_ENV: &str = "VCDN_PROXY_HOP_KEY";
pub const PROXY_CONTROLLER_TOKEN_ENV: &str = "VCDN_PROXY_CONTROLLER_TOKEN";

/// The subcommands whose processes are instances.
const INSTANCE_COMMANDS: [&str; 2] = ["cache", "proxy"];

/// The command line (after the binary) and the secret environment of an
/// instance: `vcdn cache …` or `vcdn proxy …`, with `--instance-id` last.
/// `files` are where the driver wrote the spec's files.
pub fn command(
    spec: &InstanceSpec,
    files: InstanceFiles<'_>,
) -> (Vec<String>, Vec<(&'static str, String)>) {
    let origin_ca_file = files.origin_ca;
    let mut args: Vec<String> = Vec::new();
    let mut flag = |k: &str, v: String| {
        args.push(k.into());
        args.push(v);
    };
    let admin = |flag: &mut dyn FnMut(&str, String)| {
        flag("--admin", spec.admin.to_string());
        if let Some((c, k)) = files.admin_tls {
            flag("--admin-tls-cert", c.to_string_lossy().into_owned());
            flag("--admin-tls-key", k.to_string_lossy().into_owned());
        }
    };
    let env = match &spec.proxy {
        None => {
            flag("--listen", spec.listen.to_string());
            if let Some(t) = spec.tls_listen {
                flag("--tls-listen", t.to_string());
            }
            flag("--upstream", spec.upstream.clone());
            admin(&mut flag);
            flag("--memory", format!("{}M", spec.memory_mib.max(1) / 2));
            flag("--threads", spec.vcpus.max(1).to_string());
            if let Some(f) = origin_ca_file {
                flag("--origin-ca-file", f.to_string_lossy().into_owned());
            }
            if let Some(v) = &spec.srv6 {
                flag("--chunk-prefix", v.prefix.clone());
                flag(
                    "--chunk-listen",
                    SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, CHUNK_PORT)).to_string(),
                );
                flag("--chunk-netns", v.node.netns.clone());
                flag("--srv6-sid", v.node.sid.to_string());
                flag(
                    "--srv6-dispatcher",
                    vcdn_srv6::domain::dispatcher_sid().to_string(),
                );
                flag("--srv6-device", vcdn_srv6::domain::NODE_DEVICE.into());
                flag("--srv6-clients", vcdn_srv6::domain::Node::clients_route());
                flag("--srv6-filter", v.filter.into());
            }
            if let (Some(t), Some(f)) = (&spec.telemetry, files.telemetry_keys) {
                flag("--telemetry-keys", f.to_string_lossy().into_owned());
                flag("--telemetry-node", t.node.clone());
                flag("--telemetry-discovery-port", t.discovery_port.to_string());
                flag("--telemetry-broadcast", t.broadcast.to_string());
                if t.kafka {
                    args.push("--telemetry-kafka".into());
                }
            }
            vec![("VCDN_ADMIN_TOKEN", spec.admin_token.clone())]
        }
        Some(p) => {
            flag("--name", p.location.clone());
            flag("--listen", spec.listen.to_string());
            admin(&mut flag);
            flag("--service", p.service.clone());
            flag("--origin", spec.upstream.clone());
            for (loc, addr) in &p.peers {
                flag("--peer", format!("{loc}={addr}"));
            }
            flag("--egress", p.egress.clone());
            if let Some(w) = p.warm {
                flag("--warm", w.to_string());
            }
            let mut env = vec![
                (PROXY_ADMIN_TOKEN_ENV, spec.admin_token.clone()),
                (PROXY_HOP_KEY_ENV, p.hop_key.clone()),
            ];
            if let Some((url, token)) = &p.controller {
                flag("--controller", url.clone());
                if let Some(fp) = &p.controller_fingerprint {
                    flag("--controller-fingerprint", fp.clone());
                }
                env.push((PROXY_CONTROLLER_TOKEN_ENV, token.clone()));
            }
            env
        }
    };
    if spec.proxy.is_some() {
        // Local instances share the host's network namespace with
        // everything else on it: a proxy must not flip host-wide TCP
        // settings. The operator sets tcp_slow_start_after_idle=0 on a
        // proxy host (the proxy's /healthz shows the value in force).
        args.push("--keep-sysctl".into());
    }
    let mut out = vec![if spec.proxy.is_some() {
        "proxy"
    } else {
        "cache"
    }
    .to_string()];
    out.extend(args);
    out.extend(origin_policy_args(spec));
    out.push("--instance-id".into());
    out.push(spec.identity.clone());
    (out, env)
}

/// A started instance.
#[derive(Debug, Clone)]
pub struct Started {
    /// Its process (none for a pod, which the kubernetes VIM knows by its
    /// labels).
    pub pid: Option<u32>,
    /// How its CPU is held to its vCPUs.
    pub cpu_limit: String,
}

#[derive(Debug, thiserror::Error)]
pub enum VimError {
    #[error("cannot start instance {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("cannot start instance {0}: address {1} is already in use by another process")]
    AddressInUse(String, SocketAddr),
}

/// A process this VIM started for this control plane (found by the marks
/// it gives them), whether or not a record still knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Marked {
    pub pid: Option<u32>,
    /// A pod's IP (where its `listen` and admin ports are), once it has one.
    pub ip: Option<std::net::IpAddr>,
    /// Its `--instance-id` ([`crate::types::Instance::identity`]).
    pub identity: String,
    pub listen: String,
}

/// A virtualized infrastructure manager. Drivers start and stop instances
/// and say whether one still runs; they never restart anything themselves
/// (the supervisor decides).
pub trait Vim: Send + Sync {
    fn name(&self) -> &'static str;
    fn start(&self, spec: &InstanceSpec) -> Result<Started, VimError>;
    /// Stops it (gracefully, then by force) and frees what it held. A
    /// `pid` that is not this instance's process is left alone.
    fn stop(&self, id: &str, pid: Option<u32>);
    /// Whether the instance runs (an adopted one is recognised by its pid
    /// and its identity on the command line).
    fn alive(&self, id: &str, pid: Option<u32>, identity: &str) -> bool;
    /// Every instance process this VIM started for this control plane
    /// (this data directory) that still runs, known or not.
    fn marked(&self) -> Vec<Marked> {
        Vec::new()
    }
    /// The IP an instance got from its VIM (a pod's), where its listen and
    /// admin ports are; none: the planned address is its own.
    fn address(&self, _id: &str) -> Option<std::net::IpAddr> {
        None
    }
    /// Regions whose hosts this VIM reports itself (from a cluster's nodes)
    /// instead of the catalog's.
    fn regions(&self) -> Vec<String> {
        Vec::new()
    }
    /// The hosts of [`Vim::regions`] with what is free for instances:
    /// allocatable capacity less what other workloads request.
    fn hosts(&self) -> Vec<crate::types::Host> {
        Vec::new()
    }
    /// How long an instance of this region may take to answer after its
    /// start (a pod is scheduled and its sandbox made first).
    fn start_limit(&self, _region: &str) -> std::time::Duration {
        std::time::Duration::from_secs(5)
    }
    /// Why the region's infrastructure cannot be used right now (its
    /// cluster does not answer), for the answers that would otherwise only
    /// say its hosts are full.
    fn trouble(&self, _region: &str) -> Option<String> {
        None
    }
    /// Prometheus samples of the driver's own state (a cluster's).
    fn samples(&self) -> Vec<Sample> {
        Vec::new()
    }
}

/// One Prometheus sample of a driver: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    /// `gauge` or `counter`.
    pub kind: &'static str,
    /// `k="v",…` (escaped by the driver).
    pub labels: String,
    pub value: f64,
}

/// Renders samples in the exposition format, one HELP and TYPE per family.
pub fn render_samples(samples: &[Sample], out: &mut String) {
    let mut families: Vec<&'static str> = Vec::new();
    for s in samples {
        if !families.contains(&s.name) {
            families.push(s.name);
        }
    }
    for f in families {
        let mut first = true;
        for s in samples.iter().filter(|s| s.name == f) {
            if first {
                out.push_str(&format!("# HELP {f} {}\n# TYPE {f} {}\n", s.help, s.kind));
                first = false;
            }
            out.push_str(&format!("{f}{{{}}} {}\n", s.labels, s.value));
        }
    }
}

/// The local driver for every region but those given to another VIM (a
/// Kubernetes cluster each): starts go by the instance's region; a process
/// (an instance with a pid) is the local driver's, one without is asked of
/// the others.
pub struct Vims {
    local: Arc<dyn Vim>,
    regions: Vec<(String, Arc<dyn Vim>)>,
}

impl Vims {
    pub fn new(local: Arc<dyn Vim>, regions: Vec<(String, Arc<dyn Vim>)>) -> Vims {
        Vims { local, regions }
    }

    fn of(&self, region: &str) -> &Arc<dyn Vim> {
        self.regions
            .iter()
            .find(|(r, _)| r == region)
            .map_or(&self.local, |(_, v)| v)
    }

    fn others(&self) -> impl Iterator<Item = &Arc<dyn Vim>> {
        self.regions.iter().map(|(_, v)| v)
    }
}

impl Vim for Vims {
    fn name(&self) -> &'static str {
        if self.regions.is_empty() {
            self.local.name()
        } else {
            "local+kubernetes"
        }
    }
    fn start(&self, spec: &InstanceSpec) -> Result<Started, VimError> {
        self.of(&spec.region).start(spec)
    }
    fn stop(&self, id: &str, pid: Option<u32>) {
        self.local.stop(id, pid);
        if pid.is_none() {
            for v in self.others() {
                v.stop(id, None);
            }
        }
    }
    fn alive(&self, id: &str, pid: Option<u32>, identity: &str) -> bool {
        self.local.alive(id, pid, identity)
            || (pid.is_none() && self.others().any(|v| v.alive(id, None, identity)))
    }
    fn marked(&self) -> Vec<Marked> {
        let mut m = self.local.marked();
        for v in self.others() {
            m.extend(v.marked());
        }
        m
    }
    fn address(&self, id: &str) -> Option<std::net::IpAddr> {
        self.others().find_map(|v| v.address(id))
    }
    fn regions(&self) -> Vec<String> {
        self.regions.iter().map(|(r, _)| r.clone()).collect()
    }
    fn hosts(&self) -> Vec<crate::types::Host> {
        self.others().flat_map(|v| v.hosts()).collect()
    }
    fn start_limit(&self, region: &str) -> std::time::Duration {
        self.of(region).start_limit(region)
    }
    fn trouble(&self, region: &str) -> Option<String> {
        self.of(region).trouble(region)
    }
    fn samples(&self) -> Vec<Sample> {
        self.others().flat_map(|v| v.samples()).collect()
    }
}

/// How the local driver limits an instance's CPU.
#[derive(Debug, Clone)]
enum CpuControl {
    /// cgroup v2: `cpu.max` in a child of this directory.
    V2(PathBuf),
    /// cgroup v1 cpu controller: `cpu.cfs_quota_us` in a child of this.
    V1(PathBuf),
    /// Pin to this many CPUs (round robin over the host's).
    Affinity,
}

/// The environment variable that marks an instance process as started by
/// the control plane of one data directory (its canonical path): how a
/// restarted control plane finds the processes it started, and never
/// touches anyone else's.
pub const MARK: &str = "VCDN_CONTROL_DATA_DIR";

/// The control plane's mark as a Kubernetes label value (at most 63
/// characters): a hash of [`MARK`]'s data directory path.
pub fn owner_label(data_dir: &Path) -> String {
    use sha2::Digest;
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let h = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
    format!(
        "vcdn-{}",
        h[..10]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Instances as processes of this host: `vcdn cache` bound to the
/// instance's loopback address, CPU limited by cgroup quota where the host
/// allows and by CPU affinity otherwise, output in `logs/`. Each carries
/// `--instance-id` and the [`MARK`] of this data directory.
pub struct LocalVim {
    binary: PathBuf,
    mark: String,
    logs: PathBuf,
    /// Files an instance is started with (`instances/ID/`).
    instances: PathBuf,
    cpu: CpuControl,
    children: Mutex<HashMap<String, Child>>,
    next_cpu: Mutex<usize>,
}

impl LocalVim {
    pub fn new(binary: PathBuf, data_dir: &Path) -> std::io::Result<LocalVim> {
        let logs = data_dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let cpu = detect_cpu_control();
        tracing::info!(cpu = ?cpu, binary = %binary.display(), "local VIM ready");
        let mark = std::fs::canonicalize(data_dir)?
            .to_string_lossy()
            .into_owned();
        Ok(LocalVim {
            binary,
            mark,
            logs,
            instances: data_dir.join("instances"),
            cpu,
            children: Mutex::new(HashMap::new()),
            next_cpu: Mutex::new(0),
        })
    }

    /// Writes an instance's origin CA bundle to `instances/ID/origin-ca.pem`
    /// in the data directory (replaced whole: a restarted instance gets
    /// the service's current one).
    fn write_origin_ca(&self, id: &str, pem: &str) -> std::io::Result<PathBuf> {
        let dir = self.instances.join(id);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("origin-ca.pem");
        let tmp = dir.join("origin-ca.pem.new");
        std::fs::write(&tmp, pem)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Writes an instance's admin certificate and key to
    /// `instances/ID/admin.crt` and `admin.key` (owner only, each written
    /// whole and renamed into place).
    fn write_admin_tls(&self, id: &str, c: &AdminCert) -> std::io::Result<(PathBuf, PathBuf)> {
        let dir = self.instances.join(id);
        std::fs::create_dir_all(&dir)?;
        let (cp, kp) = (dir.join("admin.crt"), dir.join("admin.key"));
        crate::control::write_secret(&kp, &c.key_pem)?;
        crate::control::write_secret(&cp, &c.cert_pem)?;
        Ok((cp, kp))
    }

    /// `instances/ID/telemetry-keys.json` (0600): the member-only key file.
    fn write_telemetry_keys(&self, id: &str, t: &InstanceTelemetry) -> std::io::Result<PathBuf> {
        let dir = self.instances.join(id);
        std::fs::create_dir_all(&dir)?;
        let p = dir.join("telemetry-keys.json");
        crate::control::write_secret(&p, &t.keys_json)?;
        Ok(p)
    }

    fn cgroup_dir(&self, id: &str) -> Option<PathBuf> {
        match &self.cpu {
            CpuControl::V2(d) | CpuControl::V1(d) => Some(d.join(id)),
            CpuControl::Affinity => None,
        }
    }

    /// Creates the instance's cgroup with its quota; returns the file a
    /// process writes itself into, and a description.
    fn prepare_cpu(&self, spec: &InstanceSpec) -> (Option<CString>, Option<Vec<usize>>, String) {
        let period = 100_000u64;
        let quota = ((spec.cpu_quota.max(0.01) * period as f64) as u64).max(1000);
        let tried = match &self.cpu {
            CpuControl::V2(d) => {
                let g = d.join(&spec.id);
                std::fs::create_dir_all(&g)
                    .and_then(|_| std::fs::write(g.join("cpu.max"), format!("{quota} {period}")))
                    .map(|_| {
                        (
                            g.join("cgroup.procs"),
                            format!("cgroup v2 cpu.max {quota}/{period}"),
                        )
                    })
            }
            CpuControl::V1(d) => {
                let g = d.join(&spec.id);
                std::fs::create_dir_all(&g)
                    .and_then(|_| std::fs::write(g.join("cpu.cfs_period_us"), period.to_string()))
                    .and_then(|_| std::fs::write(g.join("cpu.cfs_quota_us"), quota.to_string()))
                    .map(|_| {
                        (
                            g.join("cgroup.procs"),
                            format!("cgroup v1 cfs quota {quota}/{period}"),
                        )
                    })
            }
            CpuControl::Affinity => Err(std::io::Error::other("no cgroup")),
        };
        match tried {
            Ok((procs, what)) => (
                CString::new(procs.as_os_str().as_encoded_bytes()).ok(),
                None,
                what,
            ),
            Err(e) => {
                if !matches!(self.cpu, CpuControl::Affinity) {
                    tracing::warn!(error = %e, instance = %spec.id, "cgroup quota unavailable; pinning CPUs instead");
                }
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                let mut next = self.next_cpu.lock();
                let cpus: Vec<usize> = (0..spec.vcpus.max(1) as usize)
                    .map(|i| (*next + i) % n)
                    .collect();
                *next = (*next + cpus.len()) % n;
                let what = format!("affinity {cpus:?}");
                (None, Some(cpus), what)
            }
        }
    }
}

fn detect_cpu_control() -> CpuControl {
    let root = Path::new("/sys/fs/cgroup");
    let v2 = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if v2.split_whitespace().any(|c| c == "cpu") {
        let dir = root.join("vcdn");
        let ok = std::fs::write(root.join("cgroup.subtree_control"), "+cpu").is_ok()
            && std::fs::create_dir_all(&dir).is_ok()
            && std::fs::write(dir.join("cgroup.subtree_control"), "+cpu").is_ok();
        if ok {
            return CpuControl::V2(dir);
        }
    }
    let v1 = root.join("cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        let dir = v1.join("vcdn");
        if std::fs::create_dir_all(&dir).is_ok() {
            return CpuControl::V1(dir);
        }
    }
    CpuControl::Affinity
}

impl Vim for LocalVim {
    fn name(&self) -> &'static str {
        "local"
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Started, VimError> {
        let err = |e| VimError::Spawn(spec.id.clone(), e);
        // Said here, not found in a log after the process died of it.
        for a in [spec.listen, spec.admin] {
            if let Err(e) = std::net::TcpListener::bind(a) {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    return Err(VimError::AddressInUse(spec.id.clone(), a));
                }
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{}.log", spec.id)))
            .map_err(err)?;
        let log2 = log.try_clone().map_err(err)?;
        let ca_file = match (&spec.origin_ca_pem, &spec.proxy) {
            (Some(pem), None) => Some(self.write_origin_ca(&spec.id, pem).map_err(err)?),
            _ => None,
        };
        let admin_tls = match &spec.admin_tls {
            Some(c) => Some(self.write_admin_tls(&spec.id, c).map_err(err)?),
            None => None,
        };
        let telemetry_keys = match (&spec.telemetry, &spec.proxy) {
            (Some(t), None) => Some(self.write_telemetry_keys(&spec.id, t).map_err(err)?),
            _ => None,
        };
        if let Some(v) = &spec.srv6 {
            // Its own network stack in the SR domain, before the process
            // that binds in it (idempotent: a restart finds it made).
            vcdn_srv6::domain::Domain::ensure()
                .and_then(|d| d.add_node(&v.node))
                .map_err(|e| err(std::io::Error::other(format!("SR domain: {e}"))))?;
        }
        let (procs, cpus, cpu_limit) = self.prepare_cpu(spec);
        let files = InstanceFiles {
            origin_ca: ca_file.as_deref(),
            admin_tls: admin_tls.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
            telemetry_keys: telemetry_keys.as_deref(),
        };
        let (args, secrets) = command(spec, files);
        let mut cmd = Command::new(&self.binary);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own process group: a Ctrl-C to the control plane leaves
            // the data plane serving; a restarted control plane adopts it.
            .process_group(0);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("VCDN_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(secrets);
        cmd.env(MARK, &self.mark);
        // SAFETY: only async-signal-safe calls (open, write, close,
        // sched_setaffinity) on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(p) = &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                    if fd >= 0 {
                        libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                    }
                }
                if let Some(cpus) = &cpus {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    for &c in cpus {
                        libc::CPU_SET(c, &mut set);
                    }
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(err)?;
        let pid = child.id();
        self.children.lock().insert(spec.id.clone(), child);
        Ok(Started {
            pid: Some(pid),
            cpu_limit,
        })
    }

    fn stop(&self, id: &str, pid: Option<u32>) {
        // Files it was started with (a restart writes them again).
        let _ = std::fs::remove_dir_all(self.instances.join(id));
        let mut child = self.children.lock().remove(id);
        if let Some(pid) = child.as_ref().map(|c| c.id()).or(pid) {
            let mut running = || match &mut child {
                Some(c) => matches!(c.try_wait(), Ok(None)),
                None => read_process(pid).is_some_and(|p| p.is_instance(id)),
            };
            if running() {
                // SAFETY: signalling a process id.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                let t = std::time::Instant::now();
                while running() && t.elapsed() < std::time::Duration::from_secs(1) {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                if running() {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
            }
        }
        if let Some(mut c) = child {
            let _ = c.wait();
        }
        // Its node in the SR domain, if it had one (routes and link go
        // with the namespace).
        let node = vcdn_srv6::domain::Node::of(id);
        if std::path::Path::new("/run/netns")
            .join(&node.netns)
            .exists()
        {
            vcdn_srv6::domain::Domain::remove_node(&node);
        }
        if let Some(g) = self.cgroup_dir(id) {
            // The kernel frees the group once its last task is gone.
            for _ in 0..50 {
                if std::fs::remove_dir(&g).is_ok() || !g.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }

    fn alive(&self, id: &str, pid: Option<u32>, identity: &str) -> bool {
        if let Some(c) = self.children.lock().get_mut(id) {
            return matches!(c.try_wait(), Ok(None));
        }
        pid.and_then(read_process)
            .is_some_and(|p| p.flag("--instance-id") == Some(identity))
    }

    fn marked(&self) -> Vec<Marked> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let me = std::process::id();
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .filter_map(read_process)
            .filter(|p| p.is_instance_command())
            .filter(|p| p.env(MARK) == Some(self.mark.as_str()))
            .map(|p| Marked {
                pid: Some(p.pid),
                ip: None,
                identity: p.flag("--instance-id").unwrap_or_default().to_string(),
                listen: p.flag("--listen").unwrap_or_default().to_string(),
            })
            .collect()
    }
}

/// The cache flags that make an instance apply its service's origin policy
/// to every upstream address it connects to (none without a policy).
fn origin_policy_args(spec: &InstanceSpec) -> Vec<String> {
    if spec.origin_policy.is_empty() {
        Vec::new()
    } else {
        vec!["--origin-policy".into(), spec.origin_policy.clone()]
    }
}

/// A running process as `/proc` shows it.
struct Process {
    pid: u32,
    args: Vec<String>,
    environ: Vec<u8>,
}

impl Process {
    fn flag(&self, name: &str) -> Option<&str> {
        self.args
            .windows(2)
            .find(|w| w[0] == name)
            .map(|w| w[1].as_str())
    }

    fn env(&self, name: &str) -> Option<&str> {
        self.environ.split(|&b| b == 0).find_map(|kv| {
            let v = kv.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            std::str::from_utf8(v).ok()
        })
    }

    /// Whether it runs `vcdn cache` or `vcdn proxy`.
    fn is_instance_command(&self) -> bool {
        self.args
            .get(1)
            .is_some_and(|c| INSTANCE_COMMANDS.contains(&c.as_str()))
    }

    /// Whether it is the `vcdn cache` or `vcdn proxy` of instance `id` (one
    /// started before instances carried an id is recognised as a `vcdn
    /// cache` only).
    fn is_instance(&self, id: &str) -> bool {
        self.is_instance_command()
            && self.flag("--instance-id").is_none_or(|i| {
                i.strip_prefix(id)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            })
    }
}

/// The process `pid` if it runs (not a zombie) and its command line can be
/// read (its environment too when it is ours to read).
fn read_process(pid: u32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit(')').next()?.split_whitespace().next();
    if matches!(state, Some("Z") | Some("X") | None) {
        return None;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    Some(Process { pid, args, environ })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(proxy: Option<ProxySpec>) -> InstanceSpec {
        InstanceSpec {
            id: "i-1".into(),
            region: "paris".into(),
            service: "s-1".into(),
            customer: "c-1".into(),
            host: "h1".into(),
            admin_name: None,
            identity: "i-1.abc".into(),
            listen: "127.10.0.2:8080".parse().unwrap(),
            admin: "127.10.0.2:9080".parse().unwrap(),
            admin_token: "admin-secret".into(),
            upstream: "http://127.3.0.9:80".into(),
            origin_policy: "deny non-public".into(),
            origin_ca_pem: None,
            vcpus: 1,
            cpu_quota: 1.0,
            memory_mib: 256,
            proxy,
            tls_listen: None,
            admin_tls: None,
            telemetry: None,
            srv6: None,
        }
    }

    /// A cache gets the member-only telemetry key file as a private file of
    /// its directory and the flags that name it; a proxy gets none.
    #[test]
    fn a_cache_gets_its_telemetry_keys_as_a_private_file_and_flags() {
        use std::os::unix::fs::PermissionsExt;
        let data = std::env::temp_dir().join(format!("vcdn-vim-tm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).unwrap();
        let vim = LocalVim::new("/bin/true".into(), &data).unwrap();
        let t = InstanceTelemetry {
            keys_json: "{\"mac\": []}".into(),
            node: "i-1".into(),
            discovery_port: 23456,
            broadcast: "127.255.255.255".parse().unwrap(),
            kafka: false,
        };
        let path = vim.write_telemetry_keys("i-1", &t).unwrap();
        assert_eq!(path, data.join("instances/i-1/telemetry-keys.json"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut s = spec(None);
        s.telemetry = Some(t);
        let (args, _) = command(
            &s,
            InstanceFiles {
                telemetry_keys: Some(&path),
                ..Default::default()
            },
        );
        assert!(
            args.join(" ").contains(&format!(
                "--telemetry-keys {} --telemetry-node i-1 --telemetry-discovery-port 23456 --telemetry-broadcast 127.255.255.255",
                path.display()
            )),
            "{args:?}"
        );
        let _ = std::fs::remove_dir_all(&data);
    }

    /// The admin API's certificate and key go to files of the instance's
    /// directory (the key readable by its owner only, never on the
    /// command line), named by `--admin-tls-cert/--admin-tls-key`.
    #[test]
    fn an_instance_gets_its_admin_certificate_as_private_files() {
        use std::os::unix::fs::PermissionsExt;
        let data = std::env::temp_dir().join(format!("vcdn-vim-admin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).unwrap();
        let vim = LocalVim::new("/bin/true".into(), &data).unwrap();
        let c = AdminCert {
            cert_pem: "CERT".into(),
            key_pem: "SECRET KEY".into(),
        };
        assert!(!format!("{c:?}").contains("SECRET"));
        let (cp, kp) = vim.write_admin_tls("i-1", &c).unwrap();
        assert_eq!(kp, data.join("instances/i-1/admin.key"));
        assert_eq!(std::fs::read_to_string(&kp).unwrap(), "SECRET KEY");
        let mode = std::fs::metadata(&kp).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let files = InstanceFiles {
            admin_tls: Some((&cp, &kp)),
            ..Default::default()
        };
        let want = format!(
            "--admin 127.10.0.2:9080 --admin-tls-cert {} --admin-tls-key {}",
            cp.display(),
            kp.display()
        );
        for proxy in [
            None,
            Some(ProxySpec {
                location: "paris".into(),
                service: "s-1".into(),
                peers: vec![],
                egress: "paris".into(),
                hop_key: "hop-secret".into(),
                warm: None,
                controller: None,
                controller_fingerprint: None,
            }),
        ] {
            let (args, _) = command(&spec(proxy), files);
            assert!(args.join(" ").contains(&want), "{args:?}");
        }
        std::fs::remove_dir_all(&data).unwrap();
    }

    #[test]
    fn a_proxy_is_started_with_the_contract_flags_and_its_secrets_in_the_environment() {
        let (args, env) = command(
            &spec(Some(ProxySpec {
                location: "paris".into(),
                service: "s-1".into(),
                peers: vec![("marseille".into(), "127.12.0.1:8080".parse().unwrap())],
                egress: "marseille".into(),
                hop_key: "hop-secret".into(),
                warm: Some(4),
                controller: Some(("https://127.0.0.1:8070".into(), "ctl-secret".into())),
                controller_fingerprint: Some("sha256:00".into()),
            })),
            InstanceFiles::default(),
        );
        assert_eq!(
            args.join(" "),
            "proxy --name paris --listen 127.10.0.2:8080 --admin 127.10.0.2:9080 --service s-1 \
             --origin http://127.3.0.9:80 --peer marseille=127.12.0.1:8080 --egress marseille \
             --warm 4 --controller https://127.0.0.1:8070 --controller-fingerprint sha256:00 --keep-sysctl \
             --origin-policy deny non-public --instance-id i-1.abc"
        );
        for secret in ["admin-secret", "hop-secret", "ctl-secret"] {
            assert!(
                !args.iter().any(|a| a.contains(secret)),
                "{secret} on the command line"
            );
        }
        assert_eq!(
            env,
            [
                (PROXY_ADMIN_TOKEN_ENV, "admin-secret".to_string()),
                (PROXY_HOP_KEY_ENV, "hop-secret".to_string()),
                (PROXY_CONTROLLER_TOKEN_ENV, "ctl-secret".to_string()),
            ]
        );
    }

    #[test]
    fn a_cache_is_started_as_before() {
        let (args, env) = command(&spec(None), InstanceFiles::default());
        assert_eq!(
            args.join(" "),
            "cache --listen 127.10.0.2:8080 --upstream http://127.3.0.9:80 --admin 127.10.0.2:9080 \
             --memory 128M --threads 1 --origin-policy deny non-public --instance-id i-1.abc"
        );
        assert_eq!(env, [("VCDN_ADMIN_TOKEN", "admin-secret".to_string())]);
        let mut tls = spec(None);
        tls.tls_listen = Some("127.10.0.2:8443".parse().unwrap());
        assert!(command(&tls, InstanceFiles::default())
            .0
            .join(" ")
            .starts_with("cache --listen 127.10.0.2:8080 --tls-listen 127.10.0.2:8443 --upstream"));
    }

    /// An https:// origin with the service's own CA: the local VIM writes
    /// the bundle into the instance's directory and names it.
    #[test]
    fn a_cache_of_an_https_origin_gets_the_services_ca_as_a_file() {
        let data = std::env::temp_dir().join(format!("vcdn-vim-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).unwrap();
        let vim = LocalVim::new("/bin/true".into(), &data).unwrap();
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let path = vim.write_origin_ca("i-1", pem).unwrap();
        assert_eq!(path, data.join("instances/i-1/origin-ca.pem"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), pem);
        let mut s = spec(None);
        s.upstream = "https://origin.example".into();
        let (args, _) = command(
            &s,
            InstanceFiles {
                origin_ca: Some(&path),
                ..Default::default()
            },
        );
        assert!(
            args.join(" ").contains(&format!(
                "--upstream https://origin.example --admin 127.10.0.2:9080 --memory 128M --threads 1 --origin-ca-file {}",
                path.display()
            )),
            "{args:?}"
        );
        vim.stop("i-1", None);
        assert!(
            !data.join("instances/i-1").exists(),
            "removed with the instance"
        );
        let _ = std::fs::remove_dir_all(&data);
    }

    #[test]
    fn proxies_and_caches_are_recognised_as_instances_by_their_id() {
        let p = |cmd: &str, id: &str| Process {
            pid: 1,
            args: ["vcdn", cmd, "--instance-id", id]
                .map(String::from)
                .to_vec(),
            environ: Vec::new(),
        };
        assert!(p("proxy", "i-1.abc").is_instance("i-1"));
        assert!(p("cache", "i-1.abc").is_instance("i-1"));
        assert!(!p("proxy", "i-12.abc").is_instance("i-1"));
        assert!(!p("origin", "i-1.abc").is_instance("i-1"));
    }
}
