//! Dynamic-content acceleration in the product (issue 17): what the
//! control plane does for a service ordered with `acceleration`.
//!
//! The planner places one `vcdn proxy` per location (an ingress in every
//! ordered region, an egress next to the origin, one proxy for both where
//! they coincide; see [`crate::planner::egress_region`]). This module turns
//! a planned proxy into what the VIM starts ([`proxy_spec`]), points the
//! caches of an `uncacheable` service at their region's ingress
//! ([`cache_upstream`]), and wires running proxies together
//! ([`Control::wire_proxies`]: `PUT /peers`, then the chain-table hook).
//! The chain controller that receives RTT reports and pushes chain tables
//! is not here: it plugs in at [`Control::push_chains`].

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::{json, Value};

use crate::control::Control;
use crate::types::*;
use crate::vim::ProxySpec;

/// The name a service's clients resolve, and its acceleration hostname if
/// it has one (lower case, no trailing dot): names no other live service
/// may take.
pub fn names(s: &Service) -> impl Iterator<Item = String> + '_ {
    std::iter::once(s.spec.hostname.trim_end_matches('.').to_ascii_lowercase()).chain(
        s.graph
            .accel
            .as_ref()
            .map(|a| a.hostname.trim_end_matches('.').to_ascii_lowercase()),
    )
}

/// One address the origin's name resolves to (where its egress goes);
/// `None` when it does not resolve in time (the planner then falls back).
pub async fn origin_address(origin: &str) -> Option<IpAddr> {
    let url = crate::validate::origin_url(origin).ok()?;
    match url.host {
        crate::validate::OriginHost::Ip(ip) => Some(ip),
        crate::validate::OriginHost::Name(n) => tokio::time::timeout(
            crate::origin::RESOLVE_TIMEOUT,
            tokio::net::lookup_host((n.as_str(), url.port)),
        )
        .await
        .ok()?
        .ok()?
        .next()
        .map(|a| a.ip()),
    }
}

/// Where a cache fetches what it does not hold, and the origin policy it
/// enforces there. For a service that accelerates `uncacheable` content,
/// a cache whose region has an ingress proxy fetches through it (its
/// misses and passes then ride the chain): its policy also allows exactly
/// that address, which as a platform address it would otherwise refuse.
/// Everything else (proxies included) goes to the origin.
pub fn cache_upstream(s: &Service, i: &Instance) -> (String, String) {
    let direct = (s.spec.origin.clone(), s.origin_policy.clone());
    if i.role != Role::Cache || !s.spec.acceleration.as_ref().is_some_and(|a| a.uncacheable) {
        return direct;
    }
    let Some(region) = s
        .graph
        .regions
        .iter()
        .find(|r| r.instances.iter().any(|c| c.id == i.id))
    else {
        return direct;
    };
    let Some(ingress) = s.graph.ingress(&region.region) else {
        return direct;
    };
    let policy = if s.origin_policy.is_empty() {
        String::new()
    } else {
        // Host and port: the most specific rule, so it wins over the
        // platform's deny of the region's instance block.
        format!("{}, allow {}", s.origin_policy, ingress.address)
    };
    (format!("http://{}", ingress.address), policy)
}

/// The proxy part of a proxy instance's start (none for a cache): its
/// location, the service's other proxies as peers, the egress, the
/// service's hop key.
/// `controller` is the URL RTT reports go to (the control API).
pub fn proxy_spec(s: &Service, i: &Instance, controller: Option<String>) -> Option<ProxySpec> {
    if i.role != Role::Proxy {
        return None;
    }
    let a = s.graph.accel.as_ref()?;
    let location = i.location.clone()?;
    Some(ProxySpec {
        peers: peers(a, &location),
        location,
        service: s.id.clone(),
        egress: a.egress.clone(),
        hop_key: s.hop_key.clone(),
        warm: s.spec.acceleration.as_ref().and_then(|a| a.warm),
        controller: controller.map(|url| (url, crate::chain_controller::report_token(&s.hop_key))),
        controller_fingerprint: None,
    })
}

/// Every proxy of the service but the one at `location`: location → its
/// listen address.
pub fn peers(a: &AccelGraph, location: &str) -> Vec<(String, SocketAddr)> {
    a.proxies
        .iter()
        .filter(|p| p.location.as_deref() != Some(location))
        .filter_map(|p| Some((p.location.clone()?, p.address.parse().ok()?)))
        .collect()
}

/// The body of a proxy's `PUT /peers`.
pub fn peers_body(a: &AccelGraph, location: &str) -> Value {
    let map: serde_json::Map<String, Value> = peers(a, location)
        .into_iter()
        .map(|(l, addr)| (l, json!(addr.to_string())))
        .collect();
    json!({ "peers": map })
}

/// The acceleration part of an order's "planned" event.
pub fn summary(g: &ServiceGraph) -> String {
    let Some(a) = &g.accel else {
        return String::new();
    };
    let ingress: Vec<&str> = g
        .regions
        .iter()
        .filter(|r| g.ingress(&r.region).is_some())
        .map(|r| r.region.as_str())
        .collect();
    format!(
        "; acceleration: {} proxies x {} vCPU (ingress {}; egress {})",
        a.proxies.len(),
        crate::planner::PROXY_SHAPE.vcpus,
        ingress.join(", "),
        a.egress
    )
}

/// The role(s) a proxy plays in its service.
pub fn proxy_roles(g: &ServiceGraph, p: &Instance) -> Vec<&'static str> {
    let Some(a) = &g.accel else {
        return Vec::new();
    };
    let loc = p.location.as_deref().unwrap_or("");
    let mut roles = Vec::new();
    if g.regions.iter().any(|r| r.region == loc) {
        roles.push("ingress");
    }
    if a.egress == loc {
        roles.push("egress");
    }
    roles
}

/// The acceleration part of a service's API view: the entry point, the
/// ingress of every region, the egress and the proxies with their state.
pub fn view(s: &Service, dns: Option<SocketAddr>, port: u16) -> Value {
    let (Some(spec), Some(a)) = (&s.spec.acceleration, &s.graph.accel) else {
        return Value::Null;
    };
    let ingress: serde_json::Map<String, Value> = s
        .graph
        .regions
        .iter()
        .filter_map(|r| {
            let p = s.graph.ingress(&r.region)?;
            Some((r.region.clone(), json!(p.address)))
        })
        .collect();
    let proxies: Vec<Value> = a
        .proxies
        .iter()
        .map(|p| {
            json!({
                "id": p.id,
                "location": p.location,
                "roles": proxy_roles(&s.graph, p),
                "host": p.host,
                "address": p.address,
                "state": p.state,
                "pid": p.pid,
            })
        })
        .collect();
    json!({
        "hostname": a.hostname,
        "paths": spec.paths,
        "uncacheable": spec.uncacheable,
        "warm": spec.warm,
        "entry_point": {
            "hostname": a.hostname,
            "dns_server": dns.map(|d| d.to_string()),
            "url": format!("http://{}:{port}/", a.hostname),
        },
        "ingress": ingress,
        "egress": a.egress,
        "proxies": proxies,
        "usage": s.usage.accel,
    })
}

/// What a proxy's `/stats` says: requests, bytes relayed, CPU seconds.
/// `requests` may be a number or a map of counters (summed, as the
/// caches' per-status counts are).
pub fn proxy_counters(v: &Value) -> (u64, u64, f64) {
    let requests = v["requests"].as_u64().unwrap_or_else(|| {
        v["requests"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    });
    (
        requests,
        v["bytes"].as_u64().unwrap_or(0),
        v["cpu_seconds"].as_f64().unwrap_or(0.0),
    )
}

impl Control {
    /// After a service's proxies answer: tells each one where the others
    /// are (`PUT /peers`), then hands over to [`Control::push_chains`].
    pub(crate) async fn wire_proxies(&self, s: &Service) -> Result<(), String> {
        let Some(a) = &s.graph.accel else {
            return Ok(());
        };
        let auth = format!("Bearer {}", self.instance_token);
        let mut errors = Vec::new();
        for p in a.proxies.iter().filter(|p| p.serving()) {
            let loc = p.location.as_deref().unwrap_or("");
            let body = peers_body(a, loc).to_string();
            let r = crate::deployer::instance_request(
                &self.admin,
                p,
                "PUT",
                "/peers",
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                body.as_bytes(),
                Duration::from_secs(2),
            )
            .await
            .and_then(|r| match r.status() {
                200..=299 => Ok(()),
                st => Err(format!("answered {st}: {}", r.text().trim())),
            });
            if let Err(e) = r {
                errors.push(format!("proxy {} ({loc}) PUT /peers: {e}", p.id));
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        self.push_chains(s).await;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn proxy(id: &str, loc: &str, addr: &str) -> Instance {
        Instance {
            id: id.into(),
            host: format!("{loc}-1"),
            address: format!("{addr}:8080"),
            admin: format!("{addr}:9080"),
            admin_https: false,
            admin_name: None,
            vcpus: 1,
            memory_mib: 256,
            state: InstanceState::Running,
            pid: None,
            cpu_limit: String::new(),
            started_at: 0,
            nonce: "n".into(),
            role: Role::Proxy,
            location: Some(loc.into()),
        }
    }

    pub(crate) fn service(uncacheable: bool) -> Service {
        let mut cache = proxy("c1", "paris", "127.10.0.1");
        cache.role = Role::Cache;
        cache.location = None;
        Service {
            id: "s-1".into(),
            customer: "c".into(),
            spec: ServiceSpec {
                name: "shop".into(),
                origin: "http://127.3.0.9:80".into(),
                hostname: "shop.example".into(),
                flavor: "elastic".into(),
                regions: vec![RegionDemand {
                    region: "paris".into(),
                    ..Default::default()
                }],
                quality: QualitySpec::default(),
                lease: LeaseSpec::default(),
                acceleration: Some(AccelerationSpec {
                    paths: vec!["/api/".into()],
                    uncacheable,
                    hostname: Some("dyn.shop.example".into()),
                    warm: Some(4),
                }),
                origin_ca_pem: None,
                routing: Routing::Dns,
            },
            state: ServiceState::Active,
            created_at: 0,
            lease_start: 0,
            lease_end: 3600,
            graph: ServiceGraph {
                regions: vec![RegionGraph {
                    region: "paris".into(),
                    vcpus_needed: 1.0,
                    per_instance: 1.0,
                    instances: vec![cache],
                }],
                accel: Some(AccelGraph {
                    hostname: "dyn.shop.example".into(),
                    egress: "marseille".into(),
                    proxies: vec![
                        proxy("p1", "paris", "127.10.0.2"),
                        proxy("p2", "marseille", "127.12.0.1"),
                    ],
                    ..Default::default()
                }),
                srv6: None,
            },
            usage: Usage::default(),
            pricing: Pricing {
                scheme: PricingScheme::OnDemand,
                currency: "EUR".into(),
                per_vcpu_hour: 0.04,
                per_gb: 0.0,
                per_million_requests: 0.0,
            },
            planned_vcpus: 3,
            origin_policy: "deny non-public, allow 127.3.0.9:80, deny 127.10.0.0/16".into(),
            error: None,
            hop_key: "k".repeat(64),
            billing: Default::default(),
            billing_from_ms: 0,
        }
    }

    #[test]
    fn uncacheable_caches_fetch_through_their_regions_ingress_which_their_policy_allows() {
        let s = service(true);
        let cache = &s.graph.regions[0].instances[0];
        let (up, policy) = cache_upstream(&s, cache);
        assert_eq!(up, "http://127.10.0.2:8080");
        let p: vcdn_policy::origin::OriginPolicy = policy.parse().unwrap();
        assert!(
            p.check("127.10.0.2:8080".parse().unwrap()).is_ok(),
            "{policy}"
        );
        // Only that address: the region's other instances stay refused.
        assert!(p.check("127.10.0.1:8080".parse().unwrap()).is_err());
        assert!(p.check("127.10.0.2:9080".parse().unwrap()).is_err());
        // Without `uncacheable`, and for the proxies, the origin as before.
        let s = service(false);
        assert_eq!(
            cache_upstream(&s, &s.graph.regions[0].instances[0]),
            (s.spec.origin.clone(), s.origin_policy.clone())
        );
        let s = service(true);
        let p = &s.graph.accel.as_ref().unwrap().proxies[0];
        assert_eq!(cache_upstream(&s, p).0, "http://127.3.0.9:80");
    }

    #[test]
    fn a_proxy_gets_the_other_proxies_as_peers_and_the_services_key() {
        let s = service(false);
        let a = s.graph.accel.as_ref().unwrap();
        let p = proxy_spec(&s, &a.proxies[0], None).unwrap();
        assert_eq!(p.location, "paris");
        assert_eq!(p.service, "s-1");
        assert_eq!(p.egress, "marseille");
        assert_eq!(
            p.peers,
            vec![("marseille".to_string(), "127.12.0.1:8080".parse().unwrap())]
        );
        assert_eq!(p.hop_key, s.hop_key);
        assert_eq!(p.warm, Some(4));
        assert!(proxy_spec(&s, &s.graph.regions[0].instances[0], None).is_none());
        assert_eq!(
            peers_body(a, "marseille"),
            json!({"peers": {"paris": "127.10.0.2:8080"}})
        );
        assert_eq!(proxy_roles(&s.graph, &a.proxies[0]), ["ingress"]);
        assert_eq!(proxy_roles(&s.graph, &a.proxies[1]), ["egress"]);
    }

    #[test]
    fn the_view_shows_the_entry_point_ingress_egress_and_proxies_but_never_the_key() {
        let s = service(true);
        let v = view(&s, Some("127.0.0.1:53".parse().unwrap()), 8080);
        assert_eq!(v["entry_point"]["url"], "http://dyn.shop.example:8080/");
        assert_eq!(v["ingress"]["paris"], "127.10.0.2:8080");
        assert_eq!(v["egress"], "marseille");
        assert_eq!(v["proxies"].as_array().unwrap().len(), 2);
        assert!(!v.to_string().contains(&s.hop_key));
        assert_eq!(
            names(&s).collect::<Vec<_>>(),
            ["shop.example", "dyn.shop.example"]
        );
    }

    #[test]
    fn the_router_gets_the_ingress_of_every_ordered_region_only() {
        let s = service(false);
        let cfg = crate::deployer::router_service(&s);
        cfg.validate().unwrap();
        let a = cfg.accel.unwrap();
        assert_eq!(a.hostname, "dyn.shop.example");
        assert_eq!(a.paths, ["/api/"]);
        assert_eq!(
            a.regions.len(),
            1,
            "the egress-only Marseille proxy is no entry point"
        );
        assert_eq!(
            a.regions[0].caches[0].address.to_string(),
            "127.10.0.2:8080"
        );
        assert_eq!(
            cfg.regions[0].caches[0].address.to_string(),
            "127.10.0.1:8080"
        );
    }

    #[test]
    fn graphs_stored_before_roles_load_as_caches() {
        let old = r#"{"regions":[{"region":"paris","vcpus_needed":1.0,"per_instance":1.0,"instances":[{"id":"i","host":"h","address":"127.10.0.1:8080","admin":"127.10.0.1:9080","vcpus":1,"memory_mib":1,"state":"running","started_at":0}]}]}"#;
        let g: ServiceGraph = serde_json::from_str(old).unwrap();
        assert_eq!(g.regions[0].instances[0].role, Role::Cache);
        assert!(g.accel.is_none());
        assert_eq!(g.instances().count(), 1);
    }

    #[test]
    fn proxy_stats_are_read_as_numbers_or_summed_maps() {
        assert_eq!(
            proxy_counters(&json!({"requests": 7, "bytes": 100, "cpu_seconds": 0.5})),
            (7, 100, 0.5)
        );
        assert_eq!(
            proxy_counters(&json!({"requests": {"a": 2, "b": 3}})),
            (5, 0, 0.0)
        );
        assert_eq!(proxy_counters(&json!("junk")), (0, 0, 0.0));
    }
}
