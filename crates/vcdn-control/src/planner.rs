//! The planner (the paper's service orchestrator): demand + quality +
//! capacity model → vCPUs per region (the flavor's plugin) → instances on
//! hosts (placement) → the service graph, or the reason it cannot be met.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use vcdn_model::capacity::CapacityModel;
use vcdn_policy::dimensioning::{self, Demand, Quality};
use vcdn_policy::placement::{self, HostFree, Shape};

use crate::types::*;

/// Why a request cannot be met (409), or is malformed (422).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NoCapacity(String),
}

/// One region's dimensioning.
#[derive(Debug, Clone, PartialEq)]
pub struct Dimensioned {
    pub vcpus_needed: f64,
    pub instances: u32,
    /// Load one instance carries at the target, in the demand's unit.
    pub per_instance: f64,
}

/// A flavor's plugin: how it dimensions a region and whether the
/// supervisor scales it (the paper's per-flavor "service plugin").
pub trait FlavorPlugin: Send + Sync {
    fn dimension(
        &self,
        template: &Template,
        demand: &RegionDemand,
        quality: &QualitySpec,
        model: &CapacityModel,
    ) -> Result<Dimensioned, PlanError>;
    fn autoscaled(&self) -> bool;
}

/// Fixed instances from the template; no elasticity.
pub struct StaticFlavor;
/// Dimensioned from quality and demand through the capacity model;
/// autoscaled by the supervisor.
pub struct ElasticFlavor;

pub fn plugin(kind: FlavorKind) -> &'static dyn FlavorPlugin {
    match kind {
        FlavorKind::Static => &StaticFlavor,
        FlavorKind::Elastic => &ElasticFlavor,
    }
}

fn quality(q: &QualitySpec) -> Result<Quality, PlanError> {
    match (q.min_mos, q.response_ms) {
        (Some(_), Some(_)) => Err(PlanError::Invalid(
            "quality: give either min_mos or response_ms (with percentile), not both".into(),
        )),
        (Some(m), None) if (1.0..=5.0).contains(&m) => Ok(Quality::MinMos(m)),
        (Some(m), None) => Err(PlanError::Invalid(format!(
            "quality.min_mos must be within 1..5, not {m}"
        ))),
        (None, Some(ms)) if ms > 0.0 => Ok(Quality::ResponseTime {
            percentile: q.percentile.unwrap_or(90).clamp(1, 99),
            max_ms: ms,
        }),
        (None, Some(ms)) => Err(PlanError::Invalid(format!(
            "quality.response_ms must be positive, not {ms}"
        ))),
        (None, None) => Ok(Quality::BestEffort),
    }
}

fn demand(d: &RegionDemand) -> Demand {
    Demand {
        peak_users: d.peak_users,
        requests_per_s: d.requests_per_s,
        object_bytes: d.object_bytes,
        bitrate_kbps: d.bitrate_kbps,
        chunk_s: d.chunk_s,
    }
}

fn per_vcpu(d: &RegionDemand, q: &QualitySpec, model: &CapacityModel) -> Result<f64, PlanError> {
    dimensioning::capacity_per_vcpu(&demand(d), quality(q)?, model).map_err(|e| match e {
        dimensioning::DimensionError::NoDemand => PlanError::Invalid(format!(
            "region {}: give peak_users or requests_per_s",
            d.region
        )),
        e => PlanError::NoCapacity(format!("region {}: {e}", d.region)),
    })
}

impl FlavorPlugin for StaticFlavor {
    fn dimension(
        &self,
        t: &Template,
        d: &RegionDemand,
        q: &QualitySpec,
        model: &CapacityModel,
    ) -> Result<Dimensioned, PlanError> {
        quality(q)?;
        // Demand is optional here; when given, report what it would need.
        let per = if d.peak_users.is_some() || d.requests_per_s.is_some() {
            per_vcpu(d, q, model).unwrap_or(0.0) * t.vcpus_per_instance as f64
        } else {
            0.0
        };
        Ok(Dimensioned {
            vcpus_needed: (t.min_instances * t.vcpus_per_instance) as f64,
            instances: t.min_instances.max(1),
            per_instance: per,
        })
    }

    fn autoscaled(&self) -> bool {
        false
    }
}

impl FlavorPlugin for ElasticFlavor {
    fn dimension(
        &self,
        t: &Template,
        d: &RegionDemand,
        q: &QualitySpec,
        model: &CapacityModel,
    ) -> Result<Dimensioned, PlanError> {
        let per = per_vcpu(d, q, model)?;
        let load = d
            .peak_users
            .map(|u| u as f64)
            .or(d.requests_per_s)
            .unwrap_or(0.0);
        let vcpus = load / per;
        let n = dimensioning::instances(vcpus, t.vcpus_per_instance, t.min_instances.max(1));
        if n > t.max_instances {
            return Err(PlanError::NoCapacity(format!(
                "region {}: the demand needs {n} instances ({vcpus:.1} vCPUs) and this flavor allows at most {}",
                d.region, t.max_instances
            )));
        }
        Ok(Dimensioned {
            vcpus_needed: vcpus,
            instances: n,
            per_instance: per * t.vcpus_per_instance as f64,
        })
    }

    fn autoscaled(&self) -> bool {
        true
    }
}

/// The hosts of a region with what live services hold of them.
pub fn free_hosts(hosts: &[Host], services: &[Service], region: &str) -> Vec<(Host, HostFree)> {
    free_hosts_besides(hosts, services, &[], region)
}

/// [`free_hosts`] when `extra` instances (planned, not yet recorded) hold
/// capacity too.
fn free_hosts_besides(
    hosts: &[Host],
    services: &[Service],
    extra: &[Instance],
    region: &str,
) -> Vec<(Host, HostFree)> {
    let mut used: HashMap<&str, (u32, u64, u32)> = HashMap::new();
    let live = services.iter().filter(|s| s.state.live());
    for i in live.clone().flat_map(|s| s.graph.instances()).chain(extra) {
        let e = used.entry(i.host.as_str()).or_default();
        e.0 += i.vcpus;
        e.1 += i.memory_mib;
    }
    // A host's slots are taken by this region's caches only (those that
    // listen on its ports); `extra` is planned for this region.
    let region_caches = live
        .flat_map(|s| s.graph.regions.iter())
        .filter(|r| r.region == region)
        .flat_map(|r| r.instances.iter());
    for i in region_caches.chain(extra) {
        used.entry(i.host.as_str()).or_default().2 += 1;
    }
    hosts
        .iter()
        .filter(|h| h.region == region)
        .map(|h| {
            let (v, m, n) = used.get(h.name.as_str()).copied().unwrap_or_default();
            (
                h.clone(),
                HostFree {
                    vcpus: h.vcpus.saturating_sub(v),
                    memory_mib: h.memory_mib.saturating_sub(m),
                    slots: h.max_instances.map(|max| max.saturating_sub(n)),
                },
            )
        })
        .collect()
}

/// Addresses in use by live services' instances.
pub fn used_addresses(services: &[Service]) -> HashSet<Ipv4Addr> {
    services
        .iter()
        .filter(|s| s.state.live())
        .flat_map(|s| s.graph.instances())
        .filter_map(|i| i.address.parse::<SocketAddr>().ok())
        .filter_map(|a| match a.ip() {
            std::net::IpAddr::V4(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// The next free address of a region's block (`a.b.0.0/16`-style CIDR).
pub fn next_address(block: &str, used: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    let (net, len) = block.split_once('/')?;
    let net: Ipv4Addr = net.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    if !(8..=30).contains(&len) {
        return None;
    }
    let base = u32::from(net) & (u32::MAX << (32 - len));
    let size = 1u32 << (32 - len);
    (1..size - 1)
        .map(|i| Ipv4Addr::from(base + i))
        .find(|a| !used.contains(a) && a.octets()[3] != 0 && a.octets()[3] != 255)
}

/// Everything the planner reads.
pub struct PlanInput<'a> {
    pub spec: &'a ServiceSpec,
    pub flavor: &'a Flavor,
    pub regions: &'a [Region],
    pub hosts: &'a [Host],
    pub services: &'a [Service],
    pub model: &'a CapacityModel,
    pub instance_port: u16,
    pub admin_port: u16,
    /// An address the origin's name resolves to (where its egress proxy
    /// goes), if known.
    pub origin_ip: Option<IpAddr>,
}

/// What every acceleration proxy gets: one vCPU (a relay is one busy
/// thread moving bytes in the kernel) and little memory (it stores
/// nothing). A fixed shape rather than the flavor's, whose memory is sized
/// for a cache's object store.
pub const PROXY_SHAPE: Shape = Shape {
    vcpus: 1,
    memory_mib: 256,
};

/// Where a service's egress proxy goes, next to its origin:
/// 1. the catalog region whose `clients` ranges contain the origin's
///    address, if the flavor is offered there (it need not be ordered);
/// 2. else, when that region is known but not offered, the ordered region
///    nearest to it by coordinates;
/// 3. else the first ordered region.
pub fn egress_region<'a>(
    origin_ip: Option<IpAddr>,
    regions: &'a [Region],
    ordered: &[&'a str],
    allowed: &[String],
) -> Option<&'a str> {
    let offered = |r: &str| allowed.is_empty() || allowed.iter().any(|a| a == r);
    let home = origin_ip.and_then(|ip| {
        regions.iter().find(|r| {
            r.clients.iter().any(|c| {
                c.parse::<vcdn_policy::net::Cidr>()
                    .is_ok_and(|c| c.contains(ip))
            })
        })
    });
    if let Some(h) = home {
        if offered(&h.name) {
            return Some(h.name.as_str());
        }
        let coords = |r: &Region| r.lat.zip(r.lon);
        if let Some(at) = coords(h) {
            let nearest = ordered
                .iter()
                .filter_map(|o| regions.iter().find(|r| r.name == *o))
                .filter_map(|r| coords(r).map(|c| (distance_km(at, c), r.name.as_str())))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, n)) = nearest {
                return Some(n);
            }
        }
    }
    ordered.first().copied()
}

/// Great-circle distance between two (lat, lon) points in degrees.
fn distance_km(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (la1, lo1, la2, lo2) = (
        a.0.to_radians(),
        a.1.to_radians(),
        b.0.to_radians(),
        b.1.to_radians(),
    );
    let h = ((la2 - la1) / 2.0).sin().powi(2)
        + la1.cos() * la2.cos() * ((lo2 - lo1) / 2.0).sin().powi(2);
    2.0 * 6371.0 * h.sqrt().min(1.0).asin()
}

/// The proxies of an accelerated order: one per ordered region (its
/// ingress) and one in the egress region (the same one where they
/// coincide), placed on hosts like caches, after the caches `graph` holds.
fn plan_accel(
    inp: &PlanInput,
    fleet: &Fleet,
    graph: &ServiceGraph,
    new_id: &mut dyn FnMut() -> String,
    now: u64,
) -> Result<Option<AccelGraph>, PlanError> {
    let Some(a) = &inp.spec.acceleration else {
        return Ok(None);
    };
    let t = &inp.flavor.template;
    let ordered: Vec<&str> = inp.spec.regions.iter().map(|d| d.region.as_str()).collect();
    let egress = egress_region(inp.origin_ip, inp.regions, &ordered, &t.allowed_regions)
        .ok_or_else(|| PlanError::Invalid("regions: name at least one region".into()))?;
    let mut locations = ordered.clone();
    if !locations.contains(&egress) {
        locations.push(egress);
    }
    let mut placed: Vec<Instance> = graph.instances().cloned().collect();
    let mut proxies = Vec::new();
    let mut shortages = Vec::new();
    for loc in locations {
        let region = inp
            .regions
            .iter()
            .find(|r| r.name == loc)
            .ok_or_else(|| PlanError::Invalid(format!("unknown region {loc}")))?;
        match place_in(
            fleet,
            region,
            PROXY_SHAPE,
            t.placement,
            1,
            &placed,
            new_id,
            now,
        ) {
            Err(PlanError::NoCapacity(why)) => shortages.push(format!("acceleration proxy: {why}")),
            Err(e) => return Err(e),
            Ok(mut got) => {
                for p in &mut got {
                    p.role = Role::Proxy;
                    p.location = Some(loc.to_string());
                }
                placed.extend(got.iter().cloned());
                proxies.extend(got);
            }
        }
    }
    if !shortages.is_empty() {
        return Err(PlanError::NoCapacity(shortages.join("; ")));
    }
    Ok(Some(AccelGraph {
        hostname: a.hostname.clone().unwrap_or_default(),
        egress: egress.to_string(),
        proxies,
        ..Default::default()
    }))
}

/// What an SRv6 origin gateway gets: one vCPU and a small store. It
/// proxies the chunks the edges' filters reject (each once per client
/// connection), so it is shaped like a proxy, not like an edge.
pub const GATEWAY_SHAPE: Shape = PROXY_SHAPE;

/// The chunk prefix and origin gateway of an order with `routing:
/// "srv6"`: the lowest prefix number no live service holds, and a gateway
/// placed where an egress proxy would go (next to the origin).
fn plan_srv6(
    inp: &PlanInput,
    fleet: &Fleet,
    graph: &ServiceGraph,
    new_id: &mut dyn FnMut() -> String,
    now: u64,
) -> Result<Option<Srv6Graph>, PlanError> {
    if inp.spec.routing != Routing::Srv6 {
        return Ok(None);
    }
    let taken: HashSet<u16> = inp
        .services
        .iter()
        .filter(|s| s.state.live())
        .filter_map(|s| s.graph.srv6.as_ref().map(|v| v.number))
        .collect();
    let number = (1..=u16::MAX)
        .find(|n| !taken.contains(n))
        .ok_or_else(|| PlanError::NoCapacity("every SRv6 chunk prefix is in use".into()))?;
    let t = &inp.flavor.template;
    let ordered: Vec<&str> = inp.spec.regions.iter().map(|d| d.region.as_str()).collect();
    let at = egress_region(inp.origin_ip, inp.regions, &ordered, &t.allowed_regions)
        .ok_or_else(|| PlanError::Invalid("regions: name at least one region".into()))?;
    let region = inp
        .regions
        .iter()
        .find(|r| r.name == at)
        .ok_or_else(|| PlanError::Invalid(format!("unknown region {at}")))?;
    let placed: Vec<Instance> = graph.instances().cloned().collect();
    let gateway = place_in(
        fleet,
        region,
        GATEWAY_SHAPE,
        t.placement,
        1,
        &placed,
        new_id,
        now,
    )
    .map_err(|e| match e {
        PlanError::NoCapacity(why) => PlanError::NoCapacity(format!("SRv6 origin gateway: {why}")),
        e => e,
    })?
    .pop()
    .ok_or_else(|| PlanError::NoCapacity("SRv6 origin gateway: not placed".into()))?;
    Ok(Some(Srv6Graph {
        number,
        prefix: format!("{}/64", vcdn_srv6::domain::chunk_prefix(number)),
        gateway: Instance {
            location: Some(at.to_string()),
            ..gateway
        },
    }))
}

/// Plans a whole service; all regions or nothing.
pub fn plan(
    inp: &PlanInput,
    new_id: &mut dyn FnMut() -> String,
    now: u64,
) -> Result<ServiceGraph, PlanError> {
    let t = &inp.flavor.template;
    let plug = plugin(inp.flavor.kind);
    let fleet = Fleet {
        hosts: inp.hosts,
        services: inp.services,
        instance_port: inp.instance_port,
        admin_port: inp.admin_port,
    };
    let mut graph = ServiceGraph::default();
    let mut shortages = Vec::new();
    let mut seen = HashSet::new();
    if inp.spec.regions.is_empty() {
        return Err(PlanError::Invalid(
            "regions: name at least one region".into(),
        ));
    }
    for d in &inp.spec.regions {
        if !seen.insert(d.region.as_str()) {
            return Err(PlanError::Invalid(format!(
                "region {} is listed twice",
                d.region
            )));
        }
        let Some(region) = inp.regions.iter().find(|r| r.name == d.region) else {
            let known: Vec<&str> = inp.regions.iter().map(|r| r.name.as_str()).collect();
            return Err(PlanError::Invalid(format!(
                "unknown region {}; regions are: {}",
                d.region,
                known.join(", ")
            )));
        };
        if !t.allowed_regions.is_empty() && !t.allowed_regions.contains(&d.region) {
            return Err(PlanError::Invalid(format!(
                "flavor {} is not offered in region {} (only in {})",
                inp.flavor.name,
                d.region,
                t.allowed_regions.join(", ")
            )));
        }
        let dim = plug.dimension(t, d, &inp.spec.quality, inp.model)?;
        // Regions have their own hosts and address blocks, so each is
        // placed like a scale-out of that region would be.
        match place_more(&fleet, region, t, dim.instances, new_id, now) {
            Err(PlanError::NoCapacity(why)) => shortages.push(why),
            Err(e) => return Err(e),
            Ok(instances) => graph.regions.push(RegionGraph {
                region: d.region.clone(),
                vcpus_needed: dim.vcpus_needed,
                per_instance: dim.per_instance,
                instances,
            }),
        }
    }
    if !shortages.is_empty() {
        return Err(PlanError::NoCapacity(shortages.join("; ")));
    }
    graph.accel = plan_accel(inp, &fleet, &graph, new_id, now)?;
    graph.srv6 = plan_srv6(inp, &fleet, &graph, new_id, now)?;
    Ok(graph)
}

/// The platform as it stands: hosts, the services holding them, ports.
pub struct Fleet<'a> {
    pub hosts: &'a [Host],
    pub services: &'a [Service],
    pub instance_port: u16,
    pub admin_port: u16,
}

/// More instances for a region of a running service (scale-out), placed
/// like the plan would.
pub fn place_more(
    fleet: &Fleet,
    region: &Region,
    t: &Template,
    count: u32,
    new_id: &mut dyn FnMut() -> String,
    now: u64,
) -> Result<Vec<Instance>, PlanError> {
    let shape = Shape {
        vcpus: t.vcpus_per_instance,
        memory_mib: t.memory_mib_per_instance,
    };
    place_in(fleet, region, shape, t.placement, count, &[], new_id, now)
}

/// `count` instances of `shape` on the region's hosts, besides what live
/// services and `extra` (planned, not yet recorded) hold.
#[allow(clippy::too_many_arguments)]
fn place_in(
    fleet: &Fleet,
    region: &Region,
    shape: Shape,
    strategy: placement::Strategy,
    count: u32,
    extra: &[Instance],
    new_id: &mut dyn FnMut() -> String,
    now: u64,
) -> Result<Vec<Instance>, PlanError> {
    let hosts = free_hosts_besides(fleet.hosts, fleet.services, extra, &region.name);
    let free: Vec<HostFree> = hosts.iter().map(|(_, f)| f.clone()).collect();
    let picks = placement::place(count as usize, shape, &free, strategy).map_err(|s| {
        PlanError::NoCapacity(if s.full_hosts > 0 {
            format!(
                "region {}'s hosts with room take no more instances ({s})",
                region.name
            )
        } else {
            format!(
                "region {} lacks {} vCPUs and {} MiB ({s})",
                region.name, s.missing_vcpus, s.missing_memory_mib
            )
        })
    })?;
    let mut used = used_addresses(fleet.services);
    used.extend(
        extra
            .iter()
            .filter_map(|i| i.address.parse::<SocketAddr>().ok())
            .filter_map(|a| match a.ip() {
                IpAddr::V4(v) => Some(v),
                _ => None,
            }),
    );
    picks
        .into_iter()
        .map(|h| {
            let ip = next_address(&region.instance_block, &used).ok_or_else(|| {
                PlanError::NoCapacity(format!("region {}: no free address", region.name))
            })?;
            used.insert(ip);
            Ok(Instance {
                id: new_id(),
                host: hosts[h].0.name.clone(),
                address: SocketAddr::from((ip, fleet.instance_port)).to_string(),
                admin: SocketAddr::from((ip, fleet.admin_port)).to_string(),
                admin_https: false,
                admin_name: None,
                vcpus: shape.vcpus,
                memory_mib: shape.memory_mib,
                state: InstanceState::Starting,
                pid: None,
                cpu_limit: String::new(),
                started_at: now,
                nonce: String::new(),
                role: Role::Cache,
                location: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::Defaults;

    fn spec(users: u64) -> ServiceSpec {
        ServiceSpec {
            name: "demo".into(),
            origin: "http://127.0.0.1:9000".into(),
            hostname: "video.demo.example".into(),
            flavor: "elastic".into(),
            regions: vec![
                RegionDemand {
                    region: "paris".into(),
                    peak_users: Some(users),
                    ..Default::default()
                },
                RegionDemand {
                    region: "lyon".into(),
                    peak_users: Some(200),
                    ..Default::default()
                },
            ],
            quality: QualitySpec {
                min_mos: Some(4.0),
                ..Default::default()
            },
            lease: LeaseSpec::default(),
            acceleration: None,
            origin_ca_pem: None,
            routing: Routing::Dns,
        }
    }

    fn run(spec: &ServiceSpec, services: &[Service]) -> Result<ServiceGraph, PlanError> {
        run_on(spec, services, &Defaults::embedded().hosts)
    }

    fn run_on(
        spec: &ServiceSpec,
        services: &[Service],
        hosts: &[Host],
    ) -> Result<ServiceGraph, PlanError> {
        run_full(spec, services, hosts, None)
    }

    fn run_full(
        spec: &ServiceSpec,
        services: &[Service],
        hosts: &[Host],
        origin_ip: Option<IpAddr>,
    ) -> Result<ServiceGraph, PlanError> {
        let d = Defaults::embedded();
        let flavor = d.flavors.iter().find(|f| f.name == spec.flavor).unwrap();
        let model = CapacityModel::default();
        let mut n = 0;
        plan(
            &PlanInput {
                spec,
                flavor,
                regions: &d.regions,
                hosts,
                services,
                model: &model,
                instance_port: 8080,
                admin_port: 9080,
                origin_ip,
            },
            &mut || {
                n += 1;
                format!("i{n}")
            },
            0,
        )
    }

    #[test]
    fn the_issue_example_gets_one_instance_per_region_on_distinct_addresses() {
        let g = run(&spec(500), &[]).unwrap();
        assert_eq!(g.regions.len(), 2);
        assert_eq!(g.regions[0].instances.len(), 1);
        assert_eq!(g.regions[0].instances[0].address, "127.10.0.1:8080");
        assert_eq!(g.regions[1].instances[0].address, "127.11.0.1:8080");
    }

    #[test]
    fn big_demand_is_refused_with_the_region_and_the_shortfall() {
        // 17,500 HD viewers per vCPU at MOS 4: 100k need 6 instances; one
        // 4-vCPU host in Paris holds 4.
        let one_host: Vec<Host> = Defaults::embedded()
            .hosts
            .into_iter()
            .filter(|h| h.name != "paris-2")
            .collect();
        let e = run_on(&spec(100_000), &[], &one_host).unwrap_err();
        let PlanError::NoCapacity(why) = e else {
            panic!("{e:?}")
        };
        assert!(why.contains("region paris lacks 2 vCPUs"), "{why}");
        // Beyond the flavor's maximum of 8 instances.
        let e = run(&spec(200_000), &[]).unwrap_err();
        assert!(e.to_string().contains("at most 8"), "{e}");
    }

    #[test]
    fn a_host_that_takes_one_instance_takes_one_whatever_its_room() {
        // Paris's hosts as host-network Kubernetes nodes: one cache each.
        let hosts: Vec<Host> = Defaults::embedded()
            .hosts
            .into_iter()
            .map(|mut h| {
                h.max_instances = Some(1);
                h
            })
            .collect();
        // 30,000 HD viewers need 2 instances: one per host.
        let g = run_on(&spec(30_000), &[], &hosts).unwrap();
        let paris: Vec<&str> = g.regions[0]
            .instances
            .iter()
            .map(|i| i.host.as_str())
            .collect();
        assert_eq!(paris.len(), 2, "{paris:?}");
        assert_ne!(paris[0], paris[1], "one per host: {paris:?}");
        let e = run_on(&spec(60_000), &[], &hosts).unwrap_err();
        let PlanError::NoCapacity(why) = e else {
            panic!("{e:?}")
        };
        assert!(
            why.contains("region paris's hosts with room take no more instances"),
            "{why}"
        );
    }

    #[test]
    fn unknown_regions_and_contradictory_quality_are_invalid() {
        let mut s = spec(10);
        s.regions[0].region = "atlantis".into();
        assert!(matches!(run(&s, &[]), Err(PlanError::Invalid(w)) if w.contains("atlantis")));
        let mut s = spec(10);
        s.quality.response_ms = Some(50.0);
        assert!(matches!(run(&s, &[]), Err(PlanError::Invalid(_))));
    }

    fn accelerated(users: u64) -> ServiceSpec {
        let mut s = spec(users);
        s.acceleration = Some(AccelerationSpec {
            paths: vec!["/api/".into()],
            hostname: Some("dyn.video.demo.example".into()),
            ..Default::default()
        });
        s
    }

    #[test]
    fn an_accelerated_order_gets_an_ingress_per_region_and_an_egress_by_the_origin() {
        // The origin is a Marseille address (127.3.0.0/16 are Marseille's
        // clients): Paris and Lyon get ingresses, Marseille the egress.
        let g = run_full(
            &accelerated(500),
            &[],
            &Defaults::embedded().hosts,
            Some("127.3.0.9".parse().unwrap()),
        )
        .unwrap();
        let a = g.accel.as_ref().unwrap();
        assert_eq!(a.egress, "marseille");
        let locs: Vec<&str> = a
            .proxies
            .iter()
            .map(|p| p.location.as_deref().unwrap())
            .collect();
        assert_eq!(locs, ["paris", "lyon", "marseille"]);
        assert!(a.proxies.iter().all(|p| p.role == Role::Proxy
            && p.vcpus == PROXY_SHAPE.vcpus
            && p.memory_mib == PROXY_SHAPE.memory_mib));
        // On the region's hosts and addresses, next to its caches, not on
        // their addresses.
        assert_eq!(a.proxies[0].address, "127.10.0.2:8080");
        assert!(a.proxies[0].host.starts_with("paris-"));
        assert_eq!(a.proxies[2].address, "127.12.0.1:8080");
        assert_eq!(g.ingress("paris").unwrap().id, a.proxies[0].id);
        assert!(g.ingress("marseille").is_none(), "not ordered: no ingress");
        assert!(g
            .regions
            .iter()
            .all(|r| r.instances.iter().all(|i| i.role == Role::Cache)));
        // Where the origin is in an ordered region, one proxy is both.
        let g = run_full(
            &accelerated(500),
            &[],
            &Defaults::embedded().hosts,
            Some("127.2.0.9".parse().unwrap()),
        )
        .unwrap();
        let a = g.accel.unwrap();
        assert_eq!((a.egress.as_str(), a.proxies.len()), ("lyon", 2));
        // An origin in no region: the first ordered region.
        let g = run(&accelerated(500), &[]).unwrap();
        assert_eq!(g.accel.unwrap().egress, "paris");
        // Without acceleration, no proxies.
        assert!(run(&spec(500), &[]).unwrap().accel.is_none());
    }

    #[test]
    fn the_egress_falls_back_to_the_nearest_ordered_region_where_the_flavor_is_not_offered() {
        let d = Defaults::embedded();
        let ordered = ["paris", "lyon"];
        let ip = Some("127.3.0.9".parse().unwrap());
        assert_eq!(
            egress_region(ip, &d.regions, &ordered, &[]),
            Some("marseille")
        );
        // Marseille is nearer Lyon than Paris.
        let allowed = vec!["paris".to_string(), "lyon".to_string()];
        assert_eq!(
            egress_region(ip, &d.regions, &ordered, &allowed),
            Some("lyon")
        );
        assert_eq!(
            egress_region(None, &d.regions, &ordered, &allowed),
            Some("paris")
        );
        assert_eq!(egress_region(None, &d.regions, &[], &[]), None);
    }

    #[test]
    fn proxies_count_against_host_capacity_and_a_shortfall_is_refused_whole() {
        // Paris has one 4-vCPU host; the ingress proxy takes 1 vCPU of it
        // besides the cache.
        let one_host: Vec<Host> = Defaults::embedded()
            .hosts
            .into_iter()
            .filter(|h| h.name != "paris-2")
            .collect();
        let mut s = accelerated(500);
        s.regions.truncate(1);
        let g = run_on(&s, &[], &one_host).unwrap();
        let held: u32 = g
            .instances()
            .filter(|i| i.host == "paris-1")
            .map(|i| i.vcpus)
            .sum();
        assert_eq!(held, g.instances().map(|i| i.vcpus).sum::<u32>());
        let cache = g.regions[0].instances[0].vcpus;
        assert_eq!(held, cache + PROXY_SHAPE.vcpus);
        // Another service holds the rest: the cache still fits, its proxy
        // does not.
        let mut blocker = g.regions[0].instances[0].clone();
        blocker.vcpus = 4 - cache;
        blocker.address = "127.10.0.200:8080".into();
        let other = live_service(
            "s-other",
            spec(1),
            ServiceGraph {
                regions: vec![RegionGraph {
                    region: "paris".into(),
                    vcpus_needed: 0.0,
                    per_instance: 0.0,
                    instances: vec![blocker],
                }],
                accel: None,
                srv6: None,
            },
        );
        let e = run_on(&s, &[other], &one_host).unwrap_err();
        assert!(
            matches!(&e, PlanError::NoCapacity(w) if w.contains("acceleration proxy: region paris lacks 1 vCPUs")),
            "{e:?}"
        );
    }

    /// An active service of customer x holding `graph`.
    fn live_service(id: &str, spec: ServiceSpec, graph: ServiceGraph) -> Service {
        Service {
            id: id.into(),
            customer: "x".into(),
            spec,
            state: ServiceState::Active,
            created_at: 0,
            lease_start: 0,
            lease_end: 1,
            graph,
            usage: Usage::default(),
            pricing: Defaults::embedded().flavors[0].pricing.clone(),
            planned_vcpus: 0,
            origin_policy: String::new(),
            error: None,
            hop_key: String::new(),
            billing: Default::default(),
            billing_from_ms: 0,
        }
    }

    #[test]
    fn an_srv6_order_gets_a_free_chunk_prefix_and_an_origin_gateway_by_the_origin() {
        let mut s = spec(500);
        s.routing = Routing::Srv6;
        // The origin is a Marseille address: the gateway goes there.
        let g = run_full(
            &s,
            &[],
            &Defaults::embedded().hosts,
            Some("127.3.0.9".parse().unwrap()),
        )
        .unwrap();
        let v = g.srv6.as_ref().unwrap();
        assert_eq!((v.number, v.prefix.as_str()), (1, "fd76:6364:c:1::/64"));
        assert_eq!(v.gateway.role, Role::Cache);
        assert_eq!(v.gateway.location.as_deref(), Some("marseille"));
        assert!(v.gateway.host.starts_with("marseille-"));
        assert_eq!(
            (v.gateway.vcpus, v.gateway.memory_mib),
            (GATEWAY_SHAPE.vcpus, GATEWAY_SHAPE.memory_mib)
        );
        assert_eq!(g.instances().filter(|i| i.id == v.gateway.id).count(), 1);
        // A live service holds prefix 1: the next order gets 2; a deleted
        // one gives its prefix back.
        let mut holder = live_service("s-1", s.clone(), g.clone());
        let next = run(&s, std::slice::from_ref(&holder)).unwrap();
        assert_eq!(next.srv6.unwrap().number, 2);
        holder.state = ServiceState::Deleted;
        assert_eq!(run(&s, &[holder]).unwrap().srv6.unwrap().number, 1);
        // Without it, none.
        assert!(run(&spec(500), &[]).unwrap().srv6.is_none());
    }

    #[test]
    fn addresses_skip_those_in_use() {
        let used: HashSet<Ipv4Addr> = ["127.10.0.1".parse().unwrap()].into();
        assert_eq!(
            next_address("127.10.0.0/16", &used),
            Some("127.10.0.2".parse().unwrap())
        );
        assert_eq!(next_address("bogus", &used), None);
    }
}
