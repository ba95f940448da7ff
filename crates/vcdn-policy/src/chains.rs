//! MOSTO proxy chains (Sciancalepore et al., JSAC 2017, §III-B): which
//! chain of split-TCP proxies carries a transfer fastest between two proxy
//! locations, from the RTT matrix between the locations.
//!
//! The model (the paper's eq. in §III-B): over a chain p₀ … p_k with hop
//! RTTs d₁ … d_k, a transfer of r slow-start rounds takes
//! `T = ½·Σdᵢ + (r − 1)·max dᵢ`: the first window crosses the chain in one
//! one-way trip, then each proxy runs its own slow start and the pipeline
//! delivers one window per RTT of its slowest hop. T is a positive
//! combination of the two objectives (Σ RTT, max RTT), so for every r the
//! optimum is a point of the pair's Pareto front; [`ChainTable::build`]
//! computes every front once and stores, per size class, which point to use,
//! so a lookup is a table read.
//!
//! The fronts come from a sweep over the links in increasing RTT (the
//! bottleneck threshold b), maintaining all-pairs shortest distances over
//! the links of RTT ≤ b: (σ, b) is a Pareto point of (s, t) exactly when
//! adding the links of RTT b lowers the distance from s to t, to σ. The
//! distances are lexicographic (Σ RTT, hops), so each point carries a path
//! with the fewest proxies among the paths attaining it. Inserting a link
//! u→v relaxes only the sources that now reach v faster and the targets now
//! reached from u faster, so a link that changes nothing costs O(1) and one
//! that does costs O(n) plus the pairs it can improve (output-sensitive;
//! O(n⁴) at worst on a full mesh, Θ(n² log n) when every front has one
//! point). RTTs are integer nanoseconds inside, so equal sums are equal and
//! ties go to the fewer proxies, not to rounding noise.

use std::collections::{BinaryHeap, HashMap};

use serde::{Deserialize, Serialize};

/// Most proxy locations a matrix may have (the table keeps
/// n² × [`MAX_ROUNDS`] entries).
pub const MAX_NODES: usize = 1024;
/// Largest RTT accepted, ms (an hour): bounds every sum the tables hold.
pub const MAX_RTT_MS: f64 = 3_600_000.0;
/// Size classes of the table: 1 ..= MAX_ROUNDS slow-start rounds. Larger
/// transfers, and transfers of unknown size ("unknown means large"), use
/// the last class.
pub const MAX_ROUNDS: u32 = 20;
/// TCP's initial congestion window, segments (RFC 6928; the paper's
/// footnote 5).
pub const INITIAL_WINDOW: u64 = 10;
/// Payload bytes of one segment at MTU 1500.
pub const MSS: u64 = 1460;

/// Slow-start rounds a transfer of `bytes` needs: the smallest r with
/// IW·(2^r − 1) ≥ ⌈bytes / MSS⌉, the window doubling every RTT from IW = 10
/// segments (14,600 B is one round, 43,800 B two, 1 MB seven).
pub fn rounds(bytes: u64) -> u32 {
    let segments = bytes.div_ceil(MSS);
    let (mut r, mut sent, mut window) = (1, INITIAL_WINDOW, INITIAL_WINDOW);
    while sent < segments {
        window = window.saturating_mul(2);
        sent = sent.saturating_add(window);
        r += 1;
    }
    r
}

/// Why an RTT matrix or topology was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MatrixError {
    /// A bad line of the CSV text (1-based).
    #[error("line {line}: {msg}")]
    Line { line: usize, msg: String },
    #[error("more than {MAX_NODES} nodes")]
    TooManyNodes,
    #[error("no links: expected lines of src,dst,value")]
    Empty,
    #[error("node name {0:?} given twice")]
    DuplicateName(String),
    #[error("node {0} out of range")]
    NoSuchNode(usize),
    #[error("RTT {0} ms is not between 0 and {MAX_RTT_MS} ms (INFINITY means unknown)")]
    BadRtt(f64),
}

/// RTTs between proxy locations, ms: n × n, row-major, `f64::INFINITY`
/// where unknown (no direct link), 0 on the diagonal.
#[derive(Debug, Clone, PartialEq)]
pub struct RttMatrix {
    names: Vec<String>,
    rtt_ms: Vec<f64>,
}

impl RttMatrix {
    /// A matrix of these locations with every RTT unknown.
    pub fn new(names: Vec<String>) -> Result<Self, MatrixError> {
        if names.len() > MAX_NODES {
            return Err(MatrixError::TooManyNodes);
        }
        let mut seen = HashMap::new();
        for name in &names {
            if seen.insert(name.as_str(), ()).is_some() {
                return Err(MatrixError::DuplicateName(name.clone()));
            }
        }
        let n = names.len();
        let mut rtt_ms = vec![f64::INFINITY; n * n];
        for i in 0..n {
            rtt_ms[i * n + i] = 0.0;
        }
        Ok(Self { names, rtt_ms })
    }

    /// Parses `src,dst,rtt_ms` lines, one per directed pair (header line
    /// optional, `#` comments and blank lines skipped, no quoting). A pair
    /// left out is unknown, in that direction only.
    pub fn from_csv(text: &str) -> Result<Self, MatrixError> {
        let rows = parse_rows(text, "rtt_ms")?;
        let (names, ids) = name_nodes(&rows)?;
        let mut m = Self::new(names)?;
        let mut first_line: HashMap<(usize, usize), usize> = HashMap::new();
        for row in &rows {
            let (i, j) = (ids[row.src], ids[row.dst]);
            if i == j {
                return Err(row.error("a node's RTT to itself is always 0; leave the line out"));
            }
            if let Some(l) = first_line.insert((i, j), row.line) {
                return Err(row.error(&format!(
                    "duplicate pair {} -> {} (first on line {l})",
                    row.src, row.dst
                )));
            }
            if row.value > MAX_RTT_MS {
                return Err(row.error(&format!("RTT above {MAX_RTT_MS} ms")));
            }
            let n = m.len();
            m.rtt_ms[i * n + j] = row.value;
        }
        Ok(m)
    }

    /// Parses an undirected edge list `src,dst,delay_ms` with one-way link
    /// delays (the format of `shared/data/topologies/*.edges.csv`) and
    /// completes it to a full mesh: RTT = 2 × the shortest-path delay.
    /// Parallel links keep the shortest; self-loops are ignored. Nodes in
    /// different components stay unknown to each other: see
    /// [`components`](Self::components).
    pub fn from_topology(edges_csv: &str) -> Result<Self, MatrixError> {
        let rows = parse_rows(edges_csv, "delay_ms")?;
        let (names, ids) = name_nodes(&rows)?;
        let n = names.len();
        let mut adj: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        for row in &rows {
            if row.value > MAX_RTT_MS / 2.0 {
                return Err(row.error(&format!("delay above {} ms", MAX_RTT_MS / 2.0)));
            }
            let (i, j) = (ids[row.src], ids[row.dst]);
            if i != j {
                adj[i].push((j, row.value));
                adj[j].push((i, row.value));
            }
        }
        let mut m = Self::new(names)?;
        for s in 0..n {
            for (t, delay) in dijkstra(&adj, s).into_iter().enumerate() {
                if t != s && delay.is_finite() {
                    // A path's delay can exceed the per-link bound; it stays
                    // unknown rather than breaking the bound on sums.
                    let rtt = 2.0 * delay;
                    m.rtt_ms[s * n + t] = if rtt <= MAX_RTT_MS {
                        rtt
                    } else {
                        f64::INFINITY
                    };
                }
            }
        }
        Ok(m)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of a location by name.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// RTT from `i` to `j`, ms (`INFINITY` when unknown or out of range).
    pub fn rtt(&self, i: usize, j: usize) -> f64 {
        let n = self.len();
        if i < n && j < n {
            self.rtt_ms[i * n + j]
        } else {
            f64::INFINITY
        }
    }

    /// Sets the RTT from `i` to `j` (not the reverse), ms; `INFINITY` makes
    /// it unknown. The diagonal stays 0.
    pub fn set(&mut self, i: usize, j: usize, ms: f64) -> Result<(), MatrixError> {
        let n = self.len();
        for x in [i, j] {
            if x >= n {
                return Err(MatrixError::NoSuchNode(x));
            }
        }
        if ms.is_nan() || ms < 0.0 || (ms.is_finite() && ms > MAX_RTT_MS) {
            return Err(MatrixError::BadRtt(ms));
        }
        if i != j {
            self.rtt_ms[i * n + j] = ms;
        }
        Ok(())
    }

    /// Groups of locations joined by known RTTs (in either direction),
    /// largest first: a matrix from a topology with several components
    /// has no chain between them.
    pub fn components(&self) -> Vec<Vec<usize>> {
        let n = self.len();
        let mut parent: Vec<usize> = (0..n).collect();
        fn root(p: &mut [usize], mut x: usize) -> usize {
            while p[x] != x {
                p[x] = p[p[x]];
                x = p[x];
            }
            x
        }
        for i in 0..n {
            for j in 0..n {
                if i != j && self.rtt_ms[i * n + j].is_finite() {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a] = b;
                }
            }
        }
        let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
        for i in 0..n {
            let r = root(&mut parent, i);
            groups.entry(r).or_default().push(i);
        }
        let mut out: Vec<Vec<usize>> = groups.into_values().collect();
        out.sort_by(|a, b| b.len().cmp(&a.len()).then(a[0].cmp(&b[0])));
        out
    }
}

/// One parsed line: names, value, line number.
struct Row<'a> {
    line: usize,
    src: &'a str,
    dst: &'a str,
    value: f64,
}

impl Row<'_> {
    fn error(&self, msg: &str) -> MatrixError {
        MatrixError::Line {
            line: self.line,
            msg: msg.to_string(),
        }
    }
}

fn parse_rows<'a>(text: &'a str, value_name: &str) -> Result<Vec<Row<'a>>, MatrixError> {
    let mut rows = Vec::new();
    let mut first = true;
    for (k, raw) in text.lines().enumerate() {
        let line = k + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let err = |msg: String| MatrixError::Line { line, msg };
        let fields: Vec<&str> = l.split(',').map(str::trim).collect();
        if fields.len() != 3 {
            return Err(err(format!(
                "expected 3 fields src,dst,{value_name}, found {}",
                fields.len()
            )));
        }
        let is_first = std::mem::replace(&mut first, false);
        let value = match fields[2].parse::<f64>() {
            Ok(v) => v,
            Err(_) if is_first => continue, // the header
            Err(_) => return Err(err(format!("{value_name} {:?} is not a number", fields[2]))),
        };
        if !value.is_finite() || value < 0.0 {
            return Err(err(format!(
                "{value_name} must be a finite number >= 0 (leave unknown pairs out), found {}",
                fields[2]
            )));
        }
        if fields[0].is_empty() || fields[1].is_empty() {
            return Err(err("empty node name".into()));
        }
        rows.push(Row {
            line,
            src: fields[0],
            dst: fields[1],
            value,
        });
    }
    if rows.is_empty() {
        return Err(MatrixError::Empty);
    }
    Ok(rows)
}

/// Node names in order of first appearance, or numerically when every name
/// is a number (topology ids then are their own indices).
fn name_nodes<'a>(rows: &[Row<'a>]) -> Result<(Vec<String>, HashMap<&'a str, usize>), MatrixError> {
    let mut order: Vec<&str> = Vec::new();
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for row in rows {
        for name in [row.src, row.dst] {
            if seen.insert(name, ()).is_none() {
                if order.len() == MAX_NODES {
                    return Err(row.error(&format!("more than {MAX_NODES} nodes")));
                }
                order.push(name);
            }
        }
    }
    if order.iter().all(|s| s.parse::<u64>().is_ok()) {
        order.sort_by_key(|s| s.parse::<u64>().unwrap_or(u64::MAX));
    }
    let ids = order.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    Ok((order.into_iter().map(String::from).collect(), ids))
}

/// One-way delays from `s` over an undirected graph.
fn dijkstra(adj: &[Vec<(usize, f64)>], s: usize) -> Vec<f64> {
    #[derive(PartialEq)]
    struct Item(f64, usize);
    impl Eq for Item {}
    impl PartialOrd for Item {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Item {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
        }
    }
    let mut dist = vec![f64::INFINITY; adj.len()];
    dist[s] = 0.0;
    let mut heap = BinaryHeap::from([Item(0.0, s)]);
    while let Some(Item(d, x)) = heap.pop() {
        if d > dist[x] {
            continue;
        }
        for &(y, w) in &adj[x] {
            let nd = d + w;
            if nd < dist[y] {
                dist[y] = nd;
                heap.push(Item(nd, y));
            }
        }
    }
    dist
}

fn to_ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

fn to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A path length packed for lexicographic order in one u64: Σ RTT (ns) in
/// the high bits, hops in the low [`HOP_BITS`]. Sums stay below 2⁵³ ns
/// and hops below 2¹¹ even for a candidate walk of 2n − 1 links of
/// [`MAX_RTT_MS`], so adding two lengths never carries between the fields.
type Dist = u64;
const HOP_BITS: u32 = 11;
const UNREACHED: Dist = u64::MAX;
const _: () = assert!(2 * MAX_NODES <= 1 << HOP_BITS);
const _: () = assert!((2 * MAX_NODES as u64) * (MAX_RTT_MS as u64 * 1_000_000) < 1 << 53);

fn packed(sum_ns: u64, hops: u32) -> Dist {
    sum_ns << HOP_BITS | hops as u64
}

fn sum_of(d: Dist) -> u64 {
    d >> HOP_BITS
}

fn hops_of(d: Dist) -> u32 {
    (d & ((1 << HOP_BITS) - 1)) as u32
}

/// One Pareto point as stored: objectives in ns and its path's place in
/// [`ChainTable`]'s node list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Point {
    sum_ns: u64,
    max_ns: u64,
    start: u32,
    len: u32,
}

/// The chain a transfer should take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chain {
    /// Locations from `from` to `to` inclusive; the ones between are the
    /// transport proxies.
    pub nodes: Vec<usize>,
    /// Σ of the hop RTTs, ms.
    pub sum_ms: f64,
    /// Largest hop RTT, ms.
    pub max_ms: f64,
    /// ½·Σ + (rounds − 1)·max, ms: the model's transfer time.
    pub predicted_ms: f64,
    /// Slow-start rounds the prediction is for.
    pub rounds: u32,
}

/// A point of a pair's Pareto front of (Σ RTT, max RTT).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParetoPoint {
    /// A path attaining the point with the fewest proxies, `from` to `to`.
    pub nodes: Vec<usize>,
    pub sum_ms: f64,
    pub max_ms: f64,
    /// Proxies between the two ends (`nodes.len() − 2`; 0 when direct).
    pub proxies: usize,
}

/// Why a lookup has no chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("node {0} out of range")]
    NoSuchNode(usize),
    #[error("no path from node {from} to node {to}")]
    NoPath { from: usize, to: usize },
}

/// Every pair's Pareto front and, per size class, its best point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "TableData", into = "TableData")]
pub struct ChainTable(TableData);

/// The table's stored form, checked on the way in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TableData {
    names: Vec<String>,
    /// Pair (i, j)'s points are `points[fronts[i·n+j] .. fronts[i·n+j+1]]`,
    /// in increasing max (so decreasing Σ): first the minimax path, last
    /// the shortest.
    fronts: Vec<u32>,
    points: Vec<Point>,
    /// Path nodes of all points.
    nodes: Vec<u32>,
    /// Index into the pair's front of the best point for rounds 1 ..=
    /// MAX_ROUNDS: `best[(i·n+j)·MAX_ROUNDS + r − 1]`.
    best: Vec<u32>,
    /// Per pair, a shortest path with fewer hops than the front's shortest
    /// (same Σ, larger max: dominated, yet as fast in one round), or
    /// `len` 0. Only one round ignores the max, so only it can use one.
    one_round: Vec<Point>,
}

impl TryFrom<TableData> for ChainTable {
    type Error = String;
    fn try_from(t: TableData) -> Result<Self, String> {
        let n = t.names.len();
        let r = MAX_ROUNDS as usize;
        if n > MAX_NODES
            || t.fronts.len() != n * n + 1
            || t.best.len() != n * n * r
            || t.one_round.len() != n * n
        {
            return Err("chain table: inconsistent sizes".into());
        }
        if t.fronts[0] != 0 || t.fronts[n * n] as usize != t.points.len() {
            return Err("chain table: fronts do not cover the points".into());
        }
        for pair in 0..n * n {
            let (a, b) = (t.fronts[pair], t.fronts[pair + 1]);
            if a > b {
                return Err("chain table: fronts out of order".into());
            }
            if t.best[pair * r..(pair + 1) * r]
                .iter()
                .any(|&k| a + k >= b && a < b)
            {
                return Err("chain table: a choice outside its front".into());
            }
            let (from, to) = (pair / n, pair % n);
            let extra = Some(&t.one_round[pair]).filter(|p| p.len > 0);
            for p in t.points[a as usize..b as usize].iter().chain(extra) {
                let path = t
                    .nodes
                    .get(p.start as usize..p.start as usize + p.len as usize)
                    .ok_or("chain table: a path outside the node list")?;
                if path.first() != Some(&(from as u32))
                    || path.last() != Some(&(to as u32))
                    || path.iter().any(|&x| x as usize >= n)
                {
                    return Err("chain table: a path with wrong ends".into());
                }
            }
        }
        Ok(ChainTable(t))
    }
}

impl From<ChainTable> for TableData {
    fn from(t: ChainTable) -> Self {
        t.0
    }
}

impl ChainTable {
    /// All Pareto fronts and best points of `m`'s locations (see the module
    /// doc for the algorithm).
    pub fn build(m: &RttMatrix) -> ChainTable {
        let n = m.len();
        let mut links: Vec<(u64, u32, u32)> = Vec::new();
        for i in 0..n {
            for j in 0..n {
                let ms = m.rtt_ms[i * n + j];
                if i != j && ms.is_finite() && (0.0..=MAX_RTT_MS).contains(&ms) {
                    links.push((to_ns(ms), i as u32, j as u32));
                }
            }
        }
        links.sort_unstable();

        // dist[i·n+j], and its transpose col[j·n+i] so that scanning a
        // column is sequential too.
        let mut dist = vec![UNREACHED; n * n];
        let mut col = vec![UNREACHED; n * n];
        // next[i·n+j]: the node after i on the current best path to j.
        let mut next = vec![u32::MAX; n * n];
        for i in 0..n {
            dist[i * n + i] = 0;
            col[i * n + i] = 0;
            next[i * n + i] = i as u32;
        }
        // Points as found, (pair, sum, max, start, len), in increasing max.
        let mut found: Vec<(u32, u64, u32, u32, u64)> = Vec::new();
        let mut nodes: Vec<u32> = Vec::new();
        let mut stamp = vec![0u32; n * n];
        let (mut dirty, mut sources, mut targets) = (Vec::new(), Vec::new(), Vec::new());
        let mut group = 0u32;
        let mut g = 0;
        while g < links.len() {
            let b = links[g].0;
            let end = g + links[g..].iter().take_while(|l| l.0 == b).count();
            group += 1;
            dirty.clear();
            let hop = packed(b, 1);
            for &(_, u, v) in &links[g..end] {
                let (u, v) = (u as usize, v as usize);
                if dist[u * n + v] <= hop {
                    continue; // already as good without this link
                }
                // Only sources that now reach v faster through u→v, and
                // targets now reached faster from u, can improve.
                // Branch-free: whether a node qualifies is unpredictable.
                // UNREACHED saturates and never qualifies.
                sources.resize(n, 0);
                targets.resize(n, 0);
                let (to_u, to_v) = (&col[u * n..u * n + n], &col[v * n..v * n + n]);
                let mut k = 0;
                for (i, (&iu, &iv)) in to_u.iter().zip(to_v).enumerate() {
                    sources[k] = i;
                    k += usize::from(iu.saturating_add(hop) < iv);
                }
                sources.truncate(k);
                let (from_u, from_v) = (&dist[u * n..u * n + n], &dist[v * n..v * n + n]);
                let mut k = 0;
                for (j, (&uj, &vj)) in from_u.iter().zip(from_v).enumerate() {
                    targets[k] = j;
                    k += usize::from(vj.saturating_add(hop) < uj);
                }
                targets.truncate(k);
                // dist[i][u] and dist[v][j] cannot change while u→v is
                // inserted (a path using it to reach u or leave v has a
                // cycle), so updating in place is safe.
                for &i in &sources {
                    let via = col[u * n + i] + hop;
                    let first = if i == u { v as u32 } else { next[i * n + u] };
                    for &j in &targets {
                        let ij = i * n + j;
                        let cand = via + dist[v * n + j];
                        if cand < dist[ij] {
                            if sum_of(cand) < sum_of(dist[ij]) && stamp[ij] != group {
                                stamp[ij] = group;
                                dirty.push(ij);
                            }
                            dist[ij] = cand;
                            col[j * n + i] = cand;
                            next[ij] = first;
                        }
                    }
                }
            }
            // The pairs whose Σ dropped at threshold b gain the point
            // (Σ, b), with the fewest-hop path among the links ≤ b.
            for &ij in &dirty {
                let (s, t) = (ij / n, ij % n);
                let start = nodes.len() as u32;
                let mut x = s;
                nodes.push(x as u32);
                for _ in 0..n {
                    if x == t {
                        break;
                    }
                    x = next[x * n + t] as usize;
                    nodes.push(x as u32);
                }
                let len = nodes.len() as u32 - start;
                found.push((ij as u32, sum_of(dist[ij]), start, len, b));
            }
            g = end;
        }
        for i in 0..n {
            nodes.push(i as u32);
            found.push(((i * n + i) as u32, 0, nodes.len() as u32 - 1, 1, 0));
        }
        // The front's last point has the fewest hops among the shortest
        // paths of least max; the sweep's final distances have the fewest
        // among all shortest paths.
        let mut last_hops = vec![u32::MAX; n * n];
        for f in &found {
            last_hops[f.0 as usize] = f.3 - 1;
        }
        let empty = Point {
            sum_ns: 0,
            max_ns: 0,
            start: 0,
            len: 0,
        };
        let mut one_round = vec![empty; n * n];
        for (ij, d) in dist.iter().enumerate() {
            if *d == UNREACHED || hops_of(*d) >= last_hops[ij] {
                continue;
            }
            let (s, t) = (ij / n, ij % n);
            let start = nodes.len() as u32;
            let (mut x, mut max_ns) = (s, 0);
            nodes.push(x as u32);
            for _ in 0..n {
                if x == t {
                    break;
                }
                let y = next[x * n + t] as usize;
                max_ns = max_ns.max(to_ns(m.rtt_ms[x * n + y]));
                nodes.push(y as u32);
                x = y;
            }
            one_round[ij] = Point {
                sum_ns: sum_of(*d),
                max_ns,
                start,
                len: hops_of(*d) + 1,
            };
        }

        // Group the points by pair, keeping their order (counting sort).
        let mut fronts = vec![0u32; n * n + 1];
        for f in &found {
            fronts[f.0 as usize + 1] += 1;
        }
        for k in 0..n * n {
            fronts[k + 1] += fronts[k];
        }
        let mut fill = fronts.clone();
        let mut points = vec![empty; found.len()];
        for &(pair, sum_ns, start, len, max_ns) in &found {
            let slot = &mut fill[pair as usize];
            points[*slot as usize] = Point {
                sum_ns,
                max_ns,
                start,
                len,
            };
            *slot += 1;
        }

        let r_max = MAX_ROUNDS as usize;
        let mut best = vec![0u32; n * n * r_max];
        let mut key = [(u64::MAX, u32::MAX); MAX_ROUNDS as usize];
        for (pair, choice) in best.chunks_exact_mut(r_max).enumerate() {
            let front = &points[fronts[pair] as usize..fronts[pair + 1] as usize];
            key.fill((u64::MAX, u32::MAX));
            // Points come in decreasing Σ: on equal time and hops the later
            // (shorter) one wins.
            for (k, p) in front.iter().enumerate() {
                for (r, (c, kk)) in choice.iter_mut().zip(key.iter_mut()).enumerate() {
                    let t = twice_time_ns(p, r as u32 + 1);
                    if (t, p.len) <= *kk {
                        *kk = (t, p.len);
                        *c = k as u32;
                    }
                }
            }
        }
        ChainTable(TableData {
            names: m.names.clone(),
            fronts,
            points,
            nodes,
            best,
            one_round,
        })
    }

    pub fn len(&self) -> usize {
        self.0.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.names.is_empty()
    }

    /// The locations' names, by index.
    pub fn names(&self) -> &[String] {
        &self.0.names
    }

    fn pair(&self, from: usize, to: usize) -> Result<usize, LookupError> {
        let n = self.len();
        for x in [from, to] {
            if x >= n {
                return Err(LookupError::NoSuchNode(x));
            }
        }
        Ok(from * n + to)
    }

    fn points(&self, pair: usize) -> &[Point] {
        &self.0.points[self.0.fronts[pair] as usize..self.0.fronts[pair + 1] as usize]
    }

    fn path(&self, p: &Point) -> Vec<usize> {
        let a = p.start as usize;
        self.0.nodes[a..a + p.len as usize]
            .iter()
            .map(|&x| x as usize)
            .collect()
    }

    /// The chain for a transfer of `bytes` (unknown: as large as the
    /// largest class), O(1) apart from copying the path.
    pub fn lookup(&self, from: usize, to: usize, bytes: Option<u64>) -> Result<Chain, LookupError> {
        self.lookup_rounds(from, to, bytes.map_or(MAX_ROUNDS, rounds))
    }

    /// The chain for a transfer of `r` slow-start rounds (from MAX_ROUNDS
    /// on, the choice of the last class, predicted for `r`).
    pub fn lookup_rounds(&self, from: usize, to: usize, r: u32) -> Result<Chain, LookupError> {
        let pair = self.pair(from, to)?;
        let r = r.max(1);
        let class = r.min(MAX_ROUNDS) as usize;
        let k = self.0.best[pair * MAX_ROUNDS as usize + class - 1] as usize;
        let mut p = self
            .points(pair)
            .get(k)
            .ok_or(LookupError::NoPath { from, to })?;
        if r == 1 && self.0.one_round[pair].len > 0 {
            p = &self.0.one_round[pair];
        }
        Ok(Chain {
            nodes: self.path(p),
            sum_ms: to_ms(p.sum_ns),
            max_ms: to_ms(p.max_ns),
            predicted_ms: to_ms(p.sum_ns) / 2.0 + (r - 1) as f64 * to_ms(p.max_ns),
            rounds: r,
        })
    }

    /// The Pareto front of (Σ RTT, max RTT) from `from` to `to`, in
    /// increasing max RTT (first the minimax path, last the shortest).
    /// Empty when there is no path.
    pub fn front(&self, from: usize, to: usize) -> Result<Vec<ParetoPoint>, LookupError> {
        let pair = self.pair(from, to)?;
        Ok(self
            .points(pair)
            .iter()
            .map(|p| ParetoPoint {
                nodes: self.path(p),
                sum_ms: to_ms(p.sum_ns),
                max_ms: to_ms(p.max_ns),
                proxies: (p.len as usize).saturating_sub(2),
            })
            .collect())
    }
}

/// 2·T in ns for r ≤ MAX_ROUNDS rounds: Σ + 2(r − 1)·max, exact (Σ and
/// max are below 2⁵³ ns, so this stays below 2⁶⁴).
fn twice_time_ns(p: &Point, r: u32) -> u64 {
    p.sum_ns + 2 * (r as u64 - 1) * p.max_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_double_from_ten_segments() {
        // mosto-chains.md's table, and the edges of each round.
        for (bytes, r) in [
            (0, 1),
            (1, 1),
            (14_600, 1),
            (14_601, 2),
            (43_800, 2),
            (43_801, 3),
            (73_262, 3),
            (102_200, 3),
            (219_000, 4),
            (434_830, 5),
            (1_000_000, 7),
            (2_000_000, 8),
            (10_000_000, 10),
            (u64::MAX, 51),
        ] {
            assert_eq!(rounds(bytes), r, "{bytes} B");
        }
    }

    #[test]
    fn csv_with_and_without_header() {
        let a = RttMatrix::from_csv("src,dst,rtt_ms\nA,B,10\nB,A,12.5\n").unwrap();
        let b = RttMatrix::from_csv("# comment\n\nA,B,10\n B , A , 12.5 \n").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.names(), ["A", "B"]);
        assert_eq!((a.rtt(0, 1), a.rtt(1, 0), a.rtt(0, 0)), (10.0, 12.5, 0.0));
        assert_eq!(a.index("B"), Some(1));
        assert_eq!(a.index("C"), None);
    }

    #[test]
    fn csv_errors_name_the_line() {
        let err = |t: &str| RttMatrix::from_csv(t).unwrap_err().to_string();
        assert_eq!(
            err("A,B,1\nA,C\n"),
            "line 2: expected 3 fields src,dst,rtt_ms, found 2"
        );
        assert!(err("A,B,1\nA,C,x\n").starts_with("line 2: rtt_ms \"x\" is not a number"));
        assert!(err("A,B,-1\n").starts_with("line 1: rtt_ms must be a finite number >= 0"));
        assert!(err("A,B,NaN\n").starts_with("line 1: rtt_ms must be"));
        assert!(err("A,B,inf\n").starts_with("line 1: rtt_ms must be"));
        assert!(err("A,B,1e9\n").starts_with("line 1: RTT above"));
        assert_eq!(
            err("src,dst,rtt_ms\nA,B,1\nB,A,1\nA,B,2\n"),
            "line 4: duplicate pair A -> B (first on line 2)"
        );
        assert!(err("A,A,0\n").starts_with("line 1: a node's RTT to itself"));
        assert_eq!(
            err("src,dst,rtt_ms\n"),
            "no links: expected lines of src,dst,value"
        );
        let many: String = (0..MAX_NODES / 2 + 1)
            .map(|k| format!("a{k},b{k},1\n"))
            .collect();
        assert!(err(&many).ends_with(&format!("more than {MAX_NODES} nodes")));
    }

    #[test]
    fn set_checks_its_input() {
        let mut m = RttMatrix::new(vec!["a".into(), "b".into()]).unwrap();
        assert_eq!(m.rtt(0, 1), f64::INFINITY);
        m.set(0, 1, 3.0).unwrap();
        assert_eq!((m.rtt(0, 1), m.rtt(1, 0)), (3.0, f64::INFINITY));
        assert!(m.set(0, 2, 1.0).is_err());
        assert!(m.set(0, 1, f64::NAN).is_err());
        assert!(m.set(0, 1, -1.0).is_err());
        m.set(0, 1, f64::INFINITY).unwrap();
        assert_eq!(m.rtt(0, 1), f64::INFINITY);
        assert!(RttMatrix::new(vec!["a".into(), "a".into()]).is_err());
    }

    #[test]
    fn topology_is_completed_by_shortest_paths() {
        // 0 -1- 1 -2- 2, 0 -5- 2 (one-way ms), and 3 -1- 4 apart.
        let m = RttMatrix::from_topology("src,dst,delay_ms\n0,1,1\n1,2,2\n0,2,5\n3,4,1\n4,3,0.5\n")
            .unwrap();
        assert_eq!(m.names(), ["0", "1", "2", "3", "4"]);
        assert_eq!(m.rtt(0, 2), 6.0);
        assert_eq!(m.rtt(2, 0), 6.0);
        assert_eq!(m.rtt(1, 2), 4.0);
        assert_eq!(m.rtt(3, 4), 1.0, "parallel links keep the shortest");
        assert_eq!(m.rtt(0, 3), f64::INFINITY);
        assert_eq!(m.components(), vec![vec![0, 1, 2], vec![3, 4]]);
        let t = ChainTable::build(&m);
        assert_eq!(
            t.lookup(0, 4, None),
            Err(LookupError::NoPath { from: 0, to: 4 })
        );
        assert_eq!(t.front(0, 4), Ok(vec![]));
        assert_eq!(t.lookup(0, 9, None), Err(LookupError::NoSuchNode(9)));
        // 0→2 in the closure: direct 6 ms, or split at 1 (2 + 4 ms).
        let front = t.front(0, 2).unwrap();
        assert_eq!(front.len(), 1);
        // One round ignores the max: the direct link is as fast, with no proxy.
        assert_eq!(t.lookup(0, 2, Some(1000)).unwrap().nodes, [0, 2]);
        assert_eq!(t.lookup(0, 2, Some(100_000)).unwrap().nodes, [0, 1, 2]);
        assert_eq!(
            (front[0].nodes.clone(), front[0].sum_ms, front[0].max_ms),
            (vec![0, 1, 2], 6.0, 4.0)
        );
    }

    #[test]
    fn one_round_goes_direct_many_rounds_split() {
        let m = RttMatrix::from_csv("A,B,90\nA,C,50\nC,B,50\n").unwrap();
        let t = ChainTable::build(&m);
        let c1 = t.lookup(0, 1, Some(10_000)).unwrap();
        assert_eq!(
            (c1.nodes, c1.sum_ms, c1.max_ms, c1.predicted_ms, c1.rounds),
            (vec![0, 1], 90.0, 90.0, 45.0, 1)
        );
        let c10 = t.lookup(0, 1, Some(10_000_000)).unwrap();
        assert_eq!(
            (c10.nodes, c10.predicted_ms, c10.rounds),
            (vec![0, 2, 1], 50.0 + 9.0 * 50.0, 10)
        );
        let unknown = t.lookup(0, 1, None).unwrap();
        assert_eq!((unknown.nodes, unknown.rounds), (vec![0, 2, 1], MAX_ROUNDS));
        // B→A is unknown in that direction.
        assert!(t.lookup(1, 0, None).is_err());
        let front = t.front(0, 1).unwrap();
        assert_eq!(front.iter().map(|p| p.proxies).collect::<Vec<_>>(), [1, 0]);
        let same = t.lookup(2, 2, Some(1)).unwrap();
        assert_eq!((same.nodes, same.predicted_ms), (vec![2], 0.0));
    }

    #[test]
    fn table_round_trips_through_json_and_refuses_nonsense() {
        let m = RttMatrix::from_csv("A,B,90\nA,C,50\nC,B,50\nB,A,3\n").unwrap();
        let t = ChainTable::build(&m);
        let json = serde_json::to_string(&t).unwrap();
        let back: ChainTable = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["best"][3] = 7.into();
        assert!(serde_json::from_value::<ChainTable>(v.clone()).is_err());
        v["best"][3] = 0.into();
        v["nodes"][0] = 99.into();
        assert!(serde_json::from_value::<ChainTable>(v).is_err());
    }

    /// splitmix64: a seeded generator, enough for random graphs.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, k: u64) -> u64 {
            self.next() % k
        }
    }

    /// Every simple path's (Σ ns, max ns, hops) from s to t.
    fn all_paths(w: &[Option<u64>], n: usize, s: usize, t: usize) -> Vec<(u64, u64, u32)> {
        fn go(
            w: &[Option<u64>],
            n: usize,
            x: usize,
            t: usize,
            seen: &mut Vec<bool>,
            acc: (u64, u64, u32),
            out: &mut Vec<(u64, u64, u32)>,
        ) {
            if x == t {
                out.push(acc);
                return;
            }
            for y in 0..n {
                if let (false, Some(d)) = (seen[y], w[x * n + y]) {
                    seen[y] = true;
                    go(w, n, y, t, seen, (acc.0 + d, acc.1.max(d), acc.2 + 1), out);
                    seen[y] = false;
                }
            }
        }
        let mut seen = vec![false; n];
        seen[s] = true;
        let mut out = Vec::new();
        go(w, n, s, t, &mut seen, (0, 0, 0), &mut out);
        out
    }

    /// The brute-force front: each non-dominated (Σ, max) with its fewest hops.
    fn brute_front(paths: &[(u64, u64, u32)]) -> Vec<(u64, u64, u32)> {
        let mut front: Vec<(u64, u64, u32)> = paths
            .iter()
            .filter(|p| {
                !paths
                    .iter()
                    .any(|q| q.0 <= p.0 && q.1 <= p.1 && (q.0 < p.0 || q.1 < p.1))
            })
            .map(|p| {
                let hops = paths
                    .iter()
                    .filter(|q| (q.0, q.1) == (p.0, p.1))
                    .map(|q| q.2)
                    .min()
                    .unwrap();
                (p.0, p.1, hops)
            })
            .collect();
        front.sort_by_key(|p| (p.1, p.0));
        front.dedup();
        front
    }

    #[test]
    fn fronts_and_choices_match_brute_force_on_random_graphs() {
        let mut rng = Rng(17);
        for case in 0..600 {
            let n = 2 + rng.below(6) as usize; // 2..=7
            let density = [100, 100, 60, 35][case % 4];
            let symmetric = rng.below(2) == 0;
            // Few distinct values make ties (equal sums, equal maxima, zero RTTs).
            let coarse = rng.below(2) == 0;
            let mut m = RttMatrix::new((0..n).map(|k| format!("n{k}")).collect()).unwrap();
            for i in 0..n {
                for j in 0..n {
                    if i == j || (symmetric && j < i) || rng.below(100) >= density {
                        continue;
                    }
                    let ms = if coarse {
                        [0.0, 1.0, 2.0, 3.0, 4.0, 6.0][rng.below(6) as usize]
                    } else {
                        rng.below(100_000) as f64 / 1000.0
                    };
                    m.set(i, j, ms).unwrap();
                    if symmetric {
                        m.set(j, i, ms).unwrap();
                    }
                }
            }
            let w: Vec<Option<u64>> = (0..n * n)
                .map(|k| {
                    let ms = m.rtt(k / n, k % n);
                    (k / n != k % n && ms.is_finite()).then(|| to_ns(ms))
                })
                .collect();
            let t = ChainTable::build(&m);
            for s in 0..n {
                for d in 0..n {
                    let paths = all_paths(&w, n, s, d);
                    let front = t.front(s, d).unwrap();
                    let got: Vec<(u64, u64, u32)> = front
                        .iter()
                        .map(|p| (to_ns(p.sum_ms), to_ns(p.max_ms), p.nodes.len() as u32 - 1))
                        .collect();
                    assert_eq!(got, brute_front(&paths), "case {case} {s}->{d}: {m:?}");
                    for p in &front {
                        // Each path is real, simple and has the point's objectives.
                        let hops: Vec<u64> = p
                            .nodes
                            .windows(2)
                            .map(|h| w[h[0] * n + h[1]].unwrap())
                            .collect();
                        assert_eq!(hops.iter().sum::<u64>(), to_ns(p.sum_ms));
                        assert_eq!(hops.iter().copied().max().unwrap_or(0), to_ns(p.max_ms));
                        let mut seen = p.nodes.clone();
                        seen.sort_unstable();
                        seen.dedup();
                        assert_eq!(seen.len(), p.nodes.len());
                        assert_eq!((p.nodes[0], *p.nodes.last().unwrap()), (s, d));
                    }
                    for r in 1..=MAX_ROUNDS {
                        let cost =
                            |q: &(u64, u64, u32)| q.0 as u128 + 2 * (r as u128 - 1) * q.1 as u128;
                        match t.lookup_rounds(s, d, r) {
                            Err(_) => assert!(paths.is_empty()),
                            Ok(c) => {
                                let opt = paths.iter().map(cost).min().unwrap();
                                let fewest = paths
                                    .iter()
                                    .filter(|q| cost(q) == opt)
                                    .map(|q| q.2)
                                    .min()
                                    .unwrap();
                                let mine =
                                    (to_ns(c.sum_ms), to_ns(c.max_ms), c.nodes.len() as u32 - 1);
                                assert_eq!(
                                    (cost(&mine), mine.2),
                                    (opt, fewest),
                                    "case {case} {s}->{d} r={r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
