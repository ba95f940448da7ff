//! What a test bed looks like: its nodes and, per ordered pair of nodes, the
//! link's one-way delay, rate and drop-tail queue.

use std::io;
use std::path::Path;
use std::time::Duration;

/// The smallest drop-tail queue a rate-limited link gets by default: 64
/// full-size packets, so a slow link still absorbs an initial window.
pub const MIN_DEFAULT_QUEUE: u64 = 64 * 1500;

/// The default queue holds this much time at the link's rate.
pub const DEFAULT_QUEUE_TIME: Duration = Duration::from_millis(100);

/// Nodes and links of a test bed. Links are directed: `a → b` and `b → a`
/// each have their own delay, rate and queue, like the two directions of a
/// real path. A node's traffic to itself never leaves its namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct TestbedSpec {
    nodes: Vec<String>,
    /// One-way delay of link i → j at `i * n + j`.
    delay: Vec<Duration>,
    /// Rate of link i → j in bit/s (`None`: as fast as the forwarder goes).
    rate_bps: Vec<Option<u64>>,
    /// Drop-tail queue of link i → j in bytes (`None`: [`default_queue`]).
    queue_bytes: Vec<Option<u64>>,
    /// Nodes whose TCP keeps its window over idle periods
    /// (`net.ipv4.tcp_slow_start_after_idle=0`), as warm proxy connections need.
    keep_window: Vec<bool>,
    /// IPv6 only ([`Self::ipv6`]).
    ipv6: bool,
    /// Extra /64s (upper 64 bits) a node owns: the forwarder delivers
    /// packets for them to it.
    owned: Vec<(u64, usize)>,
}

/// The queue a link of `rate_bps` gets unless told: 100 ms of its rate, at
/// least [`MIN_DEFAULT_QUEUE`].
pub fn default_queue(rate_bps: u64) -> u64 {
    let bytes = rate_bps as u128 * DEFAULT_QUEUE_TIME.as_nanos() / 8 / 1_000_000_000;
    (bytes as u64).max(MIN_DEFAULT_QUEUE)
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v / 1000.0)
}

impl TestbedSpec {
    /// `names` with no delay, rate limit or queue on any link.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> io::Result<Self> {
        let nodes: Vec<String> = names.into_iter().map(Into::into).collect();
        for (i, a) in nodes.iter().enumerate() {
            if a.is_empty() || nodes[..i].contains(a) {
                return Err(invalid(format!("node name {a:?} is empty or given twice")));
            }
        }
        if nodes.len() > 60_000 {
            return Err(invalid(format!("{} nodes; at most 60000", nodes.len())));
        }
        let n = nodes.len();
        Ok(TestbedSpec {
            nodes,
            delay: vec![Duration::ZERO; n * n],
            rate_bps: vec![None; n * n],
            queue_bytes: vec![None; n * n],
            keep_window: vec![false; n],
            ipv6: false,
            owned: Vec::new(),
        })
    }

    /// From an RTT matrix CSV, `src,dst,rtt_ms` (a header line is optional),
    /// one line per directed pair: one-way delay = RTT / 2 each way. A pair
    /// given in one direction only gets the same RTT the other way.
    pub fn from_rtt_csv(text: &str) -> io::Result<Self> {
        let rows = parse_rows(text, "rtt_ms")?;
        let mut spec = Self::new(names_of(&rows))?;
        let n = spec.n();
        let mut given = vec![false; n * n];
        for (a, b, rtt) in &rows {
            let (i, j) = (spec.index(a).unwrap(), spec.index(b).unwrap());
            spec.delay[i * n + j] = ms(rtt / 2.0);
            given[i * n + j] = true;
            if !given[j * n + i] {
                spec.delay[j * n + i] = ms(rtt / 2.0);
            }
        }
        Ok(spec)
    }

    /// From a topology edge list (`src,dst,delay_ms`, the files of
    /// `shared/data/topologies/`): edges are undirected with that one-way
    /// delay, and every pair of nodes gets its shortest-path delay.
    pub fn from_topology_csv(text: &str) -> io::Result<Self> {
        let rows = parse_rows(text, "delay_ms")?;
        let mut spec = Self::new(names_of(&rows))?;
        let n = spec.n();
        let mut d = vec![f64::INFINITY; n * n];
        for i in 0..n {
            d[i * n + i] = 0.0;
        }
        for (a, b, delay) in &rows {
            let (i, j) = (spec.index(a).unwrap(), spec.index(b).unwrap());
            d[i * n + j] = d[i * n + j].min(*delay);
            d[j * n + i] = d[j * n + i].min(*delay);
        }
        for k in 0..n {
            for i in 0..n {
                let ik = d[i * n + k];
                if ik.is_infinite() {
                    continue;
                }
                for j in 0..n {
                    let via = ik + d[k * n + j];
                    if via < d[i * n + j] {
                        d[i * n + j] = via;
                    }
                }
            }
        }
        if let Some(k) = d.iter().position(|v| v.is_infinite()) {
            return Err(invalid(format!(
                "the topology is not connected: no path from {} to {}",
                spec.nodes[k / n],
                spec.nodes[k % n]
            )));
        }
        for (k, v) in d.iter().enumerate() {
            spec.delay[k] = ms(*v);
        }
        Ok(spec)
    }

    /// [`Self::from_rtt_csv`] of a file.
    pub fn from_rtt_file(path: &Path) -> io::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Self::from_rtt_csv(&text).map_err(|e| invalid(format!("{}: {e}", path.display())))
    }

    /// [`Self::from_topology_csv`] of a file.
    pub fn from_topology_file(path: &Path) -> io::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Self::from_topology_csv(&text).map_err(|e| invalid(format!("{}: {e}", path.display())))
    }

    /// Sets the round trip between `a` and `b` (one-way `rtt / 2` each way).
    pub fn rtt(mut self, a: &str, b: &str, rtt: Duration) -> io::Result<Self> {
        let (i, j) = (self.need(a)?, self.need(b)?);
        let n = self.n();
        self.delay[i * n + j] = rtt / 2;
        self.delay[j * n + i] = rtt / 2;
        Ok(self)
    }

    /// Sets the one-way delay of the link `from → to` only.
    pub fn one_way(mut self, from: &str, to: &str, delay: Duration) -> io::Result<Self> {
        let k = self.link(from, to)?;
        self.delay[k] = delay;
        Ok(self)
    }

    /// Caps both directions between `a` and `b` at `bps` bit/s.
    pub fn rate(mut self, a: &str, b: &str, bps: u64) -> io::Result<Self> {
        let (ab, ba) = (self.link(a, b)?, self.link(b, a)?);
        self.rate_bps[ab] = Some(bps.max(1));
        self.rate_bps[ba] = Some(bps.max(1));
        Ok(self)
    }

    /// Caps every link at `bps` bit/s.
    pub fn rate_all(mut self, bps: u64) -> Self {
        self.rate_bps.iter_mut().for_each(|r| *r = Some(bps.max(1)));
        self
    }

    /// Sets the drop-tail queue of both directions between `a` and `b`.
    pub fn queue(mut self, a: &str, b: &str, bytes: u64) -> io::Result<Self> {
        let (ab, ba) = (self.link(a, b)?, self.link(b, a)?);
        self.queue_bytes[ab] = Some(bytes);
        self.queue_bytes[ba] = Some(bytes);
        Ok(self)
    }

    /// Sets the drop-tail queue of every link.
    pub fn queue_all(mut self, bytes: u64) -> Self {
        self.queue_bytes.iter_mut().for_each(|q| *q = Some(bytes));
        self
    }

    /// Lets `node`'s TCP keep its congestion window over idle periods
    /// (`net.ipv4.tcp_slow_start_after_idle=0`), as a proxy's warm
    /// connections need.
    pub fn keep_window(mut self, node: &str) -> io::Result<Self> {
        let i = self.need(node)?;
        self.keep_window[i] = true;
        Ok(self)
    }

    /// IPv6 only: node i gets `fd77:0:0:<i+1>::1/64` (the /64 is its own)
    /// and no IPv4 address; every namespace routes `::/0` to the forwarder,
    /// which delivers by the destination's /64.
    pub fn ipv6(mut self) -> Self {
        self.ipv6 = true;
        self
    }

    /// Whether the bed is IPv6 only.
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// Gives `node` the /64 of `prefix` too (IPv6 beds): packets for any
    /// address in it go to `node`, which decides what to do with them (an
    /// anycast content prefix, SIDs).
    pub fn owns(mut self, node: &str, prefix: std::net::Ipv6Addr) -> io::Result<Self> {
        let i = self.need(node)?;
        let p = (u128::from(prefix) >> 64) as u64;
        if self.owned.iter().any(|&(q, _)| q == p) {
            return Err(invalid(format!("{prefix}/64 is owned twice")));
        }
        self.owned.push((p, i));
        Ok(self)
    }

    /// The extra /64s and their owners.
    pub fn owned(&self) -> &[(u64, usize)] {
        &self.owned
    }

    /// The node names, in index order.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The number of nodes.
    pub fn n(&self) -> usize {
        self.nodes.len()
    }

    /// The index of `node`.
    pub fn index(&self, node: &str) -> Option<usize> {
        self.nodes.iter().position(|x| x == node)
    }

    /// One-way delay of `from → to` (indices).
    pub fn delay(&self, from: usize, to: usize) -> Duration {
        self.delay[from * self.n() + to]
    }

    /// Rate of `from → to` in bit/s, `None` if not limited.
    pub fn rate_bps(&self, from: usize, to: usize) -> Option<u64> {
        self.rate_bps[from * self.n() + to]
    }

    /// The drop-tail queue of `from → to` in bytes: as set, else 100 ms of
    /// the rate (at least [`MIN_DEFAULT_QUEUE`]); `None` without a rate.
    pub fn queue_bytes(&self, from: usize, to: usize) -> Option<u64> {
        let k = from * self.n() + to;
        let rate = self.rate_bps[k]?;
        Some(self.queue_bytes[k].unwrap_or_else(|| default_queue(rate)))
    }

    /// Whether `node` keeps its window over idle periods.
    pub fn keeps_window(&self, node: usize) -> bool {
        self.keep_window[node]
    }

    pub(crate) fn need(&self, node: &str) -> io::Result<usize> {
        self.index(node).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no node {node:?} in the test bed (nodes: {})",
                    self.nodes.join(", ")
                ),
            )
        })
    }

    fn link(&self, from: &str, to: &str) -> io::Result<usize> {
        let (i, j) = (self.need(from)?, self.need(to)?);
        Ok(i * self.n() + j)
    }
}

/// `src,dst,value` rows of a CSV; `header_value` names the third column of
/// an optional header line.
fn parse_rows(text: &str, header_value: &str) -> io::Result<Vec<(String, String, f64)>> {
    let mut rows = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if no == 0 && f.get(2) == Some(&header_value) {
            continue;
        }
        let bad = || {
            invalid(format!(
                "line {}: want src,dst,{header_value}, got {line:?}",
                no + 1
            ))
        };
        if f.len() != 3 || f[0].is_empty() || f[1].is_empty() {
            return Err(bad());
        }
        let v: f64 = f[2].parse().map_err(|_| bad())?;
        if !v.is_finite() || !(0.0..=100_000.0).contains(&v) {
            return Err(invalid(format!(
                "line {}: {header_value} {v} is not between 0 and 100000",
                no + 1
            )));
        }
        if f[0] != f[1] {
            rows.push((f[0].to_string(), f[1].to_string(), v));
        }
    }
    if rows.is_empty() {
        return Err(invalid(format!("no src,dst,{header_value} rows")));
    }
    Ok(rows)
}

/// Node names in order of first appearance.
fn names_of(rows: &[(String, String, f64)]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (a, b, _) in rows {
        for x in [a, b] {
            if !names.contains(x) {
                names.push(x.clone());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_matrix_halves_each_way_and_mirrors_missing_directions() {
        let s = TestbedSpec::from_rtt_csv("src,dst,rtt_ms\na,b,100\nb,a,80\na,c,30\n").unwrap();
        assert_eq!(s.nodes(), ["a", "b", "c"]);
        assert_eq!(s.delay(0, 1), Duration::from_millis(50));
        assert_eq!(s.delay(1, 0), Duration::from_millis(40));
        assert_eq!(s.delay(2, 0), Duration::from_millis(15));
        assert_eq!(s.delay(1, 2), Duration::ZERO);
    }

    #[test]
    fn topology_is_completed_by_shortest_paths() {
        let s =
            TestbedSpec::from_topology_csv("src,dst,delay_ms\n0,1,10\n1,2,5\n0,2,40\n").unwrap();
        assert_eq!(s.delay(0, 2), Duration::from_millis(15));
        assert_eq!(s.delay(2, 0), Duration::from_millis(15));
        let e = TestbedSpec::from_topology_csv("0,1,1\n2,3,1\n").unwrap_err();
        assert!(e.to_string().contains("not connected"), "{e}");
    }

    #[test]
    fn real_topology_loads() {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/data/topologies"
        );
        let Ok(dir) = std::fs::read_dir(p) else {
            return;
        };
        let f = dir.filter_map(Result::ok).map(|e| e.path()).find(|p| {
            p.to_string_lossy()
                .ends_with("rocketfuel-1221-pop.edges.csv")
        });
        if let Some(f) = f {
            let s = TestbedSpec::from_topology_file(&f).unwrap();
            assert!(s.n() > 5);
            assert!((0..s.n()).all(|j| j == 0 || s.delay(0, j) > Duration::ZERO));
        }
    }

    #[test]
    fn malformed_input_says_where() {
        let e = TestbedSpec::from_rtt_csv("a,b,x\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        assert!(TestbedSpec::from_rtt_csv("a,b,-1\n").is_err());
        assert!(TestbedSpec::from_rtt_csv("").is_err());
        assert!(TestbedSpec::new(["a", "a"]).is_err());
    }

    #[test]
    fn queue_defaults_to_100ms_of_rate() {
        let s = TestbedSpec::new(["a", "b"]).unwrap().rate_all(100_000_000);
        assert_eq!(s.queue_bytes(0, 1), Some(1_250_000));
        let s = s.rate_all(1_000_000);
        assert_eq!(s.queue_bytes(0, 1), Some(MIN_DEFAULT_QUEUE));
        let s = s.queue("a", "b", 5000).unwrap();
        assert_eq!(s.queue_bytes(1, 0), Some(5000));
        assert_eq!(
            TestbedSpec::new(["a", "b"]).unwrap().queue_bytes(0, 1),
            None
        );
    }
}
