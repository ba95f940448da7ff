//! The router's state: the current configuration compiled into an
//! immutable [`Snapshot`] (swapped whole on every change, read lock-free by
//! the serving threads through a version counter), plus what outlives
//! snapshots: per-cache health, per-cache admission filters and per-service
//! popularity estimators.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use vcdn_policy::admission::{Admission, LruFilter};
use vcdn_policy::popularity::PopularityEstimator;

use crate::config::{CacheEndpoint, ConfigError, FilterKind, RouterConfig, ServiceConfig};
use crate::coverage::PrefixMap;
use crate::dns::wire::{Name, Soa};
use crate::geo::GeoIp;
use crate::metrics::Metrics;
use crate::routing::OriginUrl;

/// Filter size before the popularity of a service is known: generous,
/// because the paper's Fig. 6 shows an over-sized filter costs little and an
/// under-sized one a lot.
pub const INITIAL_FILTER_SIZE: usize = 100_000;

/// Health and load of one cache, shared by every snapshot.
#[derive(Debug)]
pub struct CacheState {
    pub endpoint: CacheEndpoint,
    /// Answered its last health check (and `rise` before it after a failure).
    pub alive: AtomicBool,
    /// Out of rotation only because its health checks came late (not
    /// refused): it is busy, not dead, and still the best choice when its
    /// region has nothing better (see `routing::Snapshot::choose`).
    pub late: AtomicBool,
    /// At or above `max_connections`.
    pub overloaded: AtomicBool,
    pub connections: AtomicU64,
    /// The cache's memory capacity and use, from its `/healthz`.
    pub capacity_bytes: AtomicU64,
    pub stored_objects: AtomicU64,
    pub stored_bytes: AtomicU64,
    pub admitted_edge: AtomicU64,
    pub admitted_origin: AtomicU64,
}

impl CacheState {
    fn new(endpoint: CacheEndpoint) -> CacheState {
        CacheState {
            endpoint,
            // Trusted until the first poll says otherwise (at most one
            // interval after start), so a router restart does not send a
            // whole region to the origin.
            alive: AtomicBool::new(true),
            late: AtomicBool::new(false),
            overloaded: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            capacity_bytes: AtomicU64::new(0),
            stored_objects: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            admitted_edge: AtomicU64::new(0),
            admitted_origin: AtomicU64::new(0),
        }
    }

    /// Alive and not overloaded: may appear in answers.
    pub fn is_available(&self) -> bool {
        self.alive.load(Ordering::Relaxed) && !self.overloaded.load(Ordering::Relaxed)
    }

    /// Out of rotation but answering, only late: usable as a last resort.
    pub fn is_late(&self) -> bool {
        !self.alive.load(Ordering::Relaxed) && self.late.load(Ordering::Relaxed)
    }

    pub fn count_admission(&self, a: Admission) {
        match a {
            Admission::Edge => self.admitted_edge.fetch_add(1, Ordering::Relaxed),
            Admission::Origin => self.admitted_origin.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// The cache's capacity in objects of its current mean size (C2), if
    /// it has reported enough to tell.
    pub fn capacity_objects(&self) -> Option<u64> {
        let cap = self.capacity_bytes.load(Ordering::Relaxed);
        let objects = self.stored_objects.load(Ordering::Relaxed);
        let bytes = self.stored_bytes.load(Ordering::Relaxed);
        if cap == 0 || objects == 0 || bytes == 0 {
            return None;
        }
        Some((cap as u128 * objects as u128 / bytes as u128) as u64)
    }
}

/// One cache of one service in a snapshot.
#[derive(Debug)]
pub struct EdgeCache {
    pub state: Arc<CacheState>,
    /// This cache's admission filter for this service (`None`: admit all).
    pub filter: Option<Arc<Mutex<LruFilter>>>,
    /// Stable name for rendezvous hashing.
    pub key: String,
}

/// A service compiled for serving.
pub struct Service {
    pub config: ServiceConfig,
    pub hostname: Name,
    pub origin: OriginUrl,
    pub origin_name: Option<Name>,
    /// (region index, its caches) in configuration order.
    pub regions: Vec<(usize, Vec<Arc<EdgeCache>>)>,
    pub namer: crate::naming::Namer,
    pub popularity: Arc<Mutex<PopularityEstimator>>,
    /// Its acceleration entry point: the path prefixes and the index (in
    /// the snapshot's services) of the compiled service whose "caches"
    /// are the ingress proxies under the acceleration hostname.
    pub accel: Option<(Vec<String>, usize)>,
}

impl Service {
    /// Whether a request target (path and query) is for an accelerated
    /// path prefix.
    pub fn accelerates(&self, target: &str) -> bool {
        self.accel
            .as_ref()
            .is_some_and(|(paths, _)| paths.iter().any(|p| target.starts_with(p.as_str())))
    }
}

/// A region known to the snapshot.
#[derive(Debug, Clone)]
pub struct Region {
    pub name: String,
    pub coords: Option<(f64, f64)>,
}

/// A zone the router is authoritative for.
#[derive(Debug, Clone)]
pub struct Zone {
    pub apex: Name,
    pub soa: Soa,
}

/// Everything the serving paths read, immutable.
pub struct Snapshot {
    pub version: u64,
    pub services: Vec<Arc<Service>>,
    pub by_host: HashMap<Vec<u8>, usize>,
    pub zones: HashMap<Vec<u8>, Zone>,
    pub ns_names: Vec<Name>,
    pub glue: HashMap<Vec<u8>, Vec<IpAddr>>,
    pub coverage: PrefixMap<usize>,
    pub regions: Vec<Region>,
    pub default_region: Option<usize>,
    pub geoip: Option<Arc<GeoIp>>,
    pub ttl: u32,
    pub negative_ttl: u32,
    pub answers: usize,
}

impl Snapshot {
    pub fn service_by_host(&self, host: &[u8]) -> Option<&Arc<Service>> {
        self.by_host.get(host).map(|&i| &self.services[i])
    }

    /// The zone `name` falls in (longest apex first), if any.
    pub fn zone_of(&self, name: &Name) -> Option<&Zone> {
        name.ancestors().find_map(|suffix| self.zones.get(suffix))
    }
}

/// A filter is per (service, cache address).
type FilterKey = (String, SocketAddr);
type SharedFilter = Arc<Mutex<LruFilter>>;

/// The router: configuration, current snapshot, long-lived state.
pub struct Router {
    config: Mutex<RouterConfig>,
    snapshot: RwLock<Arc<Snapshot>>,
    version: AtomicU64,
    caches: Mutex<HashMap<SocketAddr, Arc<CacheState>>>,
    filters: Mutex<HashMap<FilterKey, SharedFilter>>,
    estimators: Mutex<HashMap<String, Arc<Mutex<PopularityEstimator>>>>,
    geoip: Option<Arc<GeoIp>>,
    pub metrics: Metrics,
    /// The SRv6 dispatcher, when the configuration asks for one.
    pub dataplane: std::sync::OnceLock<Arc<crate::dataplane::DataPlane>>,
    /// Why the configuration's SRv6 dispatcher could not start (the
    /// router routes with DNS and HTTP alone then).
    pub srv6_unavailable: std::sync::OnceLock<String>,
}

impl Router {
    pub fn new(config: RouterConfig) -> Result<Arc<Router>, ConfigError> {
        config.validate()?;
        let geoip = match &config.geoip {
            Some(p) => Some(Arc::new(GeoIp::open(p).map_err(ConfigError::Invalid)?)),
            None => None,
        };
        let router = Arc::new(Router {
            config: Mutex::new(RouterConfig::default()),
            snapshot: RwLock::new(Arc::new(empty_snapshot())),
            version: AtomicU64::new(0),
            caches: Mutex::new(HashMap::new()),
            filters: Mutex::new(HashMap::new()),
            estimators: Mutex::new(HashMap::new()),
            geoip,
            dataplane: std::sync::OnceLock::new(),
            srv6_unavailable: std::sync::OnceLock::new(),
            metrics: Metrics::default(),
        });
        router.apply(config)?;
        Ok(router)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().clone()
    }

    /// Bumped on every new snapshot: serving threads keep their own `Arc`
    /// and reload only when this changes.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// A copy of the current configuration.
    pub fn config(&self) -> RouterConfig {
        self.config.lock().clone()
    }

    /// Every cache currently referenced, for the health checker.
    pub fn caches(&self) -> Vec<Arc<CacheState>> {
        self.caches.lock().values().cloned().collect()
    }

    /// Adds or replaces a service. Returns true if it was new.
    pub fn put_service(&self, svc: ServiceConfig) -> Result<bool, ConfigError> {
        let mut cfg = self.config();
        let new = match cfg.services.iter_mut().find(|s| s.name == svc.name) {
            Some(s) => {
                *s = svc;
                false
            }
            None => {
                cfg.services.push(svc);
                true
            }
        };
        cfg.validate()?;
        self.apply(cfg)?;
        Ok(new)
    }

    /// Removes a service. Returns false if there was none of that name.
    pub fn delete_service(&self, name: &str) -> Result<bool, ConfigError> {
        let mut cfg = self.config();
        let before = cfg.services.len();
        cfg.services.retain(|s| s.name != name);
        if cfg.services.len() == before {
            return Ok(false);
        }
        self.apply(cfg)?;
        Ok(true)
    }

    /// Compiles `cfg` into a new snapshot and swaps it in.
    fn apply(&self, cfg: RouterConfig) -> Result<(), ConfigError> {
        let mut guard = self.config.lock();
        let version = self.version.load(Ordering::Acquire) + 1;
        let snap = self.compile(&cfg, version)?;
        *self.snapshot.write() = Arc::new(snap);
        self.version.store(version, Ordering::Release);
        *guard = cfg;
        Ok(())
    }

    fn compile(&self, cfg: &RouterConfig, version: u64) -> Result<Snapshot, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let mut regions: Vec<Region> = Vec::new();
        let mut region_index: HashMap<String, usize> = HashMap::new();
        let mut region_of = |name: &str, coords: Option<(f64, f64)>| -> usize {
            if let Some(&i) = region_index.get(name) {
                if coords.is_some() {
                    regions[i].coords = coords;
                }
                return i;
            }
            regions.push(Region {
                name: name.to_string(),
                coords,
            });
            region_index.insert(name.to_string(), regions.len() - 1);
            regions.len() - 1
        };
        for r in &cfg.regions {
            let coords = r.lat.zip(r.lon);
            region_of(&r.name, coords);
        }
        let mut coverage = PrefixMap::default();
        for z in &cfg.coverage {
            let cidr = z.cidr.parse().map_err(invalid)?;
            coverage.insert(cidr, region_of(&z.region, None));
        }

        // Caches and filters persist across snapshots, keyed by address
        // (and service for filters); those no longer referenced are dropped.
        let mut caches = self.caches.lock();
        let mut filters = self.filters.lock();
        let mut estimators = self.estimators.lock();
        let mut live_caches = HashMap::new();
        let mut live_filters = HashMap::new();
        let mut live_estimators = HashMap::new();
        let mut services: Vec<Arc<Service>> = Vec::new();
        let mut by_host = HashMap::new();
        // An accelerated service compiles into two: its own, and one under
        // the acceleration hostname whose "caches" are the ingress proxies
        // (no admission filter: dynamic content is never cached).
        let mut compiled: Vec<(ServiceConfig, bool)> = Vec::new();
        for sc in &cfg.services {
            compiled.push((sc.clone(), false));
            if let Some(a) = &sc.accel {
                compiled.push((
                    ServiceConfig {
                        name: format!("{}/accel", sc.name),
                        hostname: a.hostname.clone(),
                        origin: sc.origin.clone(),
                        regions: a.regions.clone(),
                        admission: crate::config::AdmissionConfig {
                            filter: FilterKind::None,
                            ..Default::default()
                        },
                        template: None,
                        accel: None,
                        srv6: None,
                    },
                    true,
                ));
            }
        }
        for (sc, is_accel) in &compiled {
            let origin = OriginUrl::parse(&sc.origin).map_err(invalid)?;
            let origin_name = match origin.ip {
                Some(_) => None,
                None => Some(Name::parse(&origin.host).map_err(|e| invalid(e.to_string()))?),
            };
            let popularity = estimators
                .get(&sc.name)
                .cloned()
                .unwrap_or_else(|| Arc::new(Mutex::new(PopularityEstimator::default())));
            live_estimators.insert(sc.name.clone(), popularity.clone());
            let mut svc_regions = Vec::new();
            for r in &sc.regions {
                let ri = region_of(&r.region, None);
                let mut list = Vec::new();
                for ep in &r.caches {
                    // One state per address, whichever services and
                    // regions list it.
                    let state = match live_caches
                        .get(&ep.address)
                        .or_else(|| caches.get(&ep.address))
                    {
                        Some(s) if s.endpoint == *ep => Arc::clone(s),
                        _ => Arc::new(CacheState::new(ep.clone())),
                    };
                    live_caches.insert(ep.address, state.clone());
                    let filter = match sc.admission.filter {
                        FilterKind::None => None,
                        FilterKind::Lru => {
                            let key = (sc.name.clone(), ep.address);
                            let f = filters.get(&key).cloned().unwrap_or_else(|| {
                                Arc::new(Mutex::new(LruFilter::new(
                                    sc.admission.size.unwrap_or(INITIAL_FILTER_SIZE),
                                )))
                            });
                            if let Some(size) = sc.admission.size {
                                let mut g = f.lock();
                                if g.capacity() != size {
                                    g.resize(size);
                                }
                            }
                            live_filters.insert(key, f.clone());
                            Some(f)
                        }
                    };
                    list.push(Arc::new(EdgeCache {
                        state,
                        filter,
                        key: ep.address.to_string(),
                    }));
                }
                svc_regions.push((ri, list));
            }
            let hostname = Name::parse(&sc.hostname).map_err(|e| invalid(e.to_string()))?;
            by_host.insert(hostname.wire().to_vec(), services.len());
            if *is_accel {
                // The service compiled just before is the one it serves.
                let index = services.len();
                if let Some(owner) = services.last_mut().and_then(Arc::get_mut) {
                    let paths = owner
                        .config
                        .accel
                        .as_ref()
                        .map(|a| a.paths.clone())
                        .unwrap_or_default();
                    owner.accel = Some((paths, index));
                }
            }
            services.push(Arc::new(Service {
                config: sc.clone(),
                hostname,
                origin,
                origin_name,
                regions: svc_regions,
                namer: crate::naming::Namer::new(sc.template.as_ref()).map_err(invalid)?,
                popularity,
                accel: None,
            }));
        }
        *caches = live_caches;
        *filters = live_filters;
        *estimators = live_estimators;

        let ns_names: Vec<Name> = cfg
            .dns
            .ns
            .iter()
            .map(|n| Name::parse(&n.name).map_err(|e| invalid(e.to_string())))
            .collect::<Result<_, _>>()?;
        let mut glue: HashMap<Vec<u8>, Vec<IpAddr>> = HashMap::new();
        for (n, ns) in ns_names.iter().zip(&cfg.dns.ns) {
            glue.entry(n.wire().to_vec()).or_default().push(ns.address);
        }
        let mname = ns_names
            .first()
            .cloned()
            .unwrap_or_else(|| Name::parse("ns.invalid").expect("static name"));
        let rname = Name::parse(&cfg.dns.hostmaster).map_err(|e| invalid(e.to_string()))?;
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        // One SOA for every zone: the same servers, mailbox and timers.
        let soa = Soa {
            mname,
            rname,
            serial,
            refresh: 3600,
            retry: 600,
            expire: 86400,
            minimum: cfg.dns.negative_ttl,
        };
        let mut zones = HashMap::new();
        if let Some(z) = &cfg.dns.zone {
            let apex = Name::parse(z).map_err(|e| invalid(e.to_string()))?;
            zones.insert(
                apex.wire().to_vec(),
                Zone {
                    soa: soa.clone(),
                    apex,
                },
            );
        }
        for s in &services {
            zones
                .entry(s.hostname.wire().to_vec())
                .or_insert_with(|| Zone {
                    soa: soa.clone(),
                    apex: s.hostname.clone(),
                });
        }
        let default_region = cfg.default_region.as_ref().map(|d| region_of(d, None));
        Ok(Snapshot {
            version,
            services,
            by_host,
            zones,
            ns_names,
            glue,
            coverage,
            regions,
            default_region,
            geoip: self.geoip.clone(),
            ttl: cfg.dns.ttl,
            negative_ttl: cfg.dns.negative_ttl,
            answers: cfg.dns.answers,
        })
    }
}

fn empty_snapshot() -> Snapshot {
    Snapshot {
        version: 0,
        services: Vec::new(),
        by_host: HashMap::new(),
        zones: HashMap::new(),
        ns_names: Vec::new(),
        glue: HashMap::new(),
        coverage: PrefixMap::default(),
        regions: Vec::new(),
        default_region: None,
        geoip: None,
        ttl: 20,
        negative_ttl: 60,
        answers: 4,
    }
}
