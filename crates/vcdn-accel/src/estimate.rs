//! Transfer-size estimation (MOSTO §IV: the ingress does not know how big
//! an answer will be before it picks a chain). Per URL prefix (the path up
//! to its last `/`) it keeps an exponentially weighted mean of the sizes of
//! recent answers; a prefix never seen means "large", which picks the chain
//! for the most rounds (the safe choice: a long transfer is where a wrong
//! chain costs most).

use lru::LruCache;
use parking_lot::Mutex;
use std::num::NonZeroUsize;

/// Prefixes remembered (least recently used forgotten first).
pub const MAX_PREFIXES: usize = 4096;
/// Longest prefix kept (longer paths share the first bytes' entry).
const MAX_PREFIX: usize = 256;
/// Weight of the newest size in the mean.
const ALPHA: f64 = 0.3;

pub struct SizeEstimator {
    table: Mutex<LruCache<Vec<u8>, f64>>,
}

impl Default for SizeEstimator {
    fn default() -> Self {
        SizeEstimator {
            table: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_PREFIXES).expect("non-zero"),
            )),
        }
    }
}

/// The prefix a path is estimated by: up to and including its last `/`.
pub fn prefix(path: &[u8]) -> &[u8] {
    let p = match path.iter().rposition(|&c| c == b'/') {
        Some(i) => &path[..=i],
        None => path,
    };
    &p[..p.len().min(MAX_PREFIX)]
}

impl SizeEstimator {
    /// The expected body size of an answer to `path`, if its prefix was seen.
    pub fn estimate(&self, path: &[u8]) -> Option<u64> {
        self.table
            .lock()
            .get(prefix(path))
            .map(|&v| v.round() as u64)
    }

    /// Learns the size of an answer to `path` (a Content-Length, or the
    /// bytes counted when the answer had none).
    pub fn record(&self, path: &[u8], bytes: u64) {
        let mut t = self.table.lock();
        let p = prefix(path);
        let b = bytes as f64;
        match t.get_mut(p) {
            Some(v) => *v = ALPHA * b + (1.0 - ALPHA) * *v,
            None => {
                t.put(p.to_vec(), b);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.table.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Slow-start rounds a transfer of `bytes` needs, by the one model the
/// controller's tables are computed with (`vcdn_policy::chains::rounds`).
/// Unknown sizes count as large (`u32::MAX`).
pub fn rounds(bytes: Option<u64>) -> u32 {
    bytes.map_or(u32::MAX, vcdn_policy::chains::rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_match_the_model() {
        for (s, r) in [
            (14_600, 1),
            (43_800, 2),
            (73_000, 3),
            (219_000, 4),
            (435_000, 5),
            (1_000_000, 7),
            (10_000_000, 10),
        ] {
            assert_eq!(rounds(Some(s)), r, "{s}");
        }
        assert_eq!(rounds(None), u32::MAX);
    }

    #[test]
    fn learns_per_prefix() {
        let e = SizeEstimator::default();
        assert_eq!(e.estimate(b"/api/user/1"), None);
        e.record(b"/api/user/1", 1000);
        assert_eq!(e.estimate(b"/api/user/2"), Some(1000));
        e.record(b"/api/user/3", 2000);
        assert_eq!(e.estimate(b"/api/user/9"), Some(1300));
        assert_eq!(e.estimate(b"/img/x"), None);
        assert_eq!(prefix(b"nopath"), b"nopath");
    }

    #[test]
    fn table_is_bounded() {
        let e = SizeEstimator::default();
        for i in 0..MAX_PREFIXES + 100 {
            e.record(format!("/p{i}/x").as_bytes(), 1);
        }
        assert_eq!(e.len(), MAX_PREFIXES);
    }
}
