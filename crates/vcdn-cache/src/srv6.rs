//! The edge's SRv6 server agent, run by the cache itself (`srv6` in the
//! config): the content-aware data-plane paper's agent on the edge host.
//! The LRU filter decides in the kernel, on each new connection's SYN,
//! whether this cache serves the chunk or the SYN goes on to the next
//! segment (the origin); accepted connections are delivered to the chunk
//! listener (`chunk_listen`, in `chunk_netns` when the edge has its own
//! namespace). Run here, the agent's life is the cache's (a VIM starts,
//! heals and stops one process), and C2 is the cache's own capacity.

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

use vcdn_srv6::host::{HostAgent, HostConfig};
use vcdn_srv6::route::Netns;

use crate::config::CacheSrv6;
use crate::proxy::Cache;

/// Starts the agent for `cache`'s chunk prefixes.
pub fn start(cache: &Arc<Cache>, s: &CacheSrv6) -> Result<HostAgent, String> {
    let prefixes = cache
        .cfg
        .chunk_prefixes
        .iter()
        .map(|p| {
            let net = p.split('/').next().unwrap_or(p);
            net.parse::<Ipv6Addr>()
                .map_err(|e| format!("chunk prefix '{p}': {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if prefixes.is_empty() {
        return Err("srv6 needs chunk_prefixes: the agent delivers only chunk addresses".into());
    }
    let weak = Arc::downgrade(cache);
    HostAgent::start(HostConfig {
        sid: s.sid,
        prefixes,
        dispatchers: s.dispatchers.clone(),
        netns: cache
            .cfg
            .chunk_netns
            .as_deref()
            .map_or_else(Netns::current, Netns::named),
        device: s.device.clone(),
        clients: s.clients.clone(),
        table: s.table,
        filter: s.filter.parse()?,
        conns: s.conns,
        sizing_interval: Duration::from_millis(s.sizing_interval_ms),
        cache_objects: Box::new(move || weak.upgrade().and_then(|c| capacity_objects(&c))),
    })
    .map_err(|e| format!("srv6 agent: {e}"))
}

/// The cache's capacity in objects of its mean size (C2), as the router
/// computes it from `/healthz`; None while it holds nothing.
fn capacity_objects(cache: &Cache) -> Option<u64> {
    let (objects, bytes) = cache.store.memory_usage();
    if objects == 0 || bytes == 0 || cache.cfg.memory == 0 {
        return None;
    }
    Some((cache.cfg.memory as u128 * objects as u128 / bytes as u128) as u64)
}
