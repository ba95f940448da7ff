//! A server agent at work on its host: loaded, trusted dispatchers and
//! served prefixes set, routed ([`route::agent`]), and, with
//! [`FilterChoice::Auto`], its LRU filter re-sized from the chunk ids the
//! kernel samples (α and N estimated online, C2 from the local cache). The
//! same whether it runs alone (`vcdn srv6-agent`, in front of any HTTP
//! server) or inside the edge's cache (`vcdn cache --srv6-sid`).

use std::fmt::Write as _;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{Agent, AgentConfig, Filter, SelfSizing};
use crate::loader::Error;
use crate::route::{self, Netns, Routes};

/// How the filter is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterChoice {
    /// Sized by [`SelfSizing`] from the offered chunks and C2.
    Auto,
    /// Accept every connection: the origin's agent, or a last candidate.
    None,
    /// A fixed size (0 rejects every connection that has a server after
    /// this one).
    Fixed(u32),
}

impl std::str::FromStr for FilterChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(FilterChoice::Auto),
            "none" => Ok(FilterChoice::None),
            n => n
                .parse()
                .map(FilterChoice::Fixed)
                .map_err(|_| format!("filter '{n}': give auto, none or a size")),
        }
    }
}

/// The size an auto filter starts with, before estimates exist (the
/// router's HTTP filters' initial size).
pub const INITIAL_FILTER: u32 = 100_000;

/// What a host agent is given.
pub struct HostConfig {
    pub sid: Ipv6Addr,
    pub prefixes: Vec<Ipv6Addr>,
    pub dispatchers: Vec<Ipv6Addr>,
    /// The namespace its routes go in (the programs are the kernel's).
    pub netns: Netns,
    /// The device the SID is reached by and clients are answered by.
    pub device: String,
    /// The route to clients that gets the reply program (`::/0`, or
    /// `::/0 via ADDR`).
    pub clients: String,
    /// Routing table of the local delivery hairpin.
    pub table: u32,
    pub filter: FilterChoice,
    /// Connections remembered.
    pub conns: u32,
    pub sizing_interval: Duration,
    /// The local cache's capacity in objects (C2), asked at each sizing;
    /// None while it is not known.
    pub cache_objects: Box<dyn Fn() -> Option<u64> + Send>,
}

/// A running agent; dropping it stops the sizing and removes its routes.
pub struct HostAgent {
    agent: Arc<Agent>,
    stop: Arc<AtomicBool>,
    // Routes before the programs they name (fields drop in order).
    _routes: Routes,
}

impl HostAgent {
    /// Loads, routes and starts sizing; fails with what the kernel or the
    /// machine lacks (see [`crate::probe`]).
    pub fn start(cfg: HostConfig) -> Result<HostAgent, Error> {
        crate::probe()?;
        let filter = match cfg.filter {
            FilterChoice::Auto => Filter::Lru(INITIAL_FILTER),
            FilterChoice::None => Filter::AcceptAll,
            FilterChoice::Fixed(n) => Filter::Lru(n),
        };
        let agent = Agent::load(&AgentConfig {
            sid: cfg.sid,
            table: cfg.table,
            filter,
            conns: cfg.conns,
        })?;
        for p in &cfg.prefixes {
            agent.serve_prefix(*p)?;
        }
        for d in &cfg.dispatchers {
            agent.trust_dispatcher(*d)?;
        }
        let routes = route::agent(
            &cfg.netns,
            &agent,
            cfg.table,
            &cfg.prefixes,
            &cfg.device,
            &cfg.clients,
        )?;
        let agent = Arc::new(agent);
        let stop = Arc::new(AtomicBool::new(false));
        if cfg.filter == FilterChoice::Auto {
            let sampler = agent.sampler()?;
            let (agent, stop) = (agent.clone(), stop.clone());
            let every = cfg.sizing_interval.max(Duration::from_millis(10));
            let c2 = cfg.cache_objects;
            std::thread::Builder::new()
                .name("srv6-sizing".into())
                .spawn(move || size_loop(&agent, sampler, every, &*c2, &stop))
                .map_err(|e| Error::io("start the sizing thread", e))?;
        }
        Ok(HostAgent {
            agent,
            stop,
            _routes: routes,
        })
    }

    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The agent's counters, filter size and connections in Prometheus
    /// text, each name prefixed with `prefix` (e.g. `vcdn_srv6_agent`).
    pub fn metrics(&self, o: &mut String, prefix: &str) {
        let a = &self.agent;
        if let Ok(s) = a.stats() {
            for (name, help, v) in s.fields() {
                let _ = writeln!(o, "# HELP {prefix}_{name}_total {help}.");
                let _ = writeln!(o, "# TYPE {prefix}_{name}_total counter");
                let _ = writeln!(o, "{prefix}_{name}_total {v}");
            }
        }
        let size = match a.filter() {
            Filter::Lru(n) => n as i64,
            Filter::AcceptAll => -1,
        };
        let _ = writeln!(
            o,
            "# HELP {prefix}_filter_size Capacity of the LRU filter in chunk ids (-1: no filter).\n\
             # TYPE {prefix}_filter_size gauge\n{prefix}_filter_size {size}\n\
             # HELP {prefix}_filter_entries Chunk ids in the LRU filter.\n\
             # TYPE {prefix}_filter_entries gauge\n{prefix}_filter_entries {}",
            a.filter_len()
        );
        crate::render_program_runs(o, prefix, &a.program_runs());
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        // Not joined: the last owner may be the sizing thread itself (it
        // holds what gives C2 for a moment); it ends at its next poll.
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn size_loop(
    agent: &Agent,
    mut sampler: crate::agent::Sampler,
    every: Duration,
    cache_objects: &(dyn Fn() -> Option<u64> + Send),
    stop: &AtomicBool,
) {
    let mut sizing = SelfSizing::new(0);
    let mut next = Instant::now() + every;
    while !stop.load(Ordering::Relaxed) {
        let _ = sampler.poll(Duration::from_millis(100), |id| sizing.observe(id));
        if Instant::now() < next {
            continue;
        }
        next = Instant::now() + every;
        if let Some(c2) = cache_objects() {
            sizing.cache_objects = c2;
        }
        if sizing.cache_objects == 0 {
            continue;
        }
        if let Some(f) = sizing.decide(agent.filter()) {
            tracing::info!(from = ?agent.filter(), to = ?f, "resizing the SRv6 LRU filter");
            if let Err(e) = agent.set_filter(f) {
                tracing::warn!(error = %e, "cannot resize the filter");
            }
        }
    }
}
