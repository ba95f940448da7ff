//! The VoD cache of a site: vcdn's LRU admission filter
//! (`vcdn_policy::admission::LruFilter`, the IM 2019 paper's meta-cache of
//! identifiers) in front of an LRU store of titles.
//!
//! The store is an LRU of title ids too, so it reuses the filter's O(1)
//! slab list: an LRU cache's state machine is exactly the filter's (a hit
//! moves the id to the head, a miss inserts it and evicts the tail).

use vcdn_policy::admission::{Admission, AdmissionFilter, LruFilter};

/// How the site served one VoD request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The filter let it in and the store held it.
    Hit,
    /// The filter let it in; the store fetched it from the origin while
    /// serving it (and keeps it).
    Miss,
    /// The filter had not seen it recently: the origin serves it, the
    /// store is not touched.
    Bypass,
}

impl Served {
    pub fn as_str(self) -> &'static str {
        match self {
            Served::Hit => "hit",
            Served::Miss => "miss",
            Served::Bypass => "bypass",
        }
    }
}

/// One site's titles.
#[derive(Debug, Clone)]
pub struct VodCache {
    filter: Option<LruFilter>,
    store: LruFilter,
}

impl VodCache {
    /// A store of `titles` titles behind a filter of `filter` identifiers
    /// (`None`: no filter, every request goes to the store).
    pub fn new(titles: usize, filter: Option<usize>) -> Self {
        VodCache {
            filter: filter.map(LruFilter::new),
            store: LruFilter::new(titles),
        }
    }

    pub fn request(&mut self, title: u32) -> Served {
        let id = title as u64;
        if let Some(f) = &mut self.filter {
            if f.admit(id) == Admission::Origin {
                return Served::Bypass;
            }
        }
        match self.store.admit(id) {
            Admission::Edge => Served::Hit,
            Admission::Origin => Served::Miss,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_lets_in_only_what_it_saw_and_the_store_is_an_lru() {
        let mut c = VodCache::new(2, Some(3));
        assert_eq!(c.request(1), Served::Bypass, "first sight");
        assert_eq!(c.request(1), Served::Miss, "seen: the store fetches it");
        assert_eq!(c.request(1), Served::Hit);
        for t in [2, 2, 3, 3] {
            c.request(t);
        }
        // Store: 3, 2 (1 evicted); filter: 3, 2, 1.
        assert_eq!(c.request(1), Served::Miss);
        let mut none = VodCache::new(1, None);
        assert_eq!(none.request(7), Served::Miss);
        assert_eq!(none.request(7), Served::Hit);
    }
}
