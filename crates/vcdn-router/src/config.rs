//! The router's configuration: a TOML file at start, and the same service
//! records as JSON through the admin API at run time.
//!
//! Per service: hostname, origin, regions with their caches, admission
//! settings and (optionally) the DASH segment template that names chunks.
//! Globally: the DNS zone data, health-check timing, coverage zones (client
//! CIDR → region, like Traffic Router's coverage zone file), region
//! coordinates and an optional MaxMind `.mmdb` for nearest-region fallback.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::coverage::Cidr;
use crate::dns::wire::Name;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    #[serde(default)]
    pub dns: DnsConfig,
    #[serde(default)]
    pub health: HealthConfig,
    /// Client address ranges → region.
    #[serde(default)]
    pub coverage: Vec<CoverageZone>,
    /// Regions with optional coordinates (for nearest-region fallback).
    #[serde(default)]
    pub regions: Vec<RegionInfo>,
    /// Region for clients that match no coverage zone and no GeoIP entry.
    /// Without it they get the caches of every region.
    #[serde(default)]
    pub default_region: Option<String>,
    /// MaxMind GeoIP2/GeoLite2 City database for clients outside the
    /// coverage zones.
    #[serde(default)]
    pub geoip: Option<PathBuf>,
    #[serde(default)]
    pub services: Vec<ServiceConfig>,
    /// How often self-sized LRU filters are re-sized from the popularity
    /// estimates.
    #[serde(default = "default_sizing_ms")]
    pub sizing_interval_ms: u64,
    /// Be the SRv6 dispatcher of the services that have a chunk prefix
    /// (`ServiceConfig::srv6`): see `dataplane`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srv6: Option<Srv6Config>,
}

/// The router as an SRv6 dispatcher (the content-aware data-plane paper's
/// in-network server selection): it must be on the clients' path to the
/// services' chunk prefixes, and run as root.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Srv6Config {
    /// The dispatcher's SID: accepting servers steer their SYN-ACK to it,
    /// and it is the source of the encapsulations.
    pub sid: std::net::Ipv6Addr,
    /// The device encapsulated packets leave by.
    pub device: String,
    /// The network namespace (a name under `/run/netns`) the dispatcher's
    /// routes are set in, when it is not the router's own: `vcdn up` keeps
    /// its router on the host and dispatches in the PoP namespace its
    /// clients' packets cross (the programs are the kernel's, not a
    /// namespace's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// Candidates are this region's caches (the dispatcher sits in its
    /// PoP); without it, every region's.
    #[serde(default)]
    pub region: Option<String>,
    /// Learnt connections held at most (the oldest go first).
    #[serde(default = "default_srv6_flows")]
    pub flows: u32,
    /// A learnt connection idle this long is forgotten.
    #[serde(default = "default_srv6_idle_s")]
    pub idle_s: u64,
}

fn default_srv6_flows() -> u32 {
    65_536
}

fn default_srv6_idle_s() -> u64 {
    40
}

/// A service's chunk addresses (`vcdn name`): connections to its /64 are
/// dispatched in the network layer when the router is a dispatcher.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceSrv6 {
    /// The /64 of the service's chunk addresses (the last 64 bits zero).
    pub prefix: std::net::Ipv6Addr,
    /// The origin host's SID (its agent accepts every connection).
    pub origin_sid: std::net::Ipv6Addr,
}

fn default_sizing_ms() -> u64 {
    5_000
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// An operator zone to be authoritative for besides the services'
    /// hostnames (e.g. `cdn.example.net`); each service hostname is a zone
    /// of its own.
    pub zone: Option<String>,
    /// TTL of the A/AAAA answers for services. Short, so a cache that
    /// fails leaves resolvers' caches quickly.
    pub ttl: u32,
    /// TTL of NXDOMAIN/NODATA answers (the SOA minimum, RFC 2308).
    pub negative_ttl: u32,
    /// At most this many caches per answer.
    pub answers: usize,
    /// Name servers of the zones, with their addresses (glue).
    pub ns: Vec<NameServer>,
    /// The SOA RNAME (mailbox of the zone's administrator, as a name).
    pub hostmaster: String,
    /// UDP serving threads (SO_REUSEPORT sockets).
    pub threads: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            zone: None,
            ttl: 20,
            negative_ttl: 60,
            answers: 4,
            ns: Vec::new(),
            hostmaster: "hostmaster.invalid".into(),
            threads: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameServer {
    pub name: String,
    pub address: IpAddr,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Poll every cache's `/healthz` this often.
    pub interval_ms: u64,
    /// A poll that takes longer fails.
    pub timeout_ms: u64,
    /// Consecutive good polls before a failed cache returns.
    pub rise: u32,
    /// Consecutive polls without an answer in time before a cache leaves.
    /// An overloaded cache is slow, not dead: taking it out at its first
    /// late answer sends its users to the origin. A refused connection or
    /// a bad answer takes a cache out at once.
    pub fall: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        // A dead cache (its port refuses) is out after one poll, within
        // the 200 ms interval; a hung one after 3 polls of 400 ms.
        HealthConfig {
            interval_ms: 200,
            timeout_ms: 400,
            rise: 2,
            fall: 3,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoverageZone {
    pub cidr: String,
    pub region: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionInfo {
    pub name: String,
    #[serde(default)]
    pub lat: Option<f64>,
    #[serde(default)]
    pub lon: Option<f64>,
}

/// One vCDN as the router sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub name: String,
    /// The hostname end users resolve and send in `Host`.
    pub hostname: String,
    /// `http://host[:port]` of the content origin.
    pub origin: String,
    pub regions: Vec<ServiceRegion>,
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// DASH segment URL template naming chunks (see `vcdn-content`);
    /// without it every path is its own content.
    #[serde(default)]
    pub template: Option<TemplateConfig>,
    /// Dynamic-content acceleration: clients of these paths go to their
    /// region's ingress proxy instead of a cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<AccelConfig>,
    /// Chunk addresses routed with SRv6 (caches need a `sid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srv6: Option<ServiceSrv6>,
}

/// A service's acceleration entry point. The router serves it like a
/// second service without admission filter: DNS answers `hostname` with
/// the client's region's healthy ingress proxies (health-checked like
/// caches), and HTTP requests for `paths` on the service's hostname are
/// redirected to that ingress.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccelConfig {
    pub hostname: String,
    /// Path prefixes, each starting with `/`.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Per region, its ingress proxies (listed as caches).
    pub regions: Vec<ServiceRegion>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceRegion {
    pub region: String,
    pub caches: Vec<CacheEndpoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheEndpoint {
    /// Where end users reach the cache (its IP goes into DNS answers).
    pub address: SocketAddr,
    /// The cache's admin address, whose `/healthz` is polled. Without it
    /// health is a TCP connect to `address`.
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// The admin API is HTTPS (verified against the router's
    /// `cache_admin_trust`, by default the system roots).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_https: bool,
    /// The name the admin certificate carries when it cannot name the
    /// address's IP (a Kubernetes pod's IP is known only after its
    /// certificate is made); none: the IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_name: Option<String>,
    /// Overloaded at this many open connections (leaves answers until
    /// below again).
    #[serde(default)]
    pub max_connections: Option<u64>,
    /// The SID of the cache host's SRv6 agent (for services with `srv6`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sid: Option<std::net::Ipv6Addr>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum FilterKind {
    /// Every request goes to the edge.
    None,
    /// The paper's LRU filter.
    #[default]
    Lru,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    pub filter: FilterKind,
    /// Filter size C1 in identifiers. Unset: sized from the edge's capacity
    /// in objects and the α and N estimated online.
    pub size: Option<usize>,
    /// The edge's capacity in objects (C2). Unset: read from the caches'
    /// `/healthz` (memory capacity / mean object size).
    pub cache_objects: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// e.g. `/vod/$Video$/$RepresentationID$/seg-$Number$.m4s`
    pub path: String,
    /// Representation ids (or bandwidths) in quality order.
    #[serde(default)]
    pub representations: Vec<String>,
    /// Segment duration in seconds.
    #[serde(default = "default_segment_s")]
    pub segment_duration_s: f64,
}

fn default_segment_s() -> f64 {
    2.0
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            dns: DnsConfig::default(),
            health: HealthConfig::default(),
            coverage: Vec::new(),
            regions: Vec::new(),
            default_region: None,
            geoip: None,
            services: Vec::new(),
            sizing_interval_ms: default_sizing_ms(),
            srv6: None,
        }
    }
}

/// A configuration that cannot be used, with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Parse(PathBuf, String),
    #[error("{0}")]
    Invalid(String),
}

impl RouterConfig {
    pub fn from_file(path: &Path) -> Result<RouterConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.into(), e))?;
        let cfg: RouterConfig =
            toml::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks everything a typo could break, so a bad file fails at start
    /// with a message rather than answering wrongly later.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if let Some(z) = &self.dns.zone {
            Name::parse(z).map_err(|e| ConfigError::Invalid(format!("dns.zone: {e}")))?;
        }
        Name::parse(&self.dns.hostmaster)
            .map_err(|e| ConfigError::Invalid(format!("dns.hostmaster: {e}")))?;
        for ns in &self.dns.ns {
            Name::parse(&ns.name).map_err(|e| ConfigError::Invalid(format!("dns.ns: {e}")))?;
        }
        if self.dns.answers == 0 {
            return bad("dns.answers must be at least 1".into());
        }
        if self.sizing_interval_ms < 10 {
            return bad("sizing_interval_ms must be at least 10".into());
        }
        if self.health.interval_ms == 0
            || self.health.timeout_ms == 0
            || self.health.rise == 0
            || self.health.fall == 0
        {
            return bad("health.interval_ms, timeout_ms, rise and fall must be positive".into());
        }
        let mut regions: HashSet<&str> = self.regions.iter().map(|r| r.name.as_str()).collect();
        for r in &self.regions {
            if let (Some(lat), Some(lon)) = (r.lat, r.lon) {
                if !(-90.0..=90.0).contains(&lat) || !(-180.0..=180.0).contains(&lon) {
                    return bad(format!("region {}: lat/lon out of range", r.name));
                }
            }
        }
        for z in &self.coverage {
            z.cidr
                .parse::<Cidr>()
                .map_err(|e| ConfigError::Invalid(format!("coverage: {e}")))?;
            regions.insert(&z.region);
        }
        let mut names = HashSet::new();
        let mut hosts = HashSet::new();
        for s in &self.services {
            s.validate()?;
            if !names.insert(&s.name) {
                return bad(format!("service '{}' is declared twice", s.name));
            }
            for h in std::iter::once(&s.hostname).chain(s.accel.as_ref().map(|a| &a.hostname)) {
                if !hosts.insert(h.to_ascii_lowercase()) {
                    return bad(format!("hostname '{h}' is used by two services"));
                }
            }
        }
        if let Some(v) = &self.srv6 {
            if v.device.is_empty() || v.flows == 0 || v.idle_s == 0 {
                return bad("srv6: give a device, and positive flows and idle_s".into());
            }
            let mut prefixes = HashSet::new();
            for s in self.services.iter().filter_map(|s| s.srv6.as_ref()) {
                if !prefixes.insert(s.prefix) {
                    return bad(format!("srv6.prefix {} is used by two services", s.prefix));
                }
            }
        }
        if let Some(d) = &self.default_region {
            let known = regions.contains(d.as_str())
                || self
                    .services
                    .iter()
                    .any(|s| s.regions.iter().any(|r| &r.region == d));
            if !known {
                return bad(format!(
                    "default_region '{d}' is not a region of any zone or service"
                ));
            }
        }
        Ok(())
    }
}

impl ServiceConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| {
            Err(ConfigError::Invalid(format!(
                "service '{}': {m}",
                self.name
            )))
        };
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(ConfigError::Invalid(format!(
                "service name '{}' must be 1-64 letters, digits, '-' or '_'",
                self.name
            )));
        }
        if let Err(e) = Name::parse(&self.hostname) {
            return bad(format!("hostname: {e}"));
        }
        if let Err(e) = crate::routing::OriginUrl::parse(&self.origin) {
            return bad(format!("origin: {e}"));
        }
        let mut seen = HashSet::new();
        for r in &self.regions {
            if !seen.insert(&r.region) {
                return bad(format!("region '{}' listed twice", r.region));
            }
        }
        if let Some(t) = &self.template {
            if let Err(e) = crate::naming::Namer::new(Some(t)) {
                return bad(format!("template: {e}"));
            }
        }
        if let Some(a) = &self.accel {
            if let Err(e) = Name::parse(&a.hostname) {
                return bad(format!("accel.hostname: {e}"));
            }
            if a.hostname.eq_ignore_ascii_case(&self.hostname) {
                return bad("accel.hostname must differ from hostname".into());
            }
            if let Some(p) = a.paths.iter().find(|p| !p.starts_with('/')) {
                return bad(format!("accel.paths: '{p}' must start with /"));
            }
            let mut seen = HashSet::new();
            for r in &a.regions {
                if !seen.insert(&r.region) {
                    return bad(format!("accel: region '{}' listed twice", r.region));
                }
            }
        }
        if let Some(v) = &self.srv6 {
            if u128::from(v.prefix) as u64 != 0 {
                return bad(format!(
                    "srv6.prefix: {} is not a /64 (its last 64 bits must be zero)",
                    v.prefix
                ));
            }
        }
        Ok(())
    }
}
