//! The router's admin API, which the control plane calls to add, change
//! and remove services at run time. `/healthz` and `/metrics` are open;
//! everything else needs `Authorization: Bearer TOKEN`. Errors are RFC 9457
//! problem documents.
//!
//! - `GET /services`, `GET /services/{name}`
//! - `PUT /services/{name}` with a service as JSON (same fields as in the
//!   TOML file) → 201 created / 200 replaced
//! - `DELETE /services/{name}` → 204
//! - `GET /caches`: health, load and admission counters of every cache

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use vcdn_http::auth::{Guard, ThrottleConfig};
use vcdn_http::serve::{Handler, Request, Response};
use vcdn_http::Method;

use crate::config::ServiceConfig;
use crate::state::Router;

pub fn handler(router: Arc<Router>, token: Arc<str>) -> Handler {
    // Failed authentications are throttled per source and logged.
    let guard = Guard::new("vcdn-router", ThrottleConfig::default());
    Arc::new(move |req| {
        let r = route(&router, &token, &guard, req);
        Box::pin(async move { r })
    })
}

fn json_response(status: u16, v: &Value) -> Response {
    Response::new(status, "application/json", format!("{v}\n"))
}

fn route(router: &Router, token: &str, guard: &Guard, req: Request) -> Response {
    let path = String::from_utf8_lossy(req.head.path()).into_owned();
    let m = req.head.method;
    match (m, path.as_str()) {
        (Method::Get | Method::Head, "/healthz") => {
            let snap = router.snapshot();
            return json_response(
                200,
                &json!({"status": "ok", "services": snap.services.len(), "config_version": snap.version}),
            );
        }
        (Method::Get | Method::Head, "/metrics") => {
            return Response::new(
                200,
                "text/plain; version=0.0.4",
                crate::metrics::render(router),
            );
        }
        _ => {}
    }
    if let Err(r) = guard.authorize(&req, token) {
        return r;
    }
    match (m, path.as_str()) {
        (Method::Get, "/services") => {
            let cfg = router.config();
            json_response(200, &json!({"services": cfg.services}))
        }
        (Method::Get, "/caches") => caches(router),
        (_, p) if p.starts_with("/services/") => {
            let name = &p["/services/".len()..];
            match m {
                Method::Get => match router
                    .config()
                    .services
                    .into_iter()
                    .find(|s| s.name == name)
                {
                    Some(s) => json_response(200, &json!(s)),
                    None => Response::problem(404, &format!("no service named '{name}'")),
                },
                Method::Put => put_service(router, name, &req.body),
                Method::Delete => match router.delete_service(name) {
                    Ok(true) => Response::new(204, "text/plain", Vec::new()),
                    Ok(false) => Response::problem(404, &format!("no service named '{name}'")),
                    Err(e) => Response::problem(422, &e.to_string()),
                },
                _ => Response::problem(405, "use GET, PUT or DELETE on /services/{name}")
                    .header("Allow", "GET, PUT, DELETE"),
            }
        }
        _ => Response::problem(
            404,
            "no such endpoint; try /services, /services/{name}, /caches, /metrics or /healthz",
        ),
    }
}

fn put_service(router: &Router, name: &str, body: &[u8]) -> Response {
    let mut v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Response::problem(400, &format!("body is not JSON: {e}")),
    };
    if let Some(obj) = v.as_object_mut() {
        match obj.get("name") {
            None => {
                obj.insert("name".into(), json!(name));
            }
            Some(n) if n.as_str() == Some(name) => {}
            Some(n) => {
                return Response::problem(
                    422,
                    &format!("body names service {n} but the URL names '{name}'"),
                )
            }
        }
    }
    let svc: ServiceConfig = match serde_json::from_value(v) {
        Ok(s) => s,
        Err(e) => return Response::problem(422, &format!("not a valid service: {e}")),
    };
    match router.put_service(svc.clone()) {
        Ok(true) => json_response(201, &json!(svc)),
        Ok(false) => json_response(200, &json!(svc)),
        Err(e) => Response::problem(422, &e.to_string()),
    }
}

fn caches(router: &Router) -> Response {
    let snap = router.snapshot();
    let mut out = Vec::new();
    for svc in &snap.services {
        for (ri, cs) in &svc.regions {
            for c in cs {
                let s = &c.state;
                out.push(json!({
                    "service": svc.config.name,
                    "region": snap.regions[*ri].name,
                    "address": s.endpoint.address.to_string(),
                    "alive": s.alive.load(Ordering::Relaxed),
                    "overloaded": s.overloaded.load(Ordering::Relaxed),
                    "available": s.is_available(),
                    "connections": s.connections.load(Ordering::Relaxed),
                    "capacity_objects": s.capacity_objects(),
                    "admitted_edge": s.admitted_edge.load(Ordering::Relaxed),
                    "admitted_origin": s.admitted_origin.load(Ordering::Relaxed),
                    "filter_capacity": c.filter.as_ref().map(|f| f.lock().capacity()),
                }));
            }
        }
    }
    json_response(200, &json!({"caches": out}))
}
