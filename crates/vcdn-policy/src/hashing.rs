//! Consistent hashing of content over a region's caches.
//!
//! Rendezvous (highest-random-weight) hashing: each cache gets a score
//! `hash(cache, content)` and the highest score wins. The same chunk keeps
//! going to the same cache, and when a cache leaves or joins only the content
//! it wins moves (1/n of it), with no ring to rebuild and no virtual nodes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The score of `member` for `content`; the highest score wins.
fn score(member: &str, content: u64) -> u64 {
    xxh3_64_with_seed(member.as_bytes(), content)
}

/// Picks one of `members` (identified by a stable name, e.g. the cache's
/// address) for `content`, or `None` when there are none.
pub fn pick<S: AsRef<str>>(members: &[S], content: u64) -> Option<usize> {
    (0..members.len()).max_by_key(|&i| score(members[i].as_ref(), content))
}

/// Orders `members` by preference for `content` (best first): the failover
/// order when the first choice is down or overloaded.
pub fn ranking<S: AsRef<str>>(members: &[S], content: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..members.len()).collect();
    idx.sort_by_key(|&i| std::cmp::Reverse(score(members[i].as_ref(), content)));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("127.10.0.{}:8080", i + 1)).collect()
    }

    #[test]
    fn same_content_same_member_and_spread_is_even() {
        let m = members(4);
        let refs: Vec<&String> = m.iter().collect();
        let mut counts = [0usize; 4];
        for c in 0..40_000u64 {
            let a = pick(&refs, c).unwrap();
            assert_eq!(pick(&refs, c), Some(a));
            assert_eq!(ranking(&m, c)[0], a);
            counts[a] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread: {counts:?}");
        }
    }

    #[test]
    fn removing_a_member_moves_only_its_content() {
        let m = members(5);
        let all: Vec<&String> = m.iter().collect();
        let without: Vec<&String> = m.iter().filter(|s| !s.ends_with(".3:8080")).collect();
        let mut moved = 0;
        for c in 0..20_000u64 {
            let before = all[pick(&all, c).unwrap()];
            let after = without[pick(&without, c).unwrap()];
            if before != after {
                assert!(
                    before.ends_with(".3:8080"),
                    "content {c} moved off a live member"
                );
                moved += 1;
            }
        }
        assert!((3_000..5_000).contains(&moved), "moved {moved}");
    }

    #[test]
    fn no_members_no_pick() {
        let none: Vec<&str> = vec![];
        assert_eq!(pick(&none, 1), None);
        assert!(ranking::<&str>(&[], 1).is_empty());
    }
}
