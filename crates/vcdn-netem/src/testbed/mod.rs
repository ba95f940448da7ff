//! A packet-level wide-area network on one machine: one network namespace
//! per node, joined by a user-space forwarder that delays every IP packet by
//! its link's one-way delay, behind an optional rate limit and drop-tail
//! queue. Unlike the [`crate::Shim`] relay, the endpoints' own TCP stacks
//! see the delay, so slow start, congestion control and handshakes behave
//! as over a real path. Needs root (namespaces, TUN devices).
//!
//! Layout: node i lives in namespace `vcdntb-<pid>-<seq>-<i>` with its
//! loopback and one TUN device (MTU 1500, address `10.77.0.0 + i + 1`/32,
//! a route to `10.77.0.0/16` through the TUN). Every namespace is separate,
//! so all test beds use the same addresses. The TUN's file descriptor stays
//! with the forwarder thread of this process ([`forwarder`]). Each namespace
//! uses cubic with `tcp_no_metrics_save=1` (every connection starts from
//! the initial window, as the paper's measurements did), IPv6 off.
//!
//! The one host-wide change: on kernels where non-initial namespaces may
//! not pick cubic as their default, [`Testbed::start`] adds `cubic` to
//! `net.ipv4.tcp_allowed_congestion_control` (it changes no default).
//!
//! Teardown ([`Drop`], also when a test panics): stop the forwarder (the TUN
//! devices vanish with their descriptors), SIGKILL every process still
//! inside a node's namespace (whoever started it), delete the namespaces.
//! Namespaces left by a process that died without teardown are removed by
//! the next test bed that starts.

mod spec;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use crate::forwarder::MAX_IN_FLIGHT;
pub use spec::{default_queue, TestbedSpec, DEFAULT_QUEUE_TIME, MIN_DEFAULT_QUEUE};

use crate::forwarder::{Forwarder, Router, Shared};
use crate::netns;

/// The MTU of every node's TUN device.
pub const MTU: u32 = 1500;

/// The network every node's address is in.
pub const NETWORK: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);

/// Test beds started by this process so far (names stay unique).
static SEQ: AtomicU64 = AtomicU64::new(0);

/// A running test bed. Dropping it tears everything down.
pub struct Testbed {
    spec: TestbedSpec,
    /// Namespace names of the nodes created so far.
    namespaces: Vec<String>,
    ns_files: Vec<Arc<File>>,
    /// Each node's TUN device name.
    devices: Vec<String>,
    shared: Arc<Shared>,
    forwarder: Option<Forwarder>,
}

/// Counters of one directed link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub from: String,
    pub to: String,
    /// Packets and bytes accepted onto the link (delivered or on their way).
    pub packets: u64,
    pub bytes: u64,
    /// Packets dropped: queue full, or the forwarder's memory bound.
    pub drops: u64,
}

/// Counters of the whole test bed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestbedStats {
    /// Links that carried or dropped anything.
    pub links: Vec<LinkStats>,
    /// Packets with no node to go to (not IPv4, or an unknown address).
    pub unroutable: u64,
    /// The largest packet a node handed the forwarder (≤ [`MTU`]: no
    /// segmentation offload reaches the TUN devices).
    pub max_packet: u64,
    /// The latest the forwarder released a packet after its due time (its
    /// own timing error; the kernels' queues before and after it add to
    /// what endpoints see).
    pub max_late: Duration,
    /// Packets released more than 1 ms late.
    pub late_over_1ms: u64,
}

impl Testbed {
    /// Builds the namespaces and devices of `spec` and starts the forwarder.
    pub fn start(spec: TestbedSpec) -> io::Result<Testbed> {
        netns::remove_stale(netns::PREFIX);
        let n = spec.n();
        let shared = Arc::new(Shared::new(n));
        let mut tb = Testbed {
            spec,
            namespaces: Vec::new(),
            ns_files: Vec::new(),
            devices: Vec::new(),
            shared,
            forwarder: None,
        };
        for from in 0..n {
            for to in 0..n {
                tb.apply(from, to);
            }
        }
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let mut tuns = Vec::with_capacity(n);
        let mut addrs = HashMap::new();
        let mut addrs6: HashMap<u64, usize> = tb.spec.owned().iter().copied().collect();
        for i in 0..n {
            let ns = format!("{}{}-{seq}-{i}", netns::PREFIX, std::process::id());
            netns::ip(["netns", "add", &ns], None)?;
            tb.namespaces.push(ns.clone());
            tb.ns_files.push(Arc::new(netns::open(&ns)?));
            let (tun, dev) = netns::open_tun()?;
            tb.devices.push(dev.clone());
            tuns.push(tun);
            netns::ip(["link", "set", "dev", &dev, "netns", &ns], None)?;
            let ipv6 = tb.spec.is_ipv6();
            // txqueuelen: the device ring the forwarder reads from; large,
            // so a sender's burst waits in it rather than being dropped
            // before the emulated link's own queue sees it.
            // IPv6: no link-local address on the TUN (nothing needs
            // neighbour discovery on it), so a node that forwards a packet
            // back out of its only device sends no ICMPv6 redirect.
            let mut batch = format!(
                "link set dev lo up\n{}link set dev {dev} mtu {MTU} txqueuelen 10000 up\n",
                if ipv6 {
                    format!("link set dev {dev} addrgenmode none\n")
                } else {
                    String::new()
                }
            );
            if ipv6 {
                let addr = node_addr6(i);
                addrs6.insert((u128::from(addr) >> 64) as u64, i);
                batch += &format!("addr add {addr}/64 dev {dev} nodad\nroute add ::/0 dev {dev}\n");
            } else {
                let addr = node_addr(i);
                addrs.insert(u32::from(addr), i);
                batch += &format!(
                    "addr add {addr}/32 dev {dev}\nroute add {NETWORK}/16 dev {dev} src {addr}\n"
                );
            }
            let keep = tb.spec.keeps_window(i);
            match tb.run_in_index(i, move || configure_tcp(keep, ipv6))? {
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    // Only the initial namespace may default to an
                    // algorithm outside the allowed list: allow cubic
                    // (from this thread, still in the initial namespace).
                    allow_cubic()?;
                    tb.run_in_index(i, move || configure_tcp(keep, ipv6))??;
                }
                r => r?,
            }
            netns::ip(["-n", &ns, "-batch", "-"], Some(&batch))?;
        }
        tb.forwarder = Some(Forwarder::spawn(
            "vcdn-testbed-fwd",
            tb.shared.clone(),
            tuns,
            ByAddress {
                v4: addrs,
                v6: addrs6,
            },
        )?);
        Ok(tb)
    }

    /// The spec the bed was started with (delays as started; see
    /// [`Self::set_rtt`] for live changes).
    pub fn spec(&self) -> &TestbedSpec {
        &self.spec
    }

    /// The node names.
    pub fn nodes(&self) -> &[String] {
        self.spec.nodes()
    }

    /// `node`'s address (reachable from every other node).
    pub fn addr(&self, node: &str) -> io::Result<Ipv4Addr> {
        Ok(node_addr(self.spec.need(node)?))
    }

    /// `node`'s IPv6 address in an IPv6 bed: `fd77:0:0:<i+1>::1`; the
    /// whole /64 is the node's.
    pub fn addr6(&self, node: &str) -> io::Result<Ipv6Addr> {
        Ok(node_addr6(self.spec.need(node)?))
    }

    /// The name of `node`'s TUN device (in its namespace).
    pub fn device(&self, node: &str) -> io::Result<String> {
        Ok(self.devices[self.spec.need(node)?].clone())
    }

    /// The name of `node`'s namespace (for `ip netns exec NAME …`).
    pub fn namespace(&self, node: &str) -> io::Result<&str> {
        Ok(&self.namespaces[self.spec.need(node)?])
    }

    /// A command that runs `program` inside `node`'s namespace. The bed
    /// SIGKILLs whatever still runs in its namespaces when it is dropped;
    /// callers that want a clean stop earlier stop their children.
    pub fn command(&self, node: &str, program: impl AsRef<std::ffi::OsStr>) -> io::Result<Command> {
        let ns = self.ns_files[self.spec.need(node)?].clone();
        Ok(netns::command(ns, None, program))
    }

    /// Runs `f` on a thread inside `node`'s namespace and returns what it
    /// returns: sockets it creates belong to the node (and stay there when
    /// handed out), threads it spawns stay in the node.
    pub fn run_in<T: Send>(&self, node: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        self.run_in_index(self.spec.need(node)?, f)
    }

    fn run_in_index<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        netns::run_in(&self.ns_files[i], f)
    }

    /// Sets the round trip between `a` and `b` while running (one-way
    /// `rtt / 2` each way). Packets already on the link keep their time; a
    /// shorter delay never overtakes them.
    pub fn set_rtt(&mut self, a: &str, b: &str, rtt: Duration) -> io::Result<()> {
        self.spec = self.spec.clone().rtt(a, b, rtt)?;
        let (i, j) = (self.spec.need(a)?, self.spec.need(b)?);
        self.apply(i, j);
        self.apply(j, i);
        Ok(())
    }

    /// Caps both directions between `a` and `b` at `bps` bit/s while running.
    pub fn set_rate(&mut self, a: &str, b: &str, bps: u64) -> io::Result<()> {
        self.spec = self.spec.clone().rate(a, b, bps)?;
        let (i, j) = (self.spec.need(a)?, self.spec.need(b)?);
        self.apply(i, j);
        self.apply(j, i);
        Ok(())
    }

    /// The counters of the link `from → to`.
    pub fn link_stats(&self, from: &str, to: &str) -> io::Result<LinkStats> {
        let (i, j) = (self.spec.need(from)?, self.spec.need(to)?);
        Ok(self.link_stats_of(i, j))
    }

    /// The counters of every link that saw traffic, and of the forwarder.
    pub fn stats(&self) -> TestbedStats {
        let n = self.spec.n();
        let links = (0..n * n)
            .map(|k| self.link_stats_of(k / n, k % n))
            .filter(|s| s.packets > 0 || s.drops > 0)
            .collect();
        TestbedStats {
            links,
            unroutable: self.shared.unroutable.load(Relaxed),
            max_packet: self.shared.max_packet.load(Relaxed),
            max_late: self.shared.max_late(),
            late_over_1ms: self.shared.late_over_1ms.load(Relaxed),
        }
    }

    fn link_stats_of(&self, i: usize, j: usize) -> LinkStats {
        let c = &self.shared.links[i * self.spec.n() + j];
        LinkStats {
            from: self.spec.nodes()[i].clone(),
            to: self.spec.nodes()[j].clone(),
            packets: c.packets.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            drops: c.drops.load(Relaxed),
        }
    }

    /// Copies link `i → j` of the spec into the forwarder's settings.
    fn apply(&self, i: usize, j: usize) {
        self.shared.set(
            i,
            j,
            self.spec.delay(i, j),
            self.spec.rate_bps(i, j),
            self.spec.queue_bytes(i, j).unwrap_or(u64::MAX),
        );
    }

    /// Test bed namespaces of every process that exist now (to check that
    /// teardown left none).
    pub fn existing_namespaces() -> Vec<String> {
        netns::list(netns::PREFIX)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // First the forwarder: the TUN devices close with it.
        drop(self.forwarder.take());
        self.ns_files.clear();
        for ns in self.namespaces.drain(..) {
            if let Err(e) = netns::delete(&ns) {
                tracing::warn!(namespace = %ns, error = %e, "cannot delete a test bed namespace");
            }
        }
    }
}

/// Node i's IPv6 address: `fd77:0:0:<i+1>::1`.
fn node_addr6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd77, 0, 0, i as u16 + 1, 0, 0, 0, 1)
}

/// Node i's address: `10.77.0.0 + i + 1`.
fn node_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(NETWORK) + i as u32 + 1)
}

/// The TCP settings of a node (run inside its namespace): cubic, no saved
/// metrics, optionally no slow start after idle, IPv6 off unless the bed
/// is IPv6 only (then it forwards). Cubic fails with `PermissionDenied`
/// until [`allow_cubic`].
fn configure_tcp(keep_window: bool, ipv6: bool) -> io::Result<()> {
    netns::sysctl("net.ipv4.tcp_congestion_control", "cubic")?;
    netns::sysctl("net.ipv4.tcp_no_metrics_save", "1")?;
    netns::sysctl(
        "net.ipv4.tcp_slow_start_after_idle",
        if keep_window { "0" } else { "1" },
    )?;
    if ipv6 {
        netns::sysctl("net.ipv6.conf.all.forwarding", "1")?;
        return Ok(());
    }
    for k in [
        "net.ipv6.conf.all.disable_ipv6",
        "net.ipv6.conf.default.disable_ipv6",
    ] {
        let _ = netns::sysctl(k, "1");
    }
    Ok(())
}

/// Adds cubic to `net.ipv4.tcp_allowed_congestion_control` (host-wide;
/// only visible from the initial namespace).
fn allow_cubic() -> io::Result<()> {
    let path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let now = std::fs::read_to_string(path)?;
    if now.split_whitespace().any(|a| a == "cubic") {
        return Ok(());
    }
    std::fs::write(path, format!("{} cubic", now.trim()))
}

/// Routes an IP packet to the node that has its destination address
/// (IPv4) or its destination's /64 (IPv6).
struct ByAddress {
    v4: HashMap<u32, usize>,
    v6: HashMap<u64, usize>,
}

impl Router for ByAddress {
    fn route(&mut self, _from: usize, pkt: &[u8], to: &mut Vec<usize>) {
        to.extend(destination(pkt, &self.v4, &self.v6));
    }
}

/// The node an IP packet is addressed to.
fn destination(pkt: &[u8], v4: &HashMap<u32, usize>, v6: &HashMap<u64, usize>) -> Option<usize> {
    match pkt.first()? >> 4 {
        4 if pkt.len() >= 20 => {
            let dst = u32::from_be_bytes([pkt[16], pkt[17], pkt[18], pkt[19]]);
            v4.get(&dst).copied()
        }
        6 if pkt.len() >= 40 => {
            let dst = u64::from_be_bytes(pkt[24..32].try_into().ok()?);
            v6.get(&dst).copied()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_reads_the_ipv4_header() {
        let mut pkt = [0u8; 20];
        pkt[0] = 0x45;
        pkt[16..20].copy_from_slice(&[10, 77, 0, 2]);
        let addrs = HashMap::from([(u32::from_be_bytes([10, 77, 0, 2]), 1usize)]);
        let v6 = HashMap::from([(0xfd77_0000_0000_0003u64, 2usize)]);
        assert_eq!(destination(&pkt, &addrs, &v6), Some(1));
        pkt[0] = 0x60;
        assert_eq!(destination(&pkt, &addrs, &v6), None);
        assert_eq!(destination(&pkt[..10], &addrs, &v6), None);
        let mut p6 = [0u8; 40];
        p6[0] = 0x60;
        p6[24..32].copy_from_slice(&0xfd77_0000_0000_0003u64.to_be_bytes());
        assert_eq!(destination(&p6, &addrs, &v6), Some(2));
        assert_eq!(destination(&p6[..39], &addrs, &v6), None);
    }
}
