//! HTTP routing: every request for a service is answered `302` to the
//! chosen cache, or straight to the origin when the cache's admission filter
//! has not seen the content recently or no cache is healthy. The redirect
//! keeps path and query.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vcdn_http::serve::{Handler, Request, Response};
use vcdn_http::Method;

use crate::routing::{route, OriginReason, Route};
use crate::state::Router;

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

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}
