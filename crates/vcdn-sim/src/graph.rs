//! The AS-level graph a scenario runs on: ASes with a role (content,
//! transit, access) and a weight (their share of the users), links with a
//! business relationship, and the routes from the origin.
//!
//! Three sources: CAIDA's AS-relationship file with a roles/weights file
//! the user provides (never shipped: CAIDA's data is not ours to give), the
//! open single-ISP topologies in the data directory with roles assigned by
//! [`AsGraph::from_topology`]'s rules, and [`AsGraph::synthetic`] country
//! graphs of the sizes of the MiniCache paper's Table 2.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::dist;
use crate::rng::Rng;

/// What an AS does (CAIDA AS Rank's classes as CDNSim uses them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Hosts content; the origin is one of these.
    Content,
    /// Relays traffic.
    Transit,
    /// Where users are, and where edge caches may run.
    Access,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s.trim().to_ascii_lowercase().as_str() {
            "content" | "co" => Some(Role::Content),
            "transit" | "tr" | "tr/ac" | "transport" => Some(Role::Transit),
            "access" | "ac" | "stub" => Some(Role::Access),
            _ => None,
        }
    }
}

/// The relationship of a link's first AS to its second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rel {
    /// `a` is a provider of `b` (CAIDA `-1`).
    ProviderOf,
    /// Settlement-free peers (CAIDA `0`).
    Peer,
    /// Unknown (topologies without relationships): any direction is fine.
    Unknown,
}

#[derive(Debug, Clone, PartialEq)]
pub struct As {
    pub asn: u32,
    pub role: Role,
    /// Relative number of users (only access ASes have users).
    pub weight: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    pub a: u32,
    pub b: u32,
    pub rel: Rel,
}

/// Link speeds by the roles of the two ends (the paper's §3.2 by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacities {
    /// Between two non-access ASes (transit–transit, transit–content).
    pub core_bps: f64,
    /// Any link touching an access AS.
    pub access_bps: f64,
    /// Each user's own line into its access AS.
    pub line_bps: f64,
}

impl Default for Capacities {
    fn default() -> Self {
        Capacities {
            core_bps: 40e9,
            access_bps: 10e9,
            line_bps: 25e6,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AsGraph {
    pub nodes: Vec<As>,
    pub edges: Vec<Edge>,
    /// Per node: (neighbour, edge index).
    adj: Vec<Vec<(u32, u32)>>,
}

/// An input file that cannot be used, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError(pub String);

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

/// The sizes of one country's AS graph (the paper's Table 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountrySize {
    pub content: u32,
    pub transit: u32,
    pub access: u32,
}

impl CountrySize {
    /// Table 2 by ISO code: US, DE, RU, FR, ES, KR.
    pub fn table2(code: &str) -> Option<CountrySize> {
        let (content, transit, access) = match code.to_ascii_uppercase().as_str() {
            "US" => (1_148, 2_987, 10_355),
            "DE" => (239, 360, 588),
            "RU" => (172, 1_797, 2_292),
            "FR" => (160, 236, 309),
            "ES" => (54, 146, 169),
            "KR" => (5, 45, 47),
            _ => return None,
        };
        Some(CountrySize {
            content,
            transit,
            access,
        })
    }

    pub fn total(&self) -> u32 {
        self.content + self.transit + self.access
    }
}

impl AsGraph {
    fn build(nodes: Vec<As>, edges: Vec<Edge>) -> Self {
        let mut adj = vec![Vec::new(); nodes.len()];
        for (i, e) in edges.iter().enumerate() {
            adj[e.a as usize].push((e.b, i as u32));
            adj[e.b as usize].push((e.a, i as u32));
        }
        AsGraph { nodes, edges, adj }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn degree(&self, node: u32) -> usize {
        self.adj[node as usize].len()
    }

    pub fn count(&self, role: Role) -> usize {
        self.nodes.iter().filter(|n| n.role == role).count()
    }

    /// The origin CDNSim uses: the content AS with the most neighbours
    /// (ties to the lower index); any AS if there is no content AS.
    pub fn default_origin(&self) -> u32 {
        let best = |pred: &dyn Fn(&As) -> bool| {
            (0..self.nodes.len() as u32)
                .filter(|&i| pred(&self.nodes[i as usize]))
                .max_by_key(|&i| (self.degree(i), std::cmp::Reverse(i)))
        };
        best(&|n: &As| n.role == Role::Content)
            .or_else(|| best(&|_| true))
            .unwrap_or(0)
    }

    /// The capacity of every edge, by the roles of its ends.
    pub fn capacities(&self, c: &Capacities) -> Vec<f64> {
        self.edges
            .iter()
            .map(|e| {
                let access = self.nodes[e.a as usize].role == Role::Access
                    || self.nodes[e.b as usize].role == Role::Access;
                if access {
                    c.access_bps
                } else {
                    c.core_bps
                }
            })
            .collect()
    }

    /// The smallest useful graph: the origin's content AS (node 0) behind
    /// one transit AS (node 1) that serves one access AS (node 2) with all
    /// the users. For checks against closed forms and the live system.
    pub fn chain() -> AsGraph {
        AsGraph::from_caida(
            "2|1|-1\n2|3|-1\n",
            "asn,role,weight\n1,content,0\n2,transit,0\n3,access,1\n",
            None,
        )
        .expect("a valid chain")
    }

    /// CAIDA's AS-relationship file (`a|b|rel[|source]`, `#` comments;
    /// rel −1: a is b's provider, 0: peers) cut down to the ASes of a
    /// roles/weights CSV (`asn,role,weight[,country]`, a header line, role
    /// content/transit/access or CAIDA's Co/Tr/Ac); `country`, if given,
    /// keeps only the rows of that country. Access ASes of weight 0 get
    /// weight 1.
    pub fn from_caida(
        relationships: &str,
        roles: &str,
        country: Option<&str>,
    ) -> Result<Self, InputError> {
        let mut nodes = Vec::new();
        let mut index: HashMap<u32, u32> = HashMap::new();
        for (n, line) in roles.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || (n == 0 && line.starts_with("asn")) {
                continue;
            }
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            let at = || format!("roles line {}", n + 1);
            if cols.len() < 3 {
                return Err(InputError(format!(
                    "{}: expected asn,role,weight[,country], got {line:?}",
                    at()
                )));
            }
            if let (Some(want), Some(have)) = (country, cols.get(3)) {
                if !have.eq_ignore_ascii_case(want) {
                    continue;
                }
            }
            let asn: u32 = cols[0]
                .trim_start_matches("AS")
                .parse()
                .map_err(|_| InputError(format!("{}: {:?} is not an AS number", at(), cols[0])))?;
            let role = Role::parse(cols[1]).ok_or_else(|| {
                InputError(format!(
                    "{}: role {:?} is none of content, transit, access",
                    at(),
                    cols[1]
                ))
            })?;
            let weight: f64 = cols[2]
                .parse()
                .ok()
                .filter(|w: &f64| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| {
                    InputError(format!(
                        "{}: weight {:?} is not a number ≥ 0",
                        at(),
                        cols[2]
                    ))
                })?;
            if index.insert(asn, nodes.len() as u32).is_some() {
                return Err(InputError(format!("{}: AS{asn} is listed twice", at())));
            }
            let weight = match role {
                Role::Access if weight == 0.0 => 1.0,
                Role::Access => weight,
                _ => 0.0,
            };
            nodes.push(As { asn, role, weight });
        }
        if nodes.is_empty() {
            return Err(InputError(
                "the roles file lists no AS (for this country)".into(),
            ));
        }
        let mut edges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (n, line) in relationships.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut cols = line.split('|');
            let (Some(a), Some(b), Some(rel)) = (cols.next(), cols.next(), cols.next()) else {
                return Err(InputError(format!(
                    "relationships line {}: expected a|b|rel, got {line:?}",
                    n + 1
                )));
            };
            let parse = |s: &str| {
                s.trim().parse::<u32>().map_err(|_| {
                    InputError(format!(
                        "relationships line {}: {s:?} is not an AS number",
                        n + 1
                    ))
                })
            };
            let (a, b) = (parse(a)?, parse(b)?);
            let rel = match rel.trim() {
                "-1" => Rel::ProviderOf,
                "0" => Rel::Peer,
                other => {
                    return Err(InputError(format!(
                        "relationships line {}: relationship {other:?} is neither -1 nor 0",
                        n + 1
                    )))
                }
            };
            let (Some(&ia), Some(&ib)) = (index.get(&a), index.get(&b)) else {
                continue;
            };
            if ia != ib && seen.insert((ia.min(ib), ia.max(ib))) {
                edges.push(Edge { a: ia, b: ib, rel });
            }
        }
        Ok(AsGraph::build(nodes, edges))
    }

    /// A single-ISP graph of the data directory (`node,label,…` and
    /// `src,dst,…` CSVs) with roles by rule, since it has none: the node of
    /// highest degree is the content origin; the nodes of degree 1 are
    /// access, and if they are fewer than a third of the nodes, the lowest
    /// degrees are taken (ties to the higher index) until a third are;
    /// the rest are transit. Every access node weighs 1.
    pub fn from_topology(nodes_csv: &str, edges_csv: &str) -> Result<Self, InputError> {
        let mut ids: HashMap<String, u32> = HashMap::new();
        for (n, line) in nodes_csv.lines().enumerate().skip(1) {
            let id = line.split(',').next().unwrap_or("").trim();
            if id.is_empty() {
                continue;
            }
            if ids.insert(id.to_string(), ids.len() as u32).is_some() {
                return Err(InputError(format!("nodes line {}: node {id} twice", n + 1)));
            }
        }
        let mut edges = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (n, line) in edges_csv.lines().enumerate().skip(1) {
            let mut cols = line.split(',').map(str::trim);
            let (Some(a), Some(b)) = (cols.next(), cols.next()) else {
                continue;
            };
            let lookup = |s: &str| {
                ids.get(s).copied().ok_or_else(|| {
                    InputError(format!(
                        "edges line {}: node {s:?} is not in the nodes file",
                        n + 1
                    ))
                })
            };
            let (a, b) = (lookup(a)?, lookup(b)?);
            if a != b && seen.insert((a.min(b), a.max(b))) {
                edges.push(Edge {
                    a,
                    b,
                    rel: Rel::Unknown,
                });
            }
        }
        let n = ids.len();
        if n < 2 {
            return Err(InputError("a topology needs at least two nodes".into()));
        }
        let mut g = AsGraph::build(
            (0..n as u32)
                .map(|i| As {
                    asn: i,
                    role: Role::Transit,
                    weight: 0.0,
                })
                .collect(),
            edges,
        );
        let origin = (0..n as u32)
            .max_by_key(|&i| (g.degree(i), std::cmp::Reverse(i)))
            .unwrap();
        g.nodes[origin as usize].role = Role::Content;
        let mut by_degree: Vec<u32> = (0..n as u32).filter(|&i| i != origin).collect();
        by_degree.sort_by_key(|&i| (g.degree(i), std::cmp::Reverse(i)));
        let leaves = by_degree.iter().filter(|&&i| g.degree(i) <= 1).count();
        let access = leaves.max(n.div_ceil(3)).min(by_degree.len());
        for &i in &by_degree[..access] {
            g.nodes[i as usize].role = Role::Access;
            g.nodes[i as usize].weight = 1.0;
        }
        Ok(g)
    }

    /// A three-tier country graph of the given size, fixed by `seed`.
    ///
    /// Transit ASes form a connected core by preferential attachment (each
    /// new one buys transit from two existing ones, chosen in proportion
    /// to degree, as the Internet's core grows); the j-th content AS is a
    /// customer of a tenth of the transit ASes over (j+1)^0.8, at least of
    /// one to three (so the origin, the best-connected content AS, has
    /// links worth a few Tb/s as large hosters do), and every access AS of one
    /// (70 %) or two, picked by degree, so a few large transit ASes carry
    /// most customers; one access AS in ten also peers with another.
    /// Access ASes' user weights are log-normal (σ = 1.5), the shape of
    /// announced address space per AS.
    pub fn synthetic(size: CountrySize, seed: u64) -> Self {
        assert!(
            size.transit >= 1 && size.access >= 1,
            "a country needs transit and access ASes"
        );
        let mut rng = Rng::new(seed);
        let mut nodes = Vec::with_capacity(size.total() as usize);
        let mut edges: Vec<Edge> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        // Endpoints of transit-core edges, one entry per degree: sampling
        // from it picks a transit AS in proportion to its degree.
        let mut by_degree: Vec<u32> = Vec::new();
        let mut add = |edges: &mut Vec<Edge>, a: u32, b: u32, rel: Rel| -> bool {
            if a != b && seen.insert((a.min(b), a.max(b))) {
                edges.push(Edge { a, b, rel });
                true
            } else {
                false
            }
        };
        let asn = |i: u32| 64_512 + i; // private AS numbers
        for i in 0..size.transit {
            nodes.push(As {
                asn: asn(i),
                role: Role::Transit,
                weight: 0.0,
            });
            if i == 0 {
                by_degree.push(0);
                continue;
            }
            let providers = if i == 1 { 1 } else { 2 };
            let mut got = 0;
            let mut tries = 0;
            while got < providers && tries < 20 {
                tries += 1;
                let p = by_degree[rng.below(by_degree.len() as u64) as usize];
                if add(&mut edges, p, i, Rel::ProviderOf) {
                    by_degree.push(p);
                    by_degree.push(i);
                    got += 1;
                }
            }
        }
        let pick_transit = |rng: &mut Rng, by_degree: &[u32]| {
            by_degree[rng.below(by_degree.len() as u64) as usize]
        };
        let base = size.transit;
        for j in 0..size.content {
            let i = base + j;
            nodes.push(As {
                asn: asn(i),
                role: Role::Content,
                weight: 0.0,
            });
            // The j-th largest content AS buys transit from a tenth of the
            // transit ASes over (j+1)^0.8, at least one to three: a few large
            // hosters are connected everywhere, most content ASes are not.
            let wide = (size.transit as f64 * 0.1 / ((j + 1) as f64).powf(0.8)) as u32;
            let providers = wide.max(1 + rng.below(3) as u32);
            for _ in 0..providers {
                let p = pick_transit(&mut rng, &by_degree);
                add(&mut edges, p, i, Rel::ProviderOf);
            }
        }
        let base = size.transit + size.content;
        for j in 0..size.access {
            let i = base + j;
            let weight = (1.5 * dist::normal(&mut rng)).exp();
            nodes.push(As {
                asn: asn(i),
                role: Role::Access,
                weight,
            });
            let providers = if rng.next_f64() < 0.7 { 1 } else { 2 };
            for _ in 0..providers {
                let p = pick_transit(&mut rng, &by_degree);
                add(&mut edges, p, i, Rel::ProviderOf);
            }
            if j > 0 && rng.next_f64() < 0.1 {
                let peer = base + rng.below(j as u64) as u32;
                add(&mut edges, i, peer, Rel::Peer);
            }
        }
        AsGraph::build(nodes, edges)
    }

    /// Shortest routes from `origin` to every AS: by hop count, and if
    /// `valley_free`, only over paths a BGP network would carry (up to
    /// providers, across at most one peering, then down to customers;
    /// links of unknown relationship go any way).
    pub fn routes(&self, origin: u32, valley_free: bool) -> Routes {
        // States: (node, descending). Once a path has gone down to a
        // customer or across a peering it may only go down.
        let n = self.nodes.len();
        let mut parent: Vec<[Option<(u32, u32, bool)>; 2]> = vec![[None, None]; n];
        let mut hops = vec![[u32::MAX; 2]; n];
        let mut queue = VecDeque::new();
        hops[origin as usize][0] = 0;
        queue.push_back((origin, false));
        while let Some((u, down)) = queue.pop_front() {
            let h = hops[u as usize][down as usize];
            for &(v, e) in &self.adj[u as usize] {
                let edge = self.edges[e as usize];
                // Direction of u → v in business terms.
                let step = match edge.rel {
                    Rel::Unknown => Step::Any,
                    Rel::Peer => Step::Across,
                    Rel::ProviderOf if edge.a == u => Step::Down,
                    Rel::ProviderOf => Step::Up,
                };
                let next = if !valley_free {
                    Some(false)
                } else {
                    match (step, down) {
                        (Step::Any, d) => Some(d),
                        (Step::Up, false) => Some(false),
                        (Step::Up, true) => None,
                        (Step::Across, false) => Some(true),
                        (Step::Across, true) => None,
                        (Step::Down, _) => Some(true),
                    }
                };
                let Some(d) = next else { continue };
                if hops[v as usize][d as usize] == u32::MAX {
                    hops[v as usize][d as usize] = h + 1;
                    parent[v as usize][d as usize] = Some((u, e, down));
                    queue.push_back((v, d));
                }
            }
        }
        Routes {
            origin,
            parent,
            hops,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Up,
    Down,
    Across,
    Any,
}

/// Routes from one origin.
#[derive(Debug, Clone)]
pub struct Routes {
    pub origin: u32,
    parent: Vec<[Option<(u32, u32, bool)>; 2]>,
    hops: Vec<[u32; 2]>,
}

impl Routes {
    fn best(&self, node: u32) -> Option<bool> {
        let [up, down] = self.hops[node as usize];
        match (up, down) {
            (u32::MAX, u32::MAX) => None,
            (u, d) if u <= d => Some(false),
            _ => Some(true),
        }
    }

    /// Whether `node` can be reached from the origin.
    pub fn reaches(&self, node: u32) -> bool {
        self.best(node).is_some()
    }

    /// Hops from the origin, if reachable.
    pub fn hops(&self, node: u32) -> Option<u32> {
        self.best(node)
            .map(|d| self.hops[node as usize][d as usize])
    }

    /// The edges from the origin to `node`, in order; `None` if unreachable.
    pub fn path(&self, node: u32) -> Option<Vec<u32>> {
        let mut state = (node, self.best(node)?);
        let mut path = Vec::new();
        while let Some((p, e, d)) = self.parent[state.0 as usize][state.1 as usize] {
            path.push(e);
            state = (p, d);
        }
        path.reverse();
        Some(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_countries_have_table_2s_sizes_and_are_connected() {
        for code in ["DE", "KR", "FR"] {
            let size = CountrySize::table2(code).unwrap();
            let g = AsGraph::synthetic(size, 1);
            assert_eq!(g.len() as u32, size.total());
            assert_eq!(g.count(Role::Access) as u32, size.access);
            assert_eq!(g.count(Role::Content) as u32, size.content);
            let origin = g.default_origin();
            assert_eq!(g.nodes[origin as usize].role, Role::Content);
            for valley_free in [false, true] {
                let r = g.routes(origin, valley_free);
                let unreachable = (0..g.len() as u32).filter(|&i| !r.reaches(i)).count();
                assert_eq!(unreachable, 0, "{code} valley_free={valley_free}");
            }
        }
        assert_eq!(
            AsGraph::synthetic(CountrySize::table2("DE").unwrap(), 1),
            AsGraph::synthetic(CountrySize::table2("DE").unwrap(), 1)
        );
    }

    #[test]
    fn paths_are_shortest_and_valley_free_ones_may_be_longer() {
        // 0 content, customer of transit 1; 1 and 2 peer; 2 and 3 peer;
        // access 4 is 3's customer and also 1's customer via 5.
        // Hop count alone: 0-1-2-3-4 (4 hops) or 0-1-5-4 (3 hops).
        let rel = "1|0|-1\n1|2|0\n2|3|0\n3|4|-1\n1|5|-1\n5|4|-1\n";
        let roles = "asn,role,weight\n0,content,0\n1,transit,0\n2,transit,0\n3,transit,0\n4,access,3\n5,transit,0\n";
        let g = AsGraph::from_caida(rel, roles, None).unwrap();
        let r = g.routes(0, false);
        assert_eq!(r.hops(3), Some(3));
        assert_eq!(r.hops(4), Some(3));
        // 0 → 1 is up; 1 → 2 across; 2 → 3 across again: a valley.
        let vf = g.routes(0, true);
        assert_eq!(vf.hops(2), Some(2));
        assert_eq!(vf.hops(4), Some(3));
        // 3 only by a second peering or by going up again from 4: valleys.
        assert_eq!(vf.hops(3), None);
        assert_eq!(vf.path(4).map(|p| p.len()), Some(3));
    }

    #[test]
    fn caida_input_errors_say_where() {
        let roles = "asn,role,weight\n1,content,0\n2,bogus,1\n";
        let err = AsGraph::from_caida("1|2|-1\n", roles, None).unwrap_err();
        assert!(err.0.contains("line 3") && err.0.contains("bogus"), "{err}");
        let roles = "asn,role,weight\n1,content,0\n2,access,1\n";
        let err = AsGraph::from_caida("1|2|7\n", roles, None).unwrap_err();
        assert!(err.0.contains("relationship \"7\""), "{err}");
        let g = AsGraph::from_caida("# c\n1|2|-1|bgp\n1|3|0\n", roles, None).unwrap();
        assert_eq!(g.edges.len(), 1, "AS3 is not in the roles file");
    }

    #[test]
    fn the_open_topologies_get_roles_by_the_documented_rule() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/data/topologies"
        );
        let Ok(nodes) = std::fs::read_to_string(format!("{dir}/zoo-Dfn.nodes.csv")) else {
            return;
        };
        let edges = std::fs::read_to_string(format!("{dir}/zoo-Dfn.edges.csv")).unwrap();
        let g = AsGraph::from_topology(&nodes, &edges).unwrap();
        assert_eq!(g.count(Role::Content), 1);
        assert!(g.count(Role::Access) >= g.len() / 3);
        let origin = g.default_origin();
        assert_eq!(
            (0..g.len() as u32).map(|i| g.degree(i)).max(),
            Some(g.degree(origin))
        );
    }
}
