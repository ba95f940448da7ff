//! The control API (MiniCache's µSH shell, over HTTP): object listing and
//! statistics, purge, prefetch, the TLS listener's certificates, plus
//! `/metrics` and `/healthz`. Every
//! endpoint but the last two requires `Authorization: Bearer TOKEN`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use vcdn_http::auth::{Guard, ThrottleConfig};
use vcdn_http::date;
use vcdn_http::serve::{Handler, Request, Response};
use vcdn_http::Method;

use crate::key::ObjectId;
use crate::metrics::CacheStatus;
use crate::proxy::Cache;

pub fn handler(cache: Arc<Cache>) -> Handler {
    // Failed authentications are throttled per source and logged.
    let guard = Arc::new(Guard::new("vcdn-cache", ThrottleConfig::default()));
    Arc::new(move |req| {
        let cache = cache.clone();
        let guard = guard.clone();
        Box::pin(async move { route(&cache, &guard, req).await })
    })
}

async fn route(cache: &Arc<Cache>, guard: &Guard, req: Request) -> Response {
    let path = String::from_utf8_lossy(req.head.path()).into_owned();
    let query = query_of(&req);
    let m = req.head.method;
    match (m, path.as_str()) {
        (Method::Get | Method::Head, "/healthz") => health(cache),
        (Method::Get | Method::Head, "/metrics") => metrics(cache),
        _ => {
            if let Err(r) = guard.authorize(&req, cache.cfg.admin_token.as_deref().unwrap_or("")) {
                return r;
            }
            match (m, path.as_str()) {
                (Method::Get, "/stats") => json_ok(stats(cache)),
                (Method::Get, "/objects") => objects(cache, &query),
                (Method::Get, p) if p.starts_with("/objects/") => object(cache, &p[9..]),
                (Method::Post, "/purge") => purge(cache, &req.body),
                (Method::Post, "/prefetch") => prefetch(cache, &req.body).await,
                (Method::Get, "/tls/certificates") => tls_list(cache),
                (m, p) if p.starts_with("/tls/certificates/") => {
                    let name = &p["/tls/certificates/".len()..];
                    match m {
                        Method::Put => tls_put(cache, name, &req.body),
                        Method::Delete => tls_delete(cache, name),
                        Method::Get => tls_get(cache, name),
                        _ => Response::problem(405, "method not allowed on this endpoint")
                            .header("Allow", "GET, PUT, DELETE"),
                    }
                }
                (_, "/tls/certificates") => {
                    Response::problem(405, "method not allowed on this endpoint").header("Allow", "GET")
                }
                (_, "/stats" | "/objects" | "/purge" | "/prefetch") => {
                    Response::problem(405, "method not allowed on this endpoint")
                        .header("Allow", if path == "/purge" || path == "/prefetch" { "POST" } else { "GET" })
                }
                _ => Response::problem(
                    404,
                    "no such endpoint; try /stats, /objects, /purge, /prefetch, /tls/certificates, /metrics or /healthz",
                ),
            }
        }
    }
}

fn query_of(req: &Request) -> Vec<(String, String)> {
    let pq = req.head.path_and_query();
    let Some(i) = pq.iter().position(|&c| c == b'?') else {
        return Vec::new();
    };
    String::from_utf8_lossy(&pq[i + 1..])
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_ok(v: Value) -> Response {
    Response::new(200, "application/json", format!("{v}\n"))
}

fn health(cache: &Cache) -> Response {
    let (objects, bytes) = cache.store.memory_usage();
    json_ok(json!({
        "status": "ok",
        "uptime_s": cache.started.elapsed().as_secs(),
        "connections": cache.metrics.connections_open.load(Ordering::Relaxed),
        "memory_objects": objects,
        "memory_bytes": bytes,
        "memory_capacity_bytes": cache.cfg.memory,
        "upstream": cache.upstream.url(),
        "instance_id": cache.cfg.instance_id,
    }))
}

pub fn stats(cache: &Cache) -> Value {
    let m = &cache.metrics;
    let (mem_objects, mem_bytes) = cache.store.memory_usage();
    let disk = cache.store.disk();
    let results: serde_json::Map<String, Value> = CacheStatus::ALL
        .iter()
        .map(|s| (s.as_str().to_ascii_lowercase(), json!(m.count(*s))))
        .collect();
    let hits =
        m.count(CacheStatus::Hit) + m.count(CacheStatus::Stale) + m.count(CacheStatus::Revalidated);
    let lookups = hits
        + m.count(CacheStatus::Miss)
        + m.count(CacheStatus::Coalesced)
        + m.count(CacheStatus::Refresh);
    let g = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    json!({
        "instance_id": cache.cfg.instance_id,
        "uptime_s": cache.started.elapsed().as_secs(),
        "boot_ms": cache.boot_ms,
        "requests": results,
        "hit_ratio": if lookups == 0 { 0.0 } else { hits as f64 / lookups as f64 },
        "body_bytes_sent": g(&m.body_bytes_sent),
        "connections_open": g(&m.connections_open),
        "connections_total": g(&m.connections_total),
        "bad_requests": g(&m.bad_requests),
        "panics": g(&m.panics),
        "upstream": {
            "url": cache.upstream.url(),
            "requests": g(&m.upstream_requests),
            "errors": g(&m.upstream_errors),
            "retries": g(&cache.upstream.retries),
            "bytes": g(&m.upstream_bytes),
            "refused": g(&m.upstream_refused),
            "idle_connections": cache.upstream.idle_connections(),
            "fetches_in_flight": cache.inflight().len(),
        },
        "memory": { "objects": mem_objects, "bytes": mem_bytes, "capacity": cache.store.memory_capacity() },
        "disk": disk.map(|d| json!({ "objects": d.len(), "bytes": d.bytes(), "capacity": d.capacity() })),
        "evictions": g(&m.evictions),
        "purged": g(&m.purged),
    })
}

fn metrics(cache: &Cache) -> Response {
    let (mem_objects, mem_bytes) = cache.store.memory_usage();
    let disk = cache.store.disk();
    let gauges = [
        (
            "vcdn_cache_memory_objects",
            "Objects in the memory tier.",
            mem_objects as u64,
        ),
        (
            "vcdn_cache_memory_bytes",
            "Bytes used in the memory tier.",
            mem_bytes as u64,
        ),
        (
            "vcdn_cache_memory_capacity_bytes",
            "Capacity of the memory tier.",
            cache.store.memory_capacity() as u64,
        ),
        (
            "vcdn_cache_disk_objects",
            "Objects in the disk tier.",
            disk.map_or(0, |d| d.len() as u64),
        ),
        (
            "vcdn_cache_disk_bytes",
            "Bytes used in the disk tier.",
            disk.map_or(0, |d| d.bytes()),
        ),
        (
            "vcdn_cache_fetches_in_flight",
            "Upstream fetches in progress.",
            cache.inflight().len() as u64,
        ),
        (
            "vcdn_cache_upstream_idle_connections",
            "Pooled idle upstream connections.",
            cache.upstream.idle_connections() as u64,
        ),
        (
            "vcdn_cache_uptime_seconds",
            "Seconds since start.",
            cache.started.elapsed().as_secs(),
        ),
    ];
    let mut text = cache
        .metrics
        .render(cache.upstream.retries.load(Ordering::Relaxed), &gauges);
    cache.upstream.render_tls_metrics(&mut text);
    cache.metrics.render_tls(&cache.certs.list(), &mut text);
    crate::telemetry::render(cache, &mut text);
    if let Some(a) = cache
        .srv6
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        a.metrics(&mut text, "vcdn_cache_srv6");
    }
    Response::new(200, "text/plain; version=0.0.4", text)
}

fn object_json(l: &crate::store::Listed, now: u64) -> Value {
    let mut v = json!({
        "id": l.id.hex(),
        "key": String::from_utf8_lossy(&l.key),
        "url": String::from_utf8_lossy(&l.primary),
        "in_memory": l.in_memory.is_some(),
        "on_disk": l.on_disk,
    });
    if let Some(o) = &l.in_memory {
        let s = &o.stats;
        let age = o.age(now);
        v["status"] = json!(o.status);
        v["size"] = json!(o.body.len());
        v["age_s"] = json!(age);
        v["ttl_s"] = json!(o.freshness.lifetime as i64 - age as i64);
        v["fresh"] = json!(age < o.freshness.lifetime);
        v["hits"] = json!(s.hits.load(Ordering::Relaxed));
        v["misses"] = json!(s.misses.load(Ordering::Relaxed));
        v["bytes_served"] = json!(s.bytes_served.load(Ordering::Relaxed));
        v["last_access"] = json!(s.last_access.load(Ordering::Relaxed));
        v["fetch_progress"] = json!(1.0);
        v["content_type"] = json!(o.headers.get_str(b"content-type"));
    } else {
        v["disk_bytes"] = json!(l.disk_size);
    }
    v
}

fn objects(cache: &Cache, query: &[(String, String)]) -> Response {
    let prefix = query
        .iter()
        .find(|(k, _)| k == "prefix")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let limit: usize = query
        .iter()
        .find(|(k, _)| k == "limit")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(1000);
    let now = date::unix_now();
    let mut list = cache.store.list();
    list.retain(|l| l.primary.starts_with(prefix.as_bytes()));
    let total = list.len();
    let objects: Vec<Value> = list
        .iter()
        .take(limit)
        .map(|l| object_json(l, now))
        .collect();
    let fetching: Vec<Value> = cache
        .inflight()
        .into_iter()
        .filter(|(k, ..)| k.starts_with(prefix.as_bytes()))
        .map(|(k, got, len, readers)| {
            json!({
                "url": String::from_utf8_lossy(&k),
                "bytes_received": got,
                "content_length": len,
                "fetch_progress": len.map(|n| if n == 0 { 1.0 } else { got as f64 / n as f64 }),
                "clients": readers,
            })
        })
        .collect();
    json_ok(json!({ "total": total, "objects": objects, "fetching": fetching }))
}

fn object(cache: &Cache, id: &str) -> Response {
    let Some(id) = ObjectId::from_hex(id) else {
        return Response::problem(
            400,
            "an object id is 32 hexadecimal digits, as listed by GET /objects",
        );
    };
    let now = date::unix_now();
    match cache.store.list().into_iter().find(|l| l.id == id) {
        Some(l) => {
            let mut v = object_json(&l, now);
            if let Some(o) = &l.in_memory {
                let headers: Vec<Value> = o
                    .headers
                    .iter()
                    .map(|(n, v)| json!([String::from_utf8_lossy(n), String::from_utf8_lossy(v)]))
                    .collect();
                v["headers"] = json!(headers);
                v["freshness"] = json!({
                    "lifetime_s": o.freshness.lifetime,
                    "stale_while_revalidate_s": o.freshness.stale_while_revalidate,
                    "stale_if_error_s": o.freshness.stale_if_error,
                    "must_revalidate": o.freshness.must_revalidate,
                    "no_cache": o.freshness.no_cache,
                });
            }
            json_ok(v)
        }
        None => Response::problem(404, "no object with this id"),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    url: Option<String>,
    prefix: Option<String>,
    #[serde(default)]
    all: bool,
}

/// The path of a URL given as a path or as an absolute URL.
fn path_of(url: &str) -> &str {
    match url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => url,
    }
}

fn purge(cache: &Cache, body: &[u8]) -> Response {
    let b: PurgeBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => {
            return Response::problem(
                400,
                &format!("expected {{\"url\": \"/path\"}}, {{\"prefix\": \"/dir/\"}} or {{\"all\": true}}: {e}"),
            )
        }
    };
    let purged = match (b.url, b.prefix, b.all) {
        (Some(u), None, false) => cache.store.purge_key(path_of(&u).as_bytes()),
        (None, Some(p), false) => cache.store.purge_prefix(path_of(&p).as_bytes()),
        (None, None, true) => cache.store.purge_all(),
        _ => {
            return Response::problem(
                400,
                "give exactly one of \"url\", \"prefix\" or \"all\": true",
            )
        }
    };
    cache
        .metrics
        .purged
        .fetch_add(purged as u64, Ordering::Relaxed);
    tracing::info!(purged, "purge");
    json_ok(json!({ "purged": purged }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefetchBody {
    url: String,
}

/// Fetch a URL through the cache itself, so it is stored exactly as a
/// client's request would store it; answers once the object is complete.
async fn prefetch(cache: &Arc<Cache>, body: &[u8]) -> Response {
    let b: PrefetchBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return Response::problem(400, &format!("expected {{\"url\": \"/path\"}}: {e}")),
    };
    let path = path_of(&b.url);
    if !path.starts_with('/') || path.bytes().any(|c| c <= b' ' || c == 0x7f) {
        return Response::problem(400, "url must be a path (/...) or an http URL");
    }
    let raw = bytes::Bytes::from(format!("GET {path} HTTP/1.1\r\nHost: prefetch\r\n\r\n"));
    let head = match vcdn_http::parse_request(&raw, &vcdn_http::Limits::default()) {
        Ok(Some((h, _))) => h,
        _ => return Response::problem(400, "url is not a valid request target"),
    };
    let reply = cache
        .handle(
            &head,
            crate::upstream::RequestBody::None,
            std::net::Ipv4Addr::LOCALHOST.into(),
        )
        .await;
    let status = reply.status;
    if status >= 500 {
        // The cache's own error (upstream unreachable, refused by the
        // origin policy, ...): say why, as a problem document.
        if let crate::reply::ReplyBody::Full(b) = &reply.body {
            let text = String::from_utf8_lossy(b);
            let detail = text.split_once(": ").map_or(&*text, |(_, d)| d).trim_end();
            return Response::problem(status, detail);
        }
    }
    let mut size = 0u64;
    match reply.body {
        crate::reply::ReplyBody::Stream { mut reader, .. } => loop {
            match reader.next().await {
                Ok(Some(b)) => size += b.len(),
                Ok(None) => break,
                Err(e) => return Response::problem(e.status.max(502), &e.message),
            }
        },
        crate::reply::ReplyBody::Full(b) | crate::reply::ReplyBody::Shared { bytes: b, .. } => {
            size = b.len() as u64
        }
        crate::reply::ReplyBody::Empty => {}
    }
    let cached = {
        let key = bytes::Bytes::copy_from_slice(path.as_bytes());
        let (id, k) = cache.store.resolve(&key, &head.headers);
        cache.store.get_memory(id, &k).is_some() || cache.store.on_disk(id)
    };
    json_ok(json!({ "url": path, "status": status, "bytes": size, "cached": cached }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CertPut {
    cert_pem: String,
    key_pem: String,
    #[serde(default)]
    ocsp_base64: Option<String>,
}

fn tls_list(cache: &Cache) -> Response {
    let list: Vec<Value> = cache
        .certs
        .list()
        .iter()
        .map(|(n, info, ocsp)| crate::tls::describe(n, info, *ocsp))
        .collect();
    json_ok(json!(list))
}

/// A certificate and key for a host name (or `_wildcard.DOMAIN`), checked
/// (chain order, key match, valid now, covers the name) and used by the
/// next handshakes; connections already up keep the one they have.
fn tls_put(cache: &Cache, raw: &str, body: &[u8]) -> Response {
    use base64::Engine;
    let Some(name) = crate::tls::cert_name(&percent_decode(raw)) else {
        return Response::problem(
            400,
            "the certificate name must be a host name, or _wildcard.DOMAIN for *.DOMAIN",
        );
    };
    let b: CertPut = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => {
            return Response::problem(
                400,
                &format!("expected {{\"cert_pem\": \"...\", \"key_pem\": \"...\", \"ocsp_base64\": \"...\" (optional)}}: {e}"),
            )
        }
    };
    let ocsp = match b
        .ocsp_base64
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        None => None,
        Some(t) => match base64::engine::general_purpose::STANDARD.decode(t) {
            Ok(d) => Some(d),
            Err(e) => return Response::problem(400, &format!("ocsp_base64 is not base64: {e}")),
        },
    };
    let bundle = match crate::tls::check(
        &name,
        b.cert_pem.as_bytes(),
        b.key_pem.as_bytes(),
        ocsp,
        date::unix_now() as i64,
    ) {
        Ok(bundle) => bundle,
        Err(e) => return Response::problem(400, &e.to_string()),
    };
    let ocsp = bundle.key.ocsp.is_some();
    let info = bundle.info.clone();
    cache.certs.set(&name, bundle);
    tracing::info!(name, fingerprint = %info.fingerprint, not_after = %info.not_after_rfc3339(), "TLS certificate set");
    json_ok(crate::tls::describe(&name, &info, ocsp))
}

fn tls_get(cache: &Cache, raw: &str) -> Response {
    let name = crate::tls::cert_name(&percent_decode(raw));
    match cache
        .certs
        .list()
        .into_iter()
        .find(|(n, ..)| Some(n) == name.as_ref())
    {
        Some((n, info, ocsp)) => json_ok(crate::tls::describe(&n, &info, ocsp)),
        None => Response::problem(404, "no certificate with this name"),
    }
}

fn tls_delete(cache: &Cache, raw: &str) -> Response {
    let Some(name) = crate::tls::cert_name(&percent_decode(raw)) else {
        return Response::problem(404, "no certificate with this name");
    };
    if cache.certs.remove(&name) {
        tracing::info!(name, "TLS certificate removed");
        Response {
            status: 204,
            headers: Vec::new(),
            body: vcdn_http::serve::Body::Full(bytes::Bytes::new()),
            content_length: None,
        }
    } else {
        Response::problem(404, "no certificate with this name")
    }
}
