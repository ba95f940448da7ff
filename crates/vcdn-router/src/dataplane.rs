//! The router as the SRv6 dispatcher (the content-aware data-plane paper's
//! third and fastest form of routing, `vcdn-srv6`): connections to a
//! service's chunk /64 are dispatched in the kernel, on their SYN, to a
//! candidate edge then the origin; no DNS answer or redirect is involved.
//!
//! This module keeps the kernel's view in step with the router's: every
//! 100 ms, each SRv6 service's candidates are its caches (of the
//! dispatcher's region, when one is set) that health checks find available
//! and that have an agent SID. A cache that dies leaves the candidates
//! within the health check's detection time, so a new connection whose SYN
//! was lost with it goes to the origin on the client's retransmission.

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vcdn_srv6::dispatcher::{Dispatcher, DispatcherConfig, DispatcherStats};
use vcdn_srv6::route::{self, Netns, Routes};

use crate::config::Srv6Config;
use crate::state::Router;

/// Where the dispatcher's routes go.
fn netns(cfg: &Srv6Config) -> Netns {
    cfg.netns
        .as_deref()
        .map_or_else(Netns::current, Netns::named)
}

/// The loaded dispatcher, its routes, and what it was last told.
pub struct DataPlane {
    cfg: Srv6Config,
    inner: Mutex<Inner>,
}

struct Inner {
    // Routes before the programs they name.
    prefixes: HashMap<Ipv6Addr, (Routes, Vec<Ipv6Addr>)>,
    _own: Routes,
    dispatcher: Dispatcher,
}

impl DataPlane {
    /// Loads the dispatcher and routes its SID; fails with what the machine
    /// lacks (root, clang at build time, SRv6 in the kernel).
    pub fn start(cfg: Srv6Config) -> Result<Arc<DataPlane>, String> {
        vcdn_srv6::probe().map_err(|e| format!("srv6: {e}"))?;
        let dispatcher = Dispatcher::load(&DispatcherConfig {
            flows: cfg.flows,
            idle: Duration::from_secs(cfg.idle_s),
            ..DispatcherConfig::default()
        })
        .map_err(|e| format!("srv6: {e}"))?;
        let own = route::dispatcher(&netns(&cfg), &dispatcher, cfg.sid, &cfg.device)
            .map_err(|e| format!("srv6: {e}"))?;
        Ok(Arc::new(DataPlane {
            cfg,
            inner: Mutex::new(Inner {
                prefixes: HashMap::new(),
                _own: own,
                dispatcher,
            }),
        }))
    }

    /// Brings the kernel's services and candidates in line with the
    /// router's snapshot and health.
    pub fn sync(&self, router: &Router) {
        let snap = router.snapshot();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut wanted = HashMap::new();
        for svc in &snap.services {
            let Some(v) = &svc.config.srv6 else { continue };
            let mut sids: Vec<Ipv6Addr> = svc
                .regions
                .iter()
                .filter(|(r, _)| {
                    self.cfg
                        .region
                        .as_deref()
                        .is_none_or(|want| snap.regions[*r].name == want)
                })
                .flat_map(|(_, caches)| caches.iter())
                .filter(|c| c.state.is_available())
                .filter_map(|c| c.state.endpoint.sid)
                .collect();
            sids.sort();
            sids.dedup();
            wanted.insert(v.prefix, (v.origin_sid, sids));
        }
        let gone: Vec<Ipv6Addr> = inner
            .prefixes
            .keys()
            .filter(|p| !wanted.contains_key(p))
            .copied()
            .collect();
        for p in gone {
            if let Err(e) = inner.dispatcher.remove_service(p) {
                tracing::warn!(prefix = %p, error = %e, "srv6: cannot remove a service");
            }
            inner.prefixes.remove(&p);
        }
        for (prefix, (origin, sids)) in wanted {
            if inner
                .prefixes
                .get(&prefix)
                .is_some_and(|(_, now)| *now == sids)
            {
                continue;
            }
            if let Err(e) = inner.dispatcher.set_service(prefix, origin, &sids) {
                tracing::warn!(prefix = %prefix, error = %e, "srv6: cannot set a service");
                continue;
            }
            tracing::info!(prefix = %prefix, origin = %origin, edges = ?sids, "srv6: candidates");
            match inner.prefixes.remove(&prefix) {
                Some((routes, _)) => {
                    inner.prefixes.insert(prefix, (routes, sids));
                }
                None => match route::dispatched_prefix(
                    &netns(&self.cfg),
                    &inner.dispatcher,
                    prefix,
                    &self.cfg.device,
                ) {
                    Ok(routes) => {
                        inner.prefixes.insert(prefix, (routes, sids));
                    }
                    Err(e) => {
                        tracing::warn!(prefix = %prefix, error = %e, "srv6: cannot route a service's prefix");
                    }
                },
            }
        }
    }

    pub fn stats(&self) -> Option<DataPlaneStats> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Some(DataPlaneStats {
            counters: inner.dispatcher.stats().ok()?,
            flows: inner.dispatcher.flows(),
            flow_capacity: inner.dispatcher.flow_capacity(),
            programs: inner.dispatcher.program_runs(),
        })
    }
}

/// What `/metrics` shows of the dispatcher.
pub struct DataPlaneStats {
    pub counters: DispatcherStats,
    /// Learnt connections held now, and at most.
    pub flows: usize,
    pub flow_capacity: u32,
    pub programs: Vec<vcdn_srv6::ProgramRuns>,
}

/// Syncs every 100 ms, forever.
pub async fn run(router: Arc<Router>, dp: Arc<DataPlane>) {
    loop {
        let (r, d) = (router.clone(), dp.clone());
        let _ = tokio::task::spawn_blocking(move || d.sync(&r)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
