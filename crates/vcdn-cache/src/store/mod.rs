//! The object store: a byte-bounded LRU memory tier in front of an optional
//! disk tier, both addressed by object id, plus the index of which primary
//! keys have variants (Vary).

pub mod disk;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;
use vcdn_http::Headers;

use crate::body::Body;
use crate::key::{variant_key, ObjectId};
use crate::object::CachedObject;
use disk::DiskTier;

/// Variants stored under one primary key.
#[derive(Debug, Default)]
struct Variants {
    names: Vec<Bytes>,
    ids: Vec<ObjectId>,
}

#[derive(Debug)]
struct Memory {
    lru: LruCache<ObjectId, Arc<CachedObject>>,
    bytes: usize,
    /// Bytes reserved by bodies being fetched for this tier: with `bytes`,
    /// never more than the capacity.
    pending: usize,
    vary: HashMap<ObjectId, Variants>,
}

/// Where a lookup found its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Disk,
}

#[derive(Debug)]
pub struct Store {
    mem: Mutex<Memory>,
    mem_cap: usize,
    disk: Option<Arc<DiskTier>>,
}

/// A row of the object listing.
#[derive(Debug, Clone)]
pub struct Listed {
    pub id: ObjectId,
    pub key: Bytes,
    pub primary: Bytes,
    pub in_memory: Option<Arc<CachedObject>>,
    pub on_disk: bool,
    pub disk_size: u64,
}

impl Store {
    pub fn new(mem_cap: usize, disk: Option<(&Path, u64)>) -> std::io::Result<Store> {
        let disk = match disk {
            Some((dir, cap)) => Some(Arc::new(DiskTier::open(dir, cap)?)),
            None => None,
        };
        Ok(Store {
            mem: Mutex::new(Memory {
                lru: LruCache::unbounded(),
                bytes: 0,
                pending: 0,
                vary: HashMap::new(),
            }),
            mem_cap,
            disk,
        })
    }

    pub fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref()
    }

    /// The largest object the memory tier accepts.
    pub fn max_memory_object(&self) -> usize {
        self.mem_cap / 4
    }

    /// The largest object the store keeps anywhere.
    pub fn max_object(&self) -> u64 {
        match &self.disk {
            Some(_) => (self.max_memory_object() as u64).max(self.disk_cap() / 8),
            None => self.max_memory_object() as u64,
        }
    }

    fn disk_cap(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.capacity())
    }

    /// Rebuild the disk index (blocking) and register the variants it finds.
    pub fn rebuild_disk(&self) -> Option<disk::Rebuild> {
        let d = self.disk.as_ref()?;
        let (r, found) = d.rebuild();
        let mut m = self.mem.lock();
        for s in found {
            if !s.entry.vary.is_empty() {
                let v = m.vary.entry(ObjectId::of(&s.entry.primary)).or_default();
                v.names = s.entry.vary.clone();
                if !v.ids.contains(&s.id) {
                    v.ids.push(s.id);
                }
            }
        }
        Some(r)
    }

    /// The id and full key under which a request's response is stored:
    /// the primary key's, or that of the variant the request selects.
    pub fn resolve(&self, primary: &Bytes, request: &Headers) -> (ObjectId, Bytes) {
        let pid = ObjectId::of(primary);
        let m = self.mem.lock();
        match m.vary.get(&pid) {
            Some(v) => {
                let key = variant_key(primary, &v.names, request);
                (ObjectId::of(&key), key)
            }
            None => (pid, primary.clone()),
        }
    }

    /// [`Store::resolve`] and [`Store::get_memory`] under one lock, for
    /// the hot path: the object in memory for this request, if any.
    pub fn memory_object(&self, primary: &[u8], request: &Headers) -> Option<Arc<CachedObject>> {
        let pid = ObjectId::of(primary);
        let mut m = self.mem.lock();
        let found = match m.vary.get(&pid) {
            Some(v) => {
                let key = variant_key(primary, &v.names, request);
                m.lru.get(&ObjectId::of(&key)).filter(|o| o.key == key)
            }
            None => m.lru.get(&pid).filter(|o| o.key == primary),
        };
        found.cloned()
    }

    /// Look up in memory only (never blocks).
    pub fn get_memory(&self, id: ObjectId, key: &[u8]) -> Option<Arc<CachedObject>> {
        let mut m = self.mem.lock();
        m.lru.get(&id).filter(|o| o.key == key).cloned()
    }

    /// Whether the disk tier may hold `id`.
    pub fn on_disk(&self, id: ObjectId) -> bool {
        self.disk.as_ref().is_some_and(|d| d.contains(id))
    }

    /// Open from the disk tier (blocking). An object the memory tier takes
    /// is copied into memory (promoted); a larger one is served from its
    /// file and never read into memory.
    pub fn load_disk(&self, id: ObjectId, key: &[u8]) -> Option<Arc<CachedObject>> {
        let o = self.disk.as_ref()?.read(id)?;
        if o.key != key {
            return None;
        }
        if o.cost() > self.max_memory_object() {
            return Some(Arc::new(o));
        }
        let o = match o.file.clone() {
            Some(f) => {
                // Promoted meanwhile by another request: no second copy.
                if let Some(m) = self.get_memory(id, key) {
                    return Some(m);
                }
                // The copy counts against the tier while it is made; when
                // the budget refuses it, the object is sent from its file.
                let len = o.body.len();
                if !self.reserve(len) {
                    return Some(Arc::new(o));
                }
                let copy = Body::copy_of(&f, o.file_offset, len as u64);
                self.release(len);
                match copy {
                    Ok(b) => o.with_body(b.bytes, b.file, 0),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot copy a disk object into memory");
                        return Some(Arc::new(o));
                    }
                }
            }
            None => o,
        };
        let o = Arc::new(o);
        self.put_memory(o.clone());
        Some(o)
    }

    /// Store an object in memory (if it fits). Returns whether the disk tier
    /// should also get it, and how many objects memory evicted for it.
    pub fn insert(&self, o: Arc<CachedObject>) -> (bool, u64) {
        {
            let mut m = self.mem.lock();
            if !o.vary.is_empty() {
                let v = m.vary.entry(ObjectId::of(&o.primary)).or_default();
                v.names = o.vary.clone();
                if !v.ids.contains(&o.id) {
                    v.ids.push(o.id);
                }
            } else {
                m.vary.remove(&ObjectId::of(&o.primary));
            }
        }
        let evicted = self.put_memory(o);
        (self.disk.is_some(), evicted)
    }

    fn put_memory(&self, o: Arc<CachedObject>) -> u64 {
        let cost = o.cost();
        let mut m = self.mem.lock();
        if cost > self.max_memory_object() {
            if let Some(old) = m.lru.pop(&o.id) {
                m.bytes -= old.cost();
            }
            return 0;
        }
        m.bytes += cost;
        if let Some(old) = m.lru.put(o.id, o) {
            m.bytes -= old.cost();
        }
        self.make_room(&mut m)
    }

    /// Evict least recently used objects until the tier and the bodies
    /// being fetched for it fit the capacity.
    fn make_room(&self, m: &mut Memory) -> u64 {
        let mut evicted = 0;
        while m.bytes + m.pending > self.mem_cap {
            match m.lru.pop_lru() {
                Some((_, old)) => {
                    m.bytes -= old.cost();
                    evicted += 1;
                }
                None => break,
            }
        }
        evicted
    }

    /// Reserve `n` bytes of the memory tier for a body being fetched into
    /// it, evicting if needed. False when bodies in flight already hold a
    /// quarter of the tier: the fetch must then not keep its body in
    /// memory (it goes to the disk tier as it arrives, or is not kept).
    pub fn reserve(&self, n: usize) -> bool {
        let mut m = self.mem.lock();
        if m.pending + n > self.max_memory_object() {
            return false;
        }
        m.pending += n;
        self.make_room(&mut m);
        true
    }

    /// Give back a reservation (the body is stored, or will not be).
    pub fn release(&self, n: usize) {
        let mut m = self.mem.lock();
        m.pending = m.pending.saturating_sub(n);
    }

    /// Remove one id from both tiers.
    pub fn remove(&self, id: ObjectId) -> bool {
        let in_mem = {
            let mut m = self.mem.lock();
            match m.lru.pop(&id) {
                Some(o) => {
                    m.bytes -= o.cost();
                    true
                }
                None => false,
            }
        };
        let on_disk = self.on_disk(id);
        if let Some(d) = &self.disk {
            d.remove(id);
        }
        in_mem || on_disk
    }

    /// Remove a primary key and all its variants; returns how many objects.
    pub fn purge_key(&self, primary: &[u8]) -> usize {
        let pid = ObjectId::of(primary);
        let mut ids = vec![pid];
        if let Some(v) = self.mem.lock().vary.remove(&pid) {
            ids.extend(v.ids);
        }
        ids.into_iter().filter(|id| self.remove(*id)).count()
    }

    /// Remove every object whose primary key starts with `prefix`.
    pub fn purge_prefix(&self, prefix: &[u8]) -> usize {
        let ids: Vec<ObjectId> = self
            .list()
            .into_iter()
            .filter(|l| l.primary.starts_with(prefix))
            .map(|l| l.id)
            .collect();
        self.mem
            .lock()
            .vary
            .retain(|_, v| !v.ids.iter().any(|id| ids.contains(id)));
        ids.into_iter().filter(|id| self.remove(*id)).count()
    }

    pub fn purge_all(&self) -> usize {
        let ids: Vec<ObjectId> = self.list().into_iter().map(|l| l.id).collect();
        self.mem.lock().vary.clear();
        ids.into_iter().filter(|id| self.remove(*id)).count()
    }

    /// Every object in either tier.
    pub fn list(&self) -> Vec<Listed> {
        let mut out: Vec<Listed> = {
            let m = self.mem.lock();
            m.lru
                .iter()
                .map(|(id, o)| Listed {
                    id: *id,
                    key: o.key.clone(),
                    primary: o.primary.clone(),
                    in_memory: Some(o.clone()),
                    on_disk: false,
                    disk_size: 0,
                })
                .collect()
        };
        if let Some(d) = &self.disk {
            let mut pos: HashMap<ObjectId, usize> =
                out.iter().enumerate().map(|(i, l)| (l.id, i)).collect();
            for (id, e) in d.entries() {
                match pos.get(&id) {
                    Some(&i) => {
                        out[i].on_disk = true;
                        out[i].disk_size = e.size;
                    }
                    None => {
                        pos.insert(id, out.len());
                        out.push(Listed {
                            id,
                            key: e.key,
                            primary: e.primary,
                            in_memory: None,
                            on_disk: true,
                            disk_size: e.size,
                        });
                    }
                }
            }
        }
        out
    }

    /// (objects, bytes) in memory.
    pub fn memory_usage(&self) -> (usize, usize) {
        let m = self.mem.lock();
        (m.lru.len(), m.bytes)
    }

    pub fn memory_capacity(&self) -> usize {
        self.mem_cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::tests::sample;

    #[test]
    fn memory_is_byte_bounded_lru() {
        let s = Store::new(8 * 1024, None).unwrap();
        let objs: Vec<_> = (0..10)
            .map(|i| Arc::new(sample(&format!("/{i}"), &[b'x'; 1000])))
            .collect();
        for o in &objs {
            s.insert(o.clone());
            // Touch /0 so it stays recently used.
            s.get_memory(objs[0].id, b"/0");
        }
        let (n, bytes) = s.memory_usage();
        assert!(bytes <= 8 * 1024, "{bytes}");
        assert!(n < 10);
        assert!(s.get_memory(objs[0].id, b"/0").is_some());
        assert!(s.get_memory(objs[1].id, b"/1").is_none());
        assert!(s.get_memory(objs[9].id, b"/9").is_some());
        // A colliding id with another key is a miss, not a wrong object.
        assert!(s.get_memory(objs[9].id, b"/other").is_none());
    }

    #[test]
    fn bodies_in_flight_share_the_memory_budget() {
        let s = Store::new(8 * 1024, None).unwrap();
        for i in 0..10 {
            s.insert(Arc::new(sample(&format!("/{i}"), &[b'x'; 500])));
        }
        let (_, before) = s.memory_usage();
        assert!(s.reserve(1500));
        let (_, after) = s.memory_usage();
        assert!(after < before, "room is made by evicting");
        assert!(after + 1500 <= 8 * 1024);
        // Inserting does not let the tier grow into the reservation.
        s.insert(Arc::new(sample("/new", &[b'y'; 500])));
        assert!(s.memory_usage().1 + 1500 <= 8 * 1024);
        assert!(!s.reserve(1000), "bodies in flight hold at most a quarter");
        s.release(1500);
        assert!(s.reserve(1000));
    }

    #[test]
    fn variants_are_resolved_and_purged_together() {
        let s = Store::new(1 << 20, None).unwrap();
        let mut req = Headers::new();
        req.push("Accept-Encoding", "gzip");
        let names = vec![Bytes::from_static(b"accept-encoding")];
        let key = variant_key(b"/v", &names, &req);
        let mut o = sample("/v", b"gz");
        o.key = key.clone();
        o.primary = Bytes::from_static(b"/v");
        o.id = ObjectId::of(&key);
        let id = o.id;
        s.insert(Arc::new(o));
        let v = Bytes::from_static(b"/v");
        assert_eq!(s.resolve(&v, &req).0, id);
        assert_ne!(s.resolve(&v, &Headers::new()).0, id);
        assert_eq!(s.purge_key(b"/v"), 1);
        assert!(s.get_memory(id, &key).is_none());
    }

    #[test]
    fn purge_by_prefix() {
        let s = Store::new(1 << 20, None).unwrap();
        for k in ["/a/1", "/a/2", "/b/1"] {
            s.insert(Arc::new(sample(k, b"x")));
        }
        assert_eq!(s.purge_prefix(b"/a/"), 2);
        assert_eq!(s.list().len(), 1);
        assert_eq!(s.purge_all(), 1);
    }
}
