//! The discovery protocol's state machines, without I/O: one [`Node`] holds
//! every role an agent has (a follower of the data sink and/or the tracker,
//! a slave broker, or an authority itself). The runtime ([`crate::agent`])
//! feeds it datagrams that passed [`crate::envelope`] and the clock, and
//! sends what it asks for. Being pure, every timer and race is unit-tested
//! here deterministically.
//!
//! What the thesis leaves open and this adds (`docs/telemetry-protocol.md`):
//! HELLO retried with jittered exponential backoff until configured;
//! authority beacons (RECONFIG/TRECONFIG every `beacon`) with an epoch, so
//! a lost RECONFIG is repaired and two authorities of a kind resolve to the
//! one with the higher `(epoch, node)` (the other steps down until it has
//! not been heard for `authority_timeout`); PUBLISH/SUBSCRIBE as leases
//! renewed every `renew`; full destination sets per topic with a version;
//! BYE on clean shutdown; broker ids kept per node so a repeated HELLO does
//! not burn one.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::message::{
    Authority, AuthorityKind, Body, Have, Message, Role, Subscription, MAX_DESTINATIONS,
};

/// The protocol's timers. The defaults are the spec's; tests shorten them.
#[derive(Clone, Debug)]
pub struct Timers {
    /// First HELLO retry; doubled per retry up to `hello_max`, ±25 % jitter.
    pub hello_first: Duration,
    pub hello_max: Duration,
    /// How often an authority rebroadcasts RECONFIG/TRECONFIG.
    pub beacon: Duration,
    /// An authority not heard for this long is gone (three beacons lost).
    pub authority_timeout: Duration,
    /// How often PUBLISH and SUBSCRIBE are renewed.
    pub renew: Duration,
    /// How long a PUBLISH or SUBSCRIBE holds without renewal.
    pub lease: Duration,
    /// A new tracker sends no destination set before this, so that it has
    /// heard every consumer's renewal and never sends a partial set.
    pub tracker_warmup: Duration,
    /// REGISTER_SLAVE is repeated this often until acknowledged.
    pub regslave_retry: Duration,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers {
            hello_first: Duration::from_millis(250),
            hello_max: Duration::from_secs(4),
            beacon: Duration::from_secs(2),
            authority_timeout: Duration::from_millis(6500),
            renew: Duration::from_secs(2),
            lease: Duration::from_secs(6),
            tracker_warmup: Duration::from_millis(2250),
            regslave_retry: Duration::from_secs(1),
        }
    }
}

/// Most nodes an authority keeps state for (a flood of HELLOs from key
/// holders cannot grow it beyond this).
pub const MAX_NODES: usize = 4096;
/// Most slave brokers a data sink hands ids to.
pub const MAX_SLAVES: usize = 64;

/// What an agent is.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node: String,
    pub roles: Vec<Role>,
    /// Topics published (datasink or p2p).
    pub publish: Vec<String>,
    /// Topic → local UDP port wishes (p2p consumer).
    pub subscribe: Vec<Subscription>,
    /// Networks a producer may send data to; destinations outside are
    /// dropped (a tracker cannot be made to aim a producer elsewhere).
    pub allowed: Vec<Net>,
    pub timers: Timers,
    /// Seed of the retry jitter.
    pub seed: u64,
}

/// An IPv4 or IPv6 network (`addr/len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net {
    pub addr: IpAddr,
    pub len: u8,
}

impl Net {
    pub fn parse(s: &str) -> Result<Net, String> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not addr/len"))?;
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IP address"))?;
        let len: u8 = l
            .parse()
            .map_err(|_| format!("{l:?} is not a prefix length"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(format!("prefix length {len} is over {max}"));
        }
        Ok(Net { addr, len })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.len)
                };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.len)
                };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// What the node asks the runtime to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    Broadcast(Body),
    Unicast(SocketAddr, Body),
}

/// What changed, for the runtime to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A (new) data sink, or new metadata of the current one: (re)point
    /// the Kafka clients to `bootstrap`.
    Sink { node: String, authority: Authority },
    /// A (new) tracker.
    Tracker { node: String, epoch: u64 },
    /// The authority of a kind was not heard for `authority_timeout`. The
    /// last configuration stays in use; HELLOs start again.
    AuthorityLost(AuthorityKind),
    /// This slave got a broker id: start the broker, then
    /// [`Node::slave_ready`].
    SlaveAssigned {
        broker_id: u32,
        authority: Authority,
    },
    /// A slave's broker registered with this sink: reassign partitions,
    /// then [`Node::cluster_resized`].
    SlaveRegistered { broker_id: u32, listener: String },
    /// This authority saw a higher one of its kind and stopped answering.
    SteppedDown(AuthorityKind),
    /// This authority (re)took over.
    Active(AuthorityKind),
    /// A p2p producer's full destination set for a topic.
    Destinations {
        topic: String,
        dests: Vec<SocketAddr>,
    },
}

struct Current {
    node: String,
    addr: SocketAddr,
    authority: Authority,
    last_heard: Instant,
}

/// Following the authority of one kind.
struct Follow {
    kind: AuthorityKind,
    current: Option<Current>,
    hello_at: Option<Instant>,
    backoff: Duration,
}

impl Follow {
    fn new(kind: AuthorityKind, now: Instant) -> Follow {
        Follow {
            kind,
            current: None,
            hello_at: Some(now),
            backoff: Duration::ZERO,
        }
    }

    fn live(&self) -> bool {
        self.current.is_some()
    }
}

struct Rival {
    epoch: u64,
    last_heard: Instant,
}

/// This node's own authority (data sink master or tracker).
struct Own {
    kind: AuthorityKind,
    authority: Authority,
    active: bool,
    next_beacon: Instant,
    rival: Option<Rival>,
    /// Per node, when it was last sent a CONFIG/TCONFIG (rate limit).
    answered: HashMap<String, Instant>,
}

/// The data sink master's view of its slaves.
#[derive(Default)]
struct Slaves {
    ids: HashMap<String, u32>,
    next: u32,
    registered: BTreeSet<u32>,
    listeners: HashMap<u32, String>,
}

/// A slave's own progress.
struct SlaveState {
    broker_id: Option<u32>,
    listener: Option<String>,
    next_register: Option<Instant>,
    acknowledged: bool,
    sink: Option<String>,
}

struct Lease<T> {
    value: T,
    addr: IpAddr,
    port: u16,
    expires: Instant,
}

/// A p2p producer's topics and the destination sets it holds.
struct Published {
    topics: Vec<String>,
    have: Vec<Have>,
}

/// The tracker's tables.
#[derive(Default)]
struct TrackerState {
    started: Option<Instant>,
    warm: bool,
    producers: HashMap<String, Lease<Published>>,
    consumers: HashMap<String, Lease<Vec<Subscription>>>,
    sets: HashMap<String, (u64, Vec<SocketAddr>)>,
}

/// A p2p producer's destination sets.
#[derive(Default)]
struct Dests {
    sets: HashMap<String, (u64, u64, Vec<SocketAddr>)>,
    next_publish: Option<Instant>,
}

/// One agent's protocol state.
pub struct Node {
    cfg: NodeConfig,
    sink_follow: Option<Follow>,
    tracker_follow: Option<Follow>,
    own: Vec<Own>,
    slaves: Slaves,
    slave: Option<SlaveState>,
    tracker: TrackerState,
    dests: Dests,
    next_subscribe: Option<Instant>,
    out: VecDeque<Out>,
    events: VecDeque<Event>,
    rng: u64,
    stopped: bool,
}

impl Node {
    pub fn new(cfg: NodeConfig, now: Instant) -> Node {
        let follows_sink = cfg.roles.iter().any(|r| r.follows_sink());
        let follows_tracker = cfg.roles.iter().any(|r| r.follows_tracker());
        let slave = cfg
            .roles
            .contains(&Role::DatasinkSlave)
            .then_some(SlaveState {
                broker_id: None,
                listener: None,
                next_register: None,
                acknowledged: false,
                sink: None,
            });
        let rng = cfg.seed | 1;
        Node {
            sink_follow: follows_sink.then(|| Follow::new(AuthorityKind::Datasink, now)),
            tracker_follow: follows_tracker.then(|| Follow::new(AuthorityKind::Tracker, now)),
            own: Vec::new(),
            slaves: Slaves {
                next: 2,
                ..Slaves::default()
            },
            slave,
            tracker: TrackerState::default(),
            dests: Dests::default(),
            next_subscribe: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            rng,
            stopped: false,
            cfg,
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// Makes this node the data sink master once its broker runs
    /// (`authority` carries the bootstrap servers, cluster id and controller),
    /// or the tracker. Broadcasts RECONFIG/TRECONFIG at once.
    pub fn become_authority(&mut self, kind: AuthorityKind, authority: Authority, now: Instant) {
        if kind == AuthorityKind::Tracker {
            self.tracker = TrackerState {
                started: Some(now),
                ..TrackerState::default()
            };
        }
        self.own.retain(|o| o.kind != kind);
        self.own.push(Own {
            kind,
            authority,
            active: true,
            next_beacon: now,
            rival: None,
            answered: HashMap::new(),
        });
        self.events.push_back(Event::Active(kind));
        // An authority does not follow itself over the network: a data
        // sink that also produces points its own clients at its broker.
        if kind == AuthorityKind::Datasink && self.sink_follow.is_some() {
            let authority = self.own.last().expect("pushed").authority.clone();
            self.events.push_back(Event::Sink {
                node: self.cfg.node.clone(),
                authority,
            });
        }
        self.tick(now);
    }

    /// The data sink's current authority record (after resizes).
    pub fn own_authority(&self, kind: AuthorityKind) -> Option<&Authority> {
        self.own
            .iter()
            .find(|o| o.kind == kind && o.active)
            .map(|o| &o.authority)
    }

    /// A slave's broker runs and listens on `listener`: register it.
    pub fn slave_ready(&mut self, listener: String, now: Instant) {
        if let Some(s) = &mut self.slave {
            s.listener = Some(listener);
            s.next_register = Some(now);
            s.acknowledged = false;
        }
        self.tick(now);
    }

    /// The sink reassigned partitions over `brokers` (all of them, itself
    /// included): broadcast CLUSTER_RESIZE with the new bootstrap list.
    pub fn cluster_resized(&mut self, brokers: Vec<u32>, now: Instant) {
        let listeners: Vec<String> = brokers
            .iter()
            .filter_map(|b| self.slaves.listeners.get(b).cloned())
            .collect();
        if let Some(o) = self
            .own
            .iter_mut()
            .find(|o| o.kind == AuthorityKind::Datasink)
        {
            o.authority.generation += 1;
            let mut boot: Vec<String> = o
                .authority
                .bootstrap
                .as_deref()
                .unwrap_or("")
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            for l in listeners {
                if !boot.contains(&l) {
                    boot.push(l);
                }
            }
            o.authority.bootstrap = Some(boot.join(","));
            let authority = o.authority.clone();
            if o.active {
                self.out
                    .push_back(Out::Broadcast(Body::ClusterResize { authority, brokers }));
            }
        }
        let _ = now;
    }

    /// Clean shutdown: a BYE to each authority followed, and a broadcast
    /// BYE for an authority that steps down.
    pub fn shutdown(&mut self) {
        let bye = Body::Bye {
            roles: self.cfg.roles.clone(),
        };
        for f in [&self.sink_follow, &self.tracker_follow]
            .into_iter()
            .flatten()
        {
            if let Some(c) = &f.current {
                self.out.push_back(Out::Unicast(c.addr, bye.clone()));
            }
        }
        if self.own.iter().any(|o| o.active) {
            self.out.push_back(Out::Broadcast(bye));
        }
        self.stopped = true;
    }

    pub fn poll_out(&mut self) -> Option<Out> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The p2p destination set currently held for `topic`.
    pub fn destinations(&self, topic: &str) -> &[SocketAddr] {
        self.dests
            .sets
            .get(topic)
            .map(|s| s.2.as_slice())
            .unwrap_or(&[])
    }

    /// Whether every authority this node follows has configured it.
    pub fn configured(&self) -> bool {
        [&self.sink_follow, &self.tracker_follow]
            .into_iter()
            .flatten()
            .all(Follow::live)
    }

    /// The tracker's table sizes (producers, consumers), for `/metrics`.
    pub fn tracker_size(&self) -> (usize, usize) {
        (self.tracker.producers.len(), self.tracker.consumers.len())
    }

    fn jitter(&mut self, d: Duration) -> Duration {
        // xorshift64: a quarter up or down.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let f = 0.75 + (self.rng % 1000) as f64 / 2000.0;
        d.mul_f64(f)
    }

    /// The earliest instant [`Node::tick`] has work.
    pub fn next_deadline(&self, now: Instant) -> Instant {
        let mut t = now + Duration::from_secs(1);
        let mut at = |i: Option<Instant>| {
            if let Some(i) = i {
                t = t.min(i);
            }
        };
        for f in [&self.sink_follow, &self.tracker_follow]
            .into_iter()
            .flatten()
        {
            at(f.hello_at);
            at(f.current
                .as_ref()
                .map(|c| c.last_heard + self.cfg.timers.authority_timeout));
        }
        for o in &self.own {
            at(Some(o.next_beacon));
        }
        at(self.slave.as_ref().and_then(|s| s.next_register));
        at(self.dests.next_publish);
        at(self.next_subscribe);
        at(self
            .tracker
            .started
            .filter(|_| !self.tracker.warm)
            .map(|s| s + self.cfg.timers.tracker_warmup));
        t.max(now)
    }

    /// Runs the timers due at `now`.
    pub fn tick(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        let timers = self.cfg.timers.clone();
        // HELLO retries and authority expiry.
        let mut hello = false;
        for i in 0..2 {
            let f = if i == 0 {
                &mut self.sink_follow
            } else {
                &mut self.tracker_follow
            };
            let Some(f) = f else { continue };
            if let Some(c) = &f.current {
                if now >= c.last_heard + timers.authority_timeout {
                    f.current = None;
                    f.hello_at = Some(now);
                    f.backoff = Duration::ZERO;
                    self.events.push_back(Event::AuthorityLost(f.kind));
                }
            }
            if f.current.is_none() && f.hello_at.is_some_and(|t| now >= t) {
                hello = true;
            }
        }
        if hello {
            self.out.push_back(Out::Broadcast(self.hello()));
            for i in 0..2 {
                let live = match if i == 0 {
                    &self.sink_follow
                } else {
                    &self.tracker_follow
                } {
                    Some(f) => f.live(),
                    None => continue,
                };
                if live {
                    continue;
                }
                let b = {
                    let f = if i == 0 {
                        self.sink_follow.as_ref()
                    } else {
                        self.tracker_follow.as_ref()
                    };
                    let b = f.map(|f| f.backoff).unwrap_or_default();
                    if b.is_zero() {
                        timers.hello_first
                    } else {
                        (b * 2).min(timers.hello_max)
                    }
                };
                let wait = self.jitter(b);
                let f = if i == 0 {
                    self.sink_follow.as_mut()
                } else {
                    self.tracker_follow.as_mut()
                };
                if let Some(f) = f {
                    f.backoff = b;
                    f.hello_at = Some(now + wait);
                }
            }
        }
        // Authority beacons and rivals.
        for o in &mut self.own {
            if let Some(r) = &o.rival {
                if now >= r.last_heard + timers.authority_timeout {
                    // The rival is gone: take over with a higher epoch.
                    o.authority.epoch = o.authority.epoch.max(r.epoch + 1);
                    o.rival = None;
                    o.active = true;
                    o.next_beacon = now;
                    if o.kind == AuthorityKind::Tracker {
                        self.tracker = TrackerState {
                            started: Some(now),
                            ..TrackerState::default()
                        };
                    }
                    self.events.push_back(Event::Active(o.kind));
                }
            }
            if o.active && now >= o.next_beacon {
                let authority = o.authority.clone();
                self.out.push_back(Out::Broadcast(match o.kind {
                    AuthorityKind::Datasink => Body::Reconfig { authority },
                    AuthorityKind::Tracker => Body::TrackerReconfig { authority },
                }));
                o.next_beacon = now + timers.beacon;
            }
            o.answered
                .retain(|_, t| now < *t + Duration::from_millis(100));
        }
        // Slave registration retries.
        if let Some(s) = &mut self.slave {
            if let (Some(id), Some(l), Some(t)) = (s.broker_id, &s.listener, s.next_register) {
                if !s.acknowledged && now >= t {
                    if let Some(c) = self.sink_follow.as_ref().and_then(|f| f.current.as_ref()) {
                        self.out.push_back(Out::Unicast(
                            c.addr,
                            Body::RegisterSlave {
                                broker_id: id,
                                listener: l.clone(),
                            },
                        ));
                    }
                    s.next_register = Some(now + timers.regslave_retry);
                }
            }
        }
        // Lease renewals to the tracker.
        let tracker = self
            .tracker_follow
            .as_ref()
            .and_then(|f| f.current.as_ref())
            .map(|c| c.addr);
        if let Some(addr) = tracker {
            if self.cfg.roles.contains(&Role::P2pProducer)
                && self.dests.next_publish.is_some_and(|t| now >= t)
            {
                self.out.push_back(Out::Unicast(addr, self.publish()));
                self.dests.next_publish = Some(now + timers.renew);
            }
            if self.cfg.roles.contains(&Role::P2pConsumer)
                && self.next_subscribe.is_some_and(|t| now >= t)
            {
                self.out.push_back(Out::Unicast(addr, self.subscribe()));
                self.next_subscribe = Some(now + timers.renew);
            }
        }
        self.tracker_tick(now);
    }

    fn hello(&self) -> Body {
        Body::Hello {
            roles: self.cfg.roles.clone(),
            publish: self.cfg.publish.clone(),
            subscribe: self.cfg.subscribe.clone(),
        }
    }

    fn publish(&self) -> Body {
        let mut have: Vec<Have> = self
            .dests
            .sets
            .iter()
            .map(|(t, (e, v, _))| Have {
                topic: t.clone(),
                epoch: *e,
                version: *v,
            })
            .collect();
        have.sort_by(|a, b| a.topic.cmp(&b.topic));
        Body::Publish {
            topics: self.cfg.publish.clone(),
            lease_ms: self.cfg.timers.lease.as_millis() as u32,
            have,
        }
    }

    fn subscribe(&self) -> Body {
        Body::Subscribe {
            subscriptions: self.cfg.subscribe.clone(),
            lease_ms: self.cfg.timers.lease.as_millis() as u32,
        }
    }

    /// Takes one authenticated, fresh message from `from` (its source
    /// address; the unicast reply address is `from.ip()` and `msg.port`).
    pub fn handle(&mut self, now: Instant, from: SocketAddr, msg: &Message) {
        if self.stopped || msg.node == self.cfg.node {
            return;
        }
        let reply = SocketAddr::new(from.ip(), msg.port);
        match &msg.body {
            Body::Hello {
                roles,
                publish,
                subscribe,
            } => self.on_hello(now, reply, msg, roles, publish, subscribe),
            Body::Config {
                authority,
                broker_id,
            } => {
                self.on_authority(now, AuthorityKind::Datasink, reply, &msg.node, authority);
                if let (Some(id), true) = (
                    broker_id,
                    self.is_current(AuthorityKind::Datasink, &msg.node),
                ) {
                    self.on_broker_id(*id, &msg.node, authority);
                }
            }
            Body::Reconfig { authority } => {
                self.on_rival(now, AuthorityKind::Datasink, &msg.node, authority.epoch);
                self.on_authority(now, AuthorityKind::Datasink, reply, &msg.node, authority);
            }
            Body::ClusterResize { authority, brokers } => {
                self.on_authority(now, AuthorityKind::Datasink, reply, &msg.node, authority);
                if let Some(s) = &mut self.slave {
                    if s.broker_id.is_some_and(|id| brokers.contains(&id)) {
                        s.acknowledged = true;
                    }
                }
            }
            Body::TrackerConfig { authority } => {
                self.on_authority(now, AuthorityKind::Tracker, reply, &msg.node, authority)
            }
            Body::TrackerReconfig { authority } => {
                self.on_rival(now, AuthorityKind::Tracker, &msg.node, authority.epoch);
                self.on_authority(now, AuthorityKind::Tracker, reply, &msg.node, authority);
            }
            Body::RegisterSlave {
                broker_id,
                listener,
            } => self.on_register_slave(&msg.node, *broker_id, listener, reply),
            Body::Publish {
                topics,
                lease_ms,
                have,
            } => self.on_publish(now, &msg.node, reply, topics, *lease_ms, have),
            Body::Subscribe {
                subscriptions,
                lease_ms,
            } => self.on_subscribe(now, &msg.node, reply, subscriptions, *lease_ms),
            Body::NewDestination {
                topic,
                epoch,
                version,
                dests,
            } => self.on_new_destination(&msg.node, topic, *epoch, *version, dests),
            Body::Bye { roles } => self.on_bye(now, &msg.node, roles),
        }
    }

    fn is_current(&self, kind: AuthorityKind, node: &str) -> bool {
        let f = match kind {
            AuthorityKind::Datasink => &self.sink_follow,
            AuthorityKind::Tracker => &self.tracker_follow,
        };
        f.as_ref()
            .and_then(|f| f.current.as_ref())
            .is_some_and(|c| c.node == node)
    }

    fn on_authority(
        &mut self,
        now: Instant,
        kind: AuthorityKind,
        addr: SocketAddr,
        node: &str,
        authority: &Authority,
    ) {
        let f = match kind {
            AuthorityKind::Datasink => self.sink_follow.as_mut(),
            AuthorityKind::Tracker => self.tracker_follow.as_mut(),
        };
        let Some(f) = f else { return };
        let newer = match &f.current {
            None => true,
            Some(c) => (authority.epoch, node) > (c.authority.epoch, c.node.as_str()),
        };
        let same = f
            .current
            .as_ref()
            .is_some_and(|c| c.node == node && c.authority.epoch == authority.epoch);
        if !newer && !same {
            return; // an older or lower authority: ignored
        }
        let changed = !same
            || f.current
                .as_ref()
                .is_some_and(|c| c.authority != *authority || c.addr != addr);
        f.current = Some(Current {
            node: node.to_string(),
            addr,
            authority: authority.clone(),
            last_heard: now,
        });
        f.hello_at = None;
        f.backoff = Duration::ZERO;
        if !changed {
            return;
        }
        match kind {
            AuthorityKind::Datasink => {
                self.events.push_back(Event::Sink {
                    node: node.to_string(),
                    authority: authority.clone(),
                });
                // A slave under a new sink asks for a broker id again.
                if let Some(s) = &mut self.slave {
                    if s.sink.as_deref() != Some(node) {
                        s.sink = Some(node.to_string());
                        if s.broker_id.is_none() || !same {
                            self.out.push_back(Out::Unicast(addr, self.hello_body()));
                        }
                    }
                }
            }
            AuthorityKind::Tracker => {
                self.events.push_back(Event::Tracker {
                    node: node.to_string(),
                    epoch: authority.epoch,
                });
                if !same {
                    // Register with the new tracker at once.
                    if self.cfg.roles.contains(&Role::P2pProducer) {
                        self.dests.next_publish = Some(now);
                    }
                    if self.cfg.roles.contains(&Role::P2pConsumer) {
                        self.next_subscribe = Some(now);
                    }
                    self.tick(now);
                }
            }
        }
    }

    fn hello_body(&self) -> Body {
        self.hello()
    }

    fn on_broker_id(&mut self, id: u32, sink: &str, authority: &Authority) {
        if let Some(s) = &mut self.slave {
            if s.broker_id != Some(id) {
                s.broker_id = Some(id);
                s.sink = Some(sink.to_string());
                s.acknowledged = false;
                self.events.push_back(Event::SlaveAssigned {
                    broker_id: id,
                    authority: authority.clone(),
                });
            }
        }
    }

    /// Another authority of a kind this node also is: the higher
    /// `(epoch, node)` stays, the other steps down.
    fn on_rival(&mut self, now: Instant, kind: AuthorityKind, node: &str, epoch: u64) {
        let me = self.cfg.node.clone();
        let Some(o) = self.own.iter_mut().find(|o| o.kind == kind) else {
            return;
        };
        if (epoch, node) > (o.authority.epoch, me.as_str()) {
            if o.active {
                o.active = false;
                self.events.push_back(Event::SteppedDown(kind));
            }
            o.rival = Some(Rival {
                epoch,
                last_heard: now,
            });
        } else if o.active {
            // Tell the lower one at once.
            o.next_beacon = now;
        }
    }

    fn on_hello(
        &mut self,
        now: Instant,
        reply: SocketAddr,
        msg: &Message,
        roles: &[Role],
        publish: &[String],
        subscribe: &[Subscription],
    ) {
        for i in 0..self.own.len() {
            let o = &self.own[i];
            if !o.active {
                continue;
            }
            let wants = match o.kind {
                AuthorityKind::Datasink => roles.iter().any(|r| r.follows_sink()),
                AuthorityKind::Tracker => roles.iter().any(|r| r.follows_tracker()),
            };
            if !wants || o.answered.contains_key(&msg.node) || o.answered.len() >= MAX_NODES {
                continue;
            }
            let authority = o.authority.clone();
            let kind = o.kind;
            self.own[i].answered.insert(msg.node.clone(), now);
            match kind {
                AuthorityKind::Datasink => {
                    let broker_id = if roles.contains(&Role::DatasinkSlave) {
                        self.broker_id_for(&msg.node)
                    } else {
                        None
                    };
                    if roles.contains(&Role::DatasinkSlave) && broker_id.is_none() {
                        continue; // no ids left
                    }
                    self.out.push_back(Out::Unicast(
                        reply,
                        Body::Config {
                            authority,
                            broker_id,
                        },
                    ));
                }
                AuthorityKind::Tracker => {
                    self.out
                        .push_back(Out::Unicast(reply, Body::TrackerConfig { authority }));
                    // Register what the HELLO announces, as the prototype did.
                    let lease = self.cfg.timers.lease.as_millis() as u32;
                    if roles.contains(&Role::P2pProducer) {
                        self.on_publish(now, &msg.node, reply, publish, lease, &[]);
                    }
                    if roles.contains(&Role::P2pConsumer) {
                        self.on_subscribe(now, &msg.node, reply, subscribe, lease);
                    }
                }
            }
        }
    }

    fn broker_id_for(&mut self, node: &str) -> Option<u32> {
        if let Some(id) = self.slaves.ids.get(node) {
            return Some(*id);
        }
        if self.slaves.ids.len() >= MAX_SLAVES {
            return None;
        }
        let id = self.slaves.next;
        self.slaves.next += 1;
        self.slaves.ids.insert(node.to_string(), id);
        Some(id)
    }

    fn on_register_slave(&mut self, node: &str, id: u32, listener: &str, reply: SocketAddr) {
        let Some(o) = self
            .own
            .iter()
            .find(|o| o.kind == AuthorityKind::Datasink && o.active)
        else {
            return;
        };
        if self.slaves.ids.get(node) != Some(&id) {
            return; // not the id this sink gave that node
        }
        if self.slaves.registered.contains(&id) {
            // Already in: the CLUSTER_RESIZE was lost; repeat it to the slave.
            let mut brokers = vec![1];
            brokers.extend(self.slaves.registered.iter().copied());
            self.out.push_back(Out::Unicast(
                reply,
                Body::ClusterResize {
                    authority: o.authority.clone(),
                    brokers,
                },
            ));
            return;
        }
        self.slaves.registered.insert(id);
        self.slaves.listeners.insert(id, listener.to_string());
        self.events.push_back(Event::SlaveRegistered {
            broker_id: id,
            listener: listener.to_string(),
        });
    }

    fn tracker_active(&self) -> bool {
        self.own
            .iter()
            .any(|o| o.kind == AuthorityKind::Tracker && o.active)
    }

    fn lease_end(&self, now: Instant, lease_ms: u32) -> Instant {
        now + Duration::from_millis(u64::from(lease_ms)).min(self.cfg.timers.lease * 4)
    }

    fn on_publish(
        &mut self,
        now: Instant,
        node: &str,
        reply: SocketAddr,
        topics: &[String],
        lease_ms: u32,
        have: &[Have],
    ) {
        if !self.tracker_active() {
            return;
        }
        let room = self.tracker.producers.len() + self.tracker.consumers.len() < MAX_NODES;
        if !self.tracker.producers.contains_key(node) && !room {
            return;
        }
        let expires = self.lease_end(now, lease_ms);
        self.tracker.producers.insert(
            node.to_string(),
            Lease {
                value: Published {
                    topics: topics.to_vec(),
                    have: have.to_vec(),
                },
                addr: reply.ip(),
                port: reply.port(),
                expires,
            },
        );
        if self.tracker.warm {
            self.send_sets_to(node);
        }
    }

    fn on_subscribe(
        &mut self,
        now: Instant,
        node: &str,
        reply: SocketAddr,
        subs: &[Subscription],
        lease_ms: u32,
    ) {
        if !self.tracker_active() {
            return;
        }
        let room = self.tracker.producers.len() + self.tracker.consumers.len() < MAX_NODES;
        if !self.tracker.consumers.contains_key(node) && !room {
            return;
        }
        let expires = self.lease_end(now, lease_ms);
        self.tracker.consumers.insert(
            node.to_string(),
            Lease {
                value: subs.to_vec(),
                addr: reply.ip(),
                port: reply.port(),
                expires,
            },
        );
        self.recompute_sets();
    }

    fn on_bye(&mut self, now: Instant, node: &str, roles: &[Role]) {
        let mut changed = false;
        if self.tracker_active() {
            changed |= self.tracker.consumers.remove(node).is_some();
            self.tracker.producers.remove(node);
        }
        for o in &mut self.own {
            o.answered.remove(node);
        }
        // An authority stepping down: stop following it.
        for f in [&mut self.sink_follow, &mut self.tracker_follow]
            .into_iter()
            .flatten()
        {
            let is_authority = roles.iter().any(|r| {
                matches!(
                    (f.kind, r),
                    (AuthorityKind::Datasink, Role::Datasink)
                        | (AuthorityKind::Tracker, Role::Tracker)
                )
            });
            if is_authority && f.current.as_ref().is_some_and(|c| c.node == node) {
                f.current = None;
                f.hello_at = Some(now);
                f.backoff = Duration::ZERO;
                self.events.push_back(Event::AuthorityLost(f.kind));
            }
        }
        if changed {
            self.recompute_sets();
        }
    }

    /// Recomputes every topic's destination set; a changed set gets the
    /// next version and goes to the topic's producers (once warm).
    fn recompute_sets(&mut self) {
        let mut fresh: HashMap<String, Vec<SocketAddr>> = HashMap::new();
        for c in self.tracker.consumers.values() {
            for s in &c.value {
                let ip = s.host.unwrap_or(c.addr);
                fresh
                    .entry(s.topic.clone())
                    .or_default()
                    .push(SocketAddr::new(ip, s.port));
            }
        }
        let mut changed = Vec::new();
        let topics: BTreeSet<String> = fresh
            .keys()
            .chain(self.tracker.sets.keys())
            .cloned()
            .collect();
        for t in topics {
            let mut d = fresh.remove(&t).unwrap_or_default();
            d.sort();
            d.dedup();
            d.truncate(MAX_DESTINATIONS);
            let entry = self
                .tracker
                .sets
                .entry(t.clone())
                .or_insert((0, Vec::new()));
            if entry.1 != d || entry.0 == 0 {
                entry.0 += 1;
                entry.1 = d;
                changed.push(t);
            }
        }
        if !self.tracker.warm {
            return;
        }
        let producers: Vec<String> = self
            .tracker
            .producers
            .iter()
            .filter(|(_, p)| p.value.topics.iter().any(|t| changed.contains(t)))
            .map(|(n, _)| n.clone())
            .collect();
        for p in producers {
            self.send_sets_to(&p);
        }
    }

    /// Sends `node` every set of its topics that it does not hold yet.
    fn send_sets_to(&mut self, node: &str) {
        let epoch = self
            .own_authority(AuthorityKind::Tracker)
            .map(|a| a.epoch)
            .unwrap_or(0);
        let Some(p) = self.tracker.producers.get(node) else {
            return;
        };
        let addr = SocketAddr::new(p.addr, p.port);
        for t in &p.value.topics {
            let (version, dests) = self.tracker.sets.get(t).cloned().unwrap_or((0, Vec::new()));
            let has = p.value.have.iter().find(|h| &h.topic == t);
            if has.is_some_and(|h| h.epoch == epoch && h.version == version) {
                continue;
            }
            self.out.push_back(Out::Unicast(
                addr,
                Body::NewDestination {
                    topic: t.clone(),
                    epoch,
                    version,
                    dests,
                },
            ));
        }
        // Until the next PUBLISH says otherwise, assume it has them.
        let sent: Vec<Have> = p
            .value
            .topics
            .iter()
            .map(|t| Have {
                topic: t.clone(),
                epoch,
                version: self.tracker.sets.get(t).map(|s| s.0).unwrap_or(0),
            })
            .collect();
        if let Some(p) = self.tracker.producers.get_mut(node) {
            p.value.have = sent;
        }
    }

    fn tracker_tick(&mut self, now: Instant) {
        if !self.tracker_active() {
            return;
        }
        let before = self.tracker.consumers.len();
        self.tracker.consumers.retain(|_, c| now < c.expires);
        self.tracker.producers.retain(|_, p| now < p.expires);
        let expired = self.tracker.consumers.len() != before;
        if !self.tracker.warm
            && self
                .tracker
                .started
                .is_some_and(|s| now >= s + self.cfg.timers.tracker_warmup)
        {
            self.tracker.warm = true;
            self.recompute_sets();
            let all: Vec<String> = self.tracker.producers.keys().cloned().collect();
            for p in all {
                self.send_sets_to(&p);
            }
        } else if expired {
            self.recompute_sets();
        }
    }

    fn on_new_destination(
        &mut self,
        node: &str,
        topic: &str,
        epoch: u64,
        version: u64,
        dests: &[SocketAddr],
    ) {
        if !self.cfg.roles.contains(&Role::P2pProducer)
            || !self.is_current(AuthorityKind::Tracker, node)
        {
            return;
        }
        if !self.cfg.publish.iter().any(|t| t == topic) {
            return;
        }
        let held = self.dests.sets.get(topic).map(|s| (s.0, s.1));
        if held.is_some_and(|h| h >= (epoch, version)) {
            return;
        }
        let allowed: Vec<SocketAddr> = dests
            .iter()
            .filter(|d| d.port() != 0 && self.cfg.allowed.iter().any(|n| n.contains(d.ip())))
            .copied()
            .take(MAX_DESTINATIONS)
            .collect();
        self.dests
            .sets
            .insert(topic.to_string(), (epoch, version, allowed.clone()));
        self.events.push_back(Event::Destinations {
            topic: topic.to_string(),
            dests: allowed,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// A broadcast domain of nodes on one clock: what one sends reaches the
    /// others at once (broadcast) or the node at that address (unicast).
    struct Lan {
        nodes: Vec<(SocketAddr, Node, u64)>,
        ports: u16,
        now: Instant,
        events: Vec<(String, Event)>,
        lost: Box<dyn FnMut(&Body) -> bool>,
    }

    fn timers() -> Timers {
        Timers::default()
    }

    fn cfg(node: &str, roles: &[Role]) -> NodeConfig {
        NodeConfig {
            node: node.into(),
            roles: roles.to_vec(),
            publish: vec!["edge.stats".into()],
            subscribe: vec![Subscription {
                topic: "edge.stats".into(),
                port: 9000,
                host: None,
            }],
            allowed: vec![Net::parse("127.0.0.0/8").unwrap()],
            timers: timers(),
            seed: node.len() as u64 * 7919,
        }
    }

    fn authority(epoch: u64) -> Authority {
        Authority {
            epoch,
            bootstrap: Some("127.0.0.1:9092".into()),
            cluster_id: Some("c1".into()),
            controller: Some("127.0.0.1:9093".into()),
            generation: 0,
        }
    }

    impl Lan {
        fn new() -> Lan {
            Lan {
                nodes: Vec::new(),
                ports: 20000,
                now: Instant::now(),
                events: Vec::new(),
                lost: Box::new(|_| false),
            }
        }

        fn add(&mut self, c: NodeConfig) -> usize {
            self.ports += 1;
            let port = self.ports;
            let n = Node::new(c, self.now);
            self.nodes
                .push((SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port), n, 0));
            self.nodes.len() - 1
        }

        fn node(&mut self, name: &str) -> &mut Node {
            &mut self
                .nodes
                .iter_mut()
                .find(|n| n.1.cfg.node == name)
                .unwrap()
                .1
        }

        fn remove(&mut self, name: &str) {
            self.nodes.retain(|n| n.1.cfg.node != name);
        }

        /// Delivers everything queued, repeatedly, then collects events.
        fn settle(&mut self) {
            for _ in 0..100 {
                let mut sent = Vec::new();
                for (addr, n, seq) in &mut self.nodes {
                    while let Some(o) = n.poll_out() {
                        *seq += 1;
                        sent.push((*addr, n.cfg.node.clone(), *seq, o));
                    }
                    while let Some(e) = n.poll_event() {
                        self.events.push((n.cfg.node.clone(), e));
                    }
                }
                if sent.is_empty() {
                    return;
                }
                for (from, node, seq, o) in sent {
                    let (to, body) = match o {
                        Out::Broadcast(b) => (None, b),
                        Out::Unicast(a, b) => (Some(a), b),
                    };
                    if (self.lost)(&body) {
                        continue;
                    }
                    let msg = Message {
                        v: 1,
                        node,
                        inc: 1,
                        seq,
                        ts: 0,
                        port: from.port(),
                        body,
                    };
                    for (addr, n, _) in &mut self.nodes {
                        if *addr != from && to.is_none_or(|t| t == *addr) {
                            n.handle(self.now, from, &msg);
                        }
                    }
                }
            }
            panic!("messages never stopped");
        }

        /// Advances the clock in 50 ms steps, ticking every node.
        fn run(&mut self, d: Duration) {
            let end = self.now + d;
            while self.now < end {
                self.now += Duration::from_millis(50);
                for (_, n, _) in &mut self.nodes {
                    n.tick(self.now);
                }
                self.settle();
            }
        }

        fn dests(&self, node: &str) -> Vec<SocketAddr> {
            self.nodes
                .iter()
                .find(|n| n.1.cfg.node == node)
                .unwrap()
                .1
                .destinations("edge.stats")
                .to_vec()
        }
    }

    #[test]
    fn every_start_order_of_sink_producer_and_consumer_configures_all() {
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        for order in orders {
            let mut lan = Lan::new();
            for (i, who) in order.iter().enumerate() {
                match who {
                    0 => {
                        lan.add(cfg("sink", &[Role::Datasink]));
                        let now = lan.now;
                        lan.node("sink").become_authority(
                            AuthorityKind::Datasink,
                            authority(100),
                            now,
                        );
                    }
                    1 => {
                        lan.add(cfg("prod", &[Role::Producer]));
                    }
                    _ => {
                        lan.add(cfg("cons", &[Role::Consumer]));
                    }
                }
                // Each start a little apart, the last one measured.
                lan.run(Duration::from_millis(if i < 2 { 700 } else { 0 }));
            }
            let t0 = lan.now;
            lan.settle();
            while !(lan.node("prod").configured() && lan.node("cons").configured()) {
                lan.run(Duration::from_millis(50));
                assert!(
                    lan.now - t0 < Duration::from_secs(1),
                    "order {order:?} not configured in 1 s"
                );
            }
            for who in ["prod", "cons"] {
                assert!(lan.events.iter().any(|(n, e)| n == who
                    && matches!(e, Event::Sink { authority, .. } if authority.bootstrap.as_deref() == Some("127.0.0.1:9092"))));
            }
        }
    }

    #[test]
    fn hello_is_retried_with_growing_jittered_intervals_until_answered() {
        let mut lan = Lan::new();
        lan.add(cfg("prod", &[Role::Producer]));
        let mut hellos = Vec::new();
        for _ in 0..400 {
            lan.now += Duration::from_millis(50);
            let now = lan.now;
            let n = lan.node("prod");
            n.tick(now);
            while let Some(o) = n.poll_out() {
                assert!(matches!(o, Out::Broadcast(Body::Hello { .. })));
                hellos.push(now);
            }
        }
        let gaps: Vec<u128> = hellos
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert!(gaps[0] >= 150 && gaps[0] <= 350, "{gaps:?}");
        assert!(gaps.iter().all(|g| *g <= 5050), "{gaps:?}");
        assert!(
            gaps.last().unwrap() >= &2950,
            "backoff grows to ~4 s: {gaps:?}"
        );
        // 20 s of retries stay a handful of datagrams.
        assert!(hellos.len() < 15, "{}", hellos.len());
    }

    #[test]
    fn a_lost_reconfig_is_repaired_by_the_next_beacon() {
        let mut lan = Lan::new();
        lan.add(cfg("prod", &[Role::Producer]));
        lan.run(Duration::from_secs(3));
        // The producer's HELLO retries are lost, and so is the first RECONFIG.
        let mut first = true;
        lan.lost = Box::new(move |b| match b {
            Body::Hello { .. } => true,
            Body::Reconfig { .. } if first => {
                first = false;
                true
            }
            _ => false,
        });
        lan.add(cfg("sink", &[Role::Datasink]));
        let now = lan.now;
        lan.node("sink")
            .become_authority(AuthorityKind::Datasink, authority(100), now);
        lan.settle();
        assert!(!lan.node("prod").configured());
        lan.run(Duration::from_millis(2100));
        assert!(lan.node("prod").configured());
    }

    #[test]
    fn a_respawned_sink_elsewhere_is_followed_and_the_old_one_steps_down() {
        let mut lan = Lan::new();
        lan.add(cfg("sink-a", &[Role::Datasink]));
        lan.add(cfg("prod", &[Role::Producer]));
        let now = lan.now;
        lan.node("sink-a")
            .become_authority(AuthorityKind::Datasink, authority(100), now);
        lan.run(Duration::from_millis(500));
        lan.add(cfg("sink-b", &[Role::Datasink]));
        let mut b = authority(200);
        b.bootstrap = Some("127.0.0.2:9092".into());
        let now = lan.now;
        lan.node("sink-b")
            .become_authority(AuthorityKind::Datasink, b, now);
        lan.run(Duration::from_millis(100));
        assert!(
            lan.events
                .iter()
                .any(|(n, e)| n == "prod"
                    && matches!(e, Event::Sink { node, .. } if node == "sink-b"))
        );
        assert!(lan
            .events
            .iter()
            .any(|(n, e)| n == "sink-a" && *e == Event::SteppedDown(AuthorityKind::Datasink)));
        // sink-a's later beacons stop; the producer stays on sink-b.
        lan.run(Duration::from_secs(5));
        let last_sink = lan.events.iter().rev().find_map(|(n, e)| match e {
            Event::Sink { node, .. } if n == "prod" => Some(node.clone()),
            _ => None,
        });
        assert_eq!(last_sink.as_deref(), Some("sink-b"));
        // sink-b dies: after the timeout sink-a takes over with a higher epoch.
        lan.remove("sink-b");
        lan.run(Duration::from_secs(8));
        assert!(lan
            .events
            .iter()
            .any(|(n, e)| n == "sink-a" && *e == Event::Active(AuthorityKind::Datasink)));
        let a = lan
            .node("sink-a")
            .own_authority(AuthorityKind::Datasink)
            .unwrap()
            .epoch;
        assert!(a > 200, "{a}");
        assert!(
            lan.events
                .iter()
                .rev()
                .any(|(n, e)| n == "prod"
                    && matches!(e, Event::Sink { node, .. } if node == "sink-a"))
        );
    }

    #[test]
    fn a_slave_gets_one_broker_id_registers_and_is_acknowledged() {
        let mut lan = Lan::new();
        lan.add(cfg("sink", &[Role::Datasink]));
        let now = lan.now;
        lan.node("sink")
            .become_authority(AuthorityKind::Datasink, authority(100), now);
        lan.add(cfg("slave", &[Role::DatasinkSlave]));
        lan.run(Duration::from_millis(300));
        let assigned: Vec<u32> = lan
            .events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::SlaveAssigned { broker_id, .. } => Some(*broker_id),
                _ => None,
            })
            .collect();
        assert_eq!(assigned, vec![2]);
        // A repeated HELLO (e.g. a retry that crossed the CONFIG) keeps the id.
        assert_eq!(lan.node("sink").broker_id_for("slave"), Some(2));
        let now = lan.now;
        lan.node("slave").slave_ready("127.0.0.1:9192".into(), now);
        lan.settle();
        assert!(lan.events.iter().any(|(n, e)| n == "sink"
            && *e
                == Event::SlaveRegistered {
                    broker_id: 2,
                    listener: "127.0.0.1:9192".into()
                }));
        // Until the resize is done, the slave repeats its registration.
        lan.run(Duration::from_millis(1100));
        let registered = lan
            .events
            .iter()
            .filter(|(_, e)| matches!(e, Event::SlaveRegistered { .. }))
            .count();
        assert_eq!(
            registered, 1,
            "a repeated REGISTER_SLAVE is not a second registration"
        );
        let now = lan.now;
        lan.node("sink").cluster_resized(vec![1, 2], now);
        lan.settle();
        let boot = lan
            .node("sink")
            .own_authority(AuthorityKind::Datasink)
            .unwrap()
            .bootstrap
            .clone();
        assert_eq!(boot.as_deref(), Some("127.0.0.1:9092,127.0.0.1:9192"));
        assert!(lan.node("slave").slave.as_ref().unwrap().acknowledged);
    }

    fn p2p() -> Lan {
        let mut lan = Lan::new();
        lan.add(cfg("tracker", &[Role::Tracker]));
        let now = lan.now;
        lan.node("tracker")
            .become_authority(AuthorityKind::Tracker, authority(100), now);
        lan.add(cfg("prod", &[Role::P2pProducer]));
        lan.add(cfg("cons-a", &[Role::P2pConsumer]));
        lan.add(cfg("cons-b", &[Role::P2pConsumer]));
        lan.run(Duration::from_secs(3));
        lan
    }

    #[test]
    fn the_tracker_joins_producers_and_consumers_into_full_sets() {
        let lan = p2p();
        let d = lan.dests("prod");
        assert_eq!(
            d,
            vec![SocketAddr::from(([127, 0, 0, 1], 9000))],
            "both consumers on one host and port"
        );
    }

    #[test]
    fn consumers_that_stop_renewing_drop_out_and_a_respawned_tracker_sends_no_partial_set() {
        let mut lan = p2p();
        // Consumers on distinct hosts.
        for (name, ip) in [("cons-a", [127, 0, 0, 11]), ("cons-b", [127, 0, 0, 12])] {
            lan.node(name).cfg.subscribe[0].host = Some(IpAddr::from(ip));
            lan.node(name).next_subscribe = Some(lan.now);
        }
        lan.run(Duration::from_millis(200));
        assert_eq!(lan.dests("prod").len(), 2);
        // The tracker dies and a new one starts elsewhere at once.
        lan.remove("tracker");
        lan.add(cfg("tracker-2", &[Role::Tracker]));
        let now = lan.now;
        lan.node("tracker-2")
            .become_authority(AuthorityKind::Tracker, authority(300), now);
        let mut min = usize::MAX;
        for _ in 0..80 {
            lan.run(Duration::from_millis(50));
            min = min.min(lan.dests("prod").len());
        }
        assert_eq!(min, 2, "the producer never held a partial set");
        assert!(lan
            .events
            .iter()
            .any(|(n, e)| n == "prod" && matches!(e, Event::Tracker { epoch: 300, .. })));
        // cons-b vanishes without BYE: out after its lease.
        lan.remove("cons-b");
        lan.run(Duration::from_secs(7));
        assert_eq!(
            lan.dests("prod"),
            vec![SocketAddr::from(([127, 0, 0, 11], 9000))]
        );
        // cons-a leaves with BYE: out at once.
        lan.node("cons-a").shutdown();
        lan.settle();
        lan.run(Duration::from_millis(100));
        assert_eq!(lan.dests("prod"), vec![]);
    }

    #[test]
    fn destinations_outside_the_allowed_networks_are_dropped() {
        let mut lan = p2p();
        lan.node("cons-a").cfg.subscribe[0].host = Some(IpAddr::from([169, 254, 169, 254]));
        lan.node("cons-a").next_subscribe = Some(lan.now);
        lan.run(Duration::from_millis(200));
        assert!(
            lan.dests("prod").iter().all(|d| d.ip().is_loopback()),
            "{:?}",
            lan.dests("prod")
        );
    }

    #[test]
    fn a_hello_flood_keeps_the_authoritys_state_bounded() {
        let mut lan = Lan::new();
        lan.add(cfg("tracker", &[Role::Tracker]));
        let now = lan.now;
        lan.node("tracker")
            .become_authority(AuthorityKind::Tracker, authority(100), now);
        let from = SocketAddr::from(([127, 0, 0, 1], 5555));
        for i in 0..(MAX_NODES * 3) {
            let msg = Message {
                v: 1,
                node: format!("n{i}"),
                inc: 1,
                seq: 1,
                ts: 0,
                port: 5555,
                body: Body::Hello {
                    roles: vec![Role::P2pConsumer],
                    publish: vec![],
                    subscribe: cfg("x", &[]).subscribe,
                },
            };
            lan.node("tracker").handle(now, from, &msg);
        }
        let t = lan.node("tracker");
        assert!(t.tracker.consumers.len() <= MAX_NODES);
        assert!(t.own[0].answered.len() <= MAX_NODES);
        while t.poll_out().is_some() {}
    }

    #[test]
    fn net_contains() {
        let n = Net::parse("10.78.0.0/16").unwrap();
        assert!(n.contains("10.78.3.4".parse().unwrap()));
        assert!(!n.contains("10.79.0.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        assert!(Net::parse("::1/128")
            .unwrap()
            .contains("::1".parse().unwrap()));
        assert!(Net::parse("1.2.3.4/33").is_err());
        assert!(Net::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
    }
}
