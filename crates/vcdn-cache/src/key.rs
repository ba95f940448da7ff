//! Cache keys and the object ids derived from them.
//!
//! As in MiniCache's SHFS, the store is flat and addressed by a hash of the
//! key. The hash (XXH3-128) is fast but not collision resistant, so every
//! entry also keeps its full key and a lookup compares it: a crafted
//! collision can only cause a miss, never serve the wrong object.

use std::fmt;

use bytes::Bytes;
use vcdn_http::Headers;

/// The 128-bit id of a cache key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u128);

impl ObjectId {
    pub fn of(key: &[u8]) -> ObjectId {
        ObjectId(xxhash_rust::xxh3::xxh3_128(key))
    }

    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }

    pub fn from_hex(s: &str) -> Option<ObjectId> {
        (s.len() == 32)
            .then(|| u128::from_str_radix(s, 16).ok())
            .flatten()
            .map(ObjectId)
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// The primary cache key of a request: its path and query. A cache instance
/// serves one upstream (one service), so the host is not part of the key
/// and every name clients use for the service shares the same objects.
pub fn primary_key(path_and_query: &[u8]) -> Bytes {
    Bytes::copy_from_slice(path_and_query)
}

/// The key of one variant of a response that carries `Vary` (RFC 9111
/// §4.1): the primary key plus the request's values of the named fields,
/// whitespace-normalised.
pub fn variant_key(primary: &[u8], vary: &[Bytes], request: &Headers) -> Bytes {
    let mut k = Vec::with_capacity(primary.len() + 32);
    k.extend_from_slice(primary);
    for name in vary {
        k.push(0);
        k.extend_from_slice(name);
        k.push(b'=');
        let mut first = true;
        for v in request.get_all(name) {
            if !first {
                k.push(b',');
            }
            first = false;
            for item in vcdn_http::header::list_items(v) {
                k.extend_from_slice(item);
                k.push(b' ');
            }
        }
    }
    Bytes::from(k)
}

/// The field names listed in a response's `Vary`, lower-cased, or `None` for
/// `Vary: *` (never matches, so never stored).
pub fn vary_names(headers: &Headers) -> Option<Vec<Bytes>> {
    let mut names: Vec<Bytes> = Vec::new();
    for v in headers.get_all(b"vary") {
        for item in vcdn_http::header::list_items(v) {
            if item == b"*" {
                return None;
            }
            let lower = Bytes::from(item.to_ascii_lowercase());
            if !names.contains(&lower) {
                names.push(lower);
            }
        }
    }
    names.sort();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let id = ObjectId::of(b"/a");
        assert_eq!(ObjectId::from_hex(&id.hex()), Some(id));
        assert_ne!(ObjectId::of(b"/a"), ObjectId::of(b"/b"));
    }

    #[test]
    fn variants_differ_by_selected_fields() {
        let mut gz = Headers::new();
        gz.push("Accept-Encoding", "gzip,  br");
        let mut gz2 = Headers::new();
        gz2.push("accept-encoding", "gzip, br");
        let plain = Headers::new();
        let vary = vec![Bytes::from_static(b"accept-encoding")];
        assert_eq!(
            variant_key(b"/x", &vary, &gz),
            variant_key(b"/x", &vary, &gz2)
        );
        assert_ne!(
            variant_key(b"/x", &vary, &gz),
            variant_key(b"/x", &vary, &plain)
        );
        let mut h = Headers::new();
        h.push("Vary", "Accept-Encoding, User-Agent");
        assert_eq!(vary_names(&h).unwrap().len(), 2);
        h.push("Vary", "*");
        assert!(vary_names(&h).is_none());
    }
}
