//! A stored response, its per-object statistics (MiniCache/SHFS keeps hits,
//! misses, last access and download progress per file) and its on-disk
//! encoding, laid out so that it can be written while the body arrives and
//! sent from the file without reading it into memory.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use vcdn_http::Headers;

use crate::key::ObjectId;
use crate::policy::Freshness;

/// Counters of one object; shared by its successive versions, so a
/// revalidated object keeps its history.
#[derive(Debug, Default)]
pub struct ObjectStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_served: AtomicU64,
    /// Unix seconds of the last request for it.
    pub last_access: AtomicU64,
}

impl ObjectStats {
    pub fn hit(&self, now: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.last_access.store(now, Ordering::Relaxed);
    }

    pub fn miss(&self, now: u64) {
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.last_access.store(now, Ordering::Relaxed);
    }

    pub fn served(&self, bytes: u64) {
        self.bytes_served.fetch_add(bytes, Ordering::Relaxed);
    }

    fn restore(hits: u64, misses: u64, bytes: u64, last: u64) -> Arc<ObjectStats> {
        Arc::new(ObjectStats {
            hits: AtomicU64::new(hits),
            misses: AtomicU64::new(misses),
            bytes_served: AtomicU64::new(bytes),
            last_access: AtomicU64::new(last),
        })
    }
}

/// A complete response held by the cache.
#[derive(Debug)]
pub struct CachedObject {
    pub id: ObjectId,
    /// The full key (the primary key, plus the selected fields for a
    /// variant); compared on every lookup.
    pub key: Bytes,
    /// The primary key (path and query), for purges by URL or prefix.
    pub primary: Bytes,
    pub status: u16,
    /// End-to-end header fields as they will be sent (Date and Via included,
    /// Content-Length, Age and X-Cache excluded: those are per response).
    pub headers: Headers,
    /// `headers` serialised once, so a hit copies one block.
    pub head_block: Bytes,
    pub body: Bytes,
    /// The file holding `body` when it is large: a shared-memory file
    /// (see `body`) or the disk tier's file; `body` is then a mapping of
    /// it, sent with sendfile and never read through.
    pub file: Option<Arc<File>>,
    /// Where `body` starts in `file` (0 for shared memory).
    pub file_offset: u64,
    /// The Vary field names of this response (empty: no Vary).
    pub vary: Vec<Bytes>,
    pub freshness: Freshness,
    /// Unix seconds when the response (or its last validation) arrived.
    pub response_time: u64,
    /// Corrected initial age at `response_time` (RFC 9111 §4.2.3).
    pub initial_age: u64,
    pub stats: Arc<ObjectStats>,
}

/// Fields of a cached object except its serialised block.
pub struct ObjectParts {
    pub key: Bytes,
    pub primary: Bytes,
    pub status: u16,
    pub headers: Headers,
    pub body: Bytes,
    pub file: Option<Arc<File>>,
    pub file_offset: u64,
    pub vary: Vec<Bytes>,
    pub freshness: Freshness,
    pub response_time: u64,
    pub initial_age: u64,
    pub stats: Arc<ObjectStats>,
}

impl CachedObject {
    pub fn new(p: ObjectParts) -> CachedObject {
        let mut block = Vec::with_capacity(256);
        p.headers.write_to(&mut block);
        CachedObject {
            id: ObjectId::of(&p.key),
            key: p.key,
            primary: p.primary,
            status: p.status,
            headers: p.headers,
            head_block: Bytes::from(block),
            body: p.body,
            file: p.file,
            file_offset: p.file_offset,
            vary: p.vary,
            freshness: p.freshness,
            response_time: p.response_time,
            initial_age: p.initial_age,
            stats: p.stats,
        }
    }

    /// The same object with another body (read from, or mapped from, a file).
    pub fn with_body(self, body: Bytes, file: Option<Arc<File>>, file_offset: u64) -> CachedObject {
        CachedObject {
            body,
            file,
            file_offset,
            ..self
        }
    }

    /// Current age in seconds (RFC 9111 §4.2.3).
    pub fn age(&self, now: u64) -> u64 {
        self.initial_age + now.saturating_sub(self.response_time)
    }

    /// Bytes this object costs the memory tier (body, headers, bookkeeping).
    pub fn cost(&self) -> usize {
        self.body.len() + self.head_block.len() * 2 + self.key.len() * 2 + 256
    }
}

/// The first bytes of every object file (format 2: the body's length and
/// the checksum come last, so a body is written as it arrives).
pub const MAGIC: &[u8; 8] = b"VCDNOBJ2";
/// Magic and metadata length.
pub const HEAD_FIXED: u64 = 12;
/// Body length and checksum.
pub const TRAILER: u64 = 16;
/// Metadata larger than this is not ours (headers are bounded far lower).
const MAX_META: u64 = 4 << 20;

/// Why a stored file was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CorruptObject {
    #[error("file is shorter than its header says (torn write)")]
    Truncated,
    #[error("not a vcdn object file")]
    BadMagic,
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed metadata")]
    Metadata,
}

/// The start of an object file: magic, metadata length, metadata. The body
/// follows, then its length and an XXH3 checksum of everything before
/// ([`trailer`]), so torn or corrupt files are detected. `o.body` is not
/// part of it.
pub fn encode_head(o: &CachedObject) -> Vec<u8> {
    let mut meta = Vec::with_capacity(256 + o.head_block.len());
    meta.put_u16_le(o.status);
    meta.put_u64_le(o.response_time);
    meta.put_u64_le(o.initial_age);
    let f = &o.freshness;
    meta.put_u64_le(f.lifetime);
    meta.put_u64_le(f.stale_while_revalidate);
    meta.put_u64_le(f.stale_if_error);
    meta.put_u8(u8::from(f.must_revalidate) | (u8::from(f.no_cache) << 1));
    for c in [
        &o.stats.hits,
        &o.stats.misses,
        &o.stats.bytes_served,
        &o.stats.last_access,
    ] {
        meta.put_u64_le(c.load(Ordering::Relaxed));
    }
    put_bytes(&mut meta, &o.key);
    put_bytes(&mut meta, &o.primary);
    meta.put_u16_le(o.vary.len() as u16);
    for v in &o.vary {
        put_bytes(&mut meta, v);
    }
    meta.put_u16_le(o.headers.len() as u16);
    for (n, v) in o.headers.iter() {
        put_bytes(&mut meta, n);
        put_bytes(&mut meta, v);
    }
    let mut out = Vec::with_capacity(HEAD_FIXED as usize + meta.len());
    out.extend_from_slice(MAGIC);
    out.put_u32_le(meta.len() as u32);
    out.extend_from_slice(&meta);
    out
}

/// The end of an object file, given the body's length and the running
/// checksum of head and body; the checksum covers the length too.
pub fn trailer(body_len: u64, mut sum: xxhash_rust::xxh3::Xxh3) -> [u8; 16] {
    let len = body_len.to_le_bytes();
    sum.update(&len);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&len);
    out[8..].copy_from_slice(&sum.digest().to_le_bytes());
    out
}

/// A whole object file in memory (small objects, tests).
pub fn encode(o: &CachedObject) -> Vec<u8> {
    let mut out = encode_head(o);
    out.extend_from_slice(&o.body);
    let mut sum = xxhash_rust::xxh3::Xxh3::new();
    sum.update(&out);
    out.extend_from_slice(&trailer(o.body.len() as u64, sum));
    out
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.put_u32_le(b.len() as u32);
    out.extend_from_slice(b);
}

/// The layout of an object file, read from its first bytes and its
/// length: where the metadata and the body are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub meta_len: u64,
    pub body_offset: u64,
    pub body_len: u64,
}

/// Check the fixed head (the first [`HEAD_FIXED`] bytes) of a file of
/// `file_len` bytes, and say where its parts are.
pub fn layout(fixed: &[u8], file_len: u64) -> Result<Layout, CorruptObject> {
    if (fixed.len() as u64) < HEAD_FIXED || file_len < HEAD_FIXED + TRAILER {
        return Err(CorruptObject::Truncated);
    }
    if &fixed[..8] != MAGIC {
        return Err(CorruptObject::BadMagic);
    }
    let meta_len = u32::from_le_bytes(fixed[8..12].try_into().unwrap_or_default()) as u64;
    if meta_len > MAX_META {
        return Err(CorruptObject::Metadata);
    }
    let body_offset = HEAD_FIXED + meta_len;
    let body_len = file_len
        .checked_sub(body_offset + TRAILER)
        .ok_or(CorruptObject::Truncated)?;
    Ok(Layout {
        meta_len,
        body_offset,
        body_len,
    })
}

/// Check the trailer (the last [`TRAILER`] bytes) against the layout: a
/// torn file is shorter than its trailer says. The checksum is returned
/// for the caller that hashes the file.
pub fn check_trailer(l: &Layout, trailer: &[u8]) -> Result<u64, CorruptObject> {
    let t: [u8; 16] = trailer.try_into().map_err(|_| CorruptObject::Truncated)?;
    let body_len = u64::from_le_bytes(t[..8].try_into().unwrap_or_default());
    if body_len != l.body_len {
        return Err(CorruptObject::Truncated);
    }
    Ok(u64::from_le_bytes(t[8..].try_into().unwrap_or_default()))
}

/// Decode and verify a whole file held in memory (see [`encode`]).
pub fn decode(file: Bytes) -> Result<CachedObject, CorruptObject> {
    let l = layout(&file, file.len() as u64)?;
    let sum_at = file.len() - 8;
    let sum = check_trailer(&l, &file[sum_at - 8..])?;
    if xxhash_rust::xxh3::xxh3_64(&file[..sum_at]) != sum {
        return Err(CorruptObject::Checksum);
    }
    let meta = file.slice(HEAD_FIXED as usize..l.body_offset as usize);
    let body = file.slice(l.body_offset as usize..(l.body_offset + l.body_len) as usize);
    decode_meta(meta, body)
}

/// An object from its metadata (the bytes between the fixed head and the
/// body) and its body.
pub fn decode_meta(mut meta: Bytes, body: Bytes) -> Result<CachedObject, CorruptObject> {
    meta_fields(&mut meta, body).ok_or(CorruptObject::Metadata)
}

fn meta_fields(m: &mut Bytes, body: Bytes) -> Option<CachedObject> {
    fn need(m: &Bytes, n: usize) -> Option<()> {
        (m.remaining() >= n).then_some(())
    }
    fn bytes(m: &mut Bytes) -> Option<Bytes> {
        need(m, 4)?;
        let n = m.get_u32_le() as usize;
        need(m, n)?;
        Some(m.split_to(n))
    }
    need(m, 2 + 8 * 9 + 1)?;
    let status = m.get_u16_le();
    let response_time = m.get_u64_le();
    let initial_age = m.get_u64_le();
    let lifetime = m.get_u64_le();
    let swr = m.get_u64_le();
    let sie = m.get_u64_le();
    let flags = m.get_u8();
    let (hits, misses, served, last) = (
        m.get_u64_le(),
        m.get_u64_le(),
        m.get_u64_le(),
        m.get_u64_le(),
    );
    let key = bytes(m)?;
    let primary = bytes(m)?;
    need(m, 2)?;
    let nvary = m.get_u16_le();
    let vary = (0..nvary).map(|_| bytes(m)).collect::<Option<Vec<_>>>()?;
    need(m, 2)?;
    let nh = m.get_u16_le();
    let mut headers = Headers::with_capacity(nh as usize);
    for _ in 0..nh {
        let n = bytes(m)?;
        let v = bytes(m)?;
        headers.push(n, v);
    }
    Some(CachedObject::new(ObjectParts {
        key,
        primary,
        status,
        headers,
        body,
        file: None,
        file_offset: 0,
        vary,
        freshness: Freshness {
            storable: true,
            lifetime,
            stale_while_revalidate: swr,
            stale_if_error: sie,
            must_revalidate: flags & 1 != 0,
            no_cache: flags & 2 != 0,
        },
        response_time,
        initial_age,
        stats: ObjectStats::restore(hits, misses, served, last),
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample(key: &str, body: &[u8]) -> CachedObject {
        let mut headers = Headers::new();
        headers.push("Content-Type", "text/plain");
        headers.push("ETag", "\"v1\"");
        CachedObject::new(ObjectParts {
            key: Bytes::copy_from_slice(key.as_bytes()),
            primary: Bytes::copy_from_slice(key.as_bytes()),
            status: 200,
            headers,
            body: Bytes::copy_from_slice(body),
            file: None,
            file_offset: 0,
            vary: vec![Bytes::from_static(b"accept-encoding")],
            freshness: Freshness {
                storable: true,
                lifetime: 60,
                stale_while_revalidate: 5,
                stale_if_error: 10,
                must_revalidate: false,
                no_cache: true,
            },
            response_time: 1000,
            initial_age: 3,
            stats: Arc::default(),
        })
    }

    #[test]
    fn encode_decode_round_trip() {
        let o = sample("/a", b"hello");
        o.stats.hit(5);
        let d = decode(Bytes::from(encode(&o))).unwrap();
        assert_eq!(d.key, o.key);
        assert_eq!(d.body, o.body);
        assert_eq!(d.headers, o.headers);
        assert_eq!(d.freshness, o.freshness);
        assert_eq!(d.vary, o.vary);
        assert_eq!(d.stats.hits.load(Ordering::Relaxed), 1);
        assert_eq!(d.age(1010), 13);
    }

    #[test]
    fn detects_torn_and_corrupt_files() {
        let enc = encode(&sample("/a", b"hello world"));
        for cut in 0..enc.len() {
            assert!(decode(Bytes::copy_from_slice(&enc[..cut])).is_err());
        }
        let mut bad = enc.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 1;
        assert_eq!(
            decode(Bytes::from(bad)).unwrap_err(),
            CorruptObject::Checksum
        );
        let mut bad = enc;
        bad[0] = b'X';
        assert_eq!(
            decode(Bytes::from(bad)).unwrap_err(),
            CorruptObject::BadMagic
        );
    }
}
