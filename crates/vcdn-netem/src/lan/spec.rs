//! What a LAN test bed looks like: its segments, its nodes (each on one
//! segment, optionally with a CPU limit) and the link between segments.

use std::io;
use std::time::Duration;

use crate::testbed::default_queue;

/// At most this many segments (the forwarder keeps a link per ordered
/// pair, and each segment is a third octet of the address plan).
pub const MAX_SEGMENTS: usize = 16;

/// At most this many nodes per segment (a fourth octet each, 1..=250).
pub const MAX_NODES_PER_SEGMENT: usize = 250;

/// The thesis's OpenStack flavours (ANDy, §4: producers on m1.medium,
/// consumers on m1.xlarge, datasinks on all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// 2 vCPUs.
    M1Medium,
    /// 4 vCPUs.
    M1Large,
    /// 8 vCPUs.
    M1Xlarge,
}

impl Flavor {
    /// The flavour's vCPUs.
    pub fn vcpus(self) -> u32 {
        match self {
            Flavor::M1Medium => 2,
            Flavor::M1Large => 4,
            Flavor::M1Xlarge => 8,
        }
    }

    /// The CPU quota that stands for the flavour on a host of `host_cpus`:
    /// the largest flavour (8 vCPUs) gets the whole host, the others their
    /// share of it, so the flavours keep the thesis's 1 : 2 : 4 ratio. On
    /// this project's 2-CPU machines: medium 0.5, large 1, xlarge 2 CPUs.
    pub fn cpus_on(self, host_cpus: usize) -> f64 {
        self.vcpus() as f64 * host_cpus.max(1) as f64 / Flavor::M1Xlarge.vcpus() as f64
    }

    /// [`Self::cpus_on`] this host.
    pub fn cpus_here(self) -> f64 {
        self.cpus_on(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// One direction of the user-space link between two segments: a one-way
/// delay behind an optional rate cap with a drop-tail queue. Rates and
/// queues count whole Ethernet frames (header included, no preamble or
/// FCS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkSpec {
    /// One-way delay.
    pub delay: Duration,
    /// Rate cap in bit/s (`None`: as fast as the forwarder goes).
    pub rate_bps: Option<u64>,
    /// Drop-tail queue in bytes, only with a rate (`None`: 100 ms of the
    /// rate, at least 64 full frames; see [`default_queue`]).
    pub queue_bytes: Option<u64>,
}

impl LinkSpec {
    /// A link that only delays.
    pub fn delay(one_way: Duration) -> LinkSpec {
        LinkSpec {
            delay: one_way,
            ..LinkSpec::default()
        }
    }

    /// The same link capped at `bps` bit/s.
    pub fn with_rate_bps(self, bps: u64) -> LinkSpec {
        LinkSpec {
            rate_bps: Some(bps.max(1)),
            ..self
        }
    }

    /// The same link with a drop-tail queue of `bytes`.
    pub fn with_queue(self, bytes: u64) -> LinkSpec {
        LinkSpec {
            queue_bytes: Some(bytes),
            ..self
        }
    }

    /// The queue in effect: as set, else the default for the rate;
    /// unbounded without a rate.
    pub fn queue_in_effect(&self) -> u64 {
        match self.rate_bps {
            Some(r) => self.queue_bytes.unwrap_or_else(|| default_queue(r)),
            None => u64::MAX,
        }
    }
}

/// A node: its name, segment and CPU limit.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    /// Index into [`LanSpec::segments`].
    pub segment: usize,
    /// CPUs the node's processes may use together (`None`: unlimited).
    pub cpus: Option<f64>,
}

/// Segments, nodes and the link between every two segments.
#[derive(Clone, Debug, PartialEq)]
pub struct LanSpec {
    segments: Vec<String>,
    nodes: Vec<NodeSpec>,
    link: LinkSpec,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl LanSpec {
    /// Segments with these names and no nodes yet; every pair of segments
    /// joined by a link without delay or cap.
    pub fn new<S: Into<String>>(segments: impl IntoIterator<Item = S>) -> io::Result<LanSpec> {
        let segments: Vec<String> = segments.into_iter().map(Into::into).collect();
        if segments.is_empty() || segments.len() > MAX_SEGMENTS {
            return Err(invalid(format!(
                "{} segments; want 1 to {MAX_SEGMENTS}",
                segments.len()
            )));
        }
        for (i, s) in segments.iter().enumerate() {
            if s.is_empty() || segments[..i].contains(s) {
                return Err(invalid(format!(
                    "segment name {s:?} is empty or given twice"
                )));
            }
        }
        Ok(LanSpec {
            segments,
            nodes: Vec::new(),
            link: LinkSpec::default(),
        })
    }

    /// Adds `node` on `segment`, without a CPU limit.
    pub fn node(mut self, node: &str, segment: &str) -> io::Result<LanSpec> {
        let s = self.segment_index(segment)?;
        if node.is_empty() || self.index(node).is_some() {
            return Err(invalid(format!(
                "node name {node:?} is empty or given twice"
            )));
        }
        if self.on_segment(s).count() >= MAX_NODES_PER_SEGMENT {
            return Err(invalid(format!(
                "segment {segment} has {MAX_NODES_PER_SEGMENT} nodes already"
            )));
        }
        self.nodes.push(NodeSpec {
            name: node.into(),
            segment: s,
            cpus: None,
        });
        Ok(self)
    }

    /// Limits `node`'s processes to `cpus` CPUs together (a cgroup quota).
    pub fn cpus(mut self, node: &str, cpus: f64) -> io::Result<LanSpec> {
        if !(cpus.is_finite() && cpus >= 0.01) {
            return Err(invalid(format!(
                "{cpus} CPUs for {node}; want at least 0.01"
            )));
        }
        let i = self.need(node)?;
        self.nodes[i].cpus = Some(cpus);
        Ok(self)
    }

    /// Limits `node` to what `flavor` stands for on this host
    /// ([`Flavor::cpus_here`]).
    pub fn flavor(self, node: &str, flavor: Flavor) -> io::Result<LanSpec> {
        self.cpus(node, flavor.cpus_here())
    }

    /// Sets the link between every two segments, both directions.
    pub fn link(mut self, link: LinkSpec) -> LanSpec {
        self.link = link;
        self
    }

    /// The segment names.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The nodes, in the order added.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The link every pair of segments starts with.
    pub fn link_spec(&self) -> LinkSpec {
        self.link
    }

    /// The index of `node`.
    pub fn index(&self, node: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == node)
    }

    /// The nodes on segment `s`, in order.
    pub(crate) fn on_segment(&self, s: usize) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(move |n| n.segment == s)
    }

    /// Node i's position among the nodes of its segment.
    pub(crate) fn position_in_segment(&self, i: usize) -> usize {
        let s = self.nodes[i].segment;
        self.nodes[..i].iter().filter(|n| n.segment == s).count()
    }

    pub(crate) fn need(&self, node: &str) -> io::Result<usize> {
        self.index(node).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no node {node:?} in the LAN (nodes: {})",
                    self.nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    }

    pub(crate) fn segment_index(&self, segment: &str) -> io::Result<usize> {
        self.segments
            .iter()
            .position(|s| s == segment)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no segment {segment:?} (segments: {})",
                        self.segments.join(", ")
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavours_keep_the_thesis_ratio_and_fill_the_host_at_xlarge() {
        assert_eq!(Flavor::M1Medium.cpus_on(2), 0.5);
        assert_eq!(Flavor::M1Large.cpus_on(2), 1.0);
        assert_eq!(Flavor::M1Xlarge.cpus_on(2), 2.0);
        assert_eq!(Flavor::M1Medium.cpus_on(16), 4.0);
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(LanSpec::new(Vec::<String>::new()).is_err());
        assert!(LanSpec::new(["a", "a"]).is_err());
        let s = LanSpec::new(["a", "b"]).unwrap().node("x", "a").unwrap();
        assert!(s.clone().node("x", "b").is_err(), "duplicate node");
        assert!(s.clone().node("y", "c").is_err(), "unknown segment");
        assert!(s.clone().cpus("x", 0.0).is_err());
        assert!(s.clone().cpus("x", f64::NAN).is_err());
        assert!(s.clone().cpus("nobody", 1.0).is_err());
        let mut full = LanSpec::new(["a"]).unwrap();
        for i in 0..MAX_NODES_PER_SEGMENT {
            full = full.node(&format!("n{i}"), "a").unwrap();
        }
        assert!(full.node("one-more", "a").is_err());
    }

    #[test]
    fn positions_count_within_the_segment() {
        let s = LanSpec::new(["a", "b"])
            .unwrap()
            .node("a1", "a")
            .unwrap()
            .node("b1", "b")
            .unwrap()
            .node("a2", "a")
            .unwrap();
        assert_eq!(s.position_in_segment(2), 1);
        assert_eq!(s.position_in_segment(1), 0);
    }

    #[test]
    fn queue_defaults_to_the_test_beds_rule() {
        let l = LinkSpec::delay(Duration::from_millis(5));
        assert_eq!(l.queue_in_effect(), u64::MAX);
        assert_eq!(l.with_rate_bps(100_000_000).queue_in_effect(), 1_250_000);
        assert_eq!(l.with_rate_bps(1).with_queue(3000).queue_in_effect(), 3000);
    }
}
