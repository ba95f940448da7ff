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

/// The bucket of `content` among `buckets` (a power of two): splitmix64's
/// finaliser of the id, masked. The SRv6 dispatcher computes it in the
/// kernel (`vcdn-srv6/bpf/dispatcher.bpf.c` has the same constants), where
/// a rendezvous score per cache and per packet would cost too much.
pub fn bucket(content: u64, buckets: usize) -> usize {
    debug_assert!(buckets.is_power_of_two());
    let mut x = content;
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x & (buckets as u64 - 1)) as usize
}

/// A table of `buckets` entries, each the rendezvous winner ([`pick`]) of
/// its own number among `members`: content goes to
/// `table[bucket(id, buckets)]`. Hashing is rendezvous at the grain of a
/// bucket, so when a member leaves only its buckets move, as with
/// [`pick`]; the same chunk may land on another member than [`pick`]
/// gives it directly. Empty when there are no members.
pub fn bucket_table<S: AsRef<str>>(members: &[S], buckets: usize) -> Vec<usize> {
    if members.is_empty() {
        return Vec::new();
    }
    (0..buckets as u64)
        .map(|b| pick(members, b).unwrap_or(0))
        .collect()
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

    #[test]
    fn bucket_tables_spread_evenly_and_move_only_a_leaving_members_buckets() {
        // The kernel's copy of the mixer must give the same buckets.
        assert_eq!(bucket(0, 1024), 0);
        assert_eq!(bucket(1, 1 << 20), 0x5692161d100b05e5 & 0xfffff);
        let m = members(4);
        let t = bucket_table(&m, 1024);
        let mut counts = [0usize; 4];
        for &i in &t {
            counts[i] += 1;
        }
        assert!(
            counts.iter().all(|&c| (200..312).contains(&c)),
            "{counts:?}"
        );
        let fewer: Vec<String> = m
            .iter()
            .filter(|s| !s.ends_with(".3:8080"))
            .cloned()
            .collect();
        let t2 = bucket_table(&fewer, 1024);
        for b in 0..1024 {
            if m[t[b]] != fewer[t2[b]] {
                assert!(
                    m[t[b]].ends_with(".3:8080"),
                    "bucket {b} moved off a live member"
                );
            }
        }
        assert!(bucket_table::<&str>(&[], 8).is_empty());
    }
}
