//! Self-sizing LRU filters: when the operator gives no filter size, every
//! few seconds each filter is resized to the optimum of the paper's model
//! (`vcdn-model`) for the α and catalogue size N estimated online from the
//! service's requests and the edge's capacity in objects C2.
//!
//! Rendezvous hashing splits a region's content over its k caches, so each
//! cache sees a Zipf stream with the same α over about N/k objects: its
//! filter gets δ1*(α, δ2 = C2·k/N) · N/k identifiers.

use std::sync::Arc;
use std::time::Duration;

use crate::config::FilterKind;
use crate::state::{Router, INITIAL_FILTER_SIZE};

/// Resizes the filters every `every`, forever.
pub async fn run(router: Arc<Router>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        resize_all(&router);
    }
}

/// One sizing pass over every self-sized filter.
pub fn resize_all(router: &Router) {
    let snap = router.snapshot();
    for svc in &snap.services {
        let adm = &svc.config.admission;
        if adm.filter != FilterKind::Lru || adm.size.is_some() {
            continue;
        }
        let Some(pop) = svc.popularity.lock().estimate() else {
            continue;
        };
        for (_, caches) in &svc.regions {
            let k = caches.len().max(1) as f64;
            for c in caches {
                let Some(filter) = &c.filter else { continue };
                let c2 = adm.cache_objects.or_else(|| c.state.capacity_objects());
                let Some(c2) = c2 else { continue };
                let share = (pop.catalogue / k).max(1.0);
                let size = vcdn_model::filter::filter_capacity(pop.alpha, share, c2 as f64)
                    .clamp(1, 64 * INITIAL_FILTER_SIZE);
                let mut f = filter.lock();
                let now = f.capacity();
                // Hysteresis: ignore changes under 5 % (estimates jitter).
                if (size as f64 - now as f64).abs() > 0.05 * now as f64 {
                    tracing::info!(
                        service = %svc.config.name, cache = %c.key, alpha = pop.alpha,
                        catalogue = pop.catalogue, cache_objects = c2, from = now, to = size,
                        "resizing LRU filter"
                    );
                    f.resize(size);
                }
            }
        }
    }
}
