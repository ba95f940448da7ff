//! The resources of the northbound API, as stored and as sent.

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
}

/// The service instance graph: instances per region, on hosts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ServiceGraph {
    pub regions: Vec<RegionGraph>,
}

impl ServiceGraph {
    /// Every instance of every region, to change.
    pub fn instances_mut(&mut self) -> impl Iterator<Item = &mut Instance> {
        self.regions.iter_mut().flat_map(|r| r.instances.iter_mut())
    }
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
    pub vcpus: u32,
    pub memory_mib: u64,
    pub state: InstanceState,
    /// Process id under the local VIM.
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
