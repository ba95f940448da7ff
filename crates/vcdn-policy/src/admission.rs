//! Admission filters: which requests an edge cache should serve at all.
//!
//! The paper's *LRU filter* (an LRU meta-cache of identifiers, §III-A): a
//! request for content `c` goes to the edge only if `c` is already in the
//! filter (it was requested recently, so it is probably popular); otherwise it
//! goes straight to the origin and `c` enters the filter. Either way `c`
//! moves to the head. Unpopular content thus neither pollutes the edge cache
//! nor costs it a proxied miss.

use std::collections::HashMap;

/// Where an admission filter sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Seen recently: the edge cache serves it (hit, or a miss it proxies).
    Edge,
    /// Not seen recently: bypass the edge, the origin serves it directly.
    Origin,
}

/// A pluggable edge admission policy, fed one content identifier per request.
pub trait AdmissionFilter {
    /// Decides for one request and updates the filter's state.
    fn admit(&mut self, id: u64) -> Admission;
}

/// Admits everything: the baseline "no filter" edge.
#[derive(Debug, Default, Clone, Copy)]
pub struct AdmitAll;

impl AdmissionFilter for AdmitAll {
    fn admit(&mut self, _id: u64) -> Admission {
        Admission::Edge
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    prev: u32,
    next: u32,
}

/// The LRU filter: an LRU list of the last `capacity` distinct identifiers.
///
/// Entries live in one preallocated slab linked by index (like the paper's
/// VPP plugin: a linked list plus a flow table), so `admit` is O(1) and
/// allocation-free once the filter is full. Capacity 0 sends everything to the
/// origin, as in the paper (C1 = 0 disables edge caching).
#[derive(Debug, Clone)]
pub struct LruFilter {
    capacity: usize,
    index: HashMap<u64, u32>,
    slab: Vec<Entry>,
    head: u32,
    tail: u32,
}

impl LruFilter {
    /// A filter remembering at most `capacity` identifiers.
    pub fn new(capacity: usize) -> Self {
        let cap = capacity.min(u32::MAX as usize - 1);
        LruFilter {
            capacity: cap,
            index: HashMap::with_capacity(cap.min(1 << 20)),
            slab: Vec::with_capacity(cap.min(1 << 20)),
            head: NIL,
            tail: NIL,
        }
    }

    /// How many identifiers the filter remembers at most (C1).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many identifiers it remembers now.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when it remembers nothing.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// True if `id` is in the filter (does not touch the LRU order).
    pub fn contains(&self, id: u64) -> bool {
        self.index.contains_key(&id)
    }

    /// Changes the capacity, dropping the least recently seen identifiers
    /// when it shrinks.
    pub fn resize(&mut self, capacity: usize) {
        let cap = capacity.min(u32::MAX as usize - 1);
        while self.index.len() > cap {
            self.evict_tail();
        }
        if cap < self.capacity {
            // Compact the slab so memory follows the new bound.
            let ids: Vec<u64> = self.iter_mru().collect();
            self.slab.clear();
            self.index.clear();
            self.head = NIL;
            self.tail = NIL;
            self.capacity = cap;
            for id in ids.into_iter().rev() {
                self.insert_head(id);
            }
            self.slab.shrink_to(cap);
            self.index.shrink_to(cap);
        }
        self.capacity = cap;
    }

    /// Identifiers from the most to the least recently seen.
    pub fn iter_mru(&self) -> impl Iterator<Item = u64> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let e = self.slab[at as usize];
            at = e.next;
            Some(e.id)
        })
    }

    fn unlink(&mut self, i: u32) {
        let Entry { prev, next, .. } = self.slab[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.slab[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slab[next as usize].prev = prev;
        }
    }

    fn link_head(&mut self, i: u32) {
        self.slab[i as usize].prev = NIL;
        self.slab[i as usize].next = self.head;
        if self.head != NIL {
            self.slab[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn evict_tail(&mut self) -> Option<u32> {
        let t = self.tail;
        if t == NIL {
            return None;
        }
        self.unlink(t);
        self.index.remove(&self.slab[t as usize].id);
        Some(t)
    }

    fn insert_head(&mut self, id: u64) {
        // Entries leave only to make room for a new one (or in `resize`,
        // which rebuilds the slab), so the slab is full exactly when the
        // filter is.
        let slot = if self.index.len() >= self.capacity {
            match self.evict_tail() {
                Some(t) => t,
                None => return,
            }
        } else {
            self.slab.push(Entry {
                id,
                prev: NIL,
                next: NIL,
            });
            (self.slab.len() - 1) as u32
        };
        self.slab[slot as usize].id = id;
        self.index.insert(id, slot);
        self.link_head(slot);
    }
}

impl AdmissionFilter for LruFilter {
    fn admit(&mut self, id: u64) -> Admission {
        if self.capacity == 0 {
            return Admission::Origin;
        }
        match self.index.get(&id) {
            Some(&i) => {
                if self.head != i {
                    self.unlink(i);
                    self.link_head(i);
                }
                Admission::Edge
            }
            None => {
                self.insert_head(id);
                Admission::Origin
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_request_goes_to_origin_second_to_edge() {
        let mut f = LruFilter::new(2);
        assert_eq!(f.admit(1), Admission::Origin);
        assert_eq!(f.admit(1), Admission::Edge);
        assert_eq!(f.admit(2), Admission::Origin);
        // 3 evicts the least recently seen, which is 1 (2 came after it).
        assert_eq!(f.admit(3), Admission::Origin);
        assert!(!f.contains(1));
        assert_eq!(f.admit(2), Admission::Edge);
        assert_eq!(f.admit(1), Admission::Origin);
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn a_hit_refreshes_the_entry() {
        let mut f = LruFilter::new(2);
        f.admit(1);
        f.admit(2);
        assert_eq!(f.admit(1), Admission::Edge); // 1 is now most recent
        f.admit(3); // evicts 2
        assert!(f.contains(1));
        assert!(!f.contains(2));
        assert_eq!(f.iter_mru().collect::<Vec<_>>(), vec![3, 1]);
    }

    #[test]
    fn zero_capacity_sends_everything_to_origin() {
        let mut f = LruFilter::new(0);
        for _ in 0..3 {
            assert_eq!(f.admit(7), Admission::Origin);
        }
        assert!(f.is_empty());
    }

    #[test]
    fn matches_a_naive_lru_on_a_random_stream() {
        let mut f = LruFilter::new(50);
        let mut naive: Vec<u64> = Vec::new(); // front = most recent
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = x % 120;
            let expect = if let Some(p) = naive.iter().position(|&v| v == id) {
                naive.remove(p);
                Admission::Edge
            } else {
                if naive.len() == 50 {
                    naive.pop();
                }
                Admission::Origin
            };
            naive.insert(0, id);
            assert_eq!(f.admit(id), expect);
        }
        assert_eq!(f.iter_mru().collect::<Vec<_>>(), naive);
    }

    #[test]
    fn resize_keeps_the_most_recent() {
        let mut f = LruFilter::new(5);
        for id in 1..=5 {
            f.admit(id);
        }
        f.resize(2);
        assert_eq!(f.iter_mru().collect::<Vec<_>>(), vec![5, 4]);
        assert_eq!(f.admit(3), Admission::Origin);
        assert_eq!(f.iter_mru().collect::<Vec<_>>(), vec![3, 5]);
        f.resize(4);
        f.admit(9);
        f.admit(10);
        assert_eq!(f.len(), 4);
    }
}
