//! The disk tier: one file per object, named by its id, in a flat store
//! (two-level fan-out directories keep directories small). Files are written
//! to a temporary name and renamed, and carry a checksum; at start the index
//! is rebuilt from the files, and torn, corrupt or stray files are deleted.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;

use crate::key::ObjectId;
use crate::object::{decode, encode, CachedObject, CorruptObject};

/// What the index knows of a file without reading it.
#[derive(Debug, Clone)]
pub struct DiskEntry {
    pub size: u64,
    pub key: Bytes,
    pub primary: Bytes,
    pub vary: Vec<Bytes>,
}

#[derive(Debug)]
struct Index {
    lru: LruCache<ObjectId, DiskEntry>,
    bytes: u64,
}

/// The outcome of rebuilding the index at start.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rebuild {
    pub objects: u64,
    pub bytes: u64,
    pub dropped: u64,
    pub millis: u64,
}

#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    cap: u64,
    index: Mutex<Index>,
}

impl DiskTier {
    /// Open (creating it if needed) a disk tier in `dir` bounded to `cap` bytes.
    pub fn open(dir: &Path, cap: u64) -> std::io::Result<DiskTier> {
        fs::create_dir_all(dir)?;
        Ok(DiskTier {
            dir: dir.to_path_buf(),
            cap,
            index: Mutex::new(Index {
                lru: LruCache::unbounded(),
                bytes: 0,
            }),
        })
    }

    fn path(&self, id: ObjectId) -> PathBuf {
        let hex = id.hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    pub fn capacity(&self) -> u64 {
        self.cap
    }

    pub fn bytes(&self) -> u64 {
        self.index.lock().bytes
    }

    pub fn len(&self) -> usize {
        self.index.lock().lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, id: ObjectId) -> bool {
        self.index.lock().lru.contains(&id)
    }

    pub fn entries(&self) -> Vec<(ObjectId, DiskEntry)> {
        self.index
            .lock()
            .lru
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// Scan the directory, verify every file and index the good ones, least
    /// recently used first. Blocking: run it off the serving threads.
    pub fn rebuild(&self) -> (Rebuild, Vec<CachedObjectSummary>) {
        let start = Instant::now();
        let mut found = Vec::new();
        let mut r = Rebuild::default();
        for sub in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            for f in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                let path = f.path();
                let name = f.file_name().to_string_lossy().into_owned();
                let id = ObjectId::from_hex(&name);
                let loaded = id.ok_or(CorruptObject::BadMagic).and_then(|id| {
                    let bytes = fs::read(&path).map_err(|_| CorruptObject::Truncated)?;
                    let o = decode(Bytes::from(bytes))?;
                    if o.id != id {
                        return Err(CorruptObject::Metadata);
                    }
                    Ok(o)
                });
                match loaded {
                    Ok(o) => {
                        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                        found.push(CachedObjectSummary {
                            id: o.id,
                            last_access: o
                                .stats
                                .last_access
                                .load(std::sync::atomic::Ordering::Relaxed),
                            entry: DiskEntry {
                                size,
                                key: o.key.clone(),
                                primary: o.primary.clone(),
                                vary: o.vary.clone(),
                            },
                        });
                    }
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "dropping unusable cache file");
                        let _ = fs::remove_file(&path);
                        r.dropped += 1;
                    }
                }
            }
        }
        found.sort_by_key(|s| s.last_access);
        {
            let mut idx = self.index.lock();
            for s in &found {
                idx.bytes += s.entry.size;
                if let Some(old) = idx.lru.put(s.id, s.entry.clone()) {
                    idx.bytes -= old.size;
                }
            }
            r.objects = idx.lru.len() as u64;
            r.bytes = idx.bytes;
        }
        self.evict();
        r.millis = start.elapsed().as_millis() as u64;
        (r, found)
    }

    /// Write an object (blocking). Returns false if it is too large to keep.
    pub fn write(&self, o: &CachedObject) -> bool {
        let data = encode(o);
        if data.len() as u64 > self.cap / 2 {
            return false;
        }
        let path = self.path(o.id);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let res = (|| -> std::io::Result<()> {
            fs::create_dir_all(path.parent().unwrap_or(&self.dir))?;
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&data)?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = res {
            tracing::warn!(file = %path.display(), error = %e, "cannot write cache file");
            let _ = fs::remove_file(&tmp);
            return false;
        }
        {
            let mut idx = self.index.lock();
            idx.bytes += data.len() as u64;
            let entry = DiskEntry {
                size: data.len() as u64,
                key: o.key.clone(),
                primary: o.primary.clone(),
                vary: o.vary.clone(),
            };
            if let Some(old) = idx.lru.put(o.id, entry) {
                idx.bytes -= old.size;
            }
        }
        self.evict();
        true
    }

    /// Read and verify an object (blocking); a bad file is deleted.
    pub fn read(&self, id: ObjectId) -> Option<CachedObject> {
        // Touch it in the index (recently used) and bail out if unknown.
        self.index.lock().lru.get(&id)?;
        let path = self.path(id);
        let loaded = fs::read(&path)
            .map_err(|_| CorruptObject::Truncated)
            .and_then(|b| decode(Bytes::from(b)));
        match loaded {
            Ok(o) if o.id == id => Some(o),
            Ok(_) | Err(_) => {
                tracing::warn!(file = %path.display(), "dropping unreadable cache file");
                self.remove(id);
                None
            }
        }
    }

    pub fn remove(&self, id: ObjectId) {
        let removed = {
            let mut idx = self.index.lock();
            let old = idx.lru.pop(&id);
            if let Some(o) = &old {
                idx.bytes -= o.size;
            }
            old.is_some()
        };
        if removed {
            let _ = fs::remove_file(self.path(id));
        }
    }

    fn evict(&self) {
        loop {
            let victim = {
                let mut idx = self.index.lock();
                if idx.bytes <= self.cap {
                    return;
                }
                match idx.lru.pop_lru() {
                    Some((id, e)) => {
                        idx.bytes -= e.size;
                        id
                    }
                    None => return,
                }
            };
            let _ = fs::remove_file(self.path(victim));
        }
    }
}

/// One object found on disk at start.
#[derive(Debug, Clone)]
pub struct CachedObjectSummary {
    pub id: ObjectId,
    pub last_access: u64,
    pub entry: DiskEntry,
}

/// Shared handle used by the store.
pub type SharedDisk = Arc<DiskTier>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::tests::sample;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vcdn-disk-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn survives_reopen_and_drops_corrupt_files() {
        let dir = tmpdir("reopen");
        let t = DiskTier::open(&dir, 1 << 20).unwrap();
        let a = sample("/a", b"aaaa");
        let b = sample("/b", b"bbbb");
        assert!(t.write(&a) && t.write(&b));
        // Corrupt b, tear a third file, leave a stray temporary file.
        let pb = t.path(b.id);
        let mut data = fs::read(&pb).unwrap();
        let n = data.len();
        data[n - 20] ^= 0xff;
        fs::write(&pb, data).unwrap();
        let c = sample("/c", b"cccc");
        t.write(&c);
        let pc = t.path(c.id);
        let data = fs::read(&pc).unwrap();
        fs::write(&pc, &data[..data.len() - 3]).unwrap();
        fs::write(pc.with_extension("tmp1"), b"junk").unwrap();

        let t2 = DiskTier::open(&dir, 1 << 20).unwrap();
        let (r, found) = t2.rebuild();
        assert_eq!(r.objects, 1);
        assert_eq!(r.dropped, 3);
        assert_eq!(found[0].id, a.id);
        assert_eq!(t2.read(a.id).unwrap().body, a.body);
        assert!(t2.read(b.id).is_none());
        assert!(!pb.exists() && !pc.exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn evicts_least_recently_used_over_capacity() {
        let dir = tmpdir("evict");
        let t = DiskTier::open(&dir, 3000).unwrap();
        let objs: Vec<_> = (0..4)
            .map(|i| sample(&format!("/{i}"), &[b'x'; 600]))
            .collect();
        for o in &objs {
            t.write(o);
        }
        assert!(t.bytes() <= 3000);
        assert!(!t.contains(objs[0].id));
        assert!(t.contains(objs[3].id));
        let _ = fs::remove_dir_all(&dir);
    }
}
