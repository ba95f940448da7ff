//! The dispatcher's user-space half: loads `bpf/dispatcher.bpf.c`, pins its
//! two programs for the routes (`route::dispatcher`), and keeps its maps:
//! the services (chunk /64 → origin and edge table), the edge tables
//! (rendezvous winners per bucket, `vcdn_policy::hashing::bucket_table`),
//! the servers allowed to teach it, and its counters.

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::path::Path;
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object};

use crate::loader::{self, handle, sum_counters, Error};

#[cfg(vcdn_bpf)]
pub(crate) static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dispatcher.bpf.o"));
#[cfg(not(vcdn_bpf))]
pub(crate) static OBJECT: &[u8] = &[];

/// Buckets per service table: `BUCKETS` in the program.
pub const BUCKETS: usize = 1024;
/// Services one dispatcher holds: `MAX_SERVICES` in the program.
pub const MAX_SERVICES: usize = 64;

/// What the loader may tune.
#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Learnt connections kept at most (an LRU: the oldest go first).
    pub flows: u32,
    /// A learnt connection idle this long is forgotten (6LB: 40 s).
    pub idle: Duration,
    /// After the client's FIN.
    pub closing: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            flows: 65_536,
            idle: Duration::from_secs(40),
            closing: Duration::from_secs(5),
        }
    }
}

/// The dispatcher's counters (sums over CPUs), in the program's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatcherStats {
    pub candidates: u64,
    pub steered: u64,
    pub origin_only: u64,
    pub learnt: u64,
    pub conflicts: u64,
    pub not_tcp: u64,
    pub malformed: u64,
    pub unknown_prefix: u64,
    pub unknown_server: u64,
    pub encap_failed: u64,
    pub decap_failed: u64,
    pub flows_expired: u64,
}

impl DispatcherStats {
    /// (name, help, value) for Prometheus.
    pub fn fields(&self) -> [(&'static str, &'static str, u64); 12] {
        [
            (
                "candidates",
                "packets sent down the candidate list (edge, origin)",
                self.candidates,
            ),
            (
                "steered",
                "packets sent straight to the server that accepted",
                self.steered,
            ),
            (
                "origin_only",
                "candidate lists without a live edge",
                self.origin_only,
            ),
            (
                "learnt",
                "connections learnt from an accepting server's SYN-ACK",
                self.learnt,
            ),
            (
                "conflicts",
                "SYN-ACKs of a second server for a learnt connection, dropped",
                self.conflicts,
            ),
            ("not_tcp", "packets dropped: not TCP", self.not_tcp),
            (
                "malformed",
                "packets dropped: truncated or a malformed SRH",
                self.malformed,
            ),
            (
                "unknown_prefix",
                "packets dropped: no service has the /64",
                self.unknown_prefix,
            ),
            (
                "unknown_server",
                "replies dropped: from no known server",
                self.unknown_server,
            ),
            (
                "encap_failed",
                "packets dropped: the kernel refused the encapsulation",
                self.encap_failed,
            ),
            (
                "decap_failed",
                "replies dropped: the kernel refused the decapsulation",
                self.decap_failed,
            ),
            (
                "flows_expired",
                "learnt connections forgotten after their idle time",
                self.flows_expired,
            ),
        ]
    }
}

struct Service {
    index: u32,
}

/// A loaded dispatcher. Dropping it unpins the programs; routes that still
/// name them keep them until the routes go.
pub struct Dispatcher {
    obj: Object,
    services: MapHandle,
    buckets: MapHandle,
    servers: MapHandle,
    flows: MapHandle,
    stats: MapHandle,
    by_prefix: HashMap<u64, Service>,
}

impl Dispatcher {
    pub fn load(cfg: &DispatcherConfig) -> Result<Dispatcher, Error> {
        let flows = cfg.flows.max(1);
        let obj = loader::load("dispatcher", OBJECT, |open| {
            let mut m = open
                .maps_mut()
                .find(|m| m.name() == "flows")
                .ok_or_else(|| Error::map("flows", "not in the object"))?;
            m.set_max_entries(flows).map_err(|e| Error::map("flows", e))
        })?;
        let d = Dispatcher {
            services: handle(&obj, "services")?,
            buckets: handle(&obj, "buckets")?,
            servers: handle(&obj, "servers")?,
            flows: handle(&obj, "flows")?,
            stats: handle(&obj, "stats")?,
            obj,
            by_prefix: HashMap::new(),
        };
        let config = handle(&d.obj, "config")?;
        let mut v = Vec::with_capacity(16);
        v.extend((cfg.idle.as_nanos() as u64).to_ne_bytes());
        v.extend((cfg.closing.as_nanos() as u64).to_ne_bytes());
        config
            .update(&0u32.to_ne_bytes(), &v, MapFlags::ANY)
            .map_err(|e| Error::map("config", e))?;
        Ok(d)
    }

    /// How often each program ran and for how long (time only with
    /// `kernel.bpf_stats_enabled=1`).
    pub fn program_runs(&self) -> Vec<crate::ProgramRuns> {
        loader::program_runs(&self.obj)
    }

    /// Runs `f` with `dispatch` pinned (lwt_in on the services' /64 routes): iproute2 attaches it by path.
    pub fn dispatch_program<T>(
        &self,
        f: impl FnOnce(&Path) -> Result<T, Error>,
    ) -> Result<T, Error> {
        loader::with_pinned(&self.obj, "dispatch", f)
    }

    /// Runs `f` with `learn` pinned (End.BPF on the dispatcher's SID): iproute2 attaches it by path.
    pub fn learn_program<T>(&self, f: impl FnOnce(&Path) -> Result<T, Error>) -> Result<T, Error> {
        loader::with_pinned(&self.obj, "learn", f)
    }

    /// Serves chunk addresses in `prefix`'s /64: candidates are the live
    /// `edges` (SIDs; rendezvous-hashed by chunk id) then `origin`. Call
    /// again whenever the live edges change; an empty list sends every new
    /// connection to the origin.
    pub fn set_service(
        &mut self,
        prefix: Ipv6Addr,
        origin: Ipv6Addr,
        edges: &[Ipv6Addr],
    ) -> Result<(), Error> {
        let key = crate::upper64(prefix);
        let index = match self.by_prefix.get(&key) {
            Some(s) => s.index,
            None => {
                let used: Vec<u32> = self.by_prefix.values().map(|s| s.index).collect();
                (0..MAX_SERVICES as u32)
                    .find(|i| !used.contains(i))
                    .ok_or_else(|| {
                        Error::map("services", format!("full ({MAX_SERVICES} services)"))
                    })?
            }
        };
        let names: Vec<String> = edges.iter().map(|e| e.to_string()).collect();
        let table = vcdn_policy::hashing::bucket_table(&names, BUCKETS);
        for (b, &winner) in table.iter().enumerate() {
            let slot = index * BUCKETS as u32 + b as u32;
            self.buckets
                .update(&slot.to_ne_bytes(), &edges[winner].octets(), MapFlags::ANY)
                .map_err(|e| Error::map("buckets", e))?;
        }
        let mut v = Vec::with_capacity(24);
        v.extend(index.to_ne_bytes());
        v.extend((edges.len() as u32).to_ne_bytes());
        v.extend(origin.octets());
        self.services
            .update(&key.to_ne_bytes(), &v, MapFlags::ANY)
            .map_err(|e| Error::map("services", e))?;
        self.by_prefix.insert(key, Service { index });
        for s in edges.iter().chain([&origin]) {
            self.allow_server(*s)?;
        }
        Ok(())
    }

    /// Stops serving `prefix`: its packets are dropped and counted.
    pub fn remove_service(&mut self, prefix: Ipv6Addr) -> Result<(), Error> {
        let key = crate::upper64(prefix);
        if self.by_prefix.remove(&key).is_some() {
            self.services
                .delete(&key.to_ne_bytes())
                .map_err(|e| Error::map("services", e))?;
        }
        Ok(())
    }

    /// Lets replies from `server`'s /64 teach the dispatcher.
    pub fn allow_server(&self, server: Ipv6Addr) -> Result<(), Error> {
        self.servers
            .update(
                &crate::upper64(server).to_ne_bytes(),
                &1u32.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| Error::map("servers", e))
    }

    /// Learnt connections held now (walks the table: for metrics and tests,
    /// not per packet).
    pub fn flows(&self) -> usize {
        self.flows.keys().count()
    }

    /// The capacity of the flow table.
    pub fn flow_capacity(&self) -> u32 {
        self.flows.max_entries()
    }

    pub fn stats(&self) -> Result<DispatcherStats, Error> {
        let c = sum_counters(&self.stats, 12)?;
        Ok(DispatcherStats {
            candidates: c[0],
            steered: c[1],
            origin_only: c[2],
            learnt: c[3],
            conflicts: c[4],
            not_tcp: c[5],
            malformed: c[6],
            unknown_prefix: c[7],
            unknown_server: c[8],
            encap_failed: c[9],
            decap_failed: c[10],
            flows_expired: c[11],
        })
    }
}
