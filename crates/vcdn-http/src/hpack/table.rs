//! The static table (RFC 7541 Appendix A), a name lookup into it for the
//! encoder, and the dynamic table (§2.3.2, §4).

use std::collections::VecDeque;

/// Size overhead of a table entry (RFC 7541 §4.1): its name and value
/// lengths plus 32.
pub const ENTRY_OVERHEAD: usize = 32;

/// The static table; index `i` (1-based in HPACK) is `STATIC[i - 1]`.
pub(crate) static STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Slots of the open-addressing hash from a name to its first static index.
const SLOTS: usize = 128;

const fn name_hash(name: &[u8]) -> usize {
    let n = name.len();
    if n == 0 {
        return 0;
    }
    (n.wrapping_mul(31)
        ^ (name[n / 2] as usize).wrapping_mul(7)
        ^ (name[n - 1] as usize).wrapping_mul(131))
        % SLOTS
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// For each hash slot: 0 (empty) or the first static index (1-based) of a
/// name; linear probing. Built at compile time.
static NAME_SLOTS: [u8; SLOTS] = {
    let mut slots = [0u8; SLOTS];
    let mut i = 0;
    while i < STATIC.len() {
        let name = STATIC[i].0;
        let first_of_name = i == 0 || !same(STATIC[i - 1].0, name);
        if first_of_name {
            let mut h = name_hash(name);
            while slots[h] != 0 {
                h = (h + 1) % SLOTS;
            }
            slots[h] = (i + 1) as u8;
        }
        i += 1;
    }
    slots
};

/// The first static index (1-based) whose name is `name`.
pub(crate) fn static_name(name: &[u8]) -> Option<usize> {
    let mut h = name_hash(name);
    loop {
        let idx = NAME_SLOTS[h] as usize;
        if idx == 0 {
            return None;
        }
        if STATIC[idx - 1].0 == name {
            return Some(idx);
        }
        h = (h + 1) % SLOTS;
    }
}

/// The static index (1-based) of the exact field, given the first index of
/// its name: entries of one name are adjacent in the static table.
pub(crate) fn static_exact(first: usize, name: &[u8], value: &[u8]) -> Option<usize> {
    let mut i = first;
    while i <= STATIC.len() && STATIC[i - 1].0 == name {
        if STATIC[i - 1].1 == value {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// One dynamic table entry: name and value in one allocation.
pub(crate) struct Entry {
    data: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    pub(crate) fn new(name: &[u8], value: &[u8]) -> Entry {
        let mut data = Vec::with_capacity(name.len() + value.len());
        data.extend_from_slice(name);
        data.extend_from_slice(value);
        Entry {
            data: data.into_boxed_slice(),
            name_len: name.len(),
        }
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.data[..self.name_len]
    }

    pub(crate) fn value(&self) -> &[u8] {
        &self.data[self.name_len..]
    }

    /// The entry's size as RFC 7541 §4.1 counts it.
    fn size(&self) -> usize {
        self.data.len() + ENTRY_OVERHEAD
    }
}

/// The dynamic table: newest entry first, evicted from the back.
///
/// Memory is what the entries hold: each entry is one allocation of its
/// name and value, and the sum of §4.1 sizes (`size`, which counts 32 bytes
/// of overhead per entry) never exceeds `max`.
pub(crate) struct DynamicTable {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl DynamicTable {
    pub(crate) fn new(max: usize) -> DynamicTable {
        DynamicTable {
            entries: VecDeque::new(),
            size: 0,
            max,
        }
    }

    /// Entry `i`, 0 being the newest (HPACK index 62).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(i).map(|e| (e.name(), e.value()))
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Change the maximum size, evicting the oldest entries to fit (§4.3).
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_to(max);
        if self.entries.is_empty() {
            // Give back the slots of a table emptied by a size update to 0.
            self.entries = VecDeque::new();
        }
    }

    /// Whether an entry of these lengths fits at all (§4.4: one larger than
    /// the table empties it and is not added).
    pub(crate) fn fits(&self, name_len: usize, value_len: usize) -> bool {
        name_len + value_len + ENTRY_OVERHEAD <= self.max
    }

    /// Empty the table (an entry larger than it was added, §4.4).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.size = 0;
    }

    /// Add `entry` as the newest, evicting the oldest ones to make room.
    /// The caller checked [`fits`](Self::fits).
    pub(crate) fn push(&mut self, entry: Entry) {
        let size = entry.size();
        debug_assert!(size <= self.max);
        self.evict_to(self.max - size);
        self.size += size;
        self.entries.push_front(entry);
    }

    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.size(),
                None => {
                    debug_assert!(false, "dynamic table size out of step");
                    self.size = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_static_name_is_found_at_its_first_index() {
        for (i, (name, value)) in STATIC.iter().enumerate() {
            let first = static_name(name).unwrap();
            assert_eq!(STATIC[first - 1].0, *name);
            assert!(first <= i + 1);
            assert!(first == 1 || STATIC[first - 2].0 != *name);
            assert_eq!(static_exact(first, name, value), Some(i + 1));
        }
        for absent in [
            &b"x-cache"[..],
            b"",
            b"content-lengthx",
            b":statu",
            b"Server",
        ] {
            assert_eq!(
                static_name(absent),
                None,
                "{}",
                String::from_utf8_lossy(absent)
            );
        }
        assert_eq!(static_exact(8, b":status", b"302"), None);
        assert_eq!(static_exact(61, b"www-authenticate", b"x"), None);
    }

    #[test]
    fn eviction_keeps_size_within_max() {
        let mut t = DynamicTable::new(100);
        t.push(Entry::new(b"aaaa", b"bbbb")); // 40
        t.push(Entry::new(b"cccc", b"dddd")); // 80
        assert_eq!((t.len(), t.size()), (2, 80));
        t.push(Entry::new(b"eeee", b"ffff")); // evicts the oldest
        assert_eq!((t.len(), t.size()), (2, 80));
        assert_eq!(t.get(0), Some((&b"eeee"[..], &b"ffff"[..])));
        assert_eq!(t.get(1), Some((&b"cccc"[..], &b"dddd"[..])));
        assert_eq!(t.get(2), None);
        t.set_max(50);
        assert_eq!((t.len(), t.size()), (1, 40));
        t.set_max(0);
        assert_eq!((t.len(), t.size()), (0, 0));
        assert!(!t.fits(0, 0));
    }
}
