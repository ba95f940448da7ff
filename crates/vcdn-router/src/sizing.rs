//! Self-sizing LRU filters: when the operator gives no filter size, every
//! few seconds each filter is resized to the optimum of the paper's model
//! (`vcdn-model`) for the α and catalogue size N estimated online from the
//! service's requests and the edge's capacity in objects C2.
//!
//! The rule is `vcdn_policy::popularity::filter_size`, shared with the SRv6
//! agents.

use std::sync::Arc;
use std::time::Duration;

use vcdn_policy::popularity;

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
            for c in caches {
                let Some(filter) = &c.filter else { continue };
                let c2 = adm.cache_objects.or_else(|| c.state.capacity_objects());
                let Some(c2) = c2 else { continue };
                let size = popularity::filter_size(&pop, caches.len(), c2)
                    .clamp(1, 64 * INITIAL_FILTER_SIZE);
                let mut f = filter.lock();
                let now = f.capacity();
                if popularity::worth_resizing(now, size) {
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
