//! Health checks: every cache's `/healthz` (or a TCP connect when it has
//! no admin address) polled every `interval`. One failed poll takes a cache
//! out of DNS answers and HTTP routing at once; `rise` good polls in a row
//! bring it back. Load comes with the answer: at `max_connections` open
//! connections a cache counts as overloaded and leaves the answers too.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::config::HealthConfig;
use crate::state::{CacheState, Router};

/// Polls every cache of the router forever.
pub async fn run(router: Arc<Router>, cfg: HealthConfig) {
    let interval = Duration::from_millis(cfg.interval_ms);
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let mut streaks: std::collections::HashMap<std::net::SocketAddr, u32> = Default::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let caches = router.caches();
        let checks = caches.iter().map(|c| check(c.clone(), timeout));
        let results = futures_join(checks).await;
        for (c, ok) in caches.iter().zip(results) {
            router.metrics.health_checks.fetch_add(1, Ordering::Relaxed);
            let addr = c.endpoint.address;
            if ok {
                let s = streaks.entry(addr).or_insert(0);
                *s += 1;
                if !c.alive.load(Ordering::Relaxed) && *s >= cfg.rise {
                    c.alive.store(true, Ordering::Relaxed);
                    tracing::info!(cache = %addr, "cache is healthy again");
                }
            } else {
                router
                    .metrics
                    .health_failures
                    .fetch_add(1, Ordering::Relaxed);
                streaks.insert(addr, 0);
                if c.alive.swap(false, Ordering::Relaxed) {
                    tracing::warn!(cache = %addr, "cache failed its health check; out of rotation");
                }
            }
        }
        streaks.retain(|a, _| caches.iter().any(|c| c.endpoint.address == *a));
    }
}

/// Runs all checks concurrently (each bounded by its own timeout).
async fn futures_join<F: std::future::Future<Output = bool> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<bool> {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or(false));
    }
    out
}

async fn check(c: Arc<CacheState>, timeout: Duration) -> bool {
    let Some(admin) = c.endpoint.admin else {
        return matches!(
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect(c.endpoint.address)).await,
            Ok(Ok(_))
        );
    };
    let resp = vcdn_http::client::request(admin, "GET", "/healthz", &[], b"", timeout).await;
    let Ok(resp) = resp else { return false };
    if resp.status() != 200 {
        return false;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&resp.body) else {
        return false;
    };
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let conns = n("connections");
    c.connections.store(conns, Ordering::Relaxed);
    c.stored_objects
        .store(n("memory_objects"), Ordering::Relaxed);
    c.stored_bytes.store(n("memory_bytes"), Ordering::Relaxed);
    c.capacity_bytes
        .store(n("memory_capacity_bytes"), Ordering::Relaxed);
    let over = c.endpoint.max_connections.is_some_and(|max| conns >= max);
    if c.overloaded.swap(over, Ordering::Relaxed) != over {
        if over {
            tracing::warn!(cache = %c.endpoint.address, conns, "cache overloaded; out of rotation");
        } else {
            tracing::info!(cache = %c.endpoint.address, conns, "cache no longer overloaded");
        }
    }
    true
}
