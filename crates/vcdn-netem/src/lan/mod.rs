//! A layer-2 test bed: nodes on shared Ethernet segments, so that UDP
//! broadcast works, with a user-space wide-area link between segments.
//!
//! Why: ANDy's agents (issue 19) find their data sink or tracker by UDP
//! broadcast on one subnet, and the thesis ran them on two OpenStack
//! clouds whose tenant networks a SoftEther layer-2 VPN joined into one
//! broadcast domain (10.0.0.0/16). The TUN test bed ([`crate::testbed`])
//! routes IP packets between point-to-point devices and has no broadcast
//! domain; this one does, and keeps its forwarder for the wide-area part.
//!
//! Layout (all in namespaces; nothing is created in the host's):
//! - a **segment** ("a cloud") is a Linux bridge `vlbr0` in a namespace of
//!   its own, `vcdnlan-<pid>-<seq>-s<k>`;
//! - a **node** ("a VM") is a namespace `vcdnlan-<pid>-<seq>-n<i>` with
//!   loopback up and `eth0`, one end of a veth pair whose other end is a
//!   port of its segment's bridge. Node j (from 0) of segment k has
//!   address `10.78.k.(j+1)/16`; the subnet's broadcast address,
//!   `10.78.255.255` ([`BROADCAST`]), reaches every node of every
//!   segment, and so does `255.255.255.255` (a host route sends it out of
//!   `eth0`; there is no default route). IPv6 is off (no neighbour discovery chatter on the link);
//!   TCP stays at the kernel's defaults;
//! - with two or more segments, each bridge has a **TAP port** `vltap0`,
//!   opened inside the segment's namespace by this process, and the
//!   test bed's forwarder thread moves Ethernet frames between the TAPs:
//!   one link per ordered pair of segments, with the TUN test bed's one-way
//!   delay, rate cap (store-and-forward at the rate) and drop-tail queue
//!   ([`LinkSpec`], changeable while running with [`Lan::set_link`]), and
//!   a learning switch choosing where a frame goes; broadcast frames cross
//!   too, like SoftEther's. This kernel has no netem, and all of vcdn's
//!   wide-area delay goes through that one forwarder;
//! - a node with a CPU limit has a **cgroup** `vcdnlan-<pid>-<seq>-n<i>`
//!   (cgroup v2 `cpu.max`, or the v1 `cpu` controller's CFS quota), see
//!   [`crate::cgroup`]; processes started with [`Lan::command`] run in it.
//!   [`Flavor`] maps the thesis's VM sizes onto this host.
//!
//! Teardown ([`Drop`], also when a test panics): stop the forwarder (the
//! TAPs vanish with their descriptors), SIGKILL every process in a node's
//! namespace or cgroup, delete the node namespaces (their veths go with
//! them), the cgroups and the segment namespaces (bridges and ports go
//! with them). Namespaces and cgroups of a process that died without its
//! teardown are removed by the next LAN that starts.

mod spec;
mod switch;

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use spec::{Flavor, LanSpec, LinkSpec, NodeSpec, MAX_NODES_PER_SEGMENT, MAX_SEGMENTS};
pub use switch::MAX_MACS;

use crate::cgroup::{CpuGroup, Hierarchy, Throttling};
use crate::forwarder::{Forwarder, Shared};
use crate::netns;

/// Every namespace and cgroup of a LAN test bed is named
/// `PREFIX<pid>-<seq>-…`.
pub const PREFIX: &str = "vcdnlan-";

/// The subnet every node is on: `10.78.0.0/16` (the thesis used
/// 10.0.0.0/16; 10.77/16 is the TUN test bed's).
pub const NETWORK: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 0);

/// The subnet's prefix length.
pub const PREFIX_LEN: u8 = 16;

/// The subnet's broadcast address.
pub const BROADCAST: Ipv4Addr = Ipv4Addr::new(10, 78, 255, 255);

/// The MTU of every node's interface and of the TAPs.
pub const MTU: u32 = 1500;

/// Test beds started by this process so far (names stay unique).
static SEQ: AtomicU64 = AtomicU64::new(0);

/// A running LAN test bed. Dropping it tears everything down.
pub struct Lan {
    spec: LanSpec,
    /// The link of every ordered pair of segments, `i * n + j` (behind a
    /// lock so that the link can change while other threads use the bed).
    links: Mutex<Vec<LinkSpec>>,
    /// Segment namespaces created so far.
    switches: Vec<String>,
    /// Node namespaces created so far, and their open files.
    nodes: Vec<String>,
    ns_files: Vec<Arc<File>>,
    /// Each node's cgroup, if it has a CPU limit.
    groups: Vec<Option<CpuGroup>>,
    shared: Arc<Shared>,
    forwarder: Option<Forwarder>,
}

/// Counters of one direction of the link between two segments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub from: String,
    pub to: String,
    /// Frames and bytes accepted onto the link (delivered or on their way).
    pub frames: u64,
    pub bytes: u64,
    /// Frames dropped: queue full, or the forwarder's memory bound.
    pub drops: u64,
}

/// Counters of the whole link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LanStats {
    /// Directions that carried or dropped anything.
    pub links: Vec<LinkStats>,
    /// Frames shorter than an Ethernet header.
    pub runts: u64,
    /// The largest frame a TAP handed the forwarder (≤ MTU + 14 bytes of
    /// header: no offload reaches the TAPs).
    pub max_frame: u64,
    /// The latest the forwarder released a frame after its due time.
    pub max_late: Duration,
    /// Frames released more than 1 ms late.
    pub late_over_1ms: u64,
}

impl Lan {
    /// Builds the segments, nodes, cgroups and link of `spec`.
    pub fn start(spec: LanSpec) -> io::Result<Lan> {
        netns::remove_stale(PREFIX);
        let need_cpu = spec.nodes().iter().any(|n| n.cpus.is_some());
        let hierarchy = if need_cpu {
            let h = Hierarchy::detect()?;
            crate::cgroup::remove_stale(&h, PREFIX);
            Some(h)
        } else {
            if let Ok(h) = Hierarchy::detect() {
                crate::cgroup::remove_stale(&h, PREFIX);
            }
            None
        };
        let segs = spec.segments().len();
        let mut lan = Lan {
            links: Mutex::new(vec![spec.link_spec(); segs * segs]),
            spec,
            switches: Vec::new(),
            nodes: Vec::new(),
            ns_files: Vec::new(),
            groups: Vec::new(),
            shared: Arc::new(Shared::new(segs)),
            forwarder: None,
        };
        lan.set_link_all(lan.spec.link_spec());
        let base = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut switch_files = Vec::with_capacity(segs);
        for k in 0..segs {
            let ns = format!("{base}-s{k}");
            netns::ip(["netns", "add", &ns], None)?;
            lan.switches.push(ns.clone());
            let f = netns::open(&ns)?;
            netns::run_in(&f, quiet_ipv6)??;
            // No STP (ports forward at once), no multicast snooping
            // (multicast floods like broadcast, as on a dumb switch).
            netns::ip(
                [
                    "-n",
                    &ns,
                    "link",
                    "add",
                    "vlbr0",
                    "type",
                    "bridge",
                    "stp_state",
                    "0",
                    "forward_delay",
                    "0",
                    "mcast_snooping",
                    "0",
                ],
                None,
            )?;
            netns::ip(["-n", &ns, "link", "set", "vlbr0", "up"], None)?;
            switch_files.push(f);
        }
        for (i, node) in lan.spec.nodes().to_vec().iter().enumerate() {
            let ns = format!("{base}-n{i}");
            netns::ip(["netns", "add", &ns], None)?;
            lan.nodes.push(ns.clone());
            let f = Arc::new(netns::open(&ns)?);
            lan.ns_files.push(f.clone());
            netns::run_in(&f, quiet_ipv6)??;
            let sw = &lan.switches[node.segment];
            let port = format!("vlp{i}");
            netns::ip(
                [
                    "-n", &ns, "link", "add", "eth0", "mtu", "1500", "type", "veth", "peer",
                    "name", &port, "netns", sw,
                ],
                None,
            )?;
            netns::ip(
                [
                    "-n", sw, "link", "set", &port, "mtu", "1500", "master", "vlbr0", "up",
                ],
                None,
            )?;
            let addr = lan.addr_of(i);
            let batch = format!(
                "link set dev lo up\n\
                 link set dev eth0 up\n\
                 addr add {addr}/{PREFIX_LEN} broadcast {BROADCAST} dev eth0\n\
                 route add 255.255.255.255/32 dev eth0 src {addr}\n"
            );
            netns::ip(["-n", &ns, "-batch", "-"], Some(&batch))?;
            let group = match (node.cpus, &hierarchy) {
                (Some(cpus), Some(h)) => Some(CpuGroup::create(h, &ns, cpus)?),
                _ => None,
            };
            lan.groups.push(group);
        }
        if segs > 1 {
            let mut taps = Vec::with_capacity(segs);
            for (k, f) in switch_files.iter().enumerate() {
                // Opened inside the segment's namespace: the TAP is born
                // there, never in the host's.
                let (tap, _) = netns::run_in(f, || netns::open_tap("vltap0"))??;
                taps.push(tap);
                netns::ip(
                    [
                        "-n",
                        &lan.switches[k],
                        "link",
                        "set",
                        "vltap0",
                        "mtu",
                        "1500",
                        "txqueuelen",
                        "10000",
                        "master",
                        "vlbr0",
                        "up",
                    ],
                    None,
                )?;
            }
            lan.forwarder = Some(Forwarder::spawn(
                "vcdn-lan-fwd",
                lan.shared.clone(),
                taps,
                switch::LearningSwitch::new(segs),
            )?);
        }
        Ok(lan)
    }

    /// The spec the bed was started with (the link as started; see
    /// [`Self::link`] for live changes).
    pub fn spec(&self) -> &LanSpec {
        &self.spec
    }

    /// The node names, in the order added.
    pub fn nodes(&self) -> Vec<&str> {
        self.spec.nodes().iter().map(|n| n.name.as_str()).collect()
    }

    /// `node`'s address.
    pub fn addr(&self, node: &str) -> io::Result<Ipv4Addr> {
        Ok(self.addr_of(self.spec.need(node)?))
    }

    /// The subnet's broadcast address ([`BROADCAST`]).
    pub fn broadcast(&self) -> Ipv4Addr {
        BROADCAST
    }

    /// The segment `node` is on.
    pub fn segment_of(&self, node: &str) -> io::Result<&str> {
        let n = &self.spec.nodes()[self.spec.need(node)?];
        Ok(&self.spec.segments()[n.segment])
    }

    /// The name of `node`'s namespace (for `ip netns exec NAME …`).
    pub fn namespace(&self, node: &str) -> io::Result<&str> {
        Ok(&self.nodes[self.spec.need(node)?])
    }

    /// The name of `segment`'s namespace (where its bridge is).
    pub fn segment_namespace(&self, segment: &str) -> io::Result<&str> {
        Ok(&self.switches[self.spec.segment_index(segment)?])
    }

    /// A command that runs `program` inside `node`'s namespace and, if the
    /// node has a CPU limit, its cgroup (children inherit both). The bed
    /// SIGKILLs whatever still runs there when it is dropped; callers that
    /// want a clean stop earlier stop their children.
    pub fn command(&self, node: &str, program: impl AsRef<std::ffi::OsStr>) -> io::Result<Command> {
        let i = self.spec.need(node)?;
        let procs = self.groups[i].as_ref().map(|g| g.procs_path().clone());
        Ok(netns::command(self.ns_files[i].clone(), procs, program))
    }

    /// Runs `f` on a thread inside `node`'s namespace and returns what it
    /// returns: sockets it creates belong to the node (and stay there when
    /// handed out), threads it spawns stay in the node. Not in the node's
    /// cgroup: CPU limits are for processes started with [`Self::command`].
    pub fn run_in<T: Send>(&self, node: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        netns::run_in(&self.ns_files[self.spec.need(node)?], f)
    }

    /// `node`'s cgroup, if it has a CPU limit.
    pub fn cgroup(&self, node: &str) -> io::Result<Option<&CpuGroup>> {
        Ok(self.groups[self.spec.need(node)?].as_ref())
    }

    /// `node`'s CPU throttling counters (`NotFound` without a CPU limit).
    pub fn cpu_throttling(&self, node: &str) -> io::Result<Throttling> {
        self.cgroup(node)?
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{node} has no CPU limit"))
            })?
            .throttling()
    }

    /// Sets the link between segments `a` and `b`, both directions, while
    /// running. Frames already on the link keep their time; a shorter
    /// delay never overtakes them.
    pub fn set_link(&self, a: &str, b: &str, link: LinkSpec) -> io::Result<()> {
        let (i, j) = (self.spec.segment_index(a)?, self.spec.segment_index(b)?);
        let mut links = self.links();
        self.apply(&mut links, i, j, link);
        self.apply(&mut links, j, i, link);
        Ok(())
    }

    /// Sets the link between every two segments while running.
    pub fn set_link_all(&self, link: LinkSpec) {
        let n = self.spec.segments().len();
        let mut links = self.links();
        for i in 0..n {
            for j in 0..n {
                self.apply(&mut links, i, j, link);
            }
        }
    }

    /// The link `from → to` now.
    pub fn link(&self, from: &str, to: &str) -> io::Result<LinkSpec> {
        let (i, j) = (self.spec.segment_index(from)?, self.spec.segment_index(to)?);
        Ok(self.links()[i * self.spec.segments().len() + j])
    }

    fn links(&self) -> MutexGuard<'_, Vec<LinkSpec>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters of the link `from → to` (segments).
    pub fn link_stats(&self, from: &str, to: &str) -> io::Result<LinkStats> {
        let (i, j) = (self.spec.segment_index(from)?, self.spec.segment_index(to)?);
        Ok(self.link_stats_of(i, j))
    }

    /// The counters of every direction that saw traffic, and of the
    /// forwarder.
    pub fn stats(&self) -> LanStats {
        let n = self.spec.segments().len();
        LanStats {
            links: (0..n * n)
                .map(|k| self.link_stats_of(k / n, k % n))
                .filter(|s| s.frames > 0 || s.drops > 0)
                .collect(),
            runts: self.shared.unroutable.load(Relaxed),
            max_frame: self.shared.max_packet.load(Relaxed),
            max_late: self.shared.max_late(),
            late_over_1ms: self.shared.late_over_1ms.load(Relaxed),
        }
    }

    /// LAN test bed namespaces of every process that exist now.
    pub fn existing_namespaces() -> Vec<String> {
        netns::list(PREFIX)
    }

    /// LAN test bed cgroups of every process that exist now.
    pub fn existing_cgroups() -> Vec<std::path::PathBuf> {
        Hierarchy::detect()
            .map(|h| crate::cgroup::list(&h, PREFIX))
            .unwrap_or_default()
    }

    fn link_stats_of(&self, i: usize, j: usize) -> LinkStats {
        let c = &self.shared.links[i * self.spec.segments().len() + j];
        LinkStats {
            from: self.spec.segments()[i].clone(),
            to: self.spec.segments()[j].clone(),
            frames: c.packets.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            drops: c.drops.load(Relaxed),
        }
    }

    /// Sets link `i → j`, here and in the forwarder's settings.
    fn apply(&self, links: &mut [LinkSpec], i: usize, j: usize, l: LinkSpec) {
        links[i * self.spec.segments().len() + j] = l;
        self.shared
            .set(i, j, l.delay, l.rate_bps, l.queue_in_effect());
    }

    /// Node i's address: `10.78.<segment>.<position in segment + 1>`.
    fn addr_of(&self, i: usize) -> Ipv4Addr {
        let seg = self.spec.nodes()[i].segment as u8;
        let pos = self.spec.position_in_segment(i) as u8;
        let n = NETWORK.octets();
        Ipv4Addr::new(n[0], n[1], seg, pos + 1)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // First the forwarder: the TAPs close with it.
        drop(self.forwarder.take());
        self.ns_files.clear();
        for ns in self.nodes.drain(..) {
            if let Err(e) = netns::delete(&ns) {
                tracing::warn!(namespace = %ns, error = %e, "cannot delete a LAN node namespace");
            }
        }
        // Each removes itself, killing what is left in it.
        self.groups.clear();
        for ns in self.switches.drain(..) {
            if let Err(e) = netns::delete(&ns) {
                tracing::warn!(namespace = %ns, error = %e, "cannot delete a LAN segment namespace");
            }
        }
    }
}

/// IPv6 off in the calling thread's namespace, for devices made from now
/// on: no router solicitations, neighbour discovery or MLD reports on the
/// segments and the link, only what the test puts there.
fn quiet_ipv6() -> io::Result<()> {
    for k in [
        "net.ipv6.conf.all.disable_ipv6",
        "net.ipv6.conf.default.disable_ipv6",
    ] {
        match netns::sysctl(k, "1") {
            // A kernel without IPv6 has nothing to quieten.
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
