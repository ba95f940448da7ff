//! Independent-reference-model (IRM) simulation of an admission filter in
//! front of an LRU edge cache: seeded Zipf requests, the real
//! `vcdn_policy::admission` filters, and a small O(1) LRU cache.
//!
//! A request counts as a *global hit* (the paper's metric, eq. 8) when the
//! filter sends it to the edge and the edge cache has the object. Requests the
//! filter sends to the origin never touch the cache.

use vcdn_policy::admission::{Admission, AdmissionFilter, AdmitAll, LruFilter};

pub use vcdn_sim::rng::{Rng, Zipf};

const NIL: u32 = u32::MAX;

/// An LRU cache of object ids `0..n` with O(1) access: a doubly linked list
/// threaded through arrays indexed by id (the simulated edge cache's store).
#[derive(Debug, Clone)]
pub struct IdLru {
    capacity: usize,
    len: usize,
    head: u32,
    tail: u32,
    links: Vec<[u32; 2]>, // [prev, next]
    present: Vec<bool>,
}

impl IdLru {
    /// An empty cache of `capacity` objects over ids `0..n`.
    pub fn new(n: usize, capacity: usize) -> Self {
        IdLru {
            capacity,
            len: 0,
            head: NIL,
            tail: NIL,
            links: vec![[NIL, NIL]; n],
            present: vec![false; n],
        }
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True once it holds `capacity` objects (or all `n`).
    pub fn is_full(&self) -> bool {
        self.len >= self.capacity.min(self.present.len())
    }

    fn unlink(&mut self, id: u32) {
        let [prev, next] = self.links[id as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize][1] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize][0] = prev;
        }
    }

    fn push_head(&mut self, id: u32) {
        self.links[id as usize] = [NIL, self.head];
        if self.head != NIL {
            self.links[self.head as usize][0] = id;
        }
        self.head = id;
        if self.tail == NIL {
            self.tail = id;
        }
    }

    /// A request for `id`: true on a hit. Either way `id` ends at the head;
    /// a miss inserts it, evicting the least recently used object if full.
    pub fn access(&mut self, id: u32) -> bool {
        if self.capacity == 0 {
            return false;
        }
        if self.present[id as usize] {
            if self.head != id {
                self.unlink(id);
                self.push_head(id);
            }
            return true;
        }
        if self.len >= self.capacity {
            let t = self.tail;
            self.unlink(t);
            self.present[t as usize] = false;
            self.len -= 1;
        }
        self.present[id as usize] = true;
        self.len += 1;
        self.push_head(id);
        false
    }
}

/// Which admission filter sits in front of the edge cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `vcdn_policy::admission::LruFilter` of this many identifiers.
    Lru(usize),
    /// `vcdn_policy::admission::AdmitAll`: no filter.
    None,
}

/// Outcome of [`simulate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimResult {
    /// Global hit rate over the measured requests.
    pub hit_rate: f64,
    /// Standard error of `hit_rate` (batch means).
    pub std_err: f64,
    /// Share of measured requests the filter sent to the edge.
    pub edge_share: f64,
    /// Requests spent warming up (not measured).
    pub warmup: u64,
    /// Whether the cache was full when measuring began.
    pub warmed: bool,
}

/// Number of batches for the batch-means standard error.
const BATCHES: u64 = 20;

/// Puts the filter in a stationary state before the first request.
///
/// Under IRM the requests are the marks of a superposition of Poisson
/// processes, so in steady state the times since each object's last request
/// are independent Exp(rate) variables, and an LRU of C1 holds the C1 objects
/// with the smallest ones, most recent at the head. Drawing those ages and
/// feeding the chosen ids to `admit` from the oldest to the newest gives an
/// exact sample of the stationary filter, which a cold start would take
/// ~t1·Σq requests (millions for large filters) to reach.
fn prefill(filter: &mut LruFilter, zipf: &Zipf, c1: usize, rng: &mut Rng) {
    let n = zipf.n();
    let c1 = c1.min(n);
    if c1 == 0 {
        return;
    }
    let mut ages: Vec<(f64, u32)> = (0..n as u32)
        .map(|id| (-(1.0 - rng.next_f64()).ln() / zipf.rate(id), id))
        .collect();
    if c1 < n {
        ages.select_nth_unstable_by(c1 - 1, |a, b| a.0.total_cmp(&b.0));
        ages.truncate(c1);
    }
    ages.sort_unstable_by(|a, b| b.0.total_cmp(&a.0)); // oldest first
    for &(_, id) in &ages {
        filter.admit(id as u64);
    }
}

/// Simulates `requests` measured IRM requests through `filter` and an LRU
/// cache of `c2` objects, after a warm-up.
///
/// Warm-up: the filter starts stationary (see `prefill`); the cache then runs
/// until it is full — from then on an LRU's content is the last C2 distinct
/// objects it was asked for, which no longer depends on its empty start — plus
/// `requests / 20` more (at most `20 × requests` in all, after which the run
/// is measured anyway and `warmed` is false). Deterministic for a given seed.
pub fn simulate(zipf: &Zipf, filter: Filter, c2: usize, requests: u64, seed: u64) -> SimResult {
    let mut rng = Rng::new(seed);
    match filter {
        Filter::Lru(c1) => {
            let mut f = LruFilter::new(c1);
            prefill(&mut f, zipf, c1, &mut rng);
            run(zipf, &mut f, c2, requests, &mut rng)
        }
        Filter::None => run(zipf, &mut AdmitAll, c2, requests, &mut rng),
    }
}

fn run<F: AdmissionFilter>(
    zipf: &Zipf,
    filter: &mut F,
    c2: usize,
    requests: u64,
    rng: &mut Rng,
) -> SimResult {
    let mut cache = IdLru::new(zipf.n(), c2);
    let cap = 20 * requests.max(1);
    let mut warmup = 0u64;
    while !cache.is_full() && warmup < cap {
        let id = zipf.sample(rng);
        if filter.admit(id as u64) == Admission::Edge {
            cache.access(id);
        }
        warmup += 1;
    }
    let warmed = cache.is_full();
    for _ in 0..requests / 20 {
        let id = zipf.sample(rng);
        if filter.admit(id as u64) == Admission::Edge {
            cache.access(id);
        }
    }
    warmup += requests / 20;
    let per_batch = (requests / BATCHES).max(1);
    let (mut hits, mut edge, mut total) = (0u64, 0u64, 0u64);
    let mut batch_rates = Vec::with_capacity(BATCHES as usize);
    for _ in 0..BATCHES {
        let mut batch_hits = 0u64;
        for _ in 0..per_batch {
            let id = zipf.sample(rng);
            if filter.admit(id as u64) == Admission::Edge {
                edge += 1;
                if cache.access(id) {
                    batch_hits += 1;
                }
            }
        }
        hits += batch_hits;
        total += per_batch;
        batch_rates.push(batch_hits as f64 / per_batch as f64);
    }
    let mean = hits as f64 / total as f64;
    let var = batch_rates
        .iter()
        .map(|r| (r - mean) * (r - mean))
        .sum::<f64>()
        / (BATCHES - 1) as f64;
    SimResult {
        hit_rate: mean,
        std_err: (var / BATCHES as f64).sqrt(),
        edge_share: edge as f64 / total as f64,
        warmup,
        warmed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lru_evicts_the_least_recent() {
        let mut c = IdLru::new(10, 2);
        assert!(!c.access(1));
        assert!(!c.access(2));
        assert!(c.access(1)); // 1 now most recent
        assert!(!c.access(3)); // evicts 2
        assert!(c.access(1));
        assert!(!c.access(2));
        assert_eq!(c.len(), 2);
        assert!(c.is_full());
        let mut z = IdLru::new(4, 0);
        assert!(!z.access(0) && !z.access(0) && z.is_empty());
    }

    #[test]
    fn prefill_keeps_the_most_recent_objects() {
        let z = Zipf::new(1.0, 1000);
        let mut f = LruFilter::new(100);
        prefill(&mut f, &z, 100, &mut Rng::new(3));
        assert_eq!(f.len(), 100);
        // Popular objects are almost surely there, the least popular rarely.
        assert!(f.contains(0) && f.contains(1));
        let tail = (900..1000).filter(|&id| f.contains(id)).count();
        assert!(tail < 10, "{tail}");
    }
}
