//! Health checks: every cache's `/healthz` (or a TCP connect when it has
//! no admin address) polled every `interval`. A poll that is refused or
//! answered badly takes a cache out of DNS answers and HTTP routing at
//! once; polls that get no answer in time take it out after `fall` in a row
//! (an overloaded cache answers late, and its users are better served by it
//! than by the origin; a region whose caches are all late keeps them in its
//! answers as a last resort); `rise` good polls in a row bring it back. Load comes
//! with the answer: at `max_connections` open connections a cache counts as
//! overloaded and leaves the answers too.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use vcdn_http::admin_tls::AdminClient;

use crate::config::HealthConfig;
use crate::state::{CacheState, Router};

/// Polls every cache of the router forever.
pub async fn run(router: Arc<Router>, cfg: HealthConfig, client: AdminClient) {
    let interval = Duration::from_millis(cfg.interval_ms);
    let timeout = Duration::from_millis(cfg.timeout_ms);
    // Per cache: good polls in a row, late polls in a row.
    let mut streaks: std::collections::HashMap<std::net::SocketAddr, (u32, u32)> =
        Default::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let caches = router.caches();
        let checks = caches
            .iter()
            .map(|c| check(c.clone(), client.clone(), timeout));
        let results = futures_join(checks).await;
        for (c, poll) in caches.iter().zip(results) {
            router.metrics.health_checks.fetch_add(1, Ordering::Relaxed);
            let addr = c.endpoint.address;
            let (good, late) = streaks.entry(addr).or_insert((0, 0));
            match poll {
                Poll::Up => {
                    (*good, *late) = (*good + 1, 0);
                    c.late.store(false, Ordering::Relaxed);
                    if !c.alive.load(Ordering::Relaxed) && *good >= cfg.rise {
                        c.alive.store(true, Ordering::Relaxed);
                        tracing::info!(cache = %addr, "cache is healthy again");
                    }
                }
                Poll::Down | Poll::Late => {
                    router
                        .metrics
                        .health_failures
                        .fetch_add(1, Ordering::Relaxed);
                    (*good, *late) = (0, *late + u32::from(poll == Poll::Late));
                    let out = poll == Poll::Down || *late >= cfg.fall;
                    c.late.store(poll == Poll::Late, Ordering::Relaxed);
                    if out && c.alive.swap(false, Ordering::Relaxed) {
                        tracing::warn!(cache = %addr, ?poll, "cache failed its health check; out of rotation");
                    }
                }
            }
        }
        streaks.retain(|a, _| caches.iter().any(|c| c.endpoint.address == *a));
    }
}

/// What one poll found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poll {
    Up,
    /// Refused, broken or answered badly: out at once.
    Down,
    /// No answer within the timeout: out after `fall` in a row.
    Late,
}

/// Runs all checks concurrently (each bounded by its own timeout).
async fn futures_join<F: std::future::Future<Output = Poll> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<Poll> {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or(Poll::Down));
    }
    out
}

async fn check(c: Arc<CacheState>, client: AdminClient, timeout: Duration) -> Poll {
    let Some(admin) = c.endpoint.admin else {
        let conn = tokio::net::TcpStream::connect(c.endpoint.address);
        return match tokio::time::timeout(timeout, conn).await {
            Ok(Ok(_)) => Poll::Up,
            Ok(Err(_)) => Poll::Down,
            Err(_) => Poll::Late,
        };
    };
    let https = c.endpoint.admin_https;
    let resp = client
        .endpoint_named(admin, https, c.endpoint.admin_name.as_deref())
        .request("GET", "/healthz", &[], b"", timeout)
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(vcdn_http::client::ClientError::Timeout(..)) => return Poll::Late,
        Err(e) => {
            // Said once, as the cache leaves rotation.
            if e.is_untrusted_certificate() && c.alive.load(Ordering::Relaxed) {
                tracing::warn!(cache = %c.endpoint.address, error = %e, "the cache's admin certificate is not trusted");
            }
            return Poll::Down;
        }
    };
    if resp.status() != 200 {
        return Poll::Down;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&resp.body) else {
        return Poll::Down;
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
    Poll::Up
}
