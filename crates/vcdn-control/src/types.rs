//! The resources of the northbound API, as stored and as sent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vcdn_policy::placement::Strategy;

/// An operator region: a data center with hosts. Its instances bind
/// addresses in `instance_block`; clients in `clients` are routed to it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Region {
    pub name: String,
    /// IPv4 /16 (or smaller) whose addresses the region's instances bind.
    pub instance_block: String,
    /// Client address ranges served from this region (coverage zones).
    #[serde(default)]
    pub clients: Vec<String>,
    #[serde(default)]
    pub lat: Option<f64>,
    #[serde(default)]
    pub lon: Option<f64>,
}

/// A compute host of a region and its capacity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: String,
    pub region: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// How many instances it takes at most, whatever their size: one for
    /// a node of a Kubernetes region whose caches use the node's own
    /// network. None: as many as fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<u32>,
}

/// A host with what services hold of it (read-only view).
#[derive(Debug, Clone, Serialize)]
pub struct HostView {
    #[serde(flatten)]
    pub host: Host,
    pub used_vcpus: u32,
    pub used_memory_mib: u64,
    pub instances: usize,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FlavorKind {
    /// Fixed instances from the template, no elasticity.
    Static,
    /// Dimensioned from quality and demand, autoscaled.
    Elastic,
}

/// A vCDN type on offer: its plugin, template and prices.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Flavor {
    pub name: String,
    pub kind: FlavorKind,
    #[serde(default)]
    pub description: String,
    pub template: Template,
    pub pricing: Pricing,
    /// Origin addresses every service of this flavor may use although the
    /// operator's origin policy denies them (rules like `127.0.0.1:9000` or
    /// `10.1.0.0/16`; never the platform's own addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origin_allow: Vec<String>,
}

/// The service instance template (the paper's SIDR entry).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// Instances per region at least (static: exactly).
    pub min_instances: u32,
    /// Instances per region at most (elastic).
    #[serde(default = "default_max_instances")]
    pub max_instances: u32,
    pub vcpus_per_instance: u32,
    pub memory_mib_per_instance: u64,
    /// Regions this flavor may use; empty for all.
    #[serde(default)]
    pub allowed_regions: Vec<String>,
    #[serde(default)]
    pub placement: Strategy,
}

fn default_max_instances() -> u32 {
    16
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PricingScheme {
    /// Price fixed at order time from the initial dimensioning (§V-B a).
    FlatRate,
    /// Base price from the order, plus what scaling adds (§V-B b).
    OnDemand,
}

/// Prices in the operator's currency.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    pub scheme: PricingScheme,
    pub currency: String,
    pub per_vcpu_hour: f64,
    #[serde(default)]
    pub per_gb: f64,
    #[serde(default)]
    pub per_million_requests: f64,
}

/// A content provider.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Customer {
    pub id: String,
    pub name: String,
    pub created_at: u64,
    /// SHA-256 of the API key, hex (the key itself is shown once).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_sha256: String,
    /// Origin addresses this customer may use although the operator's
    /// origin policy denies them (set by the operator).
    #[serde(default)]
    pub origin_allow: Vec<String>,
    /// This customer's quota; `None`: the operator's default.
    #[serde(default)]
    pub quota: Option<crate::settings::Quota>,
}

/// One bad field of a request: where, and what to fix. Sent in the
/// `errors` member of a 422 problem document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FieldError {
    /// The field, as `regions[0].bitrate_kbps`.
    pub field: String,
    pub detail: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

/// What a customer orders.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    pub origin: String,
    pub hostname: String,
    pub flavor: String,
    pub regions: Vec<RegionDemand>,
    #[serde(default)]
    pub quality: QualitySpec,
    #[serde(default)]
    pub lease: LeaseSpec,
    /// Dynamic-content acceleration (split-TCP proxy chains); none when
    /// absent, so orders and services from before it load unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceleration: Option<AccelerationSpec>,
    /// For an `https://` origin: PEM CA certificates its certificate is
    /// verified against instead of the system roots (a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_ca_pem: Option<String>,
    /// How end users reach the caches: DNS and HTTP routing (the default),
    /// or SRv6 in the network layer as well.
    #[serde(default)]
    pub routing: Routing,
}

/// How a service's end users are routed to its caches.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Routing {
    /// The router's DNS answers and HTTP redirects (with its LRU filter).
    #[default]
    Dns,
    /// Also chunk addresses (the content-aware data-plane paper): every
    /// chunk has its own IPv6 address in the service's /64, and the
    /// dispatcher and the edges' agents choose the server on each SYN, in
    /// the kernel; chunks the edge's filter rejects go to the service's
    /// origin gateway. Needs a platform started with `vcdn up --srv6`.
    Srv6,
}

/// What of a service's content rides proxy chains instead of going to the
/// origin over one long TCP connection: path prefixes (clients reach the
/// region's ingress proxy under [`AccelerationSpec::hostname`]), and/or
/// everything the caches do not answer themselves (their misses and
/// passes go to the origin through the region's ingress).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct AccelerationSpec {
    /// Path prefixes to accelerate, each starting with `/`.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Also what the caches fetch from the origin (misses, passes,
    /// `no-store` answers): their upstream becomes the region's ingress.
    #[serde(default)]
    pub uncacheable: bool,
    /// The name clients of the accelerated paths resolve; default `dyn.`
    /// and the service's hostname.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Warm pre-opened connections each proxy keeps per next hop.
    #[serde(default)]
    pub warm: Option<u32>,
}

/// Peak demand in one region.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct RegionDemand {
    pub region: String,
    #[serde(default)]
    pub peak_users: Option<u64>,
    #[serde(default)]
    pub requests_per_s: Option<f64>,
    #[serde(default)]
    pub object_bytes: Option<u64>,
    #[serde(default)]
    pub bitrate_kbps: Option<f64>,
    #[serde(default)]
    pub chunk_s: Option<f64>,
}

/// The quality target: a minimum MOS, or a response-time percentile.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct QualitySpec {
    #[serde(default)]
    pub min_mos: Option<f64>,
    #[serde(default)]
    pub response_ms: Option<f64>,
    #[serde(default)]
    pub percentile: Option<u8>,
}

/// When the service runs: from `start` (Unix seconds, default now) to
/// `end`, or for `duration_s`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LeaseSpec {
    #[serde(default)]
    pub start: Option<u64>,
    #[serde(default)]
    pub end: Option<u64>,
    #[serde(default)]
    pub duration_s: Option<u64>,
}

/// A service's life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// Planned and reserved; its lease has not started.
    Scheduled,
    /// Instances starting, router being configured.
    Deploying,
    /// Every instance answers; the router sends users to them.
    Active,
    /// Some instance is down or being replaced.
    Degraded,
    /// Deployment failed; nothing is reserved.
    Failed,
    /// Lease over: torn down, reservation freed.
    Expired,
    /// Being deleted: recorded before its processes are stopped, so a
    /// control plane that dies meanwhile finishes the delete at start.
    Deleting,
    /// Deleted by the customer: torn down, reservation freed.
    Deleted,
}

impl ServiceState {
    /// Whether the service holds capacity and should be running.
    pub fn live(self) -> bool {
        matches!(
            self,
            ServiceState::Scheduled
                | ServiceState::Deploying
                | ServiceState::Active
                | ServiceState::Degraded
                | ServiceState::Deleting
        )
    }
}

/// A vCDN as the platform keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Service {
    pub id: String,
    pub customer: String,
    pub spec: ServiceSpec,
    pub state: ServiceState,
    pub created_at: u64,
    pub lease_start: u64,
    pub lease_end: u64,
    pub graph: ServiceGraph,
    pub usage: Usage,
    /// The flavor's pricing when ordered (later price changes do not apply).
    pub pricing: Pricing,
    /// vCPUs of the initial plan (the base of on-demand pricing).
    pub planned_vcpus: u32,
    /// The origin policy (text form) its caches enforce at every connect,
    /// fixed when ordered; empty for services ordered before policies.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub origin_policy: String,
    /// Why the service failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The key its proxies authenticate chain hops with: random per
    /// service, made at order time, never shown by the API.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hop_key: String,
    /// Kafka billing's cursor per instance (what was billed last of it),
    /// stored with the usage it produced so that a restarted control plane
    /// bills exactly once ([`crate::billing`]); never shown by the API.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub billing: std::collections::BTreeMap<String, crate::billing::Cursor>,
    /// When Kafka billing first billed this service (ms since the epoch),
    /// or 1 if nothing had been billed before it: a cache that booted
    /// before this was billed by sampling until then, so its first record
    /// without a cursor is a baseline, not new usage. 0: not yet.
    #[serde(default, skip_serializing_if = "crate::billing::is_zero")]
    pub billing_from_ms: u64,
}

/// The service instance graph: instances per region, on hosts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ServiceGraph {
    pub regions: Vec<RegionGraph>,
    /// The acceleration proxies, when ordered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<AccelGraph>,
    /// The chunk prefix and origin gateway, with `routing: "srv6"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srv6: Option<Srv6Graph>,
}

/// A service routed with SRv6: its chunk /64 (`vcdn name --prefix`) and
/// its origin gateway, the last segment of every connection: a cache whose
/// agent accepts everything, in front of the service's origin (the
/// paper's origin server inside the SR domain).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Srv6Graph {
    /// N of the chunk prefix `fd76:6364:c:N::/64`.
    pub number: u16,
    /// The chunk /64 in text (`fd76:6364:c:N::/64`).
    pub prefix: String,
    pub gateway: Instance,
}

impl ServiceGraph {
    /// Every instance (caches of every region, proxies, the SRv6 origin
    /// gateway), to change.
    pub fn instances_mut(&mut self) -> impl Iterator<Item = &mut Instance> {
        self.regions
            .iter_mut()
            .flat_map(|r| r.instances.iter_mut())
            .chain(self.accel.iter_mut().flat_map(|a| a.proxies.iter_mut()))
            .chain(self.srv6.iter_mut().map(|v| &mut v.gateway))
    }

    /// Every instance: caches of every region, proxies, the SRv6 origin
    /// gateway.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        self.regions
            .iter()
            .flat_map(|r| r.instances.iter())
            .chain(self.accel.iter().flat_map(|a| a.proxies.iter()))
            .chain(self.srv6.iter().map(|v| &v.gateway))
    }

    /// The ingress proxy of an ordered region.
    pub fn ingress(&self, region: &str) -> Option<&Instance> {
        let a = self.accel.as_ref()?;
        self.regions.iter().find(|r| r.region == region)?;
        a.proxies
            .iter()
            .find(|p| p.location.as_deref() == Some(region))
    }
}

/// The proxies of an accelerated service: one per location (a region),
/// the ingress of every ordered region and the egress next to the origin;
/// one proxy plays both where they coincide.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct AccelGraph {
    /// The name clients of accelerated paths resolve.
    pub hostname: String,
    /// The location (region) of the proxy that opens connections to the
    /// origin.
    pub egress: String,
    /// Instances with role `proxy` and their location.
    pub proxies: Vec<Instance>,
    /// The RTTs the proxies measured and reported, in ms: location → (peer
    /// location → RTT). Kept with the service, so a restarted controller
    /// recomputes the same chains.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rtt_ms: BTreeMap<String, BTreeMap<String, f64>>,
    /// The chain table each proxy was last sent (location → table), and
    /// its version (raised whenever a table changes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chains: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub chains_version: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RegionGraph {
    pub region: String,
    /// vCPUs the dimensioning asked for (fractional).
    pub vcpus_needed: f64,
    /// What one instance carries at the quality target, in the demand's
    /// unit (sessions or requests/s); drives autoscaling.
    pub per_instance: f64,
    pub instances: Vec<Instance>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Instance {
    pub id: String,
    pub host: String,
    /// Where users reach it.
    pub address: String,
    /// Its control API.
    pub admin: String,
    /// Whether its control API is HTTPS with a certificate of the internal
    /// CA (every instance started since admin APIs have TLS); false for one
    /// recorded before, which is called in plain HTTP (on loopback) until
    /// it is next started.
    #[serde(default)]
    pub admin_https: bool,
    /// The name its admin certificate carries instead of its IP: a pod's
    /// IP is known only once the pod runs, after its certificate was made
    /// (kubernetes VIM); none: the certificate names the admin IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_name: Option<String>,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub state: InstanceState,
    /// Process id under the local VIM (none for a pod).
    #[serde(default)]
    pub pid: Option<u32>,
    /// How its CPU is limited (cgroup v2, cgroup v1, affinity).
    #[serde(default)]
    pub cpu_limit: String,
    pub started_at: u64,
    /// Random, given when the instance is planned: the process proves it
    /// is this instance by answering `/healthz` with [`Instance::identity`]
    /// (a stray or another service's cache on the address cannot).
    #[serde(default)]
    pub nonce: String,
    /// What it runs (`cache` for instances recorded before roles).
    #[serde(default)]
    pub role: Role,
    /// A proxy's location name (its region), as peers and chains name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

/// What an instance runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `vcdn cache`.
    #[default]
    Cache,
    /// `vcdn proxy`: a hop of an acceleration chain.
    Proxy,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Starting,
    Running,
    /// Leaving (scale-in): out of the router, serving its viewers until
    /// they are gone or the drain time is up, then stopped.
    Draining,
    Failed,
}

impl Instance {
    /// What the instance's process is started with (`vcdn cache
    /// --instance-id`) and answers in `/healthz`.
    pub fn identity(&self) -> String {
        format!("{}.{}", self.id, self.nonce)
    }

    /// Counts as capacity of the service (not leaving, not failed).
    pub fn serving(&self) -> bool {
        matches!(self.state, InstanceState::Starting | InstanceState::Running)
    }
}

/// What a service used.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Usage {
    pub vcpu_seconds: f64,
    pub requests: u64,
    pub bytes: u64,
    /// The proxies' share of the above (billed the same way), and the CPU
    /// time they reported.
    #[serde(default, skip_serializing_if = "AccelUsage::is_zero")]
    pub accel: AccelUsage,
}

/// What an accelerated service's proxies used.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct AccelUsage {
    pub vcpu_seconds: f64,
    pub requests: u64,
    pub bytes: u64,
    /// CPU time the proxy processes reported (`/stats` `cpu_seconds`).
    pub cpu_seconds: f64,
}

impl AccelUsage {
    pub fn is_zero(&self) -> bool {
        *self == AccelUsage::default()
    }
}

/// Something the platform did to a service.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub seq: i64,
    pub service: String,
    pub at_ms: u64,
    pub kind: String,
    pub detail: String,
}
