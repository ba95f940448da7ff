//! HTTP routing: every request for a service is answered `302` to the
//! chosen cache, or straight to the origin when the cache's admission filter
//! has not seen the content recently or no cache is healthy. The redirect
//! keeps path and query.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vcdn_http::serve::{Handler, Request, Response};
use vcdn_http::Method;

use crate::routing::{route, Located, OriginReason, Route};
use crate::state::{Router, Service, Snapshot};

pub fn handler(router: Arc<Router>) -> Handler {
    Arc::new(move |req| {
        let r = redirect(&router, &req);
        Box::pin(async move { r })
    })
}

/// The response to one routing request (pure apart from counters and the
/// admission filters).
pub fn redirect(router: &Router, req: &Request) -> Response {
    let m = &router.metrics;
    if !matches!(req.head.method, Method::Get | Method::Head) {
        m.http_bad_method.fetch_add(1, Ordering::Relaxed);
        return Response::problem(405, "the router only redirects GET and HEAD requests")
            .header("Allow", "GET, HEAD");
    }
    // An absolute-form target's authority wins over Host (RFC 9112 §3.2.2).
    let host = std::str::from_utf8(req.head.authority()).unwrap_or("");
    let hostname = strip_port(host).trim_end_matches('.').to_ascii_lowercase();
    let snap = router.snapshot();
    let svc = crate::dns::wire::Name::parse(&hostname)
        .ok()
        .and_then(|n| snap.service_by_host(n.wire()).cloned());
    let Some(svc) = svc else {
        m.http_unknown_host.fetch_add(1, Ordering::Relaxed);
        return Response::problem(
            404,
            &format!(
                "no service has the hostname '{hostname}'; send the service's hostname in Host"
            ),
        );
    };
    let target = String::from_utf8_lossy(req.head.path_and_query()).into_owned();
    let id = svc.namer.content_id(&target);
    svc.popularity.lock().observe(id);
    let client: IpAddr = match req.peer.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    let loc = snap.locate(client);
    if let Some(ingress) = accel_ingress(&snap, &svc, loc, &target, id) {
        m.http_accel.fetch_add(1, Ordering::Relaxed);
        return Response::new(302, "text/plain", Vec::new())
            .header("Location", format!("http://{ingress}{target}"))
            .header("Cache-Control", "no-store")
            .header("X-Vcdn-Route", "accel");
    }
    let (location, kind) = match route(&snap, &svc, loc, id) {
        Route::Edge {
            cache, fallback, ..
        } => {
            if fallback {
                m.http_edge_fallback.fetch_add(1, Ordering::Relaxed);
            } else {
                m.http_edge.fetch_add(1, Ordering::Relaxed);
            }
            (
                format!("http://{cache}{target}"),
                if fallback { "edge-fallback" } else { "edge" },
            )
        }
        Route::Origin(reason) => {
            let kind = match reason {
                OriginReason::Filter => {
                    m.http_origin_filter.fetch_add(1, Ordering::Relaxed);
                    "origin-filter"
                }
                OriginReason::NoCache => {
                    m.http_origin_nocache.fetch_add(1, Ordering::Relaxed);
                    "origin-no-cache"
                }
            };
            (format!("{}{target}", svc.origin.base), kind)
        }
    };
    Response::new(302, "text/plain", Vec::new())
        .header("Location", location)
        .header("Cache-Control", "no-store")
        .header("X-Vcdn-Route", kind)
}

/// For a request of an accelerated path prefix: the ingress proxy of the
/// client's region (else of the nearest region with a healthy one). None
/// sends the request the usual way (no healthy ingress anywhere).
fn accel_ingress(
    snap: &Snapshot,
    svc: &Service,
    loc: Located,
    target: &str,
    id: u64,
) -> Option<std::net::SocketAddr> {
    if !svc.accelerates(target) {
        return None;
    }
    let (_, i) = svc.accel.as_ref()?;
    match route(snap, snap.services.get(*i)?, loc, id) {
        Route::Edge { cache, .. } => Some(cache),
        Route::Origin(_) => None,
    }
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        AccelConfig, CacheEndpoint, CoverageZone, RouterConfig, ServiceConfig, ServiceRegion,
    };

    fn region(name: &str, addr: &str) -> ServiceRegion {
        ServiceRegion {
            region: name.into(),
            caches: vec![CacheEndpoint {
                admin_https: false,
                admin_name: None,
                address: addr.parse().unwrap(),
                admin: None,
                max_connections: None,
                sid: None,
            }],
        }
    }

    fn router() -> Arc<Router> {
        Router::new(RouterConfig {
            coverage: vec![
                CoverageZone {
                    cidr: "127.1.0.0/16".into(),
                    region: "paris".into(),
                },
                CoverageZone {
                    cidr: "127.2.0.0/16".into(),
                    region: "lyon".into(),
                },
            ],
            services: vec![ServiceConfig {
                name: "s-1".into(),
                hostname: "shop.example".into(),
                origin: "http://127.3.0.9:80".into(),
                regions: vec![
                    region("paris", "127.10.0.1:8080"),
                    region("lyon", "127.11.0.1:8080"),
                ],
                admission: crate::config::AdmissionConfig {
                    filter: crate::config::FilterKind::None,
                    ..Default::default()
                },
                template: None,
                accel: Some(AccelConfig {
                    hostname: "dyn.shop.example".into(),
                    paths: vec!["/api/".into()],
                    regions: vec![
                        region("paris", "127.10.0.2:8080"),
                        region("lyon", "127.11.0.2:8080"),
                    ],
                }),
                srv6: None,
            }],
            ..Default::default()
        })
        .unwrap()
    }

    fn get(r: &Router, host: &str, target: &str, from: &str) -> Response {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let (head, _) = vcdn_http::request::parse_request(
            &bytes::Bytes::from(raw),
            &vcdn_http::request::Limits::default(),
        )
        .unwrap()
        .unwrap();
        redirect(
            r,
            &Request {
                head,
                body: bytes::Bytes::new(),
                peer: format!("{from}:40000").parse().unwrap(),
            },
        )
    }

    fn header<'a>(r: &'a Response, name: &str) -> &'a str {
        r.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    }

    #[test]
    fn accelerated_paths_go_to_the_clients_regions_ingress_with_path_and_query() {
        let r = router();
        let a = get(&r, "shop.example", "/api/cart?id=7", "127.1.0.5");
        assert_eq!(a.status, 302);
        assert_eq!(
            header(&a, "location"),
            "http://127.10.0.2:8080/api/cart?id=7"
        );
        assert_eq!(header(&a, "x-vcdn-route"), "accel");
        let b = get(&r, "shop.example", "/api/cart", "127.2.0.5");
        assert_eq!(header(&b, "location"), "http://127.11.0.2:8080/api/cart");
        // Other paths still go to a cache.
        let c = get(&r, "shop.example", "/img/logo.png", "127.1.0.5");
        assert_eq!(
            header(&c, "location"),
            "http://127.10.0.1:8080/img/logo.png"
        );
        assert_eq!(header(&c, "x-vcdn-route"), "edge");
        // The acceleration hostname is served by the ingress proxies.
        let d = get(&r, "dyn.shop.example", "/anything", "127.2.0.5");
        assert_eq!(header(&d, "location"), "http://127.11.0.2:8080/anything");
        assert_eq!(r.metrics.http_accel.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_unhealthy_ingress_leaves_like_an_unhealthy_cache() {
        let r = router();
        for c in r.caches() {
            if c.endpoint.address.to_string() == "127.10.0.2:8080" {
                c.alive.store(false, Ordering::Relaxed);
            }
        }
        // Paris's ingress is down: the nearest region's (Lyon's) serves.
        let a = get(&r, "shop.example", "/api/x", "127.1.0.5");
        assert_eq!(header(&a, "location"), "http://127.11.0.2:8080/api/x");
        let snap = r.snapshot();
        let name = crate::dns::wire::Name::parse("dyn.shop.example").unwrap();
        let svc = snap.service_by_host(name.wire()).unwrap();
        let paris = snap.regions.iter().position(|x| x.name == "paris");
        match snap.choose(svc, paris) {
            crate::routing::Choice::Caches { caches, .. } => {
                let got: Vec<String> = caches
                    .iter()
                    .map(|c| c.state.endpoint.address.to_string())
                    .collect();
                assert_eq!(got, ["127.11.0.2:8080"]);
            }
            crate::routing::Choice::Origin => panic!("an ingress is healthy"),
        }
        // None healthy anywhere: the request goes the usual way.
        for c in r.caches() {
            if c.endpoint.address.to_string() == "127.11.0.2:8080" {
                c.alive.store(false, Ordering::Relaxed);
            }
        }
        let b = get(&r, "shop.example", "/api/x", "127.1.0.5");
        assert_eq!(header(&b, "x-vcdn-route"), "edge");
    }

    #[test]
    fn an_acceleration_hostname_may_not_be_another_services_name() {
        let r = router();
        let mut other = r.config().services[0].clone();
        other.name = "s-2".into();
        other.hostname = "dyn.shop.example".into();
        other.accel = None;
        assert!(r.put_service(other).is_err());
        let mut same = r.config().services[0].clone();
        same.accel.as_mut().unwrap().hostname = "shop.example".into();
        assert!(same.validate().is_err());
    }
}
