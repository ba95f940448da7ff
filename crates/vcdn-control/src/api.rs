//! The northbound REST API under `/v1` (the paper's customer interface
//! manager, plus the operator's catalog and capacity management).
//!
//! Two kinds of callers, both with `Authorization: Bearer …`: the operator
//! (the operator token) and customers (API keys the operator issues).
//! Customers see and touch only their own services; operator resources
//! refuse customer keys with 403. Errors are RFC 9457 problem documents.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use vcdn_http::auth::{bearer_token, token_eq, Guard, ThrottleConfig};
use vcdn_http::serve::{Handler, Request, Response};
use vcdn_http::Method;

use crate::control::{now_s, random_hex, Control, ControlError};
use crate::types::*;
use crate::{portal, pricing};

pub const OPENAPI: &str = include_str!("openapi.json");

/// Who is calling.
#[derive(Debug, Clone, PartialEq)]
enum Caller {
    Operator,
    Customer(String),
}

impl Caller {
    fn customer(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Customer(c) => Some(c),
        }
    }
}

/// What every request is checked with: failed authentications are
/// throttled per source and logged; the portal's browser sessions.
struct Gate {
    guard: Guard,
    sessions: portal::Sessions,
}

pub fn handler(control: Arc<Control>) -> Handler {
    let gate = Arc::new(Gate {
        guard: Guard::new(
            "vcdn",
            ThrottleConfig {
                max_failures: control.cfg.auth_failures_per_minute,
                window: std::time::Duration::from_secs(60),
                ..ThrottleConfig::default()
            },
        ),
        sessions: portal::Sessions::default(),
    });
    Arc::new(move |req| {
        let control = control.clone();
        let gate = gate.clone();
        Box::pin(async move {
            control.metrics.api_requests.fetch_add(1, Ordering::Relaxed);
            let r = route(&control, &gate, req).await;
            if r.status >= 400 {
                control.metrics.api_errors.fetch_add(1, Ordering::Relaxed);
            }
            r
        })
    })
}

fn json_response(status: u16, v: &Value) -> Response {
    Response::new(status, "application/json", format!("{v:#}\n"))
}

fn problem(e: &ControlError) -> Response {
    if let ControlError::Fields(errors) = e {
        return invalid_fields(errors);
    }
    let status = match e {
        ControlError::NotFound(_) => 404,
        ControlError::Conflict(_) => 409,
        ControlError::Invalid(_) | ControlError::Fields(_) => 422,
        ControlError::Forbidden(_) => 403,
        ControlError::Deploy(_) => 502,
        ControlError::Store(e) if e.is_lost() => 503,
        ControlError::Store(_) => 500,
    };
    Response::problem(status, &e.to_string())
}

/// A 422 problem document (RFC 9457) whose `errors` member lists every
/// bad field with what to fix; `detail` says it all in one line.
fn invalid_fields(errors: &[FieldError]) -> Response {
    let detail = match errors {
        [one] => format!("{}: {}", one.field, one.detail),
        many => format!(
            "{} fields need fixing: {}",
            many.len(),
            many.iter()
                .map(|e| format!("{}: {}", e.field, e.detail))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    let doc = json!({
        "type": "about:blank",
        "title": vcdn_http::reason(422),
        "status": 422,
        "detail": detail,
        "errors": errors,
    });
    Response::new(422, "application/problem+json", format!("{doc}\n"))
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Response> {
    let bad = |e: serde_json::Error| {
        Response::problem(
            400,
            &format!("request body is not valid JSON for this resource: {e}"),
        )
    };
    let mut v: Value = serde_json::from_slice(body).map_err(bad)?;
    whole_numbers_as_integers(&mut v);
    serde_json::from_value(v).map_err(bad)
}

/// JSON (and the API document's JSON Schema) does not tell `2` from
/// `2.0`; serde does. A number with no fraction that fits an integer is
/// made one, so that `"vcpus": 4.0` is read as 4 (a fraction stays a
/// float and is refused where an integer is wanted).
fn whole_numbers_as_integers(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && (-9.0e15..=9.0e15).contains(&f) {
                *v = json!(f as i64);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(o) => o.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

pub fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Who sends the request: the operator token, else a customer key (kept as
/// SHA-256), else a portal session's cookie (with its CSRF token on what
/// changes something). A source with too many failures gets 429 before any
/// check.
async fn caller(c: &Control, gate: &Gate, req: &Request) -> Result<Caller, Response> {
    let guard = &gate.guard;
    let ip = req.peer.ip();
    if let Some(r) = guard.throttled(ip) {
        return Err(r);
    }
    let token = bearer_token(req);
    if token.is_some_and(|t| token_eq(t, c.cfg.operator_token.as_bytes())) {
        return Ok(Caller::Operator);
    }
    if let Some(key) = token {
        if let Some(id) = customer_of_key(c, &key_hash(&String::from_utf8_lossy(key))).await? {
            return Ok(Caller::Customer(id));
        }
    } else if let Some((who, csrf)) = gate.sessions.of(req) {
        let safe = matches!(req.head.method, Method::Get | Method::Head);
        if !safe && !portal::csrf_ok(req, &csrf) {
            return Err(Response::problem(
                403,
                "this request authenticates with the portal's session cookie but lacks its CSRF token: the portal sends it in X-CSRF-Token (GET /portal/session gives it); API clients send Authorization: Bearer instead",
            ));
        }
        match who {
            portal::Who::Operator => return Ok(Caller::Operator),
            portal::Who::Customer { key_sha256, .. } => {
                if let Some(id) = customer_of_key(c, &key_sha256).await? {
                    return Ok(Caller::Customer(id));
                }
                gate.sessions.close(req);
                return Err(Response::problem(
                    401,
                    "the session ended: its API key was rotated or its customer deleted; log in again",
                ));
            }
        }
    }
    Err(guard.failed(
        ip,
        "missing or unknown bearer token: send Authorization: Bearer <API key or operator token>",
    ))
}

/// The customer whose key hashes to `hash`, compared in constant time.
async fn customer_of_key(c: &Control, hash: &str) -> Result<Option<String>, Response> {
    let customers: Vec<Customer> = c
        .store
        .list("customer")
        .await
        .map_err(|e| problem(&e.into()))?;
    // Hashes have a fixed length; compare all of each in constant time.
    Ok(customers
        .into_iter()
        .find(|cu| token_eq(cu.key_sha256.as_bytes(), hash.as_bytes()))
        .map(|cu| cu.id))
}

/// `POST /portal/login` with `{"key": "…"}` (a customer API key or the
/// operator token), from the portal's own origin: opens a session, sets
/// its cookie and answers what `GET /portal/session` does.
async fn login(c: &Control, gate: &Gate, req: &Request) -> Response {
    let ip = req.peer.ip();
    if let Some(r) = gate.guard.throttled(ip) {
        return r;
    }
    if !portal::same_origin(req) {
        return Response::problem(
            403,
            "a login must come from the portal's own page (its Origin does not match)",
        );
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Login {
        key: String,
    }
    let l: Login = match parse(&req.body) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let who = if token_eq(l.key.trim().as_bytes(), c.cfg.operator_token.as_bytes()) {
        portal::Who::Operator
    } else {
        let hash = key_hash(l.key.trim());
        match customer_of_key(c, &hash).await {
            Ok(Some(id)) => portal::Who::Customer {
                id,
                key_sha256: hash,
            },
            Ok(None) => {
                return gate.guard.failed(
                    ip,
                    "unknown key: log in with your API key (vk_…) or the operator token",
                )
            }
            Err(r) => return r,
        }
    };
    let (cookie, csrf) = gate.sessions.open(who.clone());
    portal::secure(json_response(200, &session_view(c, &who, &csrf).await))
        .header("Set-Cookie", portal::set_cookie(&cookie, c.cfg.api_https))
        .header("Cache-Control", "no-store")
}

/// What the portal's page knows of its session: the role, the customer
/// (id and name) and the CSRF token to send with every change.
async fn session_view(c: &Control, who: &portal::Who, csrf: &str) -> Value {
    match who {
        portal::Who::Operator => json!({"role": "operator", "csrf": csrf}),
        portal::Who::Customer { id, .. } => {
            let name = c
                .store
                .get::<Customer>("customer", id)
                .await
                .ok()
                .flatten()
                .map(|cu| cu.name);
            json!({"role": "customer", "customer": id, "name": name, "csrf": csrf})
        }
    }
}

/// The portal's routes: its page and files, login, the session, logout.
async fn portal_route(c: &Control, gate: &Gate, req: &Request, path: &str) -> Option<Response> {
    let m = req.head.method;
    Some(match (m, path) {
        (Method::Get | Method::Head, _)
            if path == "/" || path.starts_with("/portal/") && path != "/portal/session" =>
        {
            portal::asset(path).unwrap_or_else(|| {
                portal::secure(Response::problem(404, "no such file of the portal"))
            })
        }
        (Method::Post, "/portal/login") => login(c, gate, req).await,
        (Method::Get, "/portal/session") => match gate.sessions.of(req) {
            // A customer's session ends with the key it was opened with.
            Some((portal::Who::Customer { key_sha256, .. }, _))
                if !matches!(customer_of_key(c, &key_sha256).await, Ok(Some(_))) =>
            {
                gate.sessions.close(req);
                portal::secure(Response::problem(401, "the session ended; log in again"))
            }
            Some((who, csrf)) => {
                portal::secure(json_response(200, &session_view(c, &who, &csrf).await))
                    .header("Cache-Control", "no-store")
            }
            None => portal::secure(Response::problem(401, "not logged in")),
        },
        (Method::Post, "/portal/logout") => {
            if let Some((_, csrf)) = gate.sessions.of(req) {
                if !portal::csrf_ok(req, &csrf) {
                    return Some(Response::problem(
                        403,
                        "logout needs the session's X-CSRF-Token",
                    ));
                }
                gate.sessions.close(req);
            }
            portal::secure(Response::new(204, "text/plain", Vec::new()))
                .header("Set-Cookie", portal::set_cookie("", c.cfg.api_https))
        }
        (_, "/portal/login" | "/portal/logout") => {
            Response::problem(405, "use POST").header("Allow", "POST")
        }
        (_, "/portal/session") => Response::problem(405, "use GET").header("Allow", "GET, HEAD"),
        (_, "/") => Response::problem(405, "the portal's page is read with GET")
            .header("Allow", "GET, HEAD"),
        _ => return None,
    })
}

fn operator_only(who: &Caller) -> Result<(), Response> {
    match who {
        Caller::Operator => Ok(()),
        Caller::Customer(_) => Err(Response::problem(
            403,
            "this resource belongs to the operator; customer API keys cannot use it",
        )),
    }
}

pub(crate) fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
}

/// The path split at `/`, without the leading one (nor a trailing one).
fn segments(path: &str) -> Vec<&str> {
    path.trim_end_matches('/').split('/').skip(1).collect()
}

/// The path's segments percent-decoded (RFC 3986 §2.1), so that
/// `/v1/regions/a%20b` names the region `a b` (a name no resource has is
/// then a 404, as any other); a segment that is not percent-encoded UTF-8
/// is a 400.
fn decode_segments(path: &str) -> Result<Vec<String>, Response> {
    segments(path)
        .into_iter()
        .map(|seg| {
            let b = seg.as_bytes();
            let mut out = Vec::with_capacity(b.len());
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    let hex = b
                        .get(i + 1..i + 3)
                        .and_then(|h| std::str::from_utf8(h).ok());
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(v) => out.push(v),
                        None => {
                            return Err(Response::problem(
                                400,
                                &format!(
                                "the path segment {seg:?} has a % not followed by two hex digits"
                            ),
                            ))
                        }
                    }
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).map_err(|_| {
                Response::problem(
                    400,
                    &format!("the path segment {seg:?} does not decode to UTF-8 text"),
                )
            })
        })
        .collect()
}

/// The methods the resource at `segs` (the path split at `/`, after the
/// caller is known) allows, for a 405's `Allow`; None: no such resource.
fn allowed_methods(segs: &[&str]) -> Option<&'static str> {
    Some(match segs {
        ["healthz" | "metrics"] | ["v1", "openapi.json"] => "GET, HEAD",
        ["v1", "accel", "rtt"] => "POST",
        ["v1", "prometheus", "targets"] => "GET",
        ["v1", "catalog" | "hosts" | "flavors" | "regions" | "timeseries"] => "GET",
        ["v1", "regions" | "hosts" | "flavors", _] => "PUT, DELETE",
        ["v1", "customers"] | ["v1", "services"] => "GET, POST",
        ["v1", "customers", _] => "DELETE",
        ["v1", "customers", _, "key"] => "POST",
        ["v1", "customers", _, "settings"] | ["v1", "settings"] => "GET, PUT",
        ["v1", "services", _] => "GET, DELETE",
        ["v1", "services", _, "graph" | "usage" | "events" | "timeseries"] => "GET",
        ["v1", "services", _, "purge" | "prefetch" | "qoe"] => "POST",
        ["v1", "services", _, "certificate"] => "GET, PUT, DELETE",
        _ => return None,
    })
}

async fn route(c: &Arc<Control>, gate: &Gate, req: Request) -> Response {
    let guard = &gate.guard;
    let pq = String::from_utf8_lossy(req.head.path_and_query()).into_owned();
    let (path, query) = pq.split_once('?').unwrap_or((pq.as_str(), ""));
    let m = req.head.method;
    if path == "/" || path.starts_with("/portal/") {
        if let Some(r) = portal_route(c, gate, &req, path).await {
            return r;
        }
    }
    match (m, path) {
        (Method::Get | Method::Head, "/healthz") => {
            let (status, mut v) = match c.store.health().await {
                Ok(()) => (200, json!({"status": "ok"})),
                Err(e) => (
                    503,
                    json!({"status": "unavailable", "reason": e.to_string()}),
                ),
            };
            v["store"] = json!(c.store.engine());
            v["store_install_id"] = json!(c.store.install_id());
            v["vim"] = json!(c.vim.name());
            return json_response(status, &v);
        }
        (Method::Get | Method::Head, "/metrics") => {
            return Response::new(200, "text/plain; version=0.0.4", metrics(c, guard).await)
        }
        (Method::Get | Method::Head, "/v1/openapi.json") => {
            return Response::new(200, "application/json", OPENAPI)
        }
        // Proxies' RTT reports carry their service's report token, not a
        // customer key or the operator token.
        (Method::Post, "/v1/accel/rtt") => return rtt_report(c, guard, &req).await,
        // These need no credentials, so a method they do not allow is
        // answered as such without asking for any.
        (_, "/healthz" | "/metrics" | "/v1/openapi.json" | "/v1/accel/rtt") => {
            let allow = allowed_methods(&segments(path)).unwrap_or("GET, HEAD");
            return Response::problem(
                405,
                &format!("{path} allows {allow} (see /v1/openapi.json)"),
            )
            .header("Allow", allow);
        }
        _ => {}
    }
    let who = match caller(c, gate, &req).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let decoded = match decode_segments(path) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let segs: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let r = match (m, segs.as_slice()) {
        (Method::Get, ["v1", "catalog"]) => catalog(c).await,
        (Method::Get, ["v1", "regions"]) => c
            .regions()
            .await
            .map(|r| json_response(200, &json!({"regions": r})))
            .map_err(|e| problem(&e)),
        (Method::Put, ["v1", "regions", name]) => put_region(c, &who, name, &req.body).await,
        (Method::Delete, ["v1", "regions", name]) => delete_doc(c, &who, "region", name).await,
        (Method::Get, ["v1", "hosts"]) => match operator_only(&who) {
            Ok(()) => c
                .host_views()
                .await
                .map(|h| json_response(200, &json!({"hosts": h})))
                .map_err(|e| problem(&e)),
            Err(r) => Err(r),
        },
        (Method::Put, ["v1", "hosts", name]) => put_host(c, &who, name, &req.body).await,
        (Method::Delete, ["v1", "hosts", name]) => delete_doc(c, &who, "host", name).await,
        (Method::Get, ["v1", "flavors"]) => c
            .flavors()
            .await
            .map(|f| json_response(200, &json!({"flavors": f})))
            .map_err(|e| problem(&e)),
        (Method::Put, ["v1", "flavors", name]) => put_flavor(c, &who, name, &req.body).await,
        (Method::Delete, ["v1", "flavors", name]) => delete_doc(c, &who, "flavor", name).await,
        (Method::Get, ["v1", "customers"]) => list_customers(c, &who).await,
        (Method::Post, ["v1", "customers"]) => create_customer(c, &who, &req.body).await,
        (Method::Delete, ["v1", "customers", id]) => delete_customer(c, &who, id).await,
        (Method::Post, ["v1", "customers", id, "key"]) => rotate_key(c, &who, id).await,
        (Method::Get, ["v1", "customers", id, "settings"]) => match operator_only(&who) {
            Ok(()) => c
                .customer_settings(id)
                .await
                .map(|s| json_response(200, &json!(s)))
                .map_err(|e| problem(&e)),
            Err(r) => Err(r),
        },
        (Method::Put, ["v1", "customers", id, "settings"]) => {
            put_customer_settings(c, &who, id, &req.body).await
        }
        (Method::Get, ["v1", "settings"]) => match operator_only(&who) {
            Ok(()) => c
                .settings()
                .await
                .map(|s| json_response(200, &json!(s)))
                .map_err(|e| problem(&e)),
            Err(r) => Err(r),
        },
        (Method::Put, ["v1", "settings"]) => put_settings(c, &who, &req.body).await,
        (Method::Get, ["v1", "services"]) => {
            let list: Vec<Value> = c
                .list_services(who.customer())
                .await
                .iter()
                .map(|s| service_view(c, s))
                .collect();
            Ok(json_response(200, &json!({"services": list})))
        }
        (Method::Post, ["v1", "services"]) => create_service(c, &who, &req.body, query).await,
        (Method::Get, ["v1", "services", id]) => c
            .find(id, who.customer())
            .await
            .map(|s| json_response(200, &service_view(c, &s)))
            .map_err(|e| problem(&e)),
        (Method::Delete, ["v1", "services", id]) => c
            .delete(id, who.customer())
            .await
            .map(|s| json_response(200, &service_view(c, &s)))
            .map_err(|e| problem(&e)),
        (Method::Get, ["v1", "services", id, "graph"]) => c
            .find(id, who.customer())
            .await
            .map(|s| json_response(200, &json!(s.graph)))
            .map_err(|e| problem(&e)),
        (Method::Get, ["v1", "services", id, "usage"]) => c
            .find(id, who.customer())
            .await
            .map(|s| json_response(200, &json!(pricing::bill(&s, now_s()))))
            .map_err(|e| problem(&e)),
        (Method::Get, ["v1", "services", id, "events"]) => events(c, &who, id, query).await,
        (Method::Get, ["v1", "services", id, "timeseries"]) => {
            timeseries(c, &who, Some(id), query).await
        }
        (Method::Get, ["v1", "prometheus", "targets"]) => match operator_only(&who) {
            Ok(()) => {
                let services = c.list_services(None).await;
                let r = &c.cfg.router;
                let v = crate::prometheus::targets(&services, r.admin, r.trust.is_some());
                Ok(json_response(200, &v))
            }
            Err(r) => Err(r),
        },
        (Method::Get, ["v1", "timeseries"]) => match operator_only(&who) {
            Ok(()) => timeseries(c, &who, None, query).await,
            Err(r) => Err(r),
        },
        (Method::Post, ["v1", "services", id, action @ ("purge" | "prefetch")]) => {
            content_action(c, &who, id, action, &req.body).await
        }
        (Method::Post, ["v1", "services", id, "qoe"]) => report_qoe(c, &who, id, &req.body).await,
        (Method::Get, ["v1", "services", id, "certificate"]) => get_certificate(c, &who, id).await,
        (Method::Put, ["v1", "services", id, "certificate"]) => {
            put_certificate(c, &who, id, &req.body).await
        }
        (Method::Delete, ["v1", "services", id, "certificate"]) => c
            .delete_certificate(id, who.customer())
            .await
            .map(|cert| json_response(200, &cert.view()))
            .map_err(|e| problem(&e)),
        (_, segs) => match allowed_methods(segs) {
            // RFC 9110 §15.5.6: a 405 lists what the resource allows.
            Some(allow) => Err(Response::problem(
                405,
                &format!(
                    "{} is not allowed on {path}; it allows {allow} (see /v1/openapi.json)",
                    String::from_utf8_lossy(&req.head.method_raw)
                ),
            )
            .header("Allow", allow)),
            None => Err(Response::problem(
                404,
                "no such endpoint; the API is under /v1 (see /v1/openapi.json)",
            )),
        },
    };
    r.unwrap_or_else(|e| e)
}

type Reply = Result<Response, Response>;

/// `POST /v1/accel/rtt`: a proxy's RTT measurements (the MOSTO
/// controller's input, `chain_controller`).
async fn rtt_report(c: &Arc<Control>, guard: &Guard, req: &Request) -> Response {
    let ip = req.peer.ip();
    if let Some(r) = guard.throttled(ip) {
        return r;
    }
    let Some(token) = bearer_token(req) else {
        return guard.failed(
            ip,
            "send Authorization: Bearer <the service's report token>",
        );
    };
    let report: crate::chain_controller::Report = match parse(&req.body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match c.report_rtt(token, report).await {
        Ok(()) => Response::new(204, "text/plain", Vec::new()),
        Err(ControlError::Forbidden(m)) => guard.failed(ip, &m),
        Err(e) => problem(&e),
    }
}

async fn catalog(c: &Control) -> Reply {
    let flavors = c.flavors().await.map_err(|e| problem(&e))?;
    let regions = c.regions().await.map_err(|e| problem(&e))?;
    Ok(json_response(
        200,
        &json!({
            "flavors": flavors,
            "regions": regions.iter().map(|r| json!({"name": r.name, "lat": r.lat, "lon": r.lon})).collect::<Vec<_>>(),
        }),
    ))
}

fn entry_point(c: &Control, s: &Service) -> Value {
    json!({
        "hostname": s.spec.hostname,
        "dns_server": c.cfg.dns.map(|d| d.to_string()),
        "port": c.cfg.instance_port,
        "url": format!("http://{}:{}/", s.spec.hostname, c.cfg.instance_port),
        "https_url": c.cfg.instance_tls_port.map(|p| format!("https://{}:{p}/", s.spec.hostname)),
        "http_routing": c.cfg.http_routing.map(|h| format!("http://{h}/ (send Host: {})", s.spec.hostname)),
        "srv6": s.graph.srv6.as_ref().map(|v| json!({
            "chunk_prefix": v.prefix,
            "port": crate::vim::CHUNK_PORT,
            "address_of_a_path": format!("vcdn name path --prefix {} PATH", v.prefix),
            "offered": c.cfg.srv6,
        })),
    })
}

fn service_view(c: &Control, s: &Service) -> Value {
    json!({
        "id": s.id,
        "name": s.spec.name,
        "customer": s.customer,
        "state": s.state,
        "error": s.error,
        "flavor": s.spec.flavor,
        "origin": s.spec.origin,
        "hostname": s.spec.hostname,
        "regions": s.spec.regions,
        "quality": s.spec.quality,
        "lease": {"start": s.lease_start, "end": s.lease_end},
        "created_at": s.created_at,
        "entry_point": entry_point(c, s),
        "graph": s.graph,
        "acceleration": crate::accel::view(s, c.cfg.dns, c.cfg.instance_port),
        "load": c.load(&s.id),
        "qoe": c.qoe(&s.id),
        "usage": s.usage,
        "cost": pricing::bill(s, now_s()),
    })
}

async fn create_service(c: &Control, who: &Caller, body: &[u8], query: &str) -> Reply {
    let Caller::Customer(customer) = who else {
        return Err(Response::problem(
            403,
            "services are ordered with a customer's API key (POST /v1/customers makes one)",
        ));
    };
    let spec: ServiceSpec = parse(body)?;
    let dry_run = match query_param(query, "dry_run") {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(Response::problem(
                400,
                &format!("dry_run is true or false, not {v:?}"),
            ))
        }
    };
    let s = c
        .create(customer, spec, dry_run)
        .await
        .map_err(|e| problem(&e))?;
    if dry_run {
        // What the order would be; nothing was kept or started.
        let mut v = service_view(c, &s);
        v["dry_run"] = json!(true);
        return Ok(json_response(200, &v));
    }
    let status = if s.state == ServiceState::Scheduled {
        202
    } else {
        201
    };
    Ok(json_response(status, &service_view(c, &s))
        .header("Location", format!("/v1/services/{}", s.id)))
}

async fn events(c: &Control, who: &Caller, id: &str, query: &str) -> Reply {
    let s = c.find(id, who.customer()).await.map_err(|e| problem(&e))?;
    let after = match query_param(query, "after") {
        None => 0,
        Some(v) => v
            .parse::<i64>()
            .map_err(|_| Response::problem(400, "after must be an event sequence number"))?,
    };
    let ev = c
        .store
        .events(&s.id, after)
        .await
        .map_err(|e| problem(&e.into()))?;
    Ok(json_response(200, &json!({"service": s.id, "events": ev})))
}

/// `GET /v1/services/{id}/timeseries?from=&to=&step=`: a service's
/// history per region ([`crate::timeseries`]), with its MOS target; and
/// `GET /v1/timeseries`: the platform's, every service summed per region.
async fn timeseries(c: &Control, who: &Caller, id: Option<&str>, query: &str) -> Reply {
    let w = crate::timeseries::window(query, now_s()).map_err(|e| Response::problem(422, &e))?;
    let s = match id {
        Some(id) => Some(c.find(id, who.customer()).await.map_err(|e| problem(&e))?),
        None => None,
    };
    let points = c
        .store
        .series(s.as_ref().map(|s| s.id.as_str()), w.step, w.from, w.to)
        .await
        .map_err(|e| problem(&e.into()))?;
    let mut v = crate::timeseries::view(w, &points);
    if let Some(s) = s {
        v["service"] = json!(s.id);
        v["target_mos"] = json!(s.spec.quality.min_mos);
    }
    Ok(json_response(200, &v))
}

async fn content_action(c: &Control, who: &Caller, id: &str, action: &str, body: &[u8]) -> Reply {
    let s = c.find(id, who.customer()).await.map_err(|e| problem(&e))?;
    if !matches!(s.state, ServiceState::Active | ServiceState::Degraded) {
        return Err(Response::problem(
            409,
            &format!("service {} is {:?}, not running", s.id, s.state).to_lowercase(),
        ));
    }
    /// What purge and prefetch take: exactly one of them.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Content {
        url: Option<String>,
        prefix: Option<String>,
        all: Option<bool>,
    }
    let raw: Value = parse(body)?;
    let one = raw.as_object().is_some_and(|o| o.len() == 1);
    let v: Content = serde_json::from_value(raw).map_err(|e| {
        Response::problem(
            400,
            &format!("request body is not valid JSON for this resource: {e}"),
        )
    })?;
    let ok = one
        && matches!(
            (action, v.url, v.prefix, v.all),
            ("purge", Some(_), None, None)
                | ("purge", None, Some(_), None)
                | ("purge", None, None, Some(true))
                | (_, Some(_), None, None)
        );
    if !ok {
        return Err(Response::problem(
            422,
            if action == "purge" {
                "purge takes one of {\"url\": \"/path\"}, {\"prefix\": \"/dir/\"} or {\"all\": true}"
            } else {
                "prefetch takes {\"url\": \"/path\"}"
            },
        ));
    }
    let results = c.fan_out(&s, &format!("/{action}"), body).await;
    Ok(json_response(
        200,
        &json!({"service": s.id, "instances": results}),
    ))
}

/// `GET /v1/services/{id}/certificate`: what it says about itself, never its key.
async fn get_certificate(c: &Control, who: &Caller, id: &str) -> Reply {
    let s = c.find(id, who.customer()).await.map_err(|e| problem(&e))?;
    match c.certificate(&s.id).await.map_err(|e| problem(&e))? {
        Some(cert) => Ok(json_response(200, &cert.view())),
        None => Err(Response::problem(
            404,
            &format!(
                "service {} has no certificate; upload one with PUT /v1/services/{}/certificate",
                s.id, s.id
            ),
        )),
    }
}

/// `PUT /v1/services/{id}/certificate` with `{"cert_pem", "key_pem"}`.
async fn put_certificate(c: &Control, who: &Caller, id: &str, body: &[u8]) -> Reply {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Upload {
        cert_pem: String,
        key_pem: String,
    }
    let u: Upload = parse(body)?;
    match c
        .put_certificate(id, who.customer(), &u.cert_pem, &u.key_pem)
        .await
        .map_err(|e| problem(&e))?
    {
        Ok(cert) => Ok(json_response(200, &cert.view())),
        Err(e) => Err(Response::problem(422, &e.to_string())),
    }
}

async fn report_qoe(c: &Control, who: &Caller, id: &str, body: &[u8]) -> Reply {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Qoe {
        region: String,
        mos: f64,
    }
    let q: Qoe = parse(body)?;
    c.report_qoe(id, who.customer(), &q.region, q.mos)
        .await
        .map_err(|e| problem(&e))?;
    Ok(Response::new(204, "text/plain", Vec::new()))
}

async fn put_region(c: &Control, who: &Caller, name: &str, body: &[u8]) -> Reply {
    operator_only(who)?;
    let r: Region = parse(body)?;
    if r.name != name {
        return Err(Response::problem(
            422,
            &format!("the body names region {} but the path says {name}", r.name),
        ));
    }
    let ok = r.instance_block.split_once('/').is_some_and(|(a, l)| {
        a.parse::<std::net::Ipv4Addr>().is_ok()
            && l.parse::<u8>().is_ok_and(|l| (8..=30).contains(&l))
    });
    if !ok {
        return Err(Response::problem(
            422,
            "instance_block must be an IPv4 CIDR like 127.13.0.0/16",
        ));
    }
    c.store
        .put("region", name, &r)
        .await
        .map_err(|e| problem(&e.into()))?;
    Ok(json_response(200, &json!(r)))
}

async fn put_host(c: &Control, who: &Caller, name: &str, body: &[u8]) -> Reply {
    operator_only(who)?;
    let h: Host = parse(body)?;
    if h.name != name {
        return Err(Response::problem(
            422,
            &format!("the body names host {} but the path says {name}", h.name),
        ));
    }
    if !c
        .regions()
        .await
        .map_err(|e| problem(&e))?
        .iter()
        .any(|r| r.name == h.region)
    {
        return Err(Response::problem(
            422,
            &format!(
                "unknown region {}; create it first with PUT /v1/regions/{}",
                h.region, h.region
            ),
        ));
    }
    c.store
        .put("host", name, &h)
        .await
        .map_err(|e| problem(&e.into()))?;
    Ok(json_response(200, &json!(h)))
}

async fn put_flavor(c: &Control, who: &Caller, name: &str, body: &[u8]) -> Reply {
    operator_only(who)?;
    let f: Flavor = parse(body)?;
    if f.name != name {
        return Err(Response::problem(
            422,
            &format!("the body names flavor {} but the path says {name}", f.name),
        ));
    }
    let t = &f.template;
    if t.vcpus_per_instance == 0 || t.min_instances == 0 || t.max_instances < t.min_instances {
        return Err(Response::problem(422, "template: vcpus_per_instance and min_instances must be at least 1, max_instances at least min_instances"));
    }
    let mut errors = crate::settings::check_origin_allow("origin_allow", &f.origin_allow);
    let p = &f.pricing;
    for (field, v) in [
        ("pricing.per_vcpu_hour", p.per_vcpu_hour),
        ("pricing.per_gb", p.per_gb),
        ("pricing.per_million_requests", p.per_million_requests),
    ] {
        if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
            errors.push(FieldError::new(field, "give a price from 0 to 1000000"));
        }
    }
    if !errors.is_empty() {
        return Err(invalid_fields(&errors));
    }
    c.store
        .put("flavor", name, &f)
        .await
        .map_err(|e| problem(&e.into()))?;
    Ok(json_response(200, &json!(f)))
}

async fn delete_doc(c: &Control, who: &Caller, kind: &str, name: &str) -> Reply {
    operator_only(who)?;
    let users = match kind {
        "region" => c.users_of(Some(name), None).await,
        "host" => c.users_of(None, Some(name)).await,
        _ => c
            .list_services(None)
            .await
            .into_iter()
            .filter(|s| s.state.live() && s.spec.flavor == name)
            .map(|s| s.id)
            .collect(),
    };
    if !users.is_empty() {
        return Err(Response::problem(
            409,
            &format!("{kind} {name} is in use by services {}", users.join(", ")),
        ));
    }
    match c.store.delete(kind, name).await {
        Ok(true) => Ok(Response::new(204, "text/plain", Vec::new())),
        Ok(false) => Err(Response::problem(404, &format!("no {kind} {name}"))),
        Err(e) => Err(problem(&e.into())),
    }
}

async fn put_settings(c: &Control, who: &Caller, body: &[u8]) -> Reply {
    operator_only(who)?;
    let s: crate::settings::Settings = parse(body)?;
    c.put_settings(&s).await.map_err(|e| problem(&e))?;
    Ok(json_response(200, &json!(s)))
}

async fn put_customer_settings(c: &Control, who: &Caller, id: &str, body: &[u8]) -> Reply {
    operator_only(who)?;
    let s: crate::settings::CustomerSettings = parse(body)?;
    c.put_customer_settings(id, s.clone())
        .await
        .map_err(|e| problem(&e))?;
    Ok(json_response(200, &json!(s)))
}

async fn list_customers(c: &Control, who: &Caller) -> Reply {
    operator_only(who)?;
    let mut list: Vec<Customer> = c
        .store
        .list("customer")
        .await
        .map_err(|e| problem(&e.into()))?;
    for cu in &mut list {
        cu.key_sha256.clear();
    }
    Ok(json_response(200, &json!({"customers": list})))
}

async fn create_customer(c: &Control, who: &Caller, body: &[u8]) -> Reply {
    operator_only(who)?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct New {
        name: String,
        #[serde(default)]
        origin_allow: Vec<String>,
        #[serde(default)]
        quota: Option<crate::settings::Quota>,
    }
    let n: New = parse(body)?;
    let mut errors = crate::settings::check_origin_allow("origin_allow", &n.origin_allow);
    if n.name.trim().is_empty() || n.name.len() > 200 {
        errors.push(FieldError::new(
            "name",
            "give the customer's name (1-200 characters)",
        ));
    }
    if !errors.is_empty() {
        return Err(invalid_fields(&errors));
    }
    let key = format!("vk_{}", random_hex(20));
    let cu = Customer {
        id: format!("c-{}", random_hex(5)),
        name: n.name,
        created_at: now_s(),
        key_sha256: key_hash(&key),
        origin_allow: n.origin_allow,
        quota: n.quota,
    };
    c.store
        .put("customer", &cu.id, &cu)
        .await
        .map_err(|e| problem(&e.into()))?;
    Ok(json_response(201, &json!({"id": cu.id, "name": cu.name, "created_at": cu.created_at, "api_key": key, "note": "the API key is shown only now; POST /v1/customers/{id}/key makes a new one"}))
        .header("Location", format!("/v1/customers/{}", cu.id)))
}

async fn rotate_key(c: &Control, who: &Caller, id: &str) -> Reply {
    operator_only(who)?;
    let mut cu: Customer = c
        .store
        .get("customer", id)
        .await
        .map_err(|e| problem(&e.into()))?
        .ok_or_else(|| Response::problem(404, &format!("no customer {id}")))?;
    let key = format!("vk_{}", random_hex(20));
    cu.key_sha256 = key_hash(&key);
    c.store
        .put("customer", id, &cu)
        .await
        .map_err(|e| problem(&e.into()))?;
    Ok(json_response(200, &json!({"id": cu.id, "api_key": key})))
}

async fn delete_customer(c: &Control, who: &Caller, id: &str) -> Reply {
    operator_only(who)?;
    let live: Vec<String> = c
        .list_services(Some(id))
        .await
        .into_iter()
        .filter(|s| s.state.live())
        .map(|s| s.id)
        .collect();
    if !live.is_empty() {
        return Err(Response::problem(
            409,
            &format!(
                "customer {id} still has services {}; delete them first",
                live.join(", ")
            ),
        ));
    }
    match c.store.delete("customer", id).await {
        Ok(true) => Ok(Response::new(204, "text/plain", Vec::new())),
        Ok(false) => Err(Response::problem(404, &format!("no customer {id}"))),
        Err(e) => Err(problem(&e.into())),
    }
}

async fn metrics(c: &Control, guard: &Guard) -> String {
    let m = &c.metrics;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut out = String::new();
    out.push_str(
        "# HELP vcdn_control_services Services by state.\n# TYPE vcdn_control_services gauge\n",
    );
    for (state, n) in c.state_counts().await {
        out.push_str(&format!("vcdn_control_services{{state=\"{state}\"}} {n}\n"));
    }
    let counters = [
        (
            "vcdn_control_deployments_total",
            "Services deployed to active.",
            g(&m.deployed),
        ),
        (
            "vcdn_control_deploy_milliseconds_sum",
            "Time from order to every instance serving, summed.",
            g(&m.deploy_ms_total),
        ),
        (
            "vcdn_control_healed_total",
            "Crashed instances replaced.",
            g(&m.healed),
        ),
        (
            "vcdn_control_scaled_out_total",
            "Scale-out actions.",
            g(&m.scaled_out),
        ),
        (
            "vcdn_control_scaled_in_total",
            "Scale-in actions.",
            g(&m.scaled_in),
        ),
        (
            "vcdn_control_expired_total",
            "Services ended by their lease.",
            g(&m.expired),
        ),
        (
            "vcdn_control_api_requests_total",
            "API requests.",
            g(&m.api_requests),
        ),
        (
            "vcdn_control_api_errors_total",
            "API requests answered with an error.",
            g(&m.api_errors),
        ),
        (
            "vcdn_control_instance_stats_telemetry_total",
            "Instance statistics the supervisor took from a fresh edge.stats telemetry record.",
            g(&m.stats_telemetry),
        ),
        (
            "vcdn_control_instance_stats_polled_total",
            "Instance statistics the supervisor polled (GET /stats).",
            g(&m.stats_polled),
        ),
        (
            "vcdn_control_auth_failures_total",
            "Requests with a missing or unknown bearer token (answered 401).",
            guard.failures_total(),
        ),
        (
            "vcdn_control_auth_throttled_total",
            "Requests refused with 429 because their source failed authentication too often.",
            guard.throttled_total(),
        ),
    ];
    for (name, help, v) in counters {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    }
    out.push_str("# HELP vcdn_certificate_not_after_seconds When each service's TLS certificate expires (Unix seconds).\n# TYPE vcdn_certificate_not_after_seconds gauge\n");
    for cert in c.certificates().await {
        out.push_str(&format!(
            "vcdn_certificate_not_after_seconds{{service=\"{}\",source=\"{}\"}} {}\n",
            cert.service,
            cert.source.as_str(),
            cert.not_after
        ));
    }
    crate::vim::render_samples(&c.vim.samples(), &mut out);
    if let Some(t) = &c.cfg.telemetry {
        t.render(&mut out);
    }
    if let Some(b) = &c.cfg.kafka_billing {
        b.counters.render(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OpenAPI document describes every field of the acceleration
    /// order and view, so a client generated from it can order one.
    #[test]
    fn the_openapi_document_describes_acceleration() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["ServiceSpec"]["properties"]["acceleration"]["$ref"],
            "#/components/schemas/AccelerationSpec"
        );
        let spec = json!(AccelerationSpec {
            hostname: Some("d.example".into()),
            warm: Some(1),
            ..Default::default()
        });
        let described = &schemas["AccelerationSpec"]["properties"];
        for field in spec.as_object().unwrap().keys() {
            assert!(
                described[field]["description"].is_string(),
                "AccelerationSpec.{field} undescribed"
            );
        }
        let s = crate::accel::tests::service(true);
        let view = crate::accel::view(&s, None, 8080);
        let described = &schemas["Service"]["properties"]["acceleration"]["properties"];
        for field in view.as_object().unwrap().keys() {
            assert!(
                described.get(field).is_some(),
                "acceleration.{field} undescribed"
            );
        }
        for field in ["role", "location"] {
            assert!(schemas["Instance"]["properties"].get(field).is_some());
        }
    }

    /// Every field the certificate endpoints return is described, and the
    /// three methods are there.
    #[test]
    fn the_openapi_document_describes_certificates() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        let path = &doc["paths"]["/v1/services/{id}/certificate"];
        for m in ["get", "put", "delete"] {
            assert!(path[m]["responses"]["200"].is_object(), "{m}");
        }
        assert!(path["put"]["responses"]["422"].is_object());
        let described = &doc["components"]["schemas"]["Certificate"]["properties"];
        let c = crate::certificates::ServiceCert {
            service: "s".into(),
            hostname: "h".into(),
            source: crate::certificates::Source::Uploaded,
            cert_pem: String::new(),
            key_pem: String::new(),
            names: vec![],
            not_before: 0,
            not_after: 0,
            fingerprint: String::new(),
            issuer: String::new(),
            updated_at: 0,
            warned_at: None,
        };
        for field in c.view().as_object().unwrap().keys() {
            assert!(
                described.get(field).is_some(),
                "Certificate.{field} undescribed"
            );
        }
    }
}
