//! The server agent's user-space half: loads `bpf/agent.bpf.c`, pins its
//! programs for the routes (`route::agent`), and keeps its maps: the
//! chunk /64s served, the dispatchers trusted, the mode and size of the LRU
//! filter (changed live), and the counters. [`Sampler`] reads the chunk ids
//! of new connections that the kernel samples, so that the filter can size
//! itself from α and N estimated online ([`SelfSizing`]), as the router's
//! HTTP filters do.

use std::net::Ipv6Addr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType, Object, RingBuffer, RingBufferBuilder};
use vcdn_policy::popularity::{self, PopularityEstimator};

use crate::loader::{self, handle, sum_counters, Error};

#[cfg(vcdn_bpf)]
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/agent.bpf.o"));
#[cfg(not(vcdn_bpf))]
static OBJECT: &[u8] = &[];

/// The accept policy of new connections that have a server after this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// The paper's LRU filter of this many chunk ids (0: reject all).
    Lru(u32),
    /// Accept every connection (no filter; an origin's agent).
    AcceptAll,
}

impl Filter {
    fn mode(self) -> u32 {
        match self {
            Filter::Lru(0) => 2,
            Filter::Lru(_) => 0,
            Filter::AcceptAll => 1,
        }
    }
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This host's SID (the End.BPF route) and the source of the replies it
    /// steers through the dispatcher.
    pub sid: Ipv6Addr,
    /// The routing table whose route delivers chunk addresses locally
    /// (`route::agent` sets it up).
    pub table: u32,
    pub filter: Filter,
    /// Connections remembered (an LRU): for the SYN-ACK's way back through
    /// the dispatcher and for packets that hunt.
    pub conns: u32,
}

/// The agent's counters (sums over CPUs), in the program's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    pub accepted: u64,
    pub rejected: u64,
    pub last: u64,
    pub recovered: u64,
    pub passed: u64,
    pub retransmitted: u64,
    pub replies_steered: u64,
    pub not_tcp: u64,
    pub malformed: u64,
    pub unknown_prefix: u64,
    pub untrusted: u64,
    pub decap_failed: u64,
    pub samples_lost: u64,
    pub encap_failed: u64,
}

impl AgentStats {
    /// (name, help, value) for Prometheus.
    pub fn fields(&self) -> [(&'static str, &'static str, u64); 14] {
        [
            (
                "accepted",
                "new connections the LRU filter accepted",
                self.accepted,
            ),
            (
                "rejected",
                "new connections passed on to the next segment (the origin)",
                self.rejected,
            ),
            (
                "last",
                "packets accepted with no server left (origin, or steered here)",
                self.last,
            ),
            (
                "recovered",
                "hunting packets of a connection that lives here",
                self.recovered,
            ),
            (
                "passed",
                "hunting packets of a connection that does not",
                self.passed,
            ),
            (
                "retransmitted",
                "SYNs of a connection already accepted here",
                self.retransmitted,
            ),
            (
                "replies_steered",
                "SYN-ACKs sent through the dispatcher",
                self.replies_steered,
            ),
            ("not_tcp", "packets dropped: not TCP", self.not_tcp),
            (
                "malformed",
                "packets dropped: truncated or a malformed SRH",
                self.malformed,
            ),
            (
                "unknown_prefix",
                "packets dropped: inner destination not a served /64",
                self.unknown_prefix,
            ),
            (
                "untrusted",
                "packets dropped: not from a trusted dispatcher",
                self.untrusted,
            ),
            (
                "decap_failed",
                "packets dropped: the kernel refused End.DT6",
                self.decap_failed,
            ),
            (
                "samples_lost",
                "chunk ids the sample ring had no room for",
                self.samples_lost,
            ),
            (
                "encap_failed",
                "SYN-ACKs sent direct: the kernel refused the encapsulation",
                self.encap_failed,
            ),
        ]
    }
}

/// A loaded agent. Dropping it unpins the programs.
pub struct Agent {
    obj: Object,
    config: MapHandle,
    prefixes: MapHandle,
    dispatchers: MapHandle,
    slot: MapHandle,
    stats: MapHandle,
    conns: MapHandle,
    sid: Ipv6Addr,
    table: u32,
    state: Mutex<FilterState>,
}

struct FilterState {
    filter: Filter,
    /// The LRU map in the slot (kept open so it can be copied on resize).
    lru: Option<MapHandle>,
}

impl Agent {
    pub fn load(cfg: &AgentConfig) -> Result<Agent, Error> {
        let conns = cfg.conns.max(1);
        let obj = loader::load("agent", OBJECT, |open| {
            let mut m = open
                .maps_mut()
                .find(|m| m.name() == "conns")
                .ok_or_else(|| Error::map("conns", "not in the object"))?;
            m.set_max_entries(conns).map_err(|e| Error::map("conns", e))
        })?;
        let agent = Agent {
            config: handle(&obj, "config")?,
            prefixes: handle(&obj, "prefixes")?,
            dispatchers: handle(&obj, "dispatchers")?,
            slot: handle(&obj, "filter_slot")?,
            stats: handle(&obj, "stats")?,
            conns: handle(&obj, "conns")?,
            obj,
            sid: cfg.sid,
            table: cfg.table,
            state: Mutex::new(FilterState {
                filter: Filter::Lru(0),
                lru: None,
            }),
        };
        agent.set_filter(cfg.filter)?;
        Ok(agent)
    }

    /// How often each program ran and for how long (time only with
    /// `kernel.bpf_stats_enabled=1`).
    pub fn program_runs(&self) -> Vec<crate::ProgramRuns> {
        loader::program_runs(&self.obj)
    }

    /// Runs `f` with `agent` pinned (End.BPF on the host's SID): iproute2 attaches it by path.
    pub fn agent_program<T>(&self, f: impl FnOnce(&Path) -> Result<T, Error>) -> Result<T, Error> {
        loader::with_pinned(&self.obj, "agent", f)
    }

    /// Runs `f` with `steer_reply` pinned (lwt_xmit on the route to clients): iproute2 attaches it by path.
    pub fn reply_program<T>(&self, f: impl FnOnce(&Path) -> Result<T, Error>) -> Result<T, Error> {
        loader::with_pinned(&self.obj, "steer_reply", f)
    }

    pub fn sid(&self) -> Ipv6Addr {
        self.sid
    }

    /// Accepts connections to chunk addresses of `prefix`'s /64.
    pub fn serve_prefix(&self, prefix: Ipv6Addr) -> Result<(), Error> {
        self.prefixes
            .update(
                &crate::upper64(prefix).to_ne_bytes(),
                &1u32.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| Error::map("prefixes", e))
    }

    /// Accepts encapsulated packets from `dispatcher`'s /64.
    pub fn trust_dispatcher(&self, dispatcher: Ipv6Addr) -> Result<(), Error> {
        self.dispatchers
            .update(
                &crate::upper64(dispatcher).to_ne_bytes(),
                &1u32.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| Error::map("dispatchers", e))
    }

    pub fn filter(&self) -> Filter {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).filter
    }

    /// Entries in the LRU filter now (walks it: for metrics and tests).
    pub fn filter_len(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.lru.as_ref().map_or(0, |m| m.keys().count())
    }

    /// Changes the accept policy while packets flow. A new LRU size swaps in
    /// a new map holding the most recently requested ids of the old one (as
    /// many as fit), so the filter keeps what it learnt; requests that
    /// arrive during the copy may be missed by the new map.
    pub fn set_filter(&self, filter: Filter) -> Result<(), Error> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Filter::Lru(size) = filter {
            if size > 0 && st.lru.as_ref().map(|m| m.max_entries()) != Some(size) {
                let new = new_lru(size)?;
                if let Some(old) = &st.lru {
                    copy_most_recent(old, &new, size as usize)?;
                }
                let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&new));
                self.slot
                    .update(
                        &0u32.to_ne_bytes(),
                        &(fd as u32).to_ne_bytes(),
                        MapFlags::ANY,
                    )
                    .map_err(|e| Error::map("filter_slot", e))?;
                st.lru = Some(new);
            }
        }
        let mut v = Vec::with_capacity(24);
        v.extend(self.sid.octets());
        v.extend(filter.mode().to_ne_bytes());
        v.extend(self.table.to_ne_bytes());
        self.config
            .update(&0u32.to_ne_bytes(), &v, MapFlags::ANY)
            .map_err(|e| Error::map("config", e))?;
        st.filter = filter;
        Ok(())
    }

    /// Connections remembered now (walks the table).
    pub fn conns(&self) -> usize {
        self.conns.keys().count()
    }

    pub fn stats(&self) -> Result<AgentStats, Error> {
        let c = sum_counters(&self.stats, 14)?;
        Ok(AgentStats {
            accepted: c[0],
            rejected: c[1],
            last: c[2],
            recovered: c[3],
            passed: c[4],
            retransmitted: c[5],
            replies_steered: c[6],
            not_tcp: c[7],
            malformed: c[8],
            unknown_prefix: c[9],
            untrusted: c[10],
            decap_failed: c[11],
            samples_lost: c[12],
            encap_failed: c[13],
        })
    }

    /// A reader of the chunk ids the kernel samples from new connections.
    pub fn sampler(&self) -> Result<Sampler, Error> {
        let map = handle(&self.obj, "samples")?;
        let got: Arc<Mutex<Vec<u64>>> = Arc::default();
        let sink = got.clone();
        let mut b = RingBufferBuilder::new();
        b.add(&map, move |data: &[u8]| {
            if let Ok(id) = data.try_into().map(u64::from_ne_bytes) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(id);
            }
            0
        })
        .map_err(|e| Error::map("samples", e))?;
        let ring = b.build().map_err(|e| Error::map("samples", e))?;
        Ok(Sampler { ring, got })
    }
}

fn new_lru(size: u32) -> Result<MapHandle, Error> {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    MapHandle::create(MapType::LruHash, Some("vcdn_filter"), 8, 8, size, &opts)
        .map_err(|e| Error::map("filter", e))
}

/// Copies the `n` most recently requested ids of `old` into `new`, oldest
/// first so that the newest end at the front of the new LRU.
fn copy_most_recent(old: &MapHandle, new: &MapHandle, n: usize) -> Result<(), Error> {
    let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
    for k in old.keys() {
        if let Ok(Some(v)) = old.lookup(&k, MapFlags::ANY) {
            let t = u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]));
            entries.push((t, k));
        }
    }
    entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
    entries.truncate(n);
    for (t, k) in entries.iter().rev() {
        new.update(k, &t.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| Error::map("filter", e))?;
    }
    Ok(())
}

/// Reads sampled chunk ids.
pub struct Sampler {
    ring: RingBuffer<'static>,
    got: Arc<Mutex<Vec<u64>>>,
}

impl Sampler {
    /// Waits up to `timeout` for samples and hands each to `f`.
    pub fn poll(&mut self, timeout: Duration, mut f: impl FnMut(u64)) -> Result<(), Error> {
        self.ring
            .poll(timeout)
            .map_err(|e| Error::map("samples", e))?;
        let ids = std::mem::take(&mut *self.got.lock().unwrap_or_else(|e| e.into_inner()));
        ids.into_iter().for_each(&mut f);
        Ok(())
    }
}

/// Sizes an agent's LRU filter from the popularity of the chunks it is
/// offered, by the router's rule (`vcdn_policy::popularity::filter_size`,
/// with the whole sampled stream as this edge's share).
pub struct SelfSizing {
    estimator: PopularityEstimator,
    /// The cache's capacity in chunks (C2).
    pub cache_objects: u64,
    /// Bounds of the filter's size.
    pub min: u32,
    pub max: u32,
}

impl SelfSizing {
    pub fn new(cache_objects: u64) -> SelfSizing {
        SelfSizing {
            estimator: PopularityEstimator::new(4096),
            cache_objects,
            min: 1,
            max: 1 << 22,
        }
    }

    pub fn observe(&mut self, id: u64) {
        self.estimator.observe(id);
    }

    /// The size the filter should have now, if it should change from
    /// `now`: `None` until α and N can be estimated, or when the change is
    /// within the estimates' jitter.
    pub fn decide(&self, now: Filter) -> Option<Filter> {
        let pop = self.estimator.estimate()?;
        let size = (popularity::filter_size(&pop, 1, self.cache_objects) as u64)
            .clamp(self.min as u64, self.max as u64) as u32;
        match now {
            Filter::Lru(n) if !popularity::worth_resizing(n as usize, size as usize) => None,
            _ => Some(Filter::Lru(size)),
        }
    }
}
