//! vcdn's edge cache node.
//!
//! What the MiniCache paper asks of a cache for elastic CDNs, as a Linux
//! process: it starts in milliseconds and idles in a few megabytes, serves
//! HTTP/1.1 from a hash-addressed object store with per-object statistics,
//! fetches a missing object once from its upstream (origin or parent cache)
//! and clones the stream to every client waiting for it, and obeys an
//! operator's control API.
//!
//! - `http` parsing lives in the `vcdn-http` crate;
//! - [`policy`]: RFC 9111 / 5861 / 9213 rules, pure;
//! - [`store`]: memory LRU tier and disk tier, by [`key::ObjectId`];
//! - [`body`]: large bodies in sealed memfds, sent with sendfile;
//! - [`fetch`]: coalesced upstream fetches with stream cloning;
//! - [`fill`]: where a fill keeps its body (memory budget, disk as it arrives);
//! - [`upstream`]: pooled client to the origin or parent;
//! - [`upstream_tls`]: TLS to an `https://` origin or parent;
//! - [`proxy`]: what to answer to a request, as a [`reply::Reply`];
//! - [`server`]: threads, listeners and the connection loop;
//! - [`tls`] and [`wire`]: TLS at the edge (handshake, certificates by
//!   SNI, ALPN dispatch) and the connection loop's I/O over TLS;
//! - [`h2front`]: the HTTP/2 front end (h2c on the plain listener, ALPN h2);
//! - [`admin`] and [`ctl`]: the control API and its client;
//! - [`telemetry`]: the embedded telemetry agent (`edge.stats`, `edge.events`).

pub mod admin;
pub mod body;
pub mod chunks;
pub mod config;
pub mod ctl;
pub mod fetch;
pub mod fill;
pub mod h2front;
pub mod interim;
pub mod key;
pub mod metrics;
pub mod object;
pub mod panic;
pub mod policy;
pub mod proxy;
pub mod reply;
pub mod request_body;
pub mod ring;
pub mod server;
pub mod srv6;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod upstream;
pub mod upstream_tls;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

pub use config::CacheConfig;
pub use proxy::Cache;

/// A started cache: where it listens, and its shared state.
pub struct Running {
    pub listen: SocketAddr,
    /// Where clients connect over TLS, if asked.
    pub tls_listen: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub cache: Arc<Cache>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Shut down gracefully: HTTP/2 connections get GOAWAY and their open
    /// streams may finish, for at most `drain_timeout_ms`. Returns when
    /// no HTTP/2 connection is left or the time is up; the caller then
    /// exits (HTTP/1.1 connections end with the process, as before).
    pub fn drain(&self) {
        telemetry::drain_event(&self.cache);
        self.cache.drain();
        let until = std::time::Instant::now()
            + std::time::Duration::from_millis(self.cache.cfg.drain_timeout_ms);
        let open = &self.cache.metrics.h2_connections_open;
        while open.load(std::sync::atomic::Ordering::Relaxed) > 0
            && std::time::Instant::now() < until
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        telemetry::leave(&self.cache);
        // The node's routes go with its agent (the connections they carried
        // are done or abandoned by now).
        drop(
            self.cache
                .srv6
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    /// Block until the serving threads end (they do not, short of a panic).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Bind the sockets and start the serving threads. Returns once the cache
/// accepts connections (the listen sockets exist before this returns).
pub fn start(cfg: CacheConfig) -> Result<Running, String> {
    let cache = Arc::new(Cache::new(cfg)?);
    panic::install_hook();
    let cfg = &cache.cfg;
    // The admin API's TLS, checked before anything listens.
    let admin_tls = match cfg.admin {
        Some(a) => {
            let t = vcdn_http::admin_tls::server_config_from(
                cfg.admin_tls_cert.as_deref(),
                cfg.admin_tls_key.as_deref(),
            )?;
            if t.is_none() {
                vcdn_http::admin_tls::check_plain(a)?;
            }
            t
        }
        None => None,
    };
    let threads = match cfg.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let first = server::bind_reuseport(cfg.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let listen = first.local_addr().map_err(|e| e.to_string())?;
    let mut listeners = vec![first];
    for _ in 1..threads {
        listeners.push(
            server::bind_reuseport(listen)
                .map_err(|e| format!("cannot listen on {listen}: {e}"))?,
        );
    }
    // Chunk addresses (the SRv6 data path), possibly in the edge's own
    // namespace: one per serving thread as well, on the epoll loop.
    let mut chunk_listeners = match cfg.chunk_listen {
        Some(a) => chunks::bind_listeners(a, cfg.chunk_netns.as_deref(), threads)?,
        None => Vec::new(),
    }
    .into_iter();
    // The TLS listeners: one per serving thread as well.
    let mut tls_listeners = Vec::new();
    let mut tls_listen = None;
    if let Some(addr) = cfg.tls_listen {
        let first = server::bind_reuseport(addr)
            .map_err(|e| format!("cannot listen for TLS on {addr}: {e}"))?;
        let at = first.local_addr().map_err(|e| e.to_string())?;
        tls_listeners.push(first);
        for _ in 1..threads {
            tls_listeners.push(
                server::bind_reuseport(at)
                    .map_err(|e| format!("cannot listen for TLS on {at}: {e}"))?,
            );
        }
        tls_listen = Some(at);
        if cache.certs.is_empty() {
            tracing::warn!(
                "TLS listener without any certificate: handshakes fail until one is pushed (PUT /tls/certificates/NAME)"
            );
        }
    }
    // The kernel's filter in front of the chunk listeners, once they exist.
    if let Some(s) = &cfg.srv6 {
        let agent = srv6::start(&cache, s)?;
        *cache.srv6.lock().unwrap_or_else(|e| e.into_inner()) = Some(agent);
    }
    let tls_config = tls_listen.map(|_| tls::server_config(&cache));
    let mut tls_listeners = tls_listeners.into_iter();
    let admin = match cfg.admin {
        Some(a) => {
            let l = std::net::TcpListener::bind(a)
                .map_err(|e| format!("cannot listen on admin address {a}: {e}"))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            Some(l)
        }
        None => None,
    };
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let mut handles = Vec::new();
    if let Some(a) = admin {
        // Its own thread: a cache busy to its CPU limit must still answer
        // the supervisor's load polls and the operator's shell (on a
        // serving thread's runtime a /stats took seconds under overload,
        // which hid the load exactly when scaling out was due).
        let cache = cache.clone();
        let h = std::thread::Builder::new()
            .name("vcdn-cache-admin".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the admin runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(a) {
                        Ok(a) => {
                            vcdn_http::serve::serve(
                                a,
                                vcdn_http::serve::ServeConfig {
                                    tls: admin_tls,
                                    ..Default::default()
                                },
                                admin::handler(cache),
                            )
                            .await
                        }
                        Err(e) => tracing::error!(error = %e, "admin listener"),
                    }
                });
            })
            .map_err(|e| format!("cannot start the admin thread: {e}"))?;
        handles.push(h);
    }
    if let Some(t) = telemetry::start(&cache)? {
        handles.push(t);
    }
    let use_ring = cache.cfg.io_uring && ring::available();
    for (i, l) in listeners.into_iter().enumerate() {
        let cache = cache.clone();
        let tls = tls_listeners.next().zip(tls_config.clone());
        let chunk = chunk_listeners.next();
        let h = std::thread::Builder::new()
            .name(format!("vcdn-cache-{i}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    if let Some((l, config)) = tls {
                        // TLS connections are served by the epoll loop
                        // (the io_uring front end is for plain HTTP).
                        tokio::spawn(tls::accept_loop(cache.clone(), l, config));
                    }
                    if let Some(l) = chunk {
                        tokio::spawn(server::accept_loop(cache.clone(), l));
                    }
                    if i == 0 && cache.store.disk().is_some() {
                            let c = cache.clone();
                            tokio::task::spawn_blocking(move || {
                                if let Some(r) = c.store.rebuild_disk() {
                                    tracing::info!(
                                        objects = r.objects,
                                        bytes = r.bytes,
                                        dropped = r.dropped,
                                        ignored = r.ignored,
                                        millis = r.millis,
                                        "disk index rebuilt"
                                    );
                                }
                            });
                    }
                    if use_ring {
                        let fallback = l.try_clone();
                        let failed = match panic::boundary(ring::serve(cache.clone(), l)).await {
                            Ok(Ok(())) => false,
                            Ok(Err(e)) => {
                                tracing::warn!(error = %e, "io_uring front end failed; serving with epoll");
                                true
                            }
                            Err(p) => {
                                // Its connections were closed and uncounted
                                // when it dropped; the thread serves on.
                                panic::report(&cache.metrics, &p, "on the io_uring front end; serving with epoll", None);
                                true
                            }
                        };
                        if let (true, Ok(l)) = (failed, fallback) {
                            server::accept_loop(cache, l).await;
                        }
                    } else {
                        server::accept_loop(cache, l).await;
                    }
                });
            })
            .map_err(|e| format!("cannot start thread: {e}"))?;
        handles.push(h);
    }
    Ok(Running {
        listen,
        tls_listen,
        admin: admin_addr,
        cache,
        threads: handles,
    })
}
