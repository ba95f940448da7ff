//! The discrete-event, fluid flow-level simulation of live video over an
//! AS graph with edge caches (CDNSim's model, MiniCache paper §3).
//!
//! Time is integer nanoseconds; between two events every flow's rate is
//! constant, so the next event of a player (playback starts, the buffer
//! runs dry, the download completes, playback ends) has a closed form and
//! no flow is polled. Events are kept in a binary heap ordered by (time,
//! sequence) with lazy deletion: an entity's event carries its generation
//! and is dropped when the entity has moved on.
//!
//! A session is one viewer of one channel at one quality. It is served by
//! a cache (a VM for its channel in its own access AS) or by the origin.
//! Its flow is capped by the user's line while it fills its buffer and by
//! the codec rate (and the cache's own upstream rate) once it plays, as
//! a player at the live edge. A VM fetches each quality it serves from
//! the origin over one upstream flow and lets viewers start once it holds
//! `buffer_s` of video.

use std::collections::{BinaryHeap, HashMap};

use vcdn_policy::autoscale::{Autoscaler, Decision, Trend};

use crate::cache::{Served, VodCache};
use crate::graph::{AsGraph, Capacities, Role, Routes};
use crate::qoe::{Peaks, SessionQoe};
use crate::share::{FlowId, Mode, Sharing};
use crate::workload::{Request, Requests, Workload};

/// What happens to requests while their cache boots: the original code
/// makes them wait; the paper says they go to the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootSemantics {
    #[default]
    Wait,
    Origin,
}

/// Where caches run and how they start and stop.
#[derive(Debug, Clone, PartialEq)]
pub struct CachePolicy {
    /// Start a VM for (AS, channel) on demand.
    pub on_demand: bool,
    /// Share of access ASes (the heaviest first) with static caches: a VM
    /// for every channel, always ready.
    pub static_share: f64,
    /// Requests for (AS, channel) that start its VM (those before it go
    /// to the origin).
    pub start_threshold: u32,
    /// Boot time of an on-demand VM (ns).
    pub boot_ns: u64,
    pub boot: BootSemantics,
    /// Keep an idle on-demand VM this long before tearing it down (ns;
    /// 0: at once, as the original).
    pub idle_ns: u64,
    /// vcdn's own model instead of the paper's VM per (AS, channel): see
    /// [`Sites`]. When set, `on_demand` and `static_share` are unused.
    pub sites: Option<Sites>,
    /// Sites mode: every site's VoD store and admission filter.
    pub vod: Option<VodPolicy>,
}

/// A site's VoD cache: a store of `cache_titles` titles behind vcdn's LRU
/// admission filter of `filter_titles` identifiers (`None`: no filter).
/// VoD requests while the site boots go to the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VodPolicy {
    pub cache_titles: usize,
    pub filter_titles: Option<usize>,
}

/// vcdn's cache sites: the instances of one vCDN in one access AS serve
/// every channel together, and how many run is decided by `vcdn-policy`
/// (dimensioning ahead of time, or the autoscaler from the measured load),
/// as the control plane decides it live. A site is one more link that
/// its viewers' flows cross, of capacity `ready instances ×
/// per_instance_bps`, so an under-provisioned site shows up as slower
/// downloads and stalls. A site still fetches each channel it serves from
/// the origin once (the per-channel VMs of the engine become the site's
/// channel feeds, which boot with the site).
#[derive(Debug, Clone, PartialEq)]
pub struct Sites {
    /// What one instance serves at the quality target (bit/s): the
    /// dimensioning's sessions per vCPU × vCPUs per instance × bitrate,
    /// the unit of the autoscaler's load.
    pub per_instance_bps: f64,
    /// What one instance can send (bit/s), shared by its viewers' flows:
    /// `per_instance_bps` when the quality target is where the instance
    /// saturates, more when it serves bursts faster than that (a cache on
    /// a fast network starts a player at far more than its bitrate).
    pub instance_link_bps: f64,
    pub scaling: Scaling,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Scaling {
    /// Sized ahead of time and always running: instances per access AS
    /// (graph node), as an operator provisions from a forecast. ASes not
    /// listed have no site and are served by the origin.
    Fixed(HashMap<u32, u32>),
    /// Started on demand (the cache policy's threshold and boot time),
    /// sized by vcdn's autoscaler every `every_ns` from the site's demand
    /// (Σ bitrates of its viewers), between `min` and `max` instances, and
    /// stopped after the cache policy's idle time without viewers.
    Autoscaled {
        autoscaler: Autoscaler,
        every_ns: u64,
        /// Decisions fall at `phase_ns + k × every_ns`, k ≥ 1 (a live
        /// supervisor's clock has its own phase against the viewers').
        phase_ns: u64,
        min: u32,
        max: u32,
    },
}

impl Default for CachePolicy {
    /// The original's defaults: no caches unless asked, boot 0.1 s,
    /// threshold 1, requests wait.
    fn default() -> Self {
        CachePolicy {
            on_demand: false,
            static_share: 0.0,
            start_threshold: 1,
            boot_ns: 100_000_000,
            boot: BootSemantics::Wait,
            idle_ns: 0,
            sites: None,
            vod: None,
        }
    }
}

/// The mean concurrent viewers of every access AS the origin reaches
/// (graph node, viewers), by Little's law over the whole workload (rate
/// × mean session length) split by the ASes' weights: the forecast an
/// operator sizes fixed sites from.
pub fn expected_viewers(graph: &AsGraph, cfg: &Config) -> Vec<(u32, f64)> {
    let origin = cfg.origin.unwrap_or_else(|| graph.default_origin());
    let routes = graph.routes(origin, cfg.valley_free);
    let access: Vec<(u32, f64)> = (0..graph.len() as u32)
        .filter(|&i| graph.nodes[i as usize].role == Role::Access && routes.reaches(i))
        .map(|i| (i, graph.nodes[i as usize].weight))
        .collect();
    let total: f64 = access.iter().map(|a| a.1).sum();
    let concurrent = cfg.workload.rate * cfg.workload.mean_session_s();
    access
        .into_iter()
        .map(|(i, w)| (i, concurrent * w / total.max(f64::MIN_POSITIVE)))
        .collect()
}

/// Everything a run needs besides its graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub workload: Workload,
    pub caches: CachePolicy,
    pub capacities: Capacities,
    /// Delay per AS hop, paid once when a flow starts (ns).
    pub hop_delay_ns: u64,
    /// Seconds of video a player (and a cache) buffers before playing.
    pub buffer_s: f64,
    pub sharing: Mode,
    /// Settle rates once per epoch instead of after every instant (ns;
    /// 0: exact).
    pub epoch_ns: u64,
    /// How often a flow picks up freed capacity in the local-fair-share
    /// mode (the original: 1 s).
    pub expand_ns: u64,
    pub valley_free: bool,
    /// Origin AS (index); default: the content AS of highest degree.
    pub origin: Option<u32>,
    pub seed: u64,
    /// Stop at this simulated time even if sessions remain (ns).
    pub until_ns: Option<u64>,
    /// Sample the timeline this often (ns; 0: never).
    pub sample_ns: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workload: Workload::paper(),
            caches: CachePolicy::default(),
            capacities: Capacities::default(),
            hop_delay_ns: 10_000_000,
            buffer_s: 10.0,
            sharing: Mode::MaxMin,
            epoch_ns: 0,
            expand_ns: 1_000_000_000,
            valley_free: false,
            origin: None,
            seed: 1,
            until_ns: None,
            sample_ns: 10_000_000_000,
        }
    }
}

/// A cap for flows nothing but links limit (an upstream before it is
/// live): finite, so sums of caps stay exact enough.
const UNCAPPED: f64 = 1e13;

type SessionId = u32;
type VmId = u32;
type UpId = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Origin,
    Vm(VmId),
    /// A site's VoD store (access index); on a miss the bytes come from
    /// the origin through it.
    Site(u32, Served),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// For a booting VM or an upstream that is not live yet.
    Waiting,
    /// Connecting (hop delay), no flow yet.
    Connecting,
    /// Filling the buffer (start-up or after a stall), not playing.
    Buffering,
    Playing,
    Done,
}

#[derive(Debug, Clone)]
struct Session {
    access: u32,
    channel: u32,
    quality: u8,
    v: f64,
    total: f64,
    request_ns: u64,
    server: Server,
    phase: Phase,
    flow: Option<FlowId>,
    rate: f64,
    t0: u64,
    downloaded: f64,
    played: f64,
    gen: u32,
    first_play_ns: Option<u64>,
    buffering_ns: u64,
    playing_ns: u64,
    download_ns: u64,
    stalls: u32,
    /// Position in its upstream's viewer list.
    up_slot: u32,
    /// The request's number (requests are numbered as they arrive).
    id: u64,
    title: Option<u32>,
    vod: Option<Served>,
    /// The booting VM this origin-served session keeps up (the paper's
    /// boot semantics): the VM stays while its channel has viewers in the
    /// AS, whichever server they use.
    holds: Option<VmId>,
}

#[derive(Debug, Clone)]
struct Vm {
    access: u32,
    channel: u32,
    ready: bool,
    fixed: bool,
    /// Sessions attached (waiting or served).
    viewers: u32,
    waiting: Vec<SessionId>,
    upstreams: Vec<Option<UpId>>,
    gen: u32,
    /// Sum of its viewers' rates, and the peaks.
    rate: f64,
    peak_rate: f64,
    peak_viewers: u32,
    born_ns: u64,
}

#[derive(Debug, Clone)]
struct Upstream {
    vm: VmId,
    quality: u8,
    v: f64,
    flow: Option<FlowId>,
    rate: f64,
    t0: u64,
    downloaded: f64,
    live: bool,
    gen: u32,
    /// Viewers waiting for it to go live.
    waiting: Vec<SessionId>,
    /// Viewers it feeds (their caps follow its rate).
    viewers: Vec<SessionId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The next request of the workload.
    Arrival,
    /// A session's connection is up: its flow starts.
    Connect(SessionId),
    /// A session's next playback milestone.
    Session(SessionId, u32),
    /// An upstream's connection is up.
    UpConnect(UpId),
    /// An upstream has buffered enough to go live.
    UpLive(UpId, u32),
    VmReady(VmId, u32),
    VmIdle(VmId, u32),
    /// Instances of a site (access index, how many) finished booting.
    InstancesReady(u32, u32, u32),
    /// A site without viewers for the idle time stops.
    SiteIdle(u32, u32),
    /// The autoscaler looks at every running site.
    Scale,
    /// Local-fair-share mode: a flow picks up freed capacity.
    Expand(FlowId, u32),
    /// Rates are settled (epoch mode).
    Epoch,
    /// A timeline sample.
    Sample,
}

#[derive(Debug, PartialEq, Eq)]
struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    None,
    Session(SessionId),
    Upstream(UpId),
}

/// Progress of a run, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub now_ns: u64,
    pub sessions_started: u64,
    pub sessions_done: u64,
    pub active_flows: usize,
    pub events: u64,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub sessions: Vec<SessionQoe>,
    pub peaks: Peaks,
    /// Per VM: (access AS, channel, peak bit/s, peak viewers, lifetime ns).
    pub vms: Vec<(u32, u32, f64, u32, u64)>,
    pub events: u64,
    pub end_ns: u64,
    /// Flows visited by water filling (the sharing's work).
    pub filled_flows: u64,
    /// Sessions still running at `until`.
    pub unfinished: u64,
    /// VM-seconds of on-demand and static VMs.
    pub vm_seconds: f64,
    pub max_active_flows: usize,
    /// Every `sample_ns`: what was running.
    pub timeline: Vec<Sample>,
}

/// What was running at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at_ns: u64,
    /// Sessions requested and not finished.
    pub sessions: u64,
    pub flows: usize,
    pub vms: usize,
    /// Σ rates of viewers' flows (bit/s).
    pub viewer_bps: f64,
    /// Sites mode: Σ bitrates of the sites' viewers, the load the
    /// autoscaler sees (bit/s).
    pub site_demand_bps: f64,
}

/// One access AS's cache site (sites mode).
#[derive(Debug, Clone, Default)]
struct Site {
    active: bool,
    ready: u32,
    booting: u32,
    /// Sessions its channel feeds count (waiting, held or attached).
    viewers: u32,
    /// Σ bitrates of those sessions: the autoscaler's load.
    demand_bps: f64,
    trend: Trend,
    gen: u32,
    requests: u32,
    vod: Option<Box<VodCache>>,
    /// Since when `ready + booting` has not changed (for instance-seconds).
    since_ns: u64,
}

/// One simulation run.
pub struct Sim {
    cfg: Config,
    routes: Routes,
    /// Index of each access AS in the workload's weights → graph node.
    access_nodes: Vec<u32>,
    /// Graph node → hops from the origin.
    paths: HashMap<u32, (Box<[u32]>, u32)>,
    sharing: Sharing,
    owners: Vec<Owner>,
    flow_gen: Vec<u32>,
    requests: Requests,
    pending: Option<Request>,
    heap: BinaryHeap<Scheduled>,
    seq: u64,
    now: u64,
    sessions: Vec<Session>,
    free_sessions: Vec<SessionId>,
    vms: Vec<Vm>,
    free_vms: Vec<VmId>,
    vm_of: HashMap<(u32, u32), VmId>,
    requests_seen: HashMap<(u32, u32), u32>,
    static_as: Vec<bool>,
    ups: Vec<Upstream>,
    free_ups: Vec<UpId>,
    peaks: Peaks,
    as_rate: Vec<f64>,
    as_viewers: Vec<u32>,
    as_vms: Vec<u32>,
    touched_as: Vec<u32>,
    touched_vm: Vec<VmId>,
    /// Sessions ended in the current instant, not yet handed out.
    results: Vec<SessionQoe>,
    done: u64,
    vm_log: Vec<(u32, u32, f64, u32, u64)>,
    vm_seconds: f64,
    events: u64,
    started: u64,
    epoch_armed: bool,
    max_flows: usize,
    active_flows: usize,
    timeline: Vec<Sample>,
    /// Sites mode: one per access AS, and the link id of the first.
    sites: Vec<Site>,
    site_link0: u32,
    active_sites: Vec<u32>,
    instances: u32,
}

impl Sim {
    pub fn new(graph: &AsGraph, cfg: Config) -> Result<Self, String> {
        cfg.workload.validate()?;
        if cfg.buffer_s.is_nan() || cfg.buffer_s <= 0.0 {
            return Err("the buffer must hold more than 0 s of video".into());
        }
        let origin = cfg.origin.unwrap_or_else(|| graph.default_origin());
        if origin as usize >= graph.len() {
            return Err(format!("origin {origin} is not in the graph"));
        }
        let routes = graph.routes(origin, cfg.valley_free);
        // Access ASes the origin reaches (the original drops the others).
        let access_nodes: Vec<u32> = (0..graph.len() as u32)
            .filter(|&i| graph.nodes[i as usize].role == Role::Access && routes.reaches(i))
            .collect();
        let weights: Vec<f64> = access_nodes
            .iter()
            .map(|&i| graph.nodes[i as usize].weight)
            .collect();
        if weights.iter().sum::<f64>() <= 0.0 {
            return Err("no access AS with users is reachable from the origin".into());
        }
        // Static caches in the heaviest access ASes.
        let mut static_as = vec![false; access_nodes.len()];
        let n_static =
            (cfg.caches.static_share.clamp(0.0, 1.0) * access_nodes.len() as f64).round() as usize;
        let mut by_weight: Vec<usize> = (0..access_nodes.len()).collect();
        by_weight.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        for &i in by_weight.iter().take(n_static) {
            static_as[i] = true;
        }
        let mut capacities = graph.capacities(&cfg.capacities);
        let site_link0 = capacities.len() as u32;
        let n_access = access_nodes.len();
        if let Some(sites) = &cfg.caches.sites {
            for v in [sites.per_instance_bps, sites.instance_link_bps] {
                if !(v > 0.0 && v.is_finite()) {
                    return Err("an instance must serve more than 0 bit/s".into());
                }
            }
            if let Scaling::Autoscaled {
                every_ns, min, max, ..
            } = sites.scaling
            {
                if every_ns == 0 || max == 0 || min > max {
                    return Err("the autoscaler needs a period and 0 ≤ min ≤ max, max ≥ 1".into());
                }
            }
            capacities.extend(std::iter::repeat_n(0.0, n_access));
        }
        let sharing = Sharing::new(capacities, cfg.sharing);
        let requests = Requests::new(&cfg.workload, &weights, cfg.seed);
        let mut sim = Sim {
            routes,
            access_nodes,
            paths: HashMap::new(),
            sharing,
            owners: Vec::new(),
            flow_gen: Vec::new(),
            requests,
            pending: None,
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            sessions: Vec::new(),
            free_sessions: Vec::new(),
            vms: Vec::new(),
            free_vms: Vec::new(),
            vm_of: HashMap::new(),
            requests_seen: HashMap::new(),
            static_as,
            ups: Vec::new(),
            free_ups: Vec::new(),
            peaks: Peaks::default(),
            as_rate: vec![0.0; n_access],
            as_viewers: vec![0; n_access],
            as_vms: vec![0; n_access],
            touched_as: Vec::new(),
            touched_vm: Vec::new(),
            results: Vec::new(),
            done: 0,
            vm_log: Vec::new(),
            vm_seconds: 0.0,
            events: 0,
            started: 0,
            epoch_armed: false,
            max_flows: 0,
            active_flows: 0,
            timeline: Vec::new(),
            sites: Vec::new(),
            site_link0,
            active_sites: Vec::new(),
            instances: 0,
            cfg,
        };
        match sim.cfg.caches.sites.as_ref().map(|s| &s.scaling) {
            None => {}
            Some(Scaling::Fixed(sizes)) => {
                sim.sites = vec![Site::default(); n_access];
                let sizes: Vec<(usize, u32)> = sim
                    .access_nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(a, node)| sizes.get(node).map(|&n| (a, n)))
                    .filter(|&(_, n)| n > 0)
                    .collect();
                for (a, n) in sizes {
                    let site = &mut sim.sites[a];
                    site.active = true;
                    site.ready = n;
                    sim.instances += n;
                    sim.set_site_capacity(a as u32);
                    sim.as_vms[a] = n;
                    sim.touch_as(a as u32);
                }
            }
            Some(Scaling::Autoscaled {
                every_ns, phase_ns, ..
            }) => {
                let first = *phase_ns + *every_ns;
                sim.sites = vec![Site::default(); n_access];
                sim.schedule(first, Event::Scale);
            }
        }
        if sim.cfg.sample_ns > 0 {
            sim.schedule(sim.cfg.sample_ns, Event::Sample);
        }
        sim.pending = sim.requests.next();
        if let Some(r) = sim.pending {
            sim.schedule(r.at_ns, Event::Arrival);
        }
        Ok(sim)
    }

    /// Access ASes in the order of the workload's `access` index.
    pub fn access_nodes(&self) -> &[u32] {
        &self.access_nodes
    }

    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    /// Runs to the end (or `until`), calling `progress` about every
    /// `every` events. The outcome holds every session's QoE, by request.
    pub fn run(self, every: u64, progress: impl FnMut(Progress)) -> Outcome {
        let mut sessions = Vec::new();
        let mut out = self.run_streaming(every, progress, |q| sessions.push(q));
        sessions.sort_by_key(|q| q.id);
        out.sessions = sessions;
        out
    }

    /// As [`Sim::run`], but hands each session's QoE to `on_session` as it
    /// ends (in the order they end) instead of keeping them: memory stays
    /// bounded by what runs at once, whatever the number of sessions.
    pub fn run_streaming(
        mut self,
        every: u64,
        mut progress: impl FnMut(Progress),
        mut on_session: impl FnMut(SessionQoe),
    ) -> Outcome {
        let until = self.cfg.until_ns.unwrap_or(u64::MAX);
        while let Some(top) = self.heap.peek() {
            if top.at > until {
                break;
            }
            let at = top.at;
            self.now = at;
            // Every event of this instant, then one settlement.
            while self.heap.peek().is_some_and(|s| s.at == at) {
                let s = self.heap.pop().unwrap();
                self.events += 1;
                self.handle(s.event);
                if every > 0 && self.events.is_multiple_of(every) {
                    progress(self.progress());
                }
            }
            if self.cfg.epoch_ns == 0 {
                self.settle();
            } else if !self.epoch_armed && self.sharing.pending() {
                self.epoch_armed = true;
                let next = (at / self.cfg.epoch_ns + 1) * self.cfg.epoch_ns;
                self.schedule(next, Event::Epoch);
            }
            self.note_peaks();
            for q in self.results.drain(..) {
                on_session(q);
            }
        }
        self.finish(until)
    }

    fn progress(&self) -> Progress {
        Progress {
            now_ns: self.now,
            sessions_started: self.started,
            sessions_done: self.done,
            active_flows: self.active_flows,
            events: self.events,
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Arrival => {
                let r = self.pending.take().expect("an arrival has its request");
                self.pending = self.requests.next();
                if let Some(next) = self.pending {
                    self.schedule(next.at_ns, Event::Arrival);
                }
                self.arrive(r);
            }
            Event::Connect(s) => {
                if self.sessions[s as usize].phase == Phase::Connecting {
                    self.start_flow(s);
                }
            }
            Event::Session(s, gen) => {
                if self.sessions[s as usize].gen == gen {
                    self.milestone(s);
                }
            }
            Event::UpConnect(u) => self.up_connect(u),
            Event::UpLive(u, gen) => {
                if self.ups[u as usize].gen == gen {
                    self.up_live(u);
                }
            }
            Event::VmReady(vm, gen) => {
                if self.vms[vm as usize].gen == gen {
                    self.vm_ready(vm);
                }
            }
            Event::VmIdle(vm, gen) => {
                if self.vms[vm as usize].gen == gen && self.vms[vm as usize].viewers == 0 {
                    self.teardown(vm);
                }
            }
            Event::Expand(f, gen) => {
                if self.flow_gen[f as usize] == gen && self.owners[f as usize] != Owner::None {
                    if self.sharing.expand(f) {
                        let r = self.sharing.rate(f);
                        self.rate_changed(f, r);
                    }
                    self.schedule(self.now + self.cfg.expand_ns, Event::Expand(f, gen));
                }
            }
            Event::InstancesReady(a, n, gen) => {
                if self.sites[a as usize].gen == gen {
                    self.instances_ready(a, n);
                }
            }
            Event::SiteIdle(a, gen) => {
                let site = &self.sites[a as usize];
                if site.gen == gen && site.active && site.viewers == 0 {
                    self.stop_site(a);
                }
            }
            Event::Scale => {
                self.scale();
                // While requests are to come, sessions run or a site may
                // still stop (its idle timer is then in the heap): no scan
                // of the heap once a second.
                if self.pending.is_some()
                    || self.started > self.done
                    || !self.active_sites.is_empty()
                {
                    let every = match self.cfg.caches.sites.as_ref().map(|s| &s.scaling) {
                        Some(Scaling::Autoscaled { every_ns, .. }) => *every_ns,
                        _ => unreachable!("only autoscaled sites scale"),
                    };
                    self.schedule(self.now + every, Event::Scale);
                }
            }
            Event::Epoch => {
                self.epoch_armed = false;
                self.settle();
            }
            Event::Sample => {
                self.timeline.push(Sample {
                    at_ns: self.now,
                    sessions: self.started - self.done,
                    flows: self.active_flows,
                    vms: if self.sites.is_empty() {
                        self.vm_of.len()
                    } else {
                        self.instances as usize
                    },
                    viewer_bps: self.as_rate.iter().sum(),
                    site_demand_bps: self.sites.iter().map(|s| s.demand_bps).sum(),
                });
                // Only while anything else is still to happen.
                if self
                    .heap
                    .iter()
                    .any(|e| !matches!(e.event, Event::Sample | Event::Epoch | Event::Scale))
                {
                    self.schedule(self.now + self.cfg.sample_ns, Event::Sample);
                }
            }
        }
    }

    // ---- requests, VMs and servers ------------------------------------

    fn arrive(&mut self, r: Request) {
        self.started += 1;
        let v = self.cfg.workload.qualities_bps[r.quality as usize];
        let s = Session {
            access: r.access,
            channel: r.channel,
            quality: r.quality,
            v,
            total: v * r.length_s,
            request_ns: self.now,
            server: Server::Origin,
            phase: Phase::Waiting,
            flow: None,
            rate: 0.0,
            t0: self.now,
            downloaded: 0.0,
            played: 0.0,
            gen: 0,
            first_play_ns: None,
            buffering_ns: 0,
            playing_ns: 0,
            download_ns: 0,
            stalls: 0,
            up_slot: u32::MAX,
            holds: None,
            id: r.id,
            title: r.title,
            vod: None,
        };
        let id = match self.free_sessions.pop() {
            Some(id) => {
                self.sessions[id as usize] = s;
                id
            }
            None => {
                self.sessions.push(s);
                (self.sessions.len() - 1) as SessionId
            }
        };
        if let Some(title) = r.title {
            self.arrive_vod(id, r.access, title);
            return;
        }
        let key = (r.access, r.channel);
        let vm = match self.vm_of.get(&key) {
            Some(&vm) => Some(vm),
            None if !self.sites.is_empty() => self.site_vm(r.access, r.channel),
            None if self.static_as[r.access as usize] => {
                Some(self.new_vm(r.access, r.channel, true))
            }
            None if self.cfg.caches.on_demand => {
                let seen = self.requests_seen.entry(key).or_insert(0);
                *seen += 1;
                if *seen >= self.cfg.caches.start_threshold {
                    Some(self.new_vm(r.access, r.channel, false))
                } else {
                    None
                }
            }
            None => None,
        };
        match vm {
            Some(vm) if self.vms[vm as usize].ready => self.attach(id, vm),
            Some(vm) if self.cfg.caches.boot == BootSemantics::Wait => {
                self.count_viewer(vm, id, true);
                self.vms[vm as usize].waiting.push(id);
                self.sessions[id as usize].server = Server::Vm(vm);
            }
            Some(vm) => {
                self.count_viewer(vm, id, true);
                self.sessions[id as usize].holds = Some(vm);
                self.connect(id, Server::Origin);
            }
            None => self.connect(id, Server::Origin),
        }
    }

    fn new_vm(&mut self, access: u32, channel: u32, fixed: bool) -> VmId {
        let quals = self.cfg.workload.qualities_bps.len();
        // A site's channel feed is ready when the site is, and boots with it.
        let in_site = !self.sites.is_empty();
        let vm = Vm {
            access,
            channel,
            ready: fixed || (in_site && self.sites[access as usize].ready > 0),
            fixed,
            viewers: 0,
            waiting: Vec::new(),
            upstreams: vec![None; quals],
            gen: 0,
            rate: 0.0,
            peak_rate: 0.0,
            peak_viewers: 0,
            born_ns: self.now,
        };
        let id = match self.free_vms.pop() {
            Some(id) => {
                let gen = self.vms[id as usize].gen.wrapping_add(1);
                self.vms[id as usize] = Vm { gen, ..vm };
                id
            }
            None => {
                self.vms.push(vm);
                (self.vms.len() - 1) as VmId
            }
        };
        self.vm_of.insert((access, channel), id);
        if in_site {
            return id;
        }
        self.as_vms[access as usize] += 1;
        self.touch_as(access);
        if !fixed {
            let gen = self.vms[id as usize].gen;
            self.schedule(self.now + self.cfg.caches.boot_ns, Event::VmReady(id, gen));
        }
        id
    }

    fn vm_ready(&mut self, vm: VmId) {
        self.vms[vm as usize].ready = true;
        let waiting = std::mem::take(&mut self.vms[vm as usize].waiting);
        for s in waiting {
            // attach counts the viewer again.
            self.count_viewer(vm, s, false);
            self.attach(s, vm);
        }
        if self.vms[vm as usize].viewers == 0 {
            self.vm_empty(vm);
        }
    }

    /// A session joins a ready VM: it plays from it once the VM holds
    /// enough of its quality.
    fn attach(&mut self, s: SessionId, vm: VmId) {
        let q = self.sessions[s as usize].quality;
        self.sessions[s as usize].server = Server::Vm(vm);
        self.count_viewer(vm, s, true);
        let up = match self.vms[vm as usize].upstreams[q as usize] {
            Some(u) => u,
            None => self.new_upstream(vm, q),
        };
        let u = &mut self.ups[up as usize];
        self.sessions[s as usize].up_slot = u.viewers.len() as u32;
        u.viewers.push(s);
        if u.live {
            self.connect(s, Server::Vm(vm));
        } else {
            self.ups[up as usize].waiting.push(s);
            self.sessions[s as usize].phase = Phase::Waiting;
        }
    }

    fn new_upstream(&mut self, vm: VmId, quality: u8) -> UpId {
        let up = Upstream {
            vm,
            quality,
            v: self.cfg.workload.qualities_bps[quality as usize],
            flow: None,
            rate: 0.0,
            t0: self.now,
            downloaded: 0.0,
            live: false,
            gen: 0,
            waiting: Vec::new(),
            viewers: Vec::new(),
        };
        let id = match self.free_ups.pop() {
            Some(id) => {
                let gen = self.ups[id as usize].gen.wrapping_add(1);
                self.ups[id as usize] = Upstream { gen, ..up };
                id
            }
            None => {
                self.ups.push(up);
                (self.ups.len() - 1) as UpId
            }
        };
        self.vms[vm as usize].upstreams[quality as usize] = Some(id);
        let node = self.access_nodes[self.vms[vm as usize].access as usize];
        let hops = self.path_of(node).1;
        self.schedule(
            self.now + hops as u64 * self.cfg.hop_delay_ns,
            Event::UpConnect(id),
        );
        id
    }

    fn up_connect(&mut self, u: UpId) {
        let up = &self.ups[u as usize];
        if up.flow.is_some() || self.vms[up.vm as usize].upstreams[up.quality as usize] != Some(u) {
            return;
        }
        let node = self.access_nodes[self.vms[up.vm as usize].access as usize];
        let path = self.path_of(node).0.clone();
        let f = self.sharing.add(&path, UNCAPPED);
        self.own(f, Owner::Upstream(u));
        let up = &mut self.ups[u as usize];
        up.flow = Some(f);
        up.t0 = self.now;
    }

    fn up_advance(&mut self, u: UpId) {
        let up = &mut self.ups[u as usize];
        let dt = (self.now - up.t0) as f64 / 1e9;
        up.downloaded += up.rate * dt;
        up.t0 = self.now;
    }

    fn up_reschedule(&mut self, u: UpId) {
        let up = &mut self.ups[u as usize];
        up.gen = up.gen.wrapping_add(1);
        if up.live || up.rate <= 0.0 {
            return;
        }
        let need = (self.cfg.buffer_s * up.v - up.downloaded).max(0.0);
        let at = self.now + ns_for(need, up.rate);
        let gen = up.gen;
        self.schedule(at, Event::UpLive(u, gen));
    }

    fn up_live(&mut self, u: UpId) {
        self.up_advance(u);
        let up = &mut self.ups[u as usize];
        up.live = true;
        let f = up.flow.expect("a live upstream has a flow");
        let v = up.v;
        self.sharing.set_cap(f, v);
        for s in std::mem::take(&mut self.ups[u as usize].waiting) {
            let vm = self.ups[u as usize].vm;
            self.connect(s, Server::Vm(vm));
        }
    }

    /// The rate a playing viewer of this upstream may get.
    fn up_limit(&self, u: UpId) -> f64 {
        let up = &self.ups[u as usize];
        if up.live {
            up.rate.min(up.v)
        } else {
            up.v
        }
    }

    fn detach(&mut self, s: SessionId) {
        if let Server::Site(a, _) = self.sessions[s as usize].server {
            self.count_site(a, self.sessions[s as usize].v, false);
            return;
        }
        if let Some(vm) = self.sessions[s as usize].holds.take() {
            self.count_viewer(vm, s, false);
            if self.vms[vm as usize].viewers == 0 {
                self.vm_empty(vm);
            }
        }
        let Server::Vm(vm) = self.sessions[s as usize].server else {
            return;
        };
        let q = self.sessions[s as usize].quality;
        if let Some(u) = self.vms[vm as usize].upstreams[q as usize] {
            let slot = self.sessions[s as usize].up_slot as usize;
            let up = &mut self.ups[u as usize];
            if slot < up.viewers.len() && up.viewers[slot] == s {
                up.viewers.swap_remove(slot);
                if let Some(&moved) = up.viewers.get(slot) {
                    self.sessions[moved as usize].up_slot = slot as u32;
                }
            }
            up.waiting.retain(|&w| w != s);
            if self.ups[u as usize].viewers.is_empty() {
                self.end_upstream(u);
            }
        }
        self.count_viewer(vm, s, false);
        if self.vms[vm as usize].viewers == 0 {
            self.vm_empty(vm);
        }
    }

    fn end_upstream(&mut self, u: UpId) {
        let up = &mut self.ups[u as usize];
        up.gen = up.gen.wrapping_add(1);
        let (vm, q) = (up.vm, up.quality);
        if let Some(f) = up.flow.take() {
            self.sharing.remove(f);
            self.disown(f);
        }
        self.vms[vm as usize].upstreams[q as usize] = None;
        self.free_ups.push(u);
    }

    fn vm_empty(&mut self, vm: VmId) {
        let m = &self.vms[vm as usize];
        if m.fixed || !m.ready {
            return;
        }
        if self.cfg.caches.idle_ns == 0 {
            self.teardown(vm);
        } else {
            let gen = m.gen;
            self.schedule(self.now + self.cfg.caches.idle_ns, Event::VmIdle(vm, gen));
        }
    }

    fn teardown(&mut self, vm: VmId) {
        let m = &mut self.vms[vm as usize];
        m.gen = m.gen.wrapping_add(1);
        let (access, channel) = (m.access, m.channel);
        if self.sites.is_empty() {
            self.vm_seconds += (self.now - m.born_ns) as f64 / 1e9;
        }
        self.vm_log.push((
            access,
            channel,
            m.peak_rate,
            m.peak_viewers,
            self.now - m.born_ns,
        ));
        self.vm_of.remove(&(access, channel));
        self.requests_seen.remove(&(access, channel));
        if self.sites.is_empty() {
            self.as_vms[access as usize] -= 1;
            self.touch_as(access);
        }
        self.free_vms.push(vm);
    }

    // ---- cache sites (vcdn's model) -------------------------------------

    /// The channel feed of a site for a new request, starting the site
    /// (autoscaled) once the AS has seen the threshold of requests; `None`
    /// sends the request to the origin.
    fn site_vm(&mut self, access: u32, channel: u32) -> Option<VmId> {
        self.site_active(access)
            .then(|| self.new_vm(access, channel, false))
    }

    /// Whether the AS has a site for a new request, starting it (autoscaled)
    /// once the AS has seen the threshold of requests.
    fn site_active(&mut self, access: u32) -> bool {
        let site = &mut self.sites[access as usize];
        if site.active {
            return true;
        }
        let Some(Scaling::Autoscaled { min, .. }) =
            self.cfg.caches.sites.as_ref().map(|s| &s.scaling)
        else {
            return false;
        };
        let min = (*min).max(1);
        site.requests += 1;
        if site.requests < self.cfg.caches.start_threshold {
            return false;
        }
        site.active = true;
        site.requests = 0;
        site.since_ns = self.now;
        let gen = site.gen;
        self.active_sites.push(access);
        self.boot_instances(access, min);
        // A site whose first requests all went elsewhere (VoD during its
        // boot) stops after the idle time too.
        let idle = self.now + self.cfg.caches.boot_ns + self.cfg.caches.idle_ns;
        self.schedule(idle, Event::SiteIdle(access, gen));
        true
    }

    /// A VoD request: the site's filter and store decide, if the site is
    /// ready; otherwise the origin serves it.
    fn arrive_vod(&mut self, s: SessionId, access: u32, title: u32) {
        let policy = self.cfg.caches.vod;
        let served = match policy {
            Some(p) if !self.sites.is_empty() && self.site_active(access) => {
                let site = &mut self.sites[access as usize];
                (site.ready > 0).then(|| {
                    site.vod
                        .get_or_insert_with(|| {
                            Box::new(VodCache::new(p.cache_titles, p.filter_titles))
                        })
                        .request(title)
                })
            }
            _ => None,
        };
        self.sessions[s as usize].vod = served;
        match served {
            Some(how @ (Served::Hit | Served::Miss)) => {
                self.count_site(access, self.sessions[s as usize].v, true);
                self.connect(s, Server::Site(access, how));
            }
            Some(Served::Bypass) | None => self.connect(s, Server::Origin),
        }
    }

    fn boot_instances(&mut self, access: u32, n: u32) {
        self.account_instances(access);
        let site = &mut self.sites[access as usize];
        site.booting += n;
        let gen = site.gen;
        self.instances += n;
        self.site_instances_changed(access);
        if self.cfg.caches.boot_ns == 0 {
            // Ready at once: the request that started the site is served.
            self.instances_ready(access, n);
        } else {
            self.schedule(
                self.now + self.cfg.caches.boot_ns,
                Event::InstancesReady(access, n, gen),
            );
        }
    }

    fn instances_ready(&mut self, access: u32, n: u32) {
        let site = &mut self.sites[access as usize];
        let first = site.ready == 0;
        site.booting -= n;
        site.ready += n;
        self.set_site_capacity(access);
        if first {
            // The site's channel feeds boot with it.
            let feeds: Vec<VmId> = (0..self.cfg.workload.channels)
                .filter_map(|c| self.vm_of.get(&(access, c)).copied())
                .filter(|&vm| !self.vms[vm as usize].ready)
                .collect();
            for vm in feeds {
                self.vm_ready(vm);
            }
        }
    }

    /// Adds `ready + booting` × time since the last change to the
    /// instance-seconds.
    fn account_instances(&mut self, access: u32) {
        let site = &mut self.sites[access as usize];
        let n = site.ready + site.booting;
        self.vm_seconds += n as f64 * (self.now - site.since_ns) as f64 / 1e9;
        site.since_ns = self.now;
    }

    fn site_instances_changed(&mut self, access: u32) {
        let site = &self.sites[access as usize];
        self.as_vms[access as usize] = site.ready + site.booting;
        self.touch_as(access);
    }

    fn set_site_capacity(&mut self, access: u32) {
        let per = self
            .cfg
            .caches
            .sites
            .as_ref()
            .map_or(0.0, |s| s.instance_link_bps);
        let cap = self.sites[access as usize].ready as f64 * per;
        self.sharing.set_capacity(self.site_link0 + access, cap);
        self.site_instances_changed(access);
    }

    /// Counts a session in (or out of) a VM's viewers and its site's load.
    fn count_viewer(&mut self, vm: VmId, s: SessionId, join: bool) {
        let m = &mut self.vms[vm as usize];
        if join {
            m.viewers += 1;
        } else {
            m.viewers -= 1;
        }
        let access = m.access;
        if self.sites.is_empty() {
            return;
        }
        self.count_site(access, self.sessions[s as usize].v, join);
    }

    /// Counts a session of bitrate `v` in (or out of) a site's load.
    fn count_site(&mut self, access: u32, v: f64, join: bool) {
        let autoscaled = self.is_autoscaled();
        let site = &mut self.sites[access as usize];
        if join {
            site.viewers += 1;
            site.demand_bps += v;
        } else {
            site.viewers -= 1;
            site.demand_bps = if site.viewers == 0 {
                0.0
            } else {
                site.demand_bps - v
            };
            if site.viewers == 0 && autoscaled {
                let gen = site.gen;
                self.schedule(
                    self.now + self.cfg.caches.idle_ns,
                    Event::SiteIdle(access, gen),
                );
            }
        }
    }

    fn is_autoscaled(&self) -> bool {
        matches!(
            self.cfg.caches.sites.as_ref().map(|s| &s.scaling),
            Some(Scaling::Autoscaled { .. })
        )
    }

    /// Stops a site without viewers: its instances and channel feeds go.
    fn stop_site(&mut self, access: u32) {
        self.account_instances(access);
        let feeds: Vec<VmId> = (0..self.cfg.workload.channels)
            .filter_map(|c| self.vm_of.get(&(access, c)).copied())
            .collect();
        for vm in feeds {
            self.teardown(vm);
        }
        let site = &mut self.sites[access as usize];
        self.instances -= site.ready + site.booting;
        *site = Site {
            gen: site.gen.wrapping_add(1),
            ..Site::default()
        };
        self.active_sites.retain(|&a| a != access);
        self.set_site_capacity(access);
    }

    /// One autoscaler decision per running site, from its demand.
    fn scale(&mut self) {
        let Some(Sites {
            per_instance_bps,
            scaling:
                Scaling::Autoscaled {
                    autoscaler,
                    min,
                    max,
                    ..
                },
            ..
        }) = self.cfg.caches.sites.clone()
        else {
            return;
        };
        for i in 0..self.active_sites.len() {
            let a = self.active_sites[i];
            let site = &mut self.sites[a as usize];
            let n = site.ready + site.booting;
            let load = site.demand_bps;
            match autoscaler.decide(&mut site.trend, load, per_instance_bps, n, min.max(1), max) {
                Decision::Hold => {}
                Decision::Out(k) => self.boot_instances(a, k),
                Decision::In => {
                    // A ready one drains (at once, in a fluid model); one
                    // still booting is left to finish.
                    if site.ready > 1 {
                        self.account_instances(a);
                        let site = &mut self.sites[a as usize];
                        site.ready -= 1;
                        self.instances -= 1;
                        self.set_site_capacity(a);
                    }
                }
            }
        }
    }

    // ---- sessions -------------------------------------------------------

    fn path_of(&mut self, node: u32) -> &(Box<[u32]>, u32) {
        let routes = &self.routes;
        self.paths.entry(node).or_insert_with(|| {
            let p = routes.path(node).expect("only reachable ASes have users");
            let hops = p.len() as u32;
            (p.into_boxed_slice(), hops)
        })
    }

    /// Starts connecting a session to its server (hop delay, then a flow).
    fn connect(&mut self, s: SessionId, server: Server) {
        let access = self.sessions[s as usize].access;
        let hops = match server {
            Server::Origin | Server::Site(_, Served::Miss) => {
                self.path_of(self.access_nodes[access as usize]).1
            }
            Server::Vm(_) | Server::Site(..) => 0,
        };
        let sess = &mut self.sessions[s as usize];
        sess.server = server;
        sess.phase = Phase::Connecting;
        // The user's own line is one more hop.
        let at = self.now + (hops as u64 + 1) * self.cfg.hop_delay_ns;
        self.schedule(at, Event::Connect(s));
    }

    fn start_flow(&mut self, s: SessionId) {
        self.advance(s);
        let sess = &self.sessions[s as usize];
        let path: Box<[u32]> = match sess.server {
            Server::Origin => self
                .path_of(self.access_nodes[sess.access as usize])
                .0
                .clone(),
            // A site's viewers share its instances' capacity.
            Server::Vm(_) if !self.sites.is_empty() => Box::new([self.site_link0 + sess.access]),
            Server::Vm(_) => Box::new([]),
            Server::Site(a, Served::Miss) => {
                let mut p = self.path_of(self.access_nodes[a as usize]).0.to_vec();
                p.push(self.site_link0 + a);
                p.into()
            }
            Server::Site(a, _) => Box::new([self.site_link0 + a]),
        };
        let line = self.cfg.capacities.line_bps;
        let f = self.sharing.add(&path, line);
        self.own(f, Owner::Session(s));
        let sess = &mut self.sessions[s as usize];
        sess.flow = Some(f);
        sess.phase = Phase::Buffering;
        sess.rate = 0.0;
        let access = sess.access;
        self.as_viewers[access as usize] += 1;
        self.touch_as(access);
        if let Server::Vm(vm) = self.sessions[s as usize].server {
            self.vms[vm as usize].peak_viewers = self.vms[vm as usize]
                .peak_viewers
                .max(self.vms[vm as usize].viewers);
        }
    }

    /// Brings a session's counters up to now at its current rate.
    fn advance(&mut self, s: SessionId) {
        let now = self.now;
        let sess = &mut self.sessions[s as usize];
        let dt_ns = now - sess.t0;
        if dt_ns == 0 {
            return;
        }
        let dt = dt_ns as f64 / 1e9;
        if sess.flow.is_some() {
            sess.downloaded = (sess.downloaded + sess.rate * dt).min(sess.total);
            sess.download_ns += dt_ns;
        }
        match sess.phase {
            Phase::Playing => {
                sess.played = (sess.played + sess.v * dt).min(sess.downloaded);
                sess.playing_ns += dt_ns;
            }
            Phase::Waiting | Phase::Connecting | Phase::Buffering => sess.buffering_ns += dt_ns,
            Phase::Done => {}
        }
        sess.t0 = now;
    }

    fn target(&self, s: SessionId) -> f64 {
        let sess = &self.sessions[s as usize];
        (self.cfg.buffer_s * sess.v).min(sess.total - sess.played)
    }

    /// Schedules a session's next milestone from its state and rate.
    fn reschedule(&mut self, s: SessionId) {
        let target = self.target(s);
        let sess = &mut self.sessions[s as usize];
        sess.gen = sess.gen.wrapping_add(1);
        let buffer = sess.downloaded - sess.played;
        let downloading = sess.flow.is_some();
        let after = match sess.phase {
            Phase::Buffering if sess.rate > 0.0 => Some(ns_for(target - buffer, sess.rate)),
            Phase::Playing if downloading => {
                let complete =
                    (sess.rate > 0.0).then(|| ns_for(sess.total - sess.downloaded, sess.rate));
                let empty = (sess.rate < sess.v).then(|| ns_for(buffer, sess.v - sess.rate));
                match (complete, empty) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            Phase::Playing => Some(ns_for(sess.total - sess.played, sess.v)),
            _ => None,
        };
        if let Some(after) = after {
            let gen = sess.gen;
            self.schedule(self.now + after, Event::Session(s, gen));
        }
    }

    fn milestone(&mut self, s: SessionId) {
        self.advance(s);
        let target = self.target(s);
        let sess = &self.sessions[s as usize];
        let buffer = sess.downloaded - sess.played;
        let tol = 1e-6 * sess.v + 1.0;
        match sess.phase {
            Phase::Buffering if buffer + tol >= target => {
                let sess = &mut self.sessions[s as usize];
                sess.phase = Phase::Playing;
                if sess.first_play_ns.is_none() {
                    sess.first_play_ns = Some(self.now);
                }
                self.update_cap(s);
            }
            Phase::Playing if sess.flow.is_some() && sess.downloaded + tol >= sess.total => {
                self.sessions[s as usize].downloaded = self.sessions[s as usize].total;
                self.end_flow(s);
            }
            Phase::Playing if sess.flow.is_some() && buffer <= tol => {
                let sess = &mut self.sessions[s as usize];
                sess.played = sess.downloaded;
                sess.phase = Phase::Buffering;
                sess.stalls += 1;
                self.update_cap(s);
            }
            Phase::Playing if sess.flow.is_none() && sess.played + tol >= sess.total => {
                self.finish_session(s);
                return;
            }
            _ => {}
        }
        self.reschedule(s);
    }

    /// The cap a session's flow should have in its phase.
    fn update_cap(&mut self, s: SessionId) {
        let sess = &self.sessions[s as usize];
        let Some(f) = sess.flow else { return };
        let line = self.cfg.capacities.line_bps;
        let cap = match (sess.phase, sess.server) {
            (Phase::Playing, Server::Vm(vm)) => {
                let u = self.vms[vm as usize].upstreams[sess.quality as usize];
                line.min(sess.v).min(u.map_or(sess.v, |u| self.up_limit(u)))
            }
            (Phase::Playing, Server::Origin | Server::Site(..)) => line.min(sess.v),
            _ => line,
        };
        self.sharing.set_cap(f, cap);
    }

    fn end_flow(&mut self, s: SessionId) {
        let sess = &mut self.sessions[s as usize];
        if let Some(f) = sess.flow.take() {
            let old = sess.rate;
            sess.rate = 0.0;
            let access = sess.access;
            self.account_rate(s, old, 0.0);
            self.sharing.remove(f);
            self.disown(f);
            self.as_viewers[access as usize] -= 1;
            self.touch_as(access);
        }
    }

    fn finish_session(&mut self, s: SessionId) {
        self.end_flow(s);
        let sess = &mut self.sessions[s as usize];
        sess.phase = Phase::Done;
        sess.gen = sess.gen.wrapping_add(1);
        let q = SessionQoe {
            id: sess.id,
            access: self.access_nodes[sess.access as usize],
            channel: sess.channel,
            quality_bps: sess.v,
            request_ns: sess.request_ns,
            start_ns: sess.first_play_ns.map_or(0, |t| t - sess.request_ns),
            buffering_ns: sess.buffering_ns,
            playing_ns: sess.playing_ns,
            stalls: sess.stalls,
            mean_rate_bps: if sess.download_ns > 0 {
                sess.total / (sess.download_ns as f64 / 1e9)
            } else {
                0.0
            },
            from_cache: matches!(sess.server, Server::Vm(_) | Server::Site(..)),
            title: sess.title,
            vod: sess.vod,
        };
        self.results.push(q);
        self.done += 1;
        self.detach(s);
        self.free_sessions.push(s);
    }

    // ---- flows and rates ------------------------------------------------

    fn own(&mut self, f: FlowId, owner: Owner) {
        let i = f as usize;
        if self.owners.len() <= i {
            self.owners.resize(i + 1, Owner::None);
            self.flow_gen.resize(i + 1, 0);
        }
        self.owners[i] = owner;
        self.flow_gen[i] = self.flow_gen[i].wrapping_add(1);
        self.active_flows += 1;
        self.max_flows = self.max_flows.max(self.active_flows);
        if self.sharing.mode() == Mode::LocalFairShare {
            let gen = self.flow_gen[i];
            self.schedule(self.now + self.cfg.expand_ns, Event::Expand(f, gen));
        }
    }

    fn disown(&mut self, f: FlowId) {
        self.owners[f as usize] = Owner::None;
        self.flow_gen[f as usize] = self.flow_gen[f as usize].wrapping_add(1);
        self.active_flows -= 1;
    }

    /// Settles rates and re-plans every flow whose rate changed.
    fn settle(&mut self) {
        let changed = self.sharing.recompute().to_vec();
        for f in changed {
            let r = self.sharing.rate(f);
            self.rate_changed(f, r);
        }
    }

    fn rate_changed(&mut self, f: FlowId, rate: f64) {
        match self.owners[f as usize] {
            Owner::None => {}
            Owner::Session(s) => {
                self.advance(s);
                let old = self.sessions[s as usize].rate;
                self.sessions[s as usize].rate = rate;
                self.account_rate(s, old, rate);
                self.reschedule(s);
            }
            Owner::Upstream(u) => {
                self.up_advance(u);
                self.ups[u as usize].rate = rate;
                self.up_reschedule(u);
                if self.ups[u as usize].live {
                    // Playing viewers follow their cache's feed.
                    let viewers = self.ups[u as usize].viewers.clone();
                    for s in viewers {
                        if self.sessions[s as usize].phase == Phase::Playing {
                            self.update_cap(s);
                        }
                    }
                }
            }
        }
    }

    fn account_rate(&mut self, s: SessionId, old: f64, new: f64) {
        let (access, server) = (
            self.sessions[s as usize].access,
            self.sessions[s as usize].server,
        );
        self.as_rate[access as usize] += new - old;
        self.touch_as(access);
        if let Server::Vm(vm) = server {
            self.vms[vm as usize].rate += new - old;
            self.touched_vm.push(vm);
        }
    }

    fn touch_as(&mut self, access: u32) {
        self.touched_as.push(access);
    }

    fn note_peaks(&mut self) {
        for a in std::mem::take(&mut self.touched_as) {
            let i = a as usize;
            self.peaks
                .note_as(a, self.as_rate[i], self.as_viewers[i], self.as_vms[i]);
        }
        for vm in std::mem::take(&mut self.touched_vm) {
            let m = &mut self.vms[vm as usize];
            m.peak_rate = m.peak_rate.max(m.rate);
        }
        self.peaks.note_flows(self.active_flows);
    }

    fn finish(mut self, until: u64) -> Outcome {
        let end = if self.heap.is_empty() {
            self.now
        } else {
            until
        };
        self.now = self.now.max(end.min(until));
        let live: Vec<VmId> = self.vm_of.values().copied().collect();
        for a in 0..self.sites.len() as u32 {
            self.account_instances(a);
        }
        for vm in live {
            let m = &self.vms[vm as usize];
            if self.sites.is_empty() {
                self.vm_seconds += (self.now - m.born_ns) as f64 / 1e9;
            }
            self.vm_log.push((
                m.access,
                m.channel,
                m.peak_rate,
                m.peak_viewers,
                self.now - m.born_ns,
            ));
        }
        // Freed slots are Done; the others still run.
        let unfinished = self
            .sessions
            .iter()
            .filter(|s| s.phase != Phase::Done)
            .count() as u64;
        let access_nodes = self.access_nodes.clone();
        let mut peaks = self.peaks;
        peaks.map_access(&access_nodes);
        Outcome {
            sessions: Vec::new(),
            peaks,
            vms: self
                .vm_log
                .into_iter()
                .map(|(a, c, r, v, l)| (access_nodes[a as usize], c, r, v, l))
                .collect(),
            events: self.events,
            end_ns: self.now,
            filled_flows: self.sharing.filled_flows,
            unfinished,
            vm_seconds: self.vm_seconds,
            max_active_flows: self.max_flows,
            timeline: self.timeline,
        }
    }
}

/// Nanoseconds to move `bits` at `rate` bit/s, rounded up so the event
/// never comes early (at least 1 ns: time must move).
fn ns_for(bits: f64, rate: f64) -> u64 {
    if bits <= 0.0 {
        return 1;
    }
    let ns = (bits / rate * 1e9).ceil();
    if ns >= u64::MAX as f64 / 2.0 {
        u64::MAX / 4
    } else {
        (ns as u64).max(1)
    }
}
