//! The control plane's state and its operations: order, deploy, heal,
//! scale, expire and delete services. The API and the supervisor call
//! these; the store keeps the result.
//!
//! Every service lives in memory (the `services` map, one lock) and is
//! written through to the store on each change, so a restart finds it.
//! Slow steps (waiting for instances to answer, stopping processes) run
//! outside the lock.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Mutex;
use vcdn_model::capacity::CapacityModel;
use vcdn_policy::autoscale::{Autoscaler, Trend};

use crate::deployer::{self, RouterLink};
use crate::planner::{self, PlanError, PlanInput};
use crate::store::{Store, StoreError};
use crate::types::*;
use crate::vim::{InstanceSpec, Vim};

/// How the control plane runs.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub data_dir: PathBuf,
    pub operator_token: String,
    pub router: RouterLink,
    /// What customers are told to use (DNS server, HTTP routing URL).
    pub dns: Option<SocketAddr>,
    pub http_routing: Option<SocketAddr>,
    /// Port every instance serves users on (each has its own address).
    pub instance_port: u16,
    /// Port of every instance's control API.
    pub admin_port: u16,
    /// Port every cache serves HTTPS on (its address, like `instance_port`),
    /// if caches serve HTTPS.
    pub instance_tls_port: Option<u16>,
    pub capacity: CapacityModel,
    /// CPU time one vCPU gets on this host (1.0: a whole CPU). A test bed
    /// on a small machine emulates many small vCPUs with a fraction.
    pub vcpu_share: f64,
    /// Supervisor period: crash checks every tick, load every 10 ticks.
    pub tick: Duration,
    pub autoscaler: Autoscaler,
    /// The platform's own listeners (control API, router) and what each
    /// is: no origin may point at them.
    pub platform_listeners: Vec<(SocketAddr, String)>,
    /// Whether the API is HTTPS, and its certificate's fingerprint (what
    /// the control plane's own clients, e.g. proxies reporting RTTs, pin).
    pub api_https: bool,
    pub api_fingerprint: Option<String>,
    /// Issues the services' certificates when customers upload none.
    pub internal_ca: Option<Arc<crate::pki::InternalCa>>,
    /// The telemetry agent (tracker and consumer); none: caches are
    /// started without telemetry and every instance is polled.
    pub telemetry: Option<Arc<crate::telemetry::Telemetry>>,
    /// Billing through the Kafka data sink (`vcdn up --kafka`): caches'
    /// requests and bytes are billed from `edge.stats` records consumed
    /// from Kafka ([`crate::billing`]), not by the supervisor's sampling.
    pub kafka_billing: Option<Arc<crate::billing::KafkaBilling>>,
    /// Whether `GET /stats` may be polled at all (`vcdn up
    /// --no-stats-polling` turns it off whatever the settings say).
    pub stats_polling: bool,
    /// Whether this platform built the SR domain (`vcdn up --srv6`) and
    /// offers `routing: "srv6"`.
    pub srv6: bool,
    /// Failed authentications a source may make per minute before it gets
    /// 429 until the minute is over.
    pub auth_failures_per_minute: u32,
}

/// An operation's failure, mapped to an HTTP status by the API.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// Fields of a request that are wrong, each with what to fix (422).
    #[error("{}", .0.iter().map(|e| format!("{}: {}", e.field, e.detail)).collect::<Vec<_>>().join("; "))]
    Fields(Vec<FieldError>),
    #[error("{0}")]
    Forbidden(String),
    #[error("deployment failed: {0}")]
    Deploy(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl From<PlanError> for ControlError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Invalid(m) => ControlError::Invalid(m),
            PlanError::NoCapacity(m) => ControlError::Conflict(m),
        }
    }
}

/// An instance's cumulative (requests, bytes, cache hits, cache lookups).
pub(crate) type Counters = [u64; 4];

/// Supervisor bookkeeping of one service (not stored).
#[derive(Default)]
pub(crate) struct Runtime {
    pub(crate) trends: HashMap<String, Trend>,
    /// Last counters seen per instance.
    pub(crate) counters: HashMap<String, Counters>,
    /// Last CPU seconds a proxy reported.
    pub(crate) cpu: HashMap<String, f64>,
    /// Consecutive failed polls per instance.
    pub(crate) failures: HashMap<String, u32>,
    /// Load per region from the last poll.
    pub(crate) load: HashMap<String, f64>,
    /// When a region last failed to scale out (recorded once a minute,
    /// not on every sample while the shortage lasts).
    pub(crate) scale_failed: HashMap<String, Instant>,
    /// MOS the capacity model expects at the current load, per region.
    pub(crate) estimated_mos: HashMap<String, f64>,
    /// Mean MOS players reported, per region, and when.
    pub(crate) reported_mos: HashMap<String, (f64, Instant)>,
    /// When a region was last scaled out for its QoE.
    pub(crate) qoe_scaled: HashMap<String, Instant>,
    /// Open connections per instance at the last poll.
    pub(crate) connections: HashMap<String, f64>,
    /// Load per instance at its last answered poll: an instance too busy
    /// to answer a poll in time still carries it (counting it as 0 would
    /// hide the overload that made it late).
    pub(crate) last_load: HashMap<String, f64>,
    /// When a region last scaled out (no scale-in soon after).
    pub(crate) scaled_out_at: HashMap<String, Instant>,
    /// Relaunches per instance, to back off one that keeps failing.
    pub(crate) relaunch: HashMap<String, crate::supervisor::Relaunch>,
    /// The incarnation (`boot_ms`) each instance's counters belong to.
    pub(crate) boots: HashMap<String, u64>,
}

impl Runtime {
    /// What an instance served since its counters were last seen: the
    /// increase of its cumulative counters ([`Counters`]). Counters of a
    /// later incarnation (a higher `boot_ms`) are all new; a document of an
    /// earlier one, or an older document of the same one (a lower count),
    /// adds nothing. Without `boot_ms` (an older cache), a decrease is
    /// taken for a restart.
    pub(crate) fn count(&mut self, id: &str, boot: Option<u64>, now: Counters) -> Counters {
        let mut last = self.counters.get(id).copied().unwrap_or_default();
        let restarted = match (boot, self.boots.get(id).copied()) {
            // A document of an earlier incarnation than one already
            // counted (a late record): nothing new in it.
            (Some(b), Some(before)) if b < before => return [0; 4],
            (Some(b), before) => {
                self.boots.insert(id.to_string(), b);
                before.is_some_and(|x| x != b)
            }
            (None, _) => now.iter().zip(&last).any(|(n, l)| n < l),
        };
        if restarted {
            last = [0; 4];
        }
        let delta = std::array::from_fn(|k| now[k].saturating_sub(last[k]));
        let keep = std::array::from_fn(|k| now[k].max(last[k]));
        self.counters.insert(id.to_string(), keep);
        delta
    }
}

#[derive(Default)]
pub struct Metrics {
    pub deployed: AtomicU64,
    pub deploy_ms_total: AtomicU64,
    pub healed: AtomicU64,
    pub scaled_out: AtomicU64,
    pub scaled_in: AtomicU64,
    pub expired: AtomicU64,
    pub api_requests: AtomicU64,
    pub api_errors: AtomicU64,
    /// Instance statistics taken from a telemetry record / from a poll.
    pub stats_telemetry: AtomicU64,
    pub stats_polled: AtomicU64,
}

pub struct Control {
    pub cfg: ControlConfig,
    pub store: Store,
    pub vim: Arc<dyn Vim>,
    pub metrics: Metrics,
    /// Token every instance's control API requires (kept in the data dir).
    pub instance_token: String,
    /// Calls instances' admin APIs: HTTPS trusting only the internal CA
    /// (plain HTTP for an instance recorded without `admin_https`).
    pub admin: vcdn_http::admin_tls::AdminClient,
    pub(crate) services: Mutex<BTreeMap<String, Service>>,
    pub(crate) runtime: parking_lot::Mutex<HashMap<String, Runtime>>,
    /// The open 10 s buckets of the time series.
    pub(crate) series: parking_lot::Mutex<crate::timeseries::Recorder>,
    /// Which certificate each cache instance holds.
    pub(crate) pushed: parking_lot::Mutex<crate::certificates::Pushed>,
    /// Held while a service's certificate is read and written back.
    pub(crate) cert_writes: Mutex<()>,
    /// Held while the router is told a service (healing) or told to drop
    /// it (ending): a heal that finishes after a delete must not put the
    /// deleted service back.
    pub(crate) router_writes: Mutex<()>,
}

pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes a secret (a token, a key) readable by its owner only.
pub fn write_secret(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Written whole to a temporary name, then renamed: a crash at any
    // instant leaves the old file or the new one, never a torn key.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Random lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Control {
    pub async fn open(
        cfg: ControlConfig,
        store: Store,
        vim: Arc<dyn Vim>,
    ) -> Result<Arc<Control>, ControlError> {
        let token_file = cfg.data_dir.join("instance-token");
        let instance_token = match std::fs::read_to_string(&token_file) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            _ => {
                let t = random_hex(16);
                write_secret(&token_file, &t).map_err(|e| {
                    ControlError::Invalid(format!("cannot write {}: {e}", token_file.display()))
                })?;
                t
            }
        };
        if store.list::<Region>("region").await?.is_empty() {
            let d = crate::defaults::Defaults::embedded();
            for r in &d.regions {
                store.put("region", &r.name, r).await?;
            }
            for h in &d.hosts {
                store.put("host", &h.name, h).await?;
            }
            for f in &d.flavors {
                store.put("flavor", &f.name, f).await?;
            }
            tracing::info!(
                regions = d.regions.len(),
                hosts = d.hosts.len(),
                flavors = d.flavors.len(),
                "stored the embedded defaults"
            );
        }
        let services: BTreeMap<String, Service> = store
            .list::<Service>("service")
            .await?
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        let admin = crate::pki::instance_admin_client(cfg.internal_ca.as_deref())
            .map_err(ControlError::Invalid)?;
        Ok(Arc::new(Control {
            admin,
            cfg,
            store,
            vim,
            metrics: Metrics::default(),
            instance_token,
            services: Mutex::new(services),
            runtime: parking_lot::Mutex::new(HashMap::new()),
            series: Default::default(),
            pushed: parking_lot::Mutex::new(Default::default()),
            cert_writes: Mutex::new(()),
            router_writes: Mutex::new(()),
        }))
    }

    pub async fn event(&self, service: &str, kind: &str, detail: &str) {
        tracing::info!(service, kind, detail, "event");
        if let Err(e) = self.store.add_event(service, now_ms(), kind, detail).await {
            tracing::error!(error = %e, "cannot record event");
        }
    }

    fn instance_spec(&self, s: &Service, i: &Instance) -> Result<InstanceSpec, ControlError> {
        let parse = |a: &str| {
            a.parse::<SocketAddr>()
                .map_err(|e| ControlError::Invalid(format!("instance address {a}: {e}")))
        };
        let (upstream, origin_policy) = crate::accel::cache_upstream(s, i);
        // A certificate of the internal CA for its admin API, made at each
        // start (the key never leaves this host but in the instance's files).
        let region = region_of(s, i);
        // A pod's IP is known only once it runs: its certificate names it.
        let admin_name = self
            .vim
            .regions()
            .contains(&region)
            .then(|| format!("{}.instance.vcdn.internal", i.id));
        let admin_tls = match (&self.cfg.internal_ca, &admin_name) {
            (Some(ca), Some(name)) => Some(
                crate::pki::instance_admin_cert_named(ca, name).map_err(ControlError::Deploy)?,
            ),
            (Some(ca), None) => Some(
                crate::pki::instance_admin_cert(ca, parse(&i.admin)?)
                    .map_err(ControlError::Deploy)?,
            ),
            (None, _) => None,
        };
        Ok(InstanceSpec {
            admin_tls,
            admin_name,
            region,
            service: s.id.clone(),
            customer: s.customer.clone(),
            host: i.host.clone(),
            id: i.id.clone(),
            identity: i.identity(),
            listen: parse(&i.address)?,
            admin: parse(&i.admin)?,
            admin_token: self.instance_token.clone(),
            upstream,
            origin_policy,
            origin_ca_pem: s.spec.origin_ca_pem.clone(),
            vcpus: i.vcpus,
            cpu_quota: i.vcpus as f64 * self.cfg.vcpu_share,
            memory_mib: i.memory_mib,
            tls_listen: match (i.role, self.cfg.instance_tls_port) {
                (Role::Cache, Some(port)) => Some(SocketAddr::new(parse(&i.address)?.ip(), port)),
                _ => None,
            },
            telemetry: match (&self.cfg.telemetry, i.role) {
                (Some(t), Role::Cache) => Some(crate::vim::InstanceTelemetry {
                    keys_json: t.member_keys_json().to_string(),
                    node: i.id.clone(),
                    discovery_port: t.options.discovery_port,
                    broadcast: t.options.broadcast,
                    kafka: self.cfg.kafka_billing.is_some(),
                }),
                _ => None,
            },
            proxy: crate::accel::proxy_spec(s, i, self.controller_url()).map(|mut p| {
                p.controller_fingerprint = self.cfg.api_fingerprint.clone();
                p
            }),
            srv6: match (&s.graph.srv6, i.role) {
                // A platform started without --srv6 serves such a service
                // by DNS and HTTP only (the order needed it; a restart
                // without it loses the data path, not the service).
                (Some(v), Role::Cache) if self.cfg.srv6 => Some(crate::vim::InstanceSrv6 {
                    node: vcdn_srv6::domain::Node::of(&i.id),
                    prefix: v.prefix.clone(),
                    filter: if v.gateway.id == i.id { "none" } else { "auto" },
                }),
                _ => None,
            },
        })
    }

    /// Starts (or restarts) an instance's process and records its pid.
    pub(crate) fn launch(&self, s: &Service, i: &mut Instance) -> Result<(), ControlError> {
        if i.nonce.is_empty() {
            // Recorded before instances carried one.
            i.nonce = random_hex(8);
        }
        let spec = self.instance_spec(s, i)?;
        if self.vim.regions().contains(&spec.region)
            && (spec.proxy.is_some() || spec.srv6.is_some())
        {
            return Err(ControlError::Deploy(format!(
                "region {} runs its instances on Kubernetes, which runs caches only: acceleration proxies and SRv6 nodes need a local region",
                spec.region
            )));
        }
        if let Some(t) = &self.cfg.telemetry {
            t.add_known(&i.id);
        }
        let started = self
            .vim
            .start(&spec)
            .map_err(|e| ControlError::Deploy(e.to_string()))?;
        i.admin_https = spec.admin_tls.is_some();
        i.admin_name = spec.admin_name;
        i.pid = started.pid;
        i.cpu_limit = started.cpu_limit;
        i.state = InstanceState::Starting;
        i.started_at = now_s();
        Ok(())
    }

    pub(crate) async fn persist(&self, s: &Service) {
        if let Err(e) = self.store.put("service", &s.id, s).await {
            tracing::error!(service = %s.id, error = %e, "cannot store service");
        }
    }

    // ---- catalog reads ----

    pub async fn regions(&self) -> Result<Vec<Region>, ControlError> {
        Ok(self.store.list("region").await?)
    }

    /// The catalog's hosts, but for a region a VIM reports itself (a
    /// Kubernetes cluster's nodes, with what other workloads hold of them
    /// already taken off).
    pub async fn hosts(&self) -> Result<Vec<Host>, ControlError> {
        let theirs = self.vim.regions();
        let mut hosts: Vec<Host> = self.store.list("host").await?;
        hosts.retain(|h| !theirs.contains(&h.region));
        hosts.extend(self.vim.hosts());
        Ok(hosts)
    }

    /// Waits until `instances` of service `id` answer. An instance whose
    /// IP its VIM gives (a pod's) gets it first, recorded with the planned
    /// ports: that is where the router and DNS send users.
    pub(crate) async fn wait_started(
        &self,
        id: &str,
        instances: &[Instance],
    ) -> Result<(), String> {
        let t0 = Instant::now();
        let mut ready: Vec<Instance> = Vec::with_capacity(instances.len());
        let theirs = self.vim.regions();
        let (instances, given, limit) = {
            let services = self.services.lock().await;
            // As recorded by their launch (admin name, https).
            let instances: Vec<Instance> = match services.get(id) {
                Some(s) => instances
                    .iter()
                    .map(|i| {
                        s.graph
                            .instances()
                            .find(|r| r.id == i.id)
                            .unwrap_or(i)
                            .clone()
                    })
                    .collect(),
                None => instances.to_vec(),
            };
            let regions: Vec<String> = match services.get(id) {
                Some(s) => instances.iter().map(|i| region_of(s, i)).collect(),
                None => Vec::new(),
            };
            let limit = regions
                .iter()
                .map(|r| self.vim.start_limit(r))
                .max()
                .unwrap_or(Duration::from_secs(5));
            let given: Vec<Instance> = instances
                .iter()
                .zip(&regions)
                .filter(|(_, r)| theirs.contains(r))
                .map(|(i, _)| i.clone())
                .collect();
            (instances, given, limit)
        };
        let mut pause = Duration::from_millis(5);
        let mut waiting = given;
        while !waiting.is_empty() {
            waiting.retain(|i| match self.vim.address(&i.id) {
                Some(ip) => {
                    let mut i = i.clone();
                    for a in [&mut i.address, &mut i.admin] {
                        if let Ok(mut sa) = a.parse::<SocketAddr>() {
                            sa.set_ip(ip);
                            *a = sa.to_string();
                        }
                    }
                    ready.push(i);
                    false
                }
                None => true,
            });
            if waiting.is_empty() {
                break;
            }
            if t0.elapsed() >= limit {
                let ids: Vec<&str> = waiting.iter().map(|i| i.id.as_str()).collect();
                return Err(format!(
                    "instances {} got no address from their VIM within {limit:?}",
                    ids.join(", ")
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        if !ready.is_empty() {
            let mut services = self.services.lock().await;
            if let Some(s) = services.get_mut(id) {
                for i in s.graph.instances_mut() {
                    if let Some(r) = ready.iter().find(|r| r.id == i.id) {
                        i.address = r.address.clone();
                        i.admin = r.admin.clone();
                    }
                }
                let snap = s.clone();
                drop(services);
                self.persist(&snap).await;
            }
        }
        let all: Vec<Instance> = instances
            .iter()
            .map(|i| ready.iter().find(|r| r.id == i.id).unwrap_or(i).clone())
            .collect();
        let left = limit
            .saturating_sub(t0.elapsed())
            .max(Duration::from_secs(5));
        deployer::wait_ready(&self.admin, &all, left).await
    }

    pub async fn flavors(&self) -> Result<Vec<Flavor>, ControlError> {
        Ok(self.store.list("flavor").await?)
    }

    pub async fn host_views(&self) -> Result<Vec<HostView>, ControlError> {
        let hosts = self.hosts().await?;
        let services = self.services.lock().await;
        let mut views: Vec<HostView> = hosts
            .into_iter()
            .map(|h| HostView {
                host: h,
                used_vcpus: 0,
                used_memory_mib: 0,
                instances: 0,
            })
            .collect();
        for s in services.values().filter(|s| s.state.live()) {
            for i in s.graph.instances() {
                if let Some(v) = views.iter_mut().find(|v| v.host.name == i.host) {
                    v.used_vcpus += i.vcpus;
                    v.used_memory_mib += i.memory_mib;
                    v.instances += 1;
                }
            }
        }
        Ok(views)
    }

    /// Live services using a region or a host (a region or host in use
    /// cannot be removed).
    pub async fn users_of(&self, region: Option<&str>, host: Option<&str>) -> Vec<String> {
        self.services
            .lock()
            .await
            .values()
            .filter(|s| s.state.live())
            .filter(|s| {
                s.graph
                    .regions
                    .iter()
                    .any(|r| region.is_some_and(|n| r.region == n))
                    || s.graph.instances().any(|i| {
                        host.is_some_and(|h| i.host == h)
                            || region.is_some_and(|n| i.location.as_deref() == Some(n))
                    })
            })
            .map(|s| s.id.clone())
            .collect()
    }

    // ---- services ----

    pub async fn list_services(&self, customer: Option<&str>) -> Vec<Service> {
        self.services
            .lock()
            .await
            .values()
            .filter(|s| customer.is_none_or(|c| s.customer == c))
            .cloned()
            .collect()
    }

    /// A service by id or by name, seen by `customer` (None: the operator).
    /// Someone else's service is "not found", not "forbidden": its
    /// existence is nobody else's business.
    pub async fn find(&self, key: &str, customer: Option<&str>) -> Result<Service, ControlError> {
        let services = self.services.lock().await;
        let mine = |s: &&Service| customer.is_none_or(|c| s.customer == c);
        services
            .get(key)
            .filter(mine)
            .or_else(|| {
                // By name: the live one, else the newest.
                let mut named: Vec<&Service> = services
                    .values()
                    .filter(mine)
                    .filter(|s| s.spec.name == key)
                    .collect();
                named.sort_by_key(|s| (s.state.live(), s.created_at));
                named.last().copied()
            })
            .cloned()
            .ok_or_else(|| ControlError::NotFound(format!("no service {key}")))
    }

    /// Orders a vCDN: validate, plan, reserve, deploy (now, or when the
    /// lease starts), and wire the router. A dry run stops after the plan
    /// and answers what the order would be (its graph and price), keeping
    /// and starting nothing.
    pub async fn create(
        &self,
        customer: &str,
        spec: ServiceSpec,
        dry_run: bool,
    ) -> Result<Service, ControlError> {
        let t0 = Instant::now();
        let now = now_s();
        let crate::order::Admitted {
            spec,
            start,
            end,
            origin_policy,
            quota,
        } = self.admit(customer, spec, now).await?;
        let flavors = self.flavors().await?;
        let Some(flavor) = flavors.iter().find(|f| f.name == spec.flavor) else {
            let names: Vec<&str> = flavors.iter().map(|f| f.name.as_str()).collect();
            return Err(ControlError::Invalid(format!(
                "unknown flavor {}; the catalog has: {}",
                spec.flavor,
                names.join(", ")
            )));
        };
        if spec.routing == Routing::Srv6 && !self.cfg.srv6 {
            return Err(ControlError::Conflict(
                "routing \"srv6\" is not offered here: this platform routes with DNS and HTTP \
                 only (its operator starts vcdn up with --srv6, as root, on a host with IPv6 and \
                 the kernel's SRv6 BPF, to offer it); order routing \"dns\""
                    .into(),
            ));
        }
        let regions = self.regions().await?;
        let hosts = self.hosts().await?;
        let origin_ip = crate::accel::origin_address(&spec.origin).await;
        let mut services = self.services.lock().await;
        let accel_name = spec.acceleration.as_ref().and_then(|a| a.hostname.clone());
        for hostname in std::iter::once(spec.hostname.trim_end_matches('.').to_ascii_lowercase())
            .chain(accel_name)
        {
            if let Some(other) = services
                .values()
                .find(|s| s.state.live() && crate::accel::names(s).any(|n| n == hostname))
            {
                return Err(ControlError::Conflict(if other.customer == customer {
                    format!(
                        "hostname {hostname} is already served by your service {} ({})",
                        other.spec.name, other.id
                    )
                } else {
                    format!("hostname {hostname} is already taken")
                }));
            }
        }
        if let Some(other) = services
            .values()
            .find(|s| s.state.live() && s.customer == customer && s.spec.name == spec.name)
        {
            return Err(ControlError::Conflict(format!(
                "you already have a service named {} ({})",
                spec.name, other.id
            )));
        }
        let all: Vec<Service> = services.values().cloned().collect();
        let mut graph = planner::plan(
            &PlanInput {
                spec: &spec,
                flavor,
                regions: &regions,
                hosts: &hosts,
                services: &all,
                model: &self.cfg.capacity,
                instance_port: self.cfg.instance_port,
                admin_port: self.cfg.admin_port,
                origin_ip,
            },
            &mut || format!("i-{}", random_hex(5)),
            now,
        )
        .map_err(|e| match e {
            // A cluster that does not answer has no hosts: say so.
            PlanError::NoCapacity(m) => {
                let why: Vec<String> = spec
                    .regions
                    .iter()
                    .filter_map(|d| self.vim.trouble(&d.region))
                    .collect();
                if why.is_empty() {
                    PlanError::NoCapacity(m)
                } else {
                    PlanError::NoCapacity(format!("{m}; {}", why.join("; ")))
                }
            }
            e => e,
        })?;
        let theirs = self.vim.regions();
        if let Some(d) = spec.regions.iter().find(|d| theirs.contains(&d.region)) {
            if graph.accel.is_some() || graph.srv6.is_some() {
                return Err(ControlError::Invalid(format!(
                    "region {} runs on Kubernetes, which runs caches only: acceleration and routing \"srv6\" need local regions",
                    d.region
                )));
            }
        }
        for i in graph.instances_mut() {
            i.nonce = random_hex(8);
            i.admin_https = self.cfg.internal_ca.is_some();
        }
        // Proxies are billed like caches: part of the plan's vCPUs.
        let planned_vcpus = graph.instances().map(|i| i.vcpus).sum();
        crate::order::check_quota(&quota, customer, services.values(), planned_vcpus)?;
        let hop_key = if graph.accel.is_some() {
            random_hex(32)
        } else {
            String::new()
        };
        let mut s = Service {
            id: format!("s-{}", random_hex(6)),
            customer: customer.to_string(),
            spec,
            state: if start > now {
                ServiceState::Scheduled
            } else {
                ServiceState::Deploying
            },
            created_at: now,
            lease_start: start,
            lease_end: end,
            graph,
            usage: Usage::default(),
            pricing: flavor.pricing.clone(),
            planned_vcpus,
            origin_policy,
            error: None,
            hop_key,
            billing: Default::default(),
            billing_from_ms: 0,
        };
        let summary = s
            .graph
            .regions
            .iter()
            .map(|r| {
                format!(
                    "{}: {} x {} vCPU",
                    r.region,
                    r.instances.len(),
                    flavor.template.vcpus_per_instance
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
            + &crate::accel::summary(&s.graph);
        if dry_run {
            return Ok(s);
        }
        // The intent (service, graph, instances with their addresses and
        // identities) is stored before any process starts: a control plane
        // that dies from here on finds the order at start and finishes it,
        // and owns whatever process it started.
        self.store.put("service", &s.id, &s).await?;
        services.insert(s.id.clone(), s.clone());
        // Its caches find a certificate for its hostname from the start.
        self.ensure_certificate(&s).await;
        if s.state == ServiceState::Scheduled {
            drop(services);
            self.event(
                &s.id,
                "planned",
                &format!("reserved {summary}; starts at {start}"),
            )
            .await;
            return Ok(s);
        }
        let launched = self.launch_all(&mut s);
        services.insert(s.id.clone(), s.clone());
        drop(services);
        self.persist(&s).await;
        self.event(&s.id, "planned", &format!("reserved {summary}"))
            .await;
        if let Err(e) = launched {
            return Err(self.fail(&s.id, e).await);
        }
        self.finish_deploy(&s.id, t0).await
    }

    pub(crate) fn launch_all(&self, s: &mut Service) -> Result<(), ControlError> {
        let snapshot = s.clone();
        for i in s.graph.instances_mut() {
            self.launch(&snapshot, i)?;
        }
        Ok(())
    }

    /// Waits for every instance, then points the router at them.
    pub(crate) async fn finish_deploy(
        &self,
        id: &str,
        t0: Instant,
    ) -> Result<Service, ControlError> {
        let s = self.find(id, None).await?;
        let instances: Vec<Instance> = s.graph.instances().cloned().collect();
        if let Err(e) = self.wait_started(id, &instances).await {
            return Err(self.fail(id, ControlError::Deploy(e)).await);
        }
        // With the addresses pods got.
        let s = self.find(id, None).await?;
        if let Err(e) = self.wire_proxies(&s).await {
            return Err(self.fail(id, ControlError::Deploy(e)).await);
        }
        if let Err(e) = self.cfg.router.put(&s).await {
            return Err(self.fail(id, ControlError::Deploy(e)).await);
        }
        let mut services = self.services.lock().await;
        let Some(s) = services.get_mut(id) else {
            return Err(ControlError::NotFound(format!("no service {id}")));
        };
        if s.state != ServiceState::Deploying {
            // Deleted while deploying: the delete tears down.
            return Ok(s.clone());
        }
        s.state = ServiceState::Active;
        for i in s.graph.instances_mut() {
            i.state = InstanceState::Running;
        }
        let s = s.clone();
        drop(services);
        self.persist(&s).await;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        self.metrics.deployed.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .deploy_ms_total
            .fetch_add(ms as u64, Ordering::Relaxed);
        let n = s.graph.instances().count();
        let proxies = s.graph.accel.as_ref().map_or(String::new(), |a| {
            format!(
                " ({} of them acceleration proxies, peers set)",
                a.proxies.len()
            )
        });
        self.event(
            &s.id,
            "active",
            &format!("{n} instances serving in {ms:.1} ms{proxies}"),
        )
        .await;
        Ok(s)
    }

    /// Marks a deployment failed, frees everything, returns the error.
    pub(crate) async fn fail(&self, id: &str, e: ControlError) -> ControlError {
        let msg = e.to_string();
        if let Some(s) = self.end(id, ServiceState::Failed, Some(msg.clone())).await {
            self.event(&s.id, "failed", &msg).await;
        }
        e
    }

    /// Ends a service: router, processes, then its state. Returns it as it
    /// was.
    pub(crate) async fn end(
        &self,
        id: &str,
        state: ServiceState,
        error: Option<String>,
    ) -> Option<Service> {
        // Users are sent elsewhere first; then the caches stop while the
        // service is held, so that whoever sees the ended state (the API,
        // the supervisor) finds them gone, and none is healed meanwhile.
        {
            let _router = self.router_writes.lock().await;
            if let Err(e) = self.cfg.router.delete(id).await {
                tracing::warn!(service = id, error = %e, "router did not drop the service");
            }
        }
        let mut services = self.services.lock().await;
        let s = services.get_mut(id)?;
        let before = s.clone();
        s.state = state;
        s.error = error;
        for i in s.graph.instances_mut() {
            i.state = InstanceState::Failed;
            i.pid = None;
        }
        let after = s.clone();
        self.stop_instances(before.graph.instances().cloned().collect())
            .await;
        drop(services);
        self.persist(&after).await;
        self.runtime.lock().remove(id);
        Some(before)
    }

    pub(crate) async fn stop_instances(&self, instances: Vec<Instance>) {
        let vim = self.vim.clone();
        let _ = tokio::task::spawn_blocking(move || {
            std::thread::scope(|sc| {
                for i in &instances {
                    let vim = &vim;
                    sc.spawn(move || vim.stop(&i.id, i.pid));
                }
            })
        })
        .await;
    }

    pub async fn delete(&self, key: &str, customer: Option<&str>) -> Result<Service, ControlError> {
        let s = self.find(key, customer).await?;
        if !s.state.live() || s.state == ServiceState::Deleting {
            return Err(ControlError::Conflict(
                format!("service {} is already {:?}", s.id, s.state).to_lowercase(),
            ));
        }
        // Recorded before anything stops: a control plane that dies during
        // the delete finishes it at start.
        {
            let mut services = self.services.lock().await;
            let Some(live) = services.get_mut(&s.id) else {
                return Err(ControlError::NotFound(format!("no service {key}")));
            };
            if !live.state.live() || live.state == ServiceState::Deleting {
                return Err(ControlError::Conflict(format!(
                    "service {} is already being deleted",
                    s.id
                )));
            }
            let mut deleting = live.clone();
            deleting.state = ServiceState::Deleting;
            self.store.put("service", &s.id, &deleting).await?;
            *live = deleting;
        }
        let n = s.graph.instances().count();
        self.end(&s.id, ServiceState::Deleted, None).await;
        self.event(
            &s.id,
            "deleted",
            &format!("{n} instances stopped, reservation freed"),
        )
        .await;
        self.find(&s.id, None).await
    }

    /// Sends a purge or prefetch to every running instance; returns what
    /// each answered.
    pub async fn fan_out(&self, s: &Service, path: &str, body: &[u8]) -> Vec<serde_json::Value> {
        let auth = format!("Bearer {}", self.instance_token);
        let calls = s.graph.regions.iter().flat_map(|r| r.instances.iter().map(move |i| (r.region.clone(), i.clone()))).map(|(region, i)| {
            let auth = auth.clone();
            async move {
                let res = deployer::instance_request(&self.admin, &i, "POST", path, &[("Authorization", &auth), ("Content-Type", "application/json")], body, Duration::from_secs(30)).await;
                match res {
                    Ok(r) => serde_json::json!({"instance": i.id, "region": region, "status": r.status(), "result": serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or(serde_json::Value::Null)}),
                    Err(e) => serde_json::json!({"instance": i.id, "region": region, "error": e}),
                }
            }
        });
        let mut out = Vec::new();
        for c in calls.collect::<Vec<_>>() {
            out.push(c.await);
        }
        out
    }

    /// The supervisor's view of a service's load per region.
    pub fn load(&self, id: &str) -> HashMap<String, f64> {
        self.runtime
            .lock()
            .get(id)
            .map(|r| r.load.clone())
            .unwrap_or_default()
    }

    /// Estimated and reported MOS per region.
    pub fn qoe(&self, id: &str) -> serde_json::Value {
        let rt = self.runtime.lock();
        let Some(r) = rt.get(id) else {
            return serde_json::json!({});
        };
        let mut out = serde_json::Map::new();
        for (region, m) in &r.estimated_mos {
            out.insert(
                region.clone(),
                serde_json::json!({"estimated_mos": (m * 100.0).round() / 100.0}),
            );
        }
        for (region, (m, at)) in &r.reported_mos {
            let e = out
                .entry(region.clone())
                .or_insert_with(|| serde_json::json!({}));
            e["reported_mos"] = serde_json::json!((m * 100.0).round() / 100.0);
            e["reported_s_ago"] = serde_json::json!(at.elapsed().as_secs());
        }
        serde_json::Value::Object(out)
    }

    /// A player's (or a probe's) mean MOS for a region of a service.
    pub async fn report_qoe(
        &self,
        key: &str,
        customer: Option<&str>,
        region: &str,
        mos: f64,
    ) -> Result<(), ControlError> {
        let s = self.find(key, customer).await?;
        if !s.graph.regions.iter().any(|r| r.region == region) {
            return Err(ControlError::Invalid(format!(
                "service {} has no region {region}",
                s.id
            )));
        }
        if !(1.0..=5.0).contains(&mos) {
            return Err(ControlError::Invalid(format!(
                "mos must be within 1..5, not {mos}"
            )));
        }
        self.runtime
            .lock()
            .entry(s.id.clone())
            .or_default()
            .reported_mos
            .insert(region.to_string(), (mos, Instant::now()));
        if let Some(t) = &self.cfg.telemetry {
            t.publish_qoe(&s.id, region, mos);
        }
        Ok(())
    }

    /// Services by state, for /metrics.
    pub async fn state_counts(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for s in self.services.lock().await.values() {
            *m.entry(format!("{:?}", s.state).to_lowercase())
                .or_default() += 1;
        }
        m
    }
}

pub(crate) fn fmt_pid(p: Option<u32>) -> String {
    p.map_or("-".into(), |p| p.to_string())
}

/// The region an instance serves: the one whose instances it is among, or
/// a proxy's or gateway's location.
pub(crate) fn region_of(s: &Service, i: &Instance) -> String {
    s.graph
        .regions
        .iter()
        .find(|r| r.instances.iter().any(|x| x.id == i.id))
        .map(|r| r.region.clone())
        .or_else(|| i.location.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::Runtime;

    /// Cumulative counters by incarnation: a repeat, an older document or
    /// a restart never counts anything twice, and a restart's new counts
    /// are all new.
    #[test]
    fn counters_count_once_across_repeats_late_documents_and_restarts() {
        let mut rt = Runtime::default();
        assert_eq!(
            rt.count("i-1", Some(100), [20, 2000, 0, 0]),
            [20, 2000, 0, 0]
        );
        assert_eq!(
            rt.count("i-1", Some(100), [20, 2000, 0, 0]),
            [0, 0, 0, 0],
            "same again"
        );
        assert_eq!(
            rt.count("i-1", Some(100), [15, 1500, 0, 0]),
            [0, 0, 0, 0],
            "an older one"
        );
        assert_eq!(rt.count("i-1", Some(100), [25, 2500, 0, 0]), [5, 500, 0, 0]);
        assert_eq!(
            rt.count("i-1", Some(200), [3, 300, 0, 0]),
            [3, 300, 0, 0],
            "restarted"
        );
        assert_eq!(
            rt.count("i-1", Some(100), [99, 9900, 0, 0]),
            [0, 0, 0, 0],
            "the old boot's"
        );
        assert_eq!(rt.count("i-1", Some(200), [10, 1000, 0, 0]), [7, 700, 0, 0]);
        // Without an incarnation (an older cache): a decrease is a restart.
        assert_eq!(rt.count("i-2", None, [50, 10, 0, 0]), [50, 10, 0, 0]);
        assert_eq!(rt.count("i-2", None, [4, 1, 0, 0]), [4, 1, 0, 0]);
    }
}
