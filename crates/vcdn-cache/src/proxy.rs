//! What the cache answers to one request: hit, miss, coalesced, stale,
//! revalidated or pass, as described in the crate doc. The connection loop
//! in `server` parses requests and writes the [`Reply`] this returns.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use vcdn_http::header::is_hop_by_hop;
use vcdn_http::{date, Headers, Method, RequestHead};

use crate::body::Body;
use crate::config::CacheConfig;
use crate::fetch::{Fetch, FetchError, FetchReader, FetchedHead};
use crate::fill::Fill;
use crate::interim::InterimSink;
use crate::key::{variant_key, vary_names, ObjectId};
use crate::metrics::{CacheStatus, HitTally, Metrics};
use crate::object::{CachedObject, ObjectParts, ObjectStats};
use crate::panic;
use crate::policy::{self, PolicyConfig, RangeAnswer, Usable};
use crate::reply::{
    error_reply, finish_head, push_field, push_num, push_str_field, status_line, Reply, ReplyBody,
};
use crate::store::Store;
use crate::upstream::{RequestBody, Upstream, UpstreamConfig, UpstreamError, UpstreamRequest};
use vcdn_policy::admission::{Admission, AdmissionFilter, LruFilter};

/// The shared state of one cache instance.
pub struct Cache {
    pub cfg: CacheConfig,
    pub store: Store,
    pub upstream: Upstream,
    pub metrics: Metrics,
    pub policy: PolicyConfig,
    /// Certificates of the TLS listener, by SNI; loaded from
    /// `tls_cert_dir` and replaced live through the admin API.
    pub certs: Arc<vcdn_http::tls::CertStore>,
    /// Fetches in flight, by primary id: requests for the same object join
    /// them instead of asking upstream again.
    inflight: Mutex<HashMap<ObjectId, Arc<Fetch>>>,
    /// `1.1 <name>`, appended to Via, and how loops are recognised.
    via: String,
    pub started: std::time::Instant,
    /// Wall-clock start, ms since the Unix epoch: this process's
    /// incarnation in `/stats` and in its telemetry records, so that the
    /// supervisor tells a restarted cache's counters from a late record.
    pub boot_ms: u64,
    /// The SRv6 agent, once it runs (for `/metrics`); taken at the end
    /// of a drain, which removes its routes.
    pub srv6: std::sync::Mutex<Option<vcdn_srv6::host::HostAgent>>,
    /// The telemetry agent, once it runs (for `/metrics`).
    pub telemetry: std::sync::OnceLock<std::sync::Arc<crate::telemetry::Publisher>>,
    /// Set when the cache shuts down: HTTP/2 connections send GOAWAY and
    /// finish their open streams (see [`Cache::drain`]).
    pub draining: tokio::sync::watch::Sender<bool>,
    /// The LRU admission filter, when configured (shared by all serving
    /// threads: they serve one content population).
    admission: Option<Mutex<LruFilter>>,
    /// The chunk prefixes served on the SRv6 data path (`crate::chunks`).
    chunks: Option<crate::chunks::ChunkAddresses>,
    /// Base URL filtered requests are redirected to.
    bypass_base: String,
    /// Debug builds only: requests under this path panic on purpose, so
    /// tests can prove the panic boundaries (see [`Cache::inject_fault`]).
    #[cfg(debug_assertions)]
    fault_panic: Option<Vec<u8>>,
}

/// Environment variable naming the path prefix whose requests panic on
/// purpose, in debug builds only (release builds have no such code).
#[cfg(debug_assertions)]
pub const FAULT_PANIC_ENV: &str = "VCDN_CACHE_FAULT_PANIC";

/// Where an injected fault fires.
#[cfg(debug_assertions)]
#[derive(PartialEq, Eq)]
enum FaultAt {
    /// In [`Cache::at_once`], on a serving thread's synchronous path
    /// (the io_uring front end's batch): paths ending in `/at-once`.
    AtOnce,
    /// In the upstream fetch task: paths ending in `/in-fetch`.
    InFetch,
    /// In [`Cache::handle`], after an await: any other path.
    Handle,
}

/// See [`Cache::at_once`].
pub enum AtOnce {
    /// The answer is in the output buffer; whether to close after it.
    Written { close: bool },
    /// This reply answers the request.
    Reply(Reply),
    /// Nothing could be answered at once: [`Cache::handle`] decides.
    Later,
}

/// Per-request facts the reply builder needs.
struct Ctx<'a> {
    req: &'a RequestHead,
    head_only: bool,
    keep_alive: bool,
    /// Where this client's 1xx interim responses go (`crate::interim`).
    interim: Option<InterimSink>,
}

impl Cache {
    pub fn new(cfg: CacheConfig) -> Result<Cache, String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let store = Store::new(
            cfg.memory as usize,
            cfg.disk.as_deref().map(|d| (d, cfg.disk_size)),
        )
        .map_err(|e| format!("cannot open disk tier: {e}"))?;
        let upstream = Upstream::new(UpstreamConfig {
            url: cfg.upstream.clone(),
            connect_timeout: std::time::Duration::from_millis(cfg.upstream_connect_timeout_ms),
            read_timeout: std::time::Duration::from_millis(cfg.upstream_read_timeout_ms),
            max_idle: cfg.upstream_max_idle,
            idle_timeout: std::time::Duration::from_millis(cfg.upstream_idle_timeout_ms),
            policy: cfg.origin_policy.parse()?,
            ca_file: cfg.origin_ca_file.clone(),
            tls_name: cfg.origin_tls_name.clone(),
        })
        .map_err(|e| e.to_string())?;
        let policy = PolicyConfig {
            targeted_fields: cfg
                .targeted_fields
                .iter()
                .map(|f| Bytes::from(f.to_ascii_lowercase()))
                .collect(),
            heuristic_fraction: cfg.heuristic_fraction,
            heuristic_max: cfg.heuristic_max_s,
            honor_client_no_cache: cfg.honor_client_no_cache,
        };
        let suffix = xxhash_rust::xxh3::xxh3_64(
            format!("{:?}{}", std::time::SystemTime::now(), std::process::id()).as_bytes(),
        ) & 0xff_ffff;
        let certs = crate::tls::load_dir(cfg.tls_cert_dir.as_deref())?;
        Ok(Cache {
            certs,
            via: format!("1.1 {}-{suffix:06x}", cfg.via),
            store,
            upstream,
            metrics: Metrics::default(),
            policy,
            inflight: Mutex::new(HashMap::new()),
            started: std::time::Instant::now(),
            boot_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            srv6: std::sync::Mutex::new(None),
            telemetry: std::sync::OnceLock::new(),
            draining: tokio::sync::watch::channel(false).0,
            admission: cfg.admission_filter.map(|n| Mutex::new(LruFilter::new(n))),
            chunks: crate::chunks::ChunkAddresses::new(&cfg)?,
            bypass_base: cfg
                .admission_redirect
                .clone()
                .unwrap_or_else(|| cfg.upstream.clone())
                .trim_end_matches('/')
                .to_string(),
            #[cfg(debug_assertions)]
            fault_panic: std::env::var(FAULT_PANIC_ENV)
                .ok()
                .filter(|p| !p.is_empty())
                .map(String::into_bytes),
            cfg,
        })
    }

    /// Begin shutting down: HTTP/2 connections announce GOAWAY at once and
    /// close when their open streams are done.
    pub fn drain(&self) {
        self.draining.send_replace(true);
    }

    pub fn via(&self) -> &str {
        &self.via
    }

    /// Fetches in flight: (key, bytes received, expected length, readers).
    pub fn inflight(&self) -> Vec<(Bytes, u64, Option<u64>, usize)> {
        self.inflight
            .lock()
            .values()
            .map(|f| {
                let (got, len, readers) = f.progress();
                (f.key.clone(), got, len, readers)
            })
            .collect()
    }

    /// Debug builds: panic if `path` is under the fault-injection path and
    /// names this place.
    #[cfg(debug_assertions)]
    fn inject_fault(&self, path: &[u8], at: FaultAt) {
        let Some(prefix) = &self.fault_panic else {
            return;
        };
        if !path.starts_with(prefix) {
            return;
        }
        let here = if path.ends_with(b"/at-once") {
            FaultAt::AtOnce
        } else if path.ends_with(b"/in-fetch") {
            FaultAt::InFetch
        } else {
            FaultAt::Handle
        };
        if here == at {
            panic!(
                "fault injected for {} ({FAULT_PANIC_ENV})",
                String::from_utf8_lossy(path)
            );
        }
    }

    /// Answer one request. `body` is its body (complete bytes or a stream),
    /// forwarded only on a pass (a GET's or HEAD's is not). Interim (1xx)
    /// responses from the upstream are dropped; see [`Cache::handle_interim`].
    pub async fn handle(
        self: &Arc<Self>,
        req: &RequestHead,
        body: impl Into<RequestBody>,
        peer: IpAddr,
    ) -> Reply {
        self.handle_interim(req, body, peer, None).await
    }

    /// [`Cache::handle`], passing the upstream's 1xx interim responses for
    /// this request to `interim` while the final answer is awaited (when
    /// this request starts the upstream fetch: `crate::interim` says why).
    pub async fn handle_interim(
        self: &Arc<Self>,
        req: &RequestHead,
        body: impl Into<RequestBody>,
        peer: IpAddr,
        interim: Option<InterimSink>,
    ) -> Reply {
        let body = body.into();
        let ctx = Ctx {
            req,
            head_only: req.method == Method::Head,
            keep_alive: req.keep_alive,
            interim,
        };
        #[cfg(debug_assertions)]
        if self.fault_panic.is_some() {
            tokio::task::yield_now().await;
            self.inject_fault(req.path(), FaultAt::Handle);
        }
        if req.method == Method::Trace && !self.cfg.allow_trace {
            // TRACE would echo the request to the client, cookies and
            // credentials included (RFC 9110 §9.3.8): off unless allowed.
            let mut r = self.error(&ctx, 405, "TRACE is not allowed on this service");
            r.head.truncate(r.head.len() - 2);
            r.head
                .extend_from_slice(b"Allow: GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS\r\n\r\n");
            return r;
        }
        if req
            .headers
            .get_all(b"via")
            .any(|v| contains(v, self.via.as_bytes()))
        {
            return self.error(
                &ctx,
                508,
                "this request has already passed through this cache (forwarding loop)",
            );
        }
        match req.method {
            Method::Get | Method::Head => self.lookup(&ctx, peer).await,
            _ => self.pass(&ctx, body, peer).await,
        }
    }

    /// The admission filter's verdict on a GET or HEAD: `Some(302)` to the
    /// origin when the content was not requested recently (the request is
    /// then neither proxied nor cached here), `None` to serve it.
    fn admit(&self, req: &RequestHead) -> Option<Reply> {
        let filter = self.admission.as_ref()?;
        if !matches!(req.method, Method::Get | Method::Head) {
            return None;
        }
        let pq = req.path_and_query();
        let path = pq.split(|&c| c == b'?').next().unwrap_or(pq);
        let id = xxhash_rust::xxh3::xxh3_64(path);
        if filter.lock().admit(id) == Admission::Edge {
            return None;
        }
        self.metrics.request(CacheStatus::Bypass);
        self.metrics.response(302, 0);
        let mut head = status_line(302);
        head.extend_from_slice(b"Date: ");
        date::write_now(&mut head);
        head.extend_from_slice(b"\r\nLocation: ");
        head.extend_from_slice(self.bypass_base.as_bytes());
        head.extend_from_slice(pq);
        head.extend_from_slice(
            b"\r\nCache-Control: no-store\r\nX-Cache: BYPASS\r\nContent-Length: 0\r\n",
        );
        finish_head(&mut head, !req.keep_alive);
        Some(Reply {
            status: 302,
            head,
            body: ReplyBody::Empty,
            close: !req.keep_alive,
            stats: None,
        })
    }

    /// The chunk a connection was let in for (`crate::chunks`), from its
    /// local address: None when this cache serves no chunk prefixes (then
    /// `local` is not called, so other caches pay no system call) or the
    /// address is not a chunk address.
    pub fn chunk_of(&self, local: impl FnOnce() -> std::io::Result<SocketAddr>) -> Option<u64> {
        self.chunks.as_ref()?.of_local(local().ok()?)
    }

    /// Why `req`, on a connection let in for `chunk`, is refused (421);
    /// counted. None when it names that chunk or `chunk` is None.
    pub fn misdirected(&self, req: &RequestHead, chunk: Option<u64>) -> Option<String> {
        let refused = self
            .chunks
            .as_ref()?
            .misdirected(req.path_and_query(), chunk?)?;
        self.metrics.misdirected.fetch_add(1, Ordering::Relaxed);
        Some(refused)
    }

    /// What a front end can answer without the asynchronous machinery: an
    /// admission-filter redirect, or a fresh memory hit, written straight
    /// into `out` when its body is at most `max_body` bytes (the usual
    /// case), else as a reply whose head reuses `spare`.
    pub fn at_once(
        &self,
        req: &RequestHead,
        out: &mut Vec<u8>,
        max_body: usize,
        spare: &mut Vec<u8>,
        tally: &mut HitTally,
    ) -> AtOnce {
        #[cfg(debug_assertions)]
        self.inject_fault(req.path(), FaultAt::AtOnce);
        if let Some(r) = self.admit(req) {
            return AtOnce::Reply(r);
        }
        if let Some(close) = self.hit_into(req, out, max_body, tally) {
            return AtOnce::Written { close };
        }
        match self.try_hit(req, std::mem::take(spare)) {
            Ok(r) => AtOnce::Reply(r),
            Err(buf) => {
                *spare = buf;
                AtOnce::Later
            }
        }
    }

    /// A fresh hit in memory as a reply, its head written into `buf`.
    /// `Err(buf)`: go through [`Cache::handle`].
    fn try_hit(&self, req: &RequestHead, buf: Vec<u8>) -> Result<Reply, Vec<u8>> {
        if !matches!(req.method, Method::Get | Method::Head) || req.headers.contains(b"via") {
            return Err(buf);
        }
        let Some(o) = self.store.memory_object(req.path_and_query(), &req.headers) else {
            return Err(buf);
        };
        let now = date::unix_now();
        if policy::usable(&o.freshness, o.age(now), &req.headers, &self.policy) != Usable::Fresh {
            return Err(buf);
        }
        let ctx = Ctx {
            req,
            head_only: req.method == Method::Head,
            keep_alive: req.keep_alive,
            interim: None,
        };
        Ok(self.object_reply_into(&ctx, &o, CacheStatus::Hit, now, buf))
    }

    /// The leanest answer, for the front ends' hot path: a fresh memory hit
    /// on a plain GET or HEAD (no Range, no validator to compare) of a 200
    /// whose body is at most `max_body` bytes, written head and body
    /// straight into `out`. No reply is built and no reference taken but
    /// the object's; shared counters go through `tally`. Returns whether
    /// the connection closes after it, or `None` (nothing written) when
    /// [`Cache::try_hit`] must decide.
    fn hit_into(
        &self,
        req: &RequestHead,
        out: &mut Vec<u8>,
        max_body: usize,
        tally: &mut HitTally,
    ) -> Option<bool> {
        let head_only = match req.method {
            Method::Get => false,
            Method::Head => true,
            _ => return None,
        };
        if req.headers.iter().any(|(n, _)| needs_full_path(n)) {
            return None;
        }
        let o = self
            .store
            .memory_object(req.path_and_query(), &req.headers)?;
        if o.status != 200 || (o.body.len() > max_body && !head_only) {
            return None;
        }
        let now = date::unix_now();
        let age = o.age(now);
        if policy::usable(&o.freshness, age, &req.headers, &self.policy) != Usable::Fresh {
            return None;
        }
        o.stats.hit(now);
        let close = !req.keep_alive;
        let len = o.body.len() as u64;
        write_object_head(out, &o, 200, age, CacheStatus::Hit, None, Some(len), close);
        if !head_only {
            out.extend_from_slice(&o.body);
            o.stats.served(len);
            tally.body_bytes += len;
        }
        tally.hits += 1;
        Some(close)
    }

    async fn lookup(self: &Arc<Self>, ctx: &Ctx<'_>, peer: IpAddr) -> Reply {
        let req = ctx.req;
        let primary = req.origin_form();
        let (id, key) = self.store.resolve(&primary, &req.headers);
        let mut found = self.store.get_memory(id, &key);
        if found.is_none() && self.store.on_disk(id) {
            let cache = self.clone();
            let k = key.clone();
            let loaded =
                tokio::task::spawn_blocking(move || panic::catch(|| cache.store.load_disk(id, &k)))
                    .await;
            found = match loaded {
                Ok(Ok(o)) => o,
                Ok(Err(c)) => {
                    // Served as a miss.
                    panic::report(&self.metrics, &c, "reading the disk tier", None);
                    None
                }
                Err(_) => None,
            };
        }
        let now = date::unix_now();
        if let Some(o) = found {
            match policy::usable(&o.freshness, o.age(now), &req.headers, &self.policy) {
                Usable::Fresh => return self.object_reply(ctx, &o, CacheStatus::Hit, now),
                Usable::StaleWhileRevalidate => {
                    self.background_revalidate(&o, &primary, req, peer);
                    return self.object_reply(ctx, &o, CacheStatus::Stale, now);
                }
                Usable::Revalidate { stale_if_error } => {
                    return self.revalidate(ctx, o, primary, peer, stale_if_error).await
                }
            }
        }
        if policy::parse_directives(req.headers.get_all(b"cache-control")).only_if_cached {
            return self.error(ctx, 504, "not in cache and the request says only-if-cached");
        }
        let (reader, leader) = self.join_or_fetch(&primary, req, peer, None, ctx.interim.clone());
        self.stream_reply(ctx, reader, leader, None, peer).await
    }

    /// Join the fetch in flight for this primary key, or start one.
    fn join_or_fetch(
        self: &Arc<Self>,
        primary: &Bytes,
        req: &RequestHead,
        peer: IpAddr,
        conditional: Option<Arc<CachedObject>>,
        interim: Option<InterimSink>,
    ) -> (FetchReader, bool) {
        let pid = ObjectId::of(primary);
        let mut map = self.inflight.lock();
        if let Some(reader) = map.get(&pid).and_then(|f| f.join()) {
            return (reader, false);
        }
        let stats = conditional
            .as_ref()
            .map(|o| o.stats.clone())
            .unwrap_or_default();
        let fetch = Fetch::new(
            primary.clone(),
            req.headers.clone(),
            stats,
            self.store.max_memory_object() as u64,
            self.cfg.stream_window,
        );
        map.insert(pid, fetch.clone());
        drop(map);
        let reader = fetch.join().expect("a new fetch can be joined");
        let mut plan = self.fill_plan(req, peer, conditional);
        plan.interim = interim;
        tokio::spawn(self.clone().run_fetch(fetch, plan, true));
        (reader, true)
    }

    /// A fetch of our own, not shared (Vary mismatch, or a response that
    /// turned out not to be shareable).
    fn private_fetch(
        self: &Arc<Self>,
        req: &RequestHead,
        peer: IpAddr,
        interim: Option<InterimSink>,
    ) -> FetchReader {
        let primary = req.origin_form();
        let fetch = Fetch::new(
            primary,
            req.headers.clone(),
            Arc::default(),
            self.store.max_memory_object() as u64,
            self.cfg.stream_window,
        );
        let reader = fetch.join().expect("a new fetch can be joined");
        let mut plan = self.fill_plan(req, peer, None);
        plan.interim = interim;
        tokio::spawn(self.clone().run_fetch(fetch, plan, false));
        reader
    }

    fn background_revalidate(
        self: &Arc<Self>,
        o: &Arc<CachedObject>,
        primary: &Bytes,
        req: &RequestHead,
        peer: IpAddr,
    ) {
        let pid = ObjectId::of(primary);
        if self.inflight.lock().contains_key(&pid) {
            return;
        }
        // The reader is dropped at once: the fetch still completes and
        // stores its result, since its body is kept for the cache.
        let _ = self.join_or_fetch(primary, req, peer, Some(o.clone()), None);
    }

    async fn revalidate(
        self: &Arc<Self>,
        ctx: &Ctx<'_>,
        stale: Arc<CachedObject>,
        primary: Bytes,
        peer: IpAddr,
        stale_if_error: bool,
    ) -> Reply {
        let (mut reader, leader) = self.join_or_fetch(
            &primary,
            ctx.req,
            peer,
            Some(stale.clone()),
            ctx.interim.clone(),
        );
        let now = date::unix_now();
        match reader.head().await {
            Ok(h) => {
                if let Some(fresh) = &h.refreshed {
                    return self.object_reply(ctx, fresh, CacheStatus::Revalidated, now);
                }
                if h.status >= 500 && stale_if_error {
                    return self.object_reply(ctx, &stale, CacheStatus::Stale, now);
                }
                self.stream_reply(ctx, reader, leader, Some(CacheStatus::Refresh), peer)
                    .await
            }
            Err(_) if stale_if_error => self.object_reply(ctx, &stale, CacheStatus::Stale, now),
            Err(e) => self.error(ctx, e.status, &e.message),
        }
    }

    /// Forward a request that the cache cannot answer (unsafe methods), then
    /// invalidate what it may have changed (RFC 9111 §4.4).
    async fn pass(self: &Arc<Self>, ctx: &Ctx<'_>, body: RequestBody, peer: IpAddr) -> Reply {
        let req = ctx.req;
        let primary = req.origin_form();
        let fetch = Fetch::new(
            primary.clone(),
            req.headers.clone(),
            Arc::default(),
            0,
            self.cfg.stream_window,
        );
        let mut reader = fetch.join().expect("a new fetch can be joined");
        let plan = FetchPlan {
            method: req.method_raw.clone(),
            path: primary.clone(),
            headers: self.forward_headers(req, peer, false),
            body,
            idempotent: req.method.is_idempotent(),
            store: false,
            conditional: None,
            interim: ctx.interim.clone(),
        };
        tokio::spawn(self.clone().run_fetch(fetch, plan, false));
        if let Ok(h) = reader.head().await {
            if !req.method.is_safe() && (200..400).contains(&h.status) {
                let mut n = self.store.purge_key(&primary);
                for field in [&b"location"[..], b"content-location"] {
                    if let Some(p) = h.headers.get(field).and_then(|v| same_origin_path(v)) {
                        n += self.store.purge_key(p);
                    }
                }
                self.metrics.purged.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        self.stream_reply(ctx, reader, false, Some(CacheStatus::Pass), peer)
            .await
    }

    /// Reply with a body cloned from a fetch.
    async fn stream_reply(
        self: &Arc<Self>,
        ctx: &Ctx<'_>,
        mut reader: FetchReader,
        leader: bool,
        status_override: Option<CacheStatus>,
        peer: IpAddr,
    ) -> Reply {
        let h = match reader.head().await {
            Ok(h) => h,
            Err(e) => return self.error(ctx, e.status, &e.message),
        };
        let fetch = reader.fetch().clone();
        if let Some(fresh) = &h.refreshed {
            // A revalidation we joined without holding the stale copy.
            return self.object_reply(ctx, fresh, CacheStatus::Revalidated, date::unix_now());
        }
        let shared_ok = status_override == Some(CacheStatus::Pass)
            || leader
            || (h.freshness.storable
                && h.vary.as_ref().is_some_and(|names| {
                    names.is_empty()
                        || variant_key(&fetch.key, names, &ctx.req.headers)
                            == variant_key(&fetch.key, names, &fetch.leader_headers)
                }));
        if !shared_ok {
            // Not ours to share: ask upstream for this client alone.
            drop(reader);
            reader = self.private_fetch(ctx.req, peer, ctx.interim.clone());
            return Box::pin(self.stream_reply(ctx, reader, true, Some(CacheStatus::Pass), peer))
                .await;
        }
        let status = status_override.unwrap_or(if leader {
            CacheStatus::Miss
        } else {
            CacheStatus::Coalesced
        });
        if status == CacheStatus::Miss || status == CacheStatus::Coalesced {
            fetch.stats.miss(date::unix_now());
        }
        let stats = Some(fetch.stats.clone());
        self.metrics.request(status);

        // A conditional or range request is answered from the fetched head.
        let mut code = h.status;
        let mut skip = 0;
        let mut take = None;
        let mut extra = String::new();
        if h.status == 200 && status != CacheStatus::Pass {
            if policy::not_modified(&ctx.req.headers, &h.headers) {
                return self.not_modified(ctx, &h.headers, h.initial_age, status, stats);
            }
            if let Some(len) = h.content_length {
                match policy::resolve_range(&ctx.req.headers, &h.headers, len) {
                    RangeAnswer::Full => {}
                    RangeAnswer::Partial { start, end } => {
                        code = 206;
                        skip = start;
                        take = Some(end - start + 1);
                        extra = format!("Content-Range: bytes {start}-{end}/{len}\r\n");
                    }
                    RangeAnswer::Unsatisfiable => {
                        return self.range_not_satisfiable(ctx, len, status);
                    }
                }
            }
        }
        let no_body = ctx.head_only || code == 204 || code == 304 || code < 200;
        let length = take.or(h.content_length);
        let mut head = status_line(code);
        h.headers.write_to(&mut head);
        push_field(&mut head, "Age", h.initial_age);
        push_field(&mut head, "X-Cache", status.as_str());
        head.extend_from_slice(extra.as_bytes());
        let (chunked, close) = match length {
            Some(n) => {
                if code != 204 && code != 304 && code >= 200 {
                    push_field(&mut head, "Content-Length", n);
                }
                (false, !ctx.keep_alive)
            }
            None if no_body => (false, !ctx.keep_alive),
            None if ctx.req.minor_version >= 1 => {
                head.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                (true, !ctx.keep_alive)
            }
            // An HTTP/1.0 client learns the end from the connection closing.
            None => (false, true),
        };
        finish_head(&mut head, close);
        self.metrics.response(code, 0);
        Reply {
            status: code,
            head,
            body: if no_body {
                ReplyBody::Empty
            } else {
                ReplyBody::Stream {
                    reader,
                    skip,
                    take,
                    chunked,
                }
            },
            close,
            stats,
        }
    }

    /// Reply with a stored object.
    fn object_reply(
        &self,
        ctx: &Ctx<'_>,
        o: &CachedObject,
        status: CacheStatus,
        now: u64,
    ) -> Reply {
        self.object_reply_into(ctx, o, status, now, Vec::new())
    }

    /// Reply with a stored object, writing the head into `head`.
    fn object_reply_into(
        &self,
        ctx: &Ctx<'_>,
        o: &CachedObject,
        status: CacheStatus,
        now: u64,
        mut head: Vec<u8>,
    ) -> Reply {
        self.metrics.request(status);
        if status == CacheStatus::Hit || status == CacheStatus::Stale {
            o.stats.hit(now);
        }
        let stats = Some(o.stats.clone());
        let age = o.age(now);
        if o.status == 200 && policy::not_modified(&ctx.req.headers, &o.headers) {
            return self.not_modified(ctx, &o.headers, age, status, stats);
        }
        let len = o.body.len() as u64;
        let mut range: Option<(u64, u64)> = None;
        let (code, body) = if o.status == 200 {
            match policy::resolve_range(&ctx.req.headers, &o.headers, len) {
                RangeAnswer::Full => (200, o.body.clone()),
                RangeAnswer::Partial { start, end } => {
                    range = Some((start, end));
                    (206, o.body.slice(start as usize..=end as usize))
                }
                RangeAnswer::Unsatisfiable => return self.range_not_satisfiable(ctx, len, status),
            }
        } else {
            (o.status, o.body.clone())
        };
        head.clear();
        let mut close = !ctx.keep_alive;
        let length = (code != 204 && code != 304).then_some(body.len() as u64);
        let sent = if ctx.head_only { 0 } else { body.len() as u64 };
        let body = if ctx.head_only || code == 204 || code == 304 {
            ReplyBody::Empty
        } else if let Some(part) = small_part_of_disk_file(o, body.len(), range) {
            part.unwrap_or_else(|()| {
                // Cut short: the client sees a truncated response.
                close = true;
                ReplyBody::Empty
            })
        } else if let Some(file) = &o.file {
            ReplyBody::Shared {
                bytes: body,
                file: file.clone(),
                offset: o.file_offset + range.map_or(0, |r| r.0),
            }
        } else {
            ReplyBody::Full(body)
        };
        write_object_head(&mut head, o, code, age, status, range, length, close);
        self.metrics.response(code, sent);
        Reply {
            status: code,
            head,
            body,
            close,
            stats,
        }
    }

    fn not_modified(
        &self,
        ctx: &Ctx<'_>,
        stored: &Headers,
        age: u64,
        status: CacheStatus,
        stats: Option<Arc<ObjectStats>>,
    ) -> Reply {
        let mut head = status_line(304);
        // RFC 9110 §15.4.5: the fields a 200 would have carried that
        // describe the representation's validators and caching.
        for name in [
            &b"cache-control"[..],
            b"cdn-cache-control",
            b"content-location",
            b"date",
            b"etag",
            b"expires",
            b"last-modified",
            b"vary",
            b"via",
        ] {
            for v in stored.get_all(name) {
                head.extend_from_slice(name);
                head.extend_from_slice(b": ");
                head.extend_from_slice(v);
                head.extend_from_slice(b"\r\n");
            }
        }
        push_field(&mut head, "Age", age);
        push_field(&mut head, "X-Cache", status.as_str());
        finish_head(&mut head, !ctx.keep_alive);
        self.metrics.response(304, 0);
        Reply {
            status: 304,
            head,
            body: ReplyBody::Empty,
            close: !ctx.keep_alive,
            stats,
        }
    }

    fn range_not_satisfiable(&self, ctx: &Ctx<'_>, len: u64, status: CacheStatus) -> Reply {
        let body = Bytes::from(format!(
            "416 Range Not Satisfiable: the object has {len} bytes\n"
        ));
        let mut head = status_line(416);
        push_field(&mut head, "Content-Range", format!("bytes */{len}"));
        push_field(&mut head, "Content-Type", "text/plain; charset=utf-8");
        push_field(&mut head, "X-Cache", status.as_str());
        push_field(&mut head, "Content-Length", body.len());
        finish_head(&mut head, !ctx.keep_alive);
        self.metrics.response(416, 0);
        Reply {
            status: 416,
            head,
            body: if ctx.head_only {
                ReplyBody::Empty
            } else {
                ReplyBody::Full(body)
            },
            close: !ctx.keep_alive,
            stats: None,
        }
    }

    /// An error answered by the cache itself, with a body a person can read.
    fn error(&self, ctx: &Ctx<'_>, code: u16, message: &str) -> Reply {
        self.metrics.request(CacheStatus::Error);
        let mut r = error_reply(code, message, !ctx.keep_alive, ctx.head_only);
        let mut head = std::mem::take(&mut r.head);
        // Insert X-Cache before the final CRLF.
        head.truncate(head.len() - 2);
        push_field(&mut head, "X-Cache", "ERROR");
        head.extend_from_slice(b"\r\n");
        r.head = head;
        self.metrics.response(code, 0);
        r
    }

    fn fill_plan(
        &self,
        req: &RequestHead,
        peer: IpAddr,
        conditional: Option<Arc<CachedObject>>,
    ) -> FetchPlan {
        let mut headers = self.forward_headers(req, peer, true);
        if let Some(o) = &conditional {
            if let Some(etag) = o.headers.get(b"etag") {
                headers.push((Bytes::from_static(b"If-None-Match"), etag.clone()));
            }
            if let Some(lm) = o.headers.get(b"last-modified") {
                headers.push((Bytes::from_static(b"If-Modified-Since"), lm.clone()));
            }
        }
        FetchPlan {
            method: Bytes::from_static(b"GET"),
            path: req.origin_form(),
            headers,
            body: RequestBody::None,
            idempotent: true,
            store: true,
            conditional,
            interim: None,
        }
    }

    /// The end-to-end fields of a client request to send upstream. A cache
    /// fill asks for the whole representation, so it drops the client's
    /// conditionals and ranges (the cache answers those itself).
    fn forward_headers(&self, req: &RequestHead, peer: IpAddr, fill: bool) -> Vec<(Bytes, Bytes)> {
        const FILL_DROP: [&[u8]; 6] = [
            b"if-none-match",
            b"if-modified-since",
            b"if-match",
            b"if-unmodified-since",
            b"range",
            b"if-range",
        ];
        let mut out = Vec::with_capacity(req.headers.len() + 2);
        let mut via = None;
        let mut xff = None;
        for (n, v) in req.headers.iter() {
            let skip = is_hop_by_hop(n)
                || req.headers.has_token(b"connection", n)
                || [&b"host"[..], b"content-length", b"expect"]
                    .iter()
                    .any(|h| n.eq_ignore_ascii_case(h))
                || (fill && FILL_DROP.iter().any(|h| n.eq_ignore_ascii_case(h)));
            if n.eq_ignore_ascii_case(b"via") {
                via = Some(v.clone());
            } else if n.eq_ignore_ascii_case(b"x-forwarded-for") {
                xff = Some(v.clone());
            } else if !skip {
                out.push((n.clone(), v.clone()));
            }
        }
        let via = match via {
            Some(v) => format!("{}, {}", String::from_utf8_lossy(&v), self.via),
            None => self.via.clone(),
        };
        out.push((Bytes::from_static(b"Via"), Bytes::from(via)));
        let xff = match xff {
            Some(v) => format!("{}, {peer}", String::from_utf8_lossy(&v)),
            None => peer.to_string(),
        };
        out.push((Bytes::from_static(b"X-Forwarded-For"), Bytes::from(xff)));
        out
    }

    /// Run one upstream exchange into `fetch`, then store what may be
    /// stored. A panic in it is caught here: its clients get a 500 (or a
    /// cut body) instead of waiting forever on a fetch nobody fills, and it
    /// leaves the in-flight map.
    async fn run_fetch(self: Arc<Self>, fetch: Arc<Fetch>, plan: FetchPlan, registered: bool) {
        let mut unfinished = Unfinished {
            cache: &self,
            fetch: &fetch,
            registered: Some(registered),
        };
        match panic::boundary(self.exchange(&fetch, plan, registered)).await {
            Ok(()) => unfinished.registered = None,
            Err(c) => panic::report(&self.metrics, &c, "in an upstream fetch", None),
        }
    }

    async fn exchange(self: &Arc<Self>, fetch: &Arc<Fetch>, mut plan: FetchPlan, registered: bool) {
        #[cfg(debug_assertions)]
        self.inject_fault(
            fetch.key.split(|&c| c == b'?').next().unwrap_or_default(),
            FaultAt::InFetch,
        );
        self.metrics
            .upstream_requests
            .fetch_add(1, Ordering::Relaxed);
        let request_time = date::unix_now();
        let req = UpstreamRequest {
            method: &plan.method,
            path_and_query: &plan.path,
            headers: plan.headers.clone(),
            idempotent: plan.idempotent,
            head_only: plan.method == "HEAD",
            interim: plan.interim.take(),
        };
        let body = std::mem::take(&mut plan.body);
        let result = self.upstream.send(&req, body).await;
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                let key = String::from_utf8_lossy(&fetch.key);
                match &e {
                    // The client's fault, answered by the connection loop.
                    UpstreamError::BodyAborted => {
                        tracing::debug!(key = %key, "request body ended early; upstream request abandoned")
                    }
                    UpstreamError::Refused(r) => {
                        self.metrics
                            .upstream_refused
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key = %key, upstream = %self.upstream.url(), address = %r.addr, rule = %r.rule, "upstream address refused by the origin policy");
                    }
                    // Counted by reason in the upstream's TLS metrics too.
                    UpstreamError::Tls(url, f) => {
                        self.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key = %key, upstream = %url, reason = f.reason.as_str(), "TLS with the upstream failed: {}", f.message);
                    }
                    _ => {
                        self.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key = %key, error = %e, "upstream request failed");
                    }
                }
                fetch.finish(Err(FetchError {
                    status: e.status(),
                    message: e.to_string(),
                }));
                self.forget(fetch, registered);
                return;
            }
        };
        let response_time = date::unix_now();
        let status = resp.head.status;
        let mut headers = clean_response_headers(&resp.head.headers, &self.via, response_time);
        let initial_age = policy::initial_age(&resp.head.headers, request_time, response_time);

        if let (Some(old), 304) = (&plan.conditional, status) {
            let fresh = self.refresh(old, &headers, response_time, initial_age);
            while let Ok(Some(_)) = resp.body.next().await {}
            fetch.set_head(Ok(Arc::new(FetchedHead {
                status: fresh.status,
                headers: fresh.headers.clone(),
                content_length: Some(fresh.body.len() as u64),
                freshness: fresh.freshness,
                vary: Some(fresh.vary.clone()),
                response_time,
                initial_age,
                refreshed: Some(fresh),
            })));
            fetch.finish(Ok(()));
            self.forget(fetch, registered);
            return;
        }
        let freshness = policy::freshness(&fetch.leader_headers, status, &headers, &self.policy);
        let vary = vary_names(&headers);
        headers.remove(b"age");
        let content_length = resp.body.length();
        let storable = plan.store && freshness.storable && vary.is_some();
        fetch.set_head(Ok(Arc::new(FetchedHead {
            status,
            headers: headers.clone(),
            content_length,
            freshness,
            vary: vary.clone(),
            response_time,
            initial_age,
            refreshed: None,
        })));
        if !storable {
            // Nobody else may join a response that will not be cached.
            self.forget(fetch, registered);
        }
        let vary = vary.unwrap_or_default();
        let key = if vary.is_empty() {
            fetch.key.clone()
        } else {
            variant_key(&fetch.key, &vary, &fetch.leader_headers)
        };
        let object = |body: Body| {
            CachedObject::new(ObjectParts {
                key: key.clone(),
                primary: fetch.key.clone(),
                status,
                headers: headers.clone(),
                body: body.bytes,
                file: body.file,
                file_offset: 0,
                vary: vary.clone(),
                freshness,
                response_time,
                initial_age,
                stats: fetch.stats.clone(),
            })
        };
        let meta = storable.then(|| Arc::new(object(Body::heap(Bytes::new()))));
        let mut fill = Fill::start(self.clone(), fetch.clone(), meta, content_length).await;
        let outcome = loop {
            match resp.body.next().await {
                Ok(Some(chunk)) => {
                    self.metrics
                        .upstream_bytes
                        .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    fill.admit(chunk.len() as u64).await;
                    if !fetch.push(chunk).await {
                        break Err(FetchError {
                            status: 499,
                            message: "every client left".into(),
                        });
                    }
                    fill.pushed().await;
                }
                Ok(None) => break Ok(()),
                Err(e) => {
                    self.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(key = %String::from_utf8_lossy(&fetch.key), error = %e, "upstream body failed; not cached");
                    break Err(FetchError {
                        status: e.status(),
                        message: e.to_string(),
                    });
                }
            }
        };
        let ok = outcome.is_ok();
        fetch.finish(outcome);
        if let Some(body) = fill.finish(ok && storable).await {
            self.put(Arc::new(object(body))).await;
        }
        self.forget(fetch, registered);
    }

    /// Store in memory, and on disk when there is a disk tier.
    pub async fn put(self: &Arc<Self>, o: Arc<CachedObject>) {
        let (to_disk, evicted) = self.store.insert(o.clone());
        self.metrics.evictions.fetch_add(evicted, Ordering::Relaxed);
        if to_disk {
            let cache = self.clone();
            let written = tokio::task::spawn_blocking(move || {
                panic::catch(|| {
                    if let Some(d) = cache.store.disk() {
                        d.write(&o);
                    }
                })
            })
            .await;
            if let Ok(Err(c)) = written {
                panic::report(&self.metrics, &c, "writing the disk tier", None);
            }
        }
    }

    /// A stored object updated by a 304 (RFC 9111 §4.3.4): new header
    /// values replace the stored ones, the body stays.
    fn refresh(
        self: &Arc<Self>,
        old: &CachedObject,
        update: &Headers,
        response_time: u64,
        initial_age: u64,
    ) -> Arc<CachedObject> {
        let mut headers = old.headers.clone();
        for (n, _) in update.iter() {
            if n.eq_ignore_ascii_case(b"content-length") || n.eq_ignore_ascii_case(b"age") {
                continue;
            }
            let name = n.to_ascii_lowercase();
            headers.remove(&name);
        }
        for (n, v) in update.iter() {
            if !(n.eq_ignore_ascii_case(b"content-length") || n.eq_ignore_ascii_case(b"age")) {
                headers.push(n.clone(), v.clone());
            }
        }
        let freshness = policy::freshness(&Headers::new(), old.status, &headers, &self.policy);
        let o = Arc::new(CachedObject::new(ObjectParts {
            key: old.key.clone(),
            primary: old.primary.clone(),
            status: old.status,
            headers,
            body: old.body.clone(),
            file: old.file.clone(),
            file_offset: old.file_offset,
            vary: old.vary.clone(),
            freshness,
            response_time,
            initial_age,
            stats: old.stats.clone(),
        }));
        let cache = self.clone();
        let stored = o.clone();
        tokio::spawn(async move { cache.put(stored).await });
        o
    }

    fn forget(&self, fetch: &Arc<Fetch>, registered: bool) {
        if !registered {
            return;
        }
        let mut map = self.inflight.lock();
        if map.get(&fetch.id).is_some_and(|f| Arc::ptr_eq(f, fetch)) {
            map.remove(&fetch.id);
        }
    }
}

/// A fetch task that has not completed its fetch. Dropped so (its task
/// panicked), it fails the fetch for the clients reading it and takes it
/// out of the in-flight map, so later requests start a new one.
struct Unfinished<'a> {
    cache: &'a Cache,
    fetch: &'a Arc<Fetch>,
    /// `Some(registered)` until the fetch completed normally.
    registered: Option<bool>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(registered) = self.registered {
            self.fetch.finish(Err(FetchError {
                status: 500,
                message: "the cache failed while fetching this object (a bug; it is logged)".into(),
            }));
            self.cache.forget(self.fetch, registered);
        }
    }
}

/// What a fetch asks upstream for.
struct FetchPlan {
    method: Bytes,
    path: Bytes,
    headers: Vec<(Bytes, Bytes)>,
    body: RequestBody,
    idempotent: bool,
    /// A cache fill (its response may be stored), not a pass.
    store: bool,
    /// The stale object this fetch revalidates.
    conditional: Option<Arc<CachedObject>>,
    /// Where the 1xx interim responses go: the client that started it.
    interim: Option<InterimSink>,
}

/// Response fields to keep: end-to-end only, Via extended, Date ensured.
fn clean_response_headers(h: &Headers, via: &str, now: u64) -> Headers {
    let mut out = Headers::with_capacity(h.len() + 2);
    let mut upstream_via = None;
    for (n, v) in h.iter() {
        // X-Cache describes one hop; each cache sets its own.
        if is_hop_by_hop(n)
            || h.has_token(b"connection", n)
            || n.eq_ignore_ascii_case(b"content-length")
            || n.eq_ignore_ascii_case(b"x-cache")
        {
            continue;
        }
        if n.eq_ignore_ascii_case(b"via") {
            upstream_via = Some(v.clone());
            continue;
        }
        out.push(n.clone(), v.clone());
    }
    if !out.contains(b"date") {
        out.push(Bytes::from_static(b"Date"), Bytes::from(date::format(now)));
    }
    let via = match upstream_via {
        Some(v) => format!("{}, {via}", String::from_utf8_lossy(&v)),
        None => via.to_string(),
    };
    out.push(Bytes::from_static(b"Via"), Bytes::from(via));
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The path of a Location/Content-Location that names this service: a
/// relative reference, or an absolute one (any host: a cache serves one).
fn same_origin_path(v: &[u8]) -> Option<&[u8]> {
    if v.first() == Some(&b'/') {
        return Some(v);
    }
    let rest = v
        .strip_prefix(b"http://")
        .or_else(|| v.strip_prefix(b"https://"))?;
    let i = rest.iter().position(|&c| c == b'/')?;
    Some(&rest[i..])
}

/// Request fields that [`Cache::hit_into`] leaves to the full path: a Via
/// (loop detection), a Range, or a validator to compare.
fn needs_full_path(name: &[u8]) -> bool {
    [
        &b"via"[..],
        b"range",
        b"if-none-match",
        b"if-modified-since",
    ]
    .iter()
    .any(|f| name.eq_ignore_ascii_case(f))
}

/// A small part (at most 64 KiB, which a front end would copy) of an
/// object sent from its disk-tier file, read with pread: the file's mapping
/// is never read through, so its pages do not become resident and a file
/// changed behind the cache's back cannot fault the process. `None` for
/// anything else (the object's body is then used as it is); `Err` when the
/// file cannot be read.
fn small_part_of_disk_file(
    o: &CachedObject,
    len: usize,
    range: Option<(u64, u64)>,
) -> Option<Result<ReplyBody, ()>> {
    use std::os::unix::fs::FileExt;
    // Shared-memory bodies start at 0 and are sealed; disk files after a head.
    let file = o.file.as_ref().filter(|_| o.file_offset > 0)?;
    if len > crate::body::SHM_MIN {
        return None;
    }
    let mut part = vec![0u8; len];
    let at = o.file_offset + range.map_or(0, |r| r.0);
    Some(match file.read_exact_at(&mut part, at) {
        Ok(()) => Ok(ReplyBody::Full(Bytes::from(part))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read a disk-tier file");
            Err(())
        }
    })
}

/// The head of a reply from a stored object: status line, the stored
/// block, Age, X-Cache, Content-Range for a part, Content-Length (a 204
/// or 304 has none), Connection.
#[allow(clippy::too_many_arguments)]
fn write_object_head(
    head: &mut Vec<u8>,
    o: &CachedObject,
    code: u16,
    age: u64,
    status: CacheStatus,
    range: Option<(u64, u64)>,
    content_length: Option<u64>,
    close: bool,
) {
    head.reserve(o.head_block.len() + 128);
    if code == 200 {
        head.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        head.extend_from_slice(&status_line(code));
    }
    head.extend_from_slice(&o.head_block);
    push_num(head, "Age", age);
    push_str_field(head, "X-Cache", status.as_str());
    if let Some((start, end)) = range {
        let len = o.body.len();
        push_field(head, "Content-Range", format!("bytes {start}-{end}/{len}"));
    }
    if let Some(n) = content_length {
        push_num(head, "Content-Length", n);
    }
    finish_head(head, close);
}
