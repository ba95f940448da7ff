//! The disk tier: one file per object, named by its id, in a flat store
//! (two-level fan-out directories keep directories small). Files are written
//! to a temporary name, possibly while the body still arrives ([`Spool`]),
//! and renamed; they end with their length and a checksum. At start the
//! index is rebuilt from the files, reading each in bounded pieces.
//!
//! The directory is the operator's: the tier only ever touches what it
//! created. A marker file at its root names the format and version; a
//! non-empty directory without it, or with another format, is refused at
//! start. Inside, a file is removed only when it is provably the tier's
//! own (its name, and its first bytes are an object file's) and torn or
//! corrupt; anything else is left where it is, and logged.

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3;

use crate::body::SHM_MIN;
use crate::key::ObjectId;
use crate::object::{
    check_trailer, decode_meta, encode_head, layout, trailer, CachedObject, CorruptObject, Layout,
    HEAD_FIXED, TRAILER,
};

/// The marker file at the root of a disk tier.
pub const MARKER: &str = "VCDN-DISK-TIER";
/// The marker's first line: format name and version this build reads.
const FORMAT: &str = "vcdn-disk-tier";
const VERSION: u32 = 2;
/// Pieces in which files are read and copied (never whole).
const PIECE: usize = 256 * 1024;

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
    /// Torn or corrupt files of the tier's own, removed.
    pub dropped: u64,
    /// Files the tier does not recognise, left in place.
    pub ignored: u64,
    pub millis: u64,
}

#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    cap: u64,
    index: Mutex<Index>,
    /// Bytes of files being written (spools): they count against the
    /// capacity too, so eviction makes room for them as they grow.
    writing: Arc<AtomicU64>,
}

/// Why a directory cannot be used as a disk tier.
fn refuse(dir: &Path, why: String) -> std::io::Error {
    std::io::Error::other(format!("{}: {why}", dir.display()))
}

impl DiskTier {
    /// Open a disk tier in `dir` bounded to `cap` bytes: a new or empty
    /// directory gets the marker; a marked one is used; anything else is
    /// refused, untouched.
    pub fn open(dir: &Path, cap: u64) -> std::io::Result<DiskTier> {
        fs::create_dir_all(dir)?;
        let marker = dir.join(MARKER);
        match fs::read_to_string(&marker) {
            Ok(text) => check_marker(dir, &text)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // A marker left half-written by a start that crashed is ours.
                let foreign = fs::read_dir(dir)?.flatten().any(|e| {
                    !e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{MARKER}.tmp"))
                });
                if foreign {
                    return Err(refuse(
                        dir,
                        format!(
                            "the directory is not empty and has no {MARKER} marker, so it is not a \
                             vcdn disk tier; vcdn only touches files it created. Point --disk at a \
                             new or empty directory (vcdn marks it as its own)"
                        ),
                    ));
                }
                let text = format!(
                    "{FORMAT} {VERSION}\n\
                     # This directory is the disk tier of a vcdn cache: its files are cache\n\
                     # objects that vcdn creates, reads and removes. Files vcdn does not\n\
                     # recognise are left alone.\n"
                );
                let tmp = dir.join(format!("{MARKER}.tmp{}", std::process::id()));
                fs::write(&tmp, text)?;
                fs::rename(&tmp, &marker)?;
            }
            Err(e) => return Err(refuse(dir, format!("cannot read {MARKER}: {e}"))),
        }
        Ok(DiskTier {
            dir: dir.to_path_buf(),
            cap,
            index: Mutex::new(Index {
                lru: LruCache::unbounded(),
                bytes: 0,
            }),
            writing: Arc::default(),
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

    /// Scan the directory, verify the tier's files and index the good ones,
    /// least recently used first. Blocking: run it off the serving threads.
    pub fn rebuild(&self) -> (Rebuild, Vec<CachedObjectSummary>) {
        let start = Instant::now();
        let mut found = Vec::new();
        let mut r = Rebuild::default();
        for sub in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let sub_name = sub.file_name().to_string_lossy().into_owned();
            if !is_fanout(&sub_name) || !sub.file_type().is_ok_and(|t| t.is_dir()) {
                if sub_name != MARKER {
                    r.ignored += 1;
                    tracing::info!(file = %sub.path().display(), "leaving a file the disk tier does not recognise");
                }
                continue;
            }
            for f in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                let path = f.path();
                let name = f.file_name().to_string_lossy().into_owned();
                match classify(&sub_name, &name) {
                    Name::Object(id) if f.file_type().is_ok_and(|t| t.is_file()) => {
                        match verify(&path) {
                            Ok(o) if o.id == id => {
                                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                                found.push(CachedObjectSummary {
                                    id,
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
                            Err(CorruptObject::BadMagic) => {
                                r.ignored += 1;
                                tracing::warn!(file = %path.display(), "leaving a file named like a cache object that vcdn did not write");
                            }
                            Ok(_) | Err(_) => {
                                tracing::warn!(file = %path.display(), "removing a torn or corrupt cache object");
                                let _ = fs::remove_file(&path);
                                r.dropped += 1;
                            }
                        }
                    }
                    Name::Temporary if starts_with_magic(&path) => {
                        tracing::info!(file = %path.display(), "removing an unfinished cache object");
                        let _ = fs::remove_file(&path);
                        r.dropped += 1;
                    }
                    _ => {
                        r.ignored += 1;
                        tracing::info!(file = %path.display(), "leaving a file the disk tier does not recognise");
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

    /// Start writing an object whose body will follow (blocking): its
    /// head goes to a temporary file now. `o.body` is ignored.
    pub fn begin(&self, o: &CachedObject) -> std::io::Result<Spool> {
        let path = self.path(o.id);
        fs::create_dir_all(path.parent().unwrap_or(&self.dir))?;
        // A name of its own: two writes of one object never share a file
        // (clients may be sent this one while it is written).
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{seq}", std::process::id()));
        // Readable too: clients are sent what is written while it is.
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let head = encode_head(o);
        let mut s = Spool {
            id: o.id,
            file: Arc::new(file),
            tmp: Some(tmp),
            path,
            sum: Xxh3::new(),
            head_len: head.len() as u64,
            body_len: 0,
            writing: self.writing.clone(),
            counted: 0,
            entry: DiskEntry {
                size: 0,
                key: o.key.clone(),
                primary: o.primary.clone(),
                vary: o.vary.clone(),
            },
        };
        s.write_raw(&head)?;
        Ok(s)
    }

    /// Finish a spool: write its trailer, put it in place and index it
    /// (blocking). False (and the file removed) if it cannot be kept.
    pub fn commit(&self, mut s: Spool) -> bool {
        let size = s.head_len + s.body_len + TRAILER;
        if size > self.max_file() {
            return false;
        }
        let t = trailer(s.body_len, s.sum.clone());
        let res = (&*s.file).write_all(&t).and_then(|()| match &s.tmp {
            Some(tmp) => fs::rename(tmp, &s.path),
            None => Ok(()),
        });
        if let Err(e) = res {
            tracing::warn!(file = %s.path.display(), error = %e, "cannot write cache file");
            return false;
        }
        s.tmp = None;
        self.writing
            .fetch_sub(std::mem::take(&mut s.counted), Ordering::Relaxed);
        {
            let mut idx = self.index.lock();
            idx.bytes += size;
            let mut entry = s.entry.clone();
            entry.size = size;
            if let Some(old) = idx.lru.put(s.id, entry) {
                idx.bytes -= old.size;
            }
        }
        self.evict();
        true
    }

    /// The largest file the tier keeps.
    pub fn max_file(&self) -> u64 {
        self.cap / 2
    }

    /// Write a complete object (blocking), its body copied in pieces.
    /// Returns false if it is too large to keep or cannot be written.
    pub fn write(&self, o: &CachedObject) -> bool {
        if o.body.len() as u64 > self.max_file() {
            return false;
        }
        let written = self.begin(o).and_then(|mut s| {
            match &o.file {
                // Read from the file, not through the mapping, so the
                // copy does not make the whole body resident.
                Some(f) => s.append_from(f, o.file_offset, o.body.len() as u64)?,
                None => s.append(&o.body)?,
            }
            Ok(s)
        });
        match written {
            Ok(s) => self.commit(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot write cache file");
                false
            }
        }
    }

    /// Open an object for serving (blocking). Its body is not read: a
    /// small one is, a large one is mapped (and sent from the file with
    /// sendfile). A bad file of the tier's is removed.
    pub fn read(&self, id: ObjectId) -> Option<CachedObject> {
        // Touch it in the index (recently used) and bail out if unknown.
        self.index.lock().lru.get(&id)?;
        let path = self.path(id);
        match open_object(&path) {
            Ok(o) if o.id == id => Some(o),
            Err(CorruptObject::BadMagic) => {
                // Replaced by something that is not ours: forget, keep.
                tracing::warn!(file = %path.display(), "a cache object was replaced by another file; leaving it");
                self.forget(id);
                None
            }
            Ok(_) | Err(_) => {
                tracing::warn!(file = %path.display(), "dropping unreadable cache file");
                self.remove(id);
                None
            }
        }
    }

    fn forget(&self, id: ObjectId) -> bool {
        let mut idx = self.index.lock();
        let old = idx.lru.pop(&id);
        if let Some(o) = &old {
            idx.bytes -= o.size;
        }
        old.is_some()
    }

    pub fn remove(&self, id: ObjectId) {
        if self.forget(id) {
            let _ = fs::remove_file(self.path(id));
        }
    }

    /// Evict least recently used objects until the files in place and
    /// those being written fit the capacity (blocking).
    pub fn evict(&self) {
        loop {
            let victim = {
                let mut idx = self.index.lock();
                if idx.bytes + self.writing.load(Ordering::Relaxed) <= self.cap {
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

fn check_marker(dir: &Path, text: &str) -> std::io::Result<()> {
    let first = text.lines().next().unwrap_or("");
    let mut words = first.split_whitespace();
    let (format, version) = (
        words.next(),
        words.next().and_then(|v| v.parse::<u32>().ok()),
    );
    match (format, version) {
        (Some(FORMAT), Some(VERSION)) => Ok(()),
        (Some(FORMAT), Some(v)) => Err(refuse(
            dir,
            format!(
                "the disk tier has format version {v}, and this vcdn reads version {VERSION}; \
                 point --disk at a new or empty directory, or empty this one"
            ),
        )),
        _ => Err(refuse(
            dir,
            format!(
                "{MARKER} does not name a disk tier format this vcdn knows ({first:?}); \
                 point --disk at a new or empty directory"
            ),
        )),
    }
}

/// What a file name inside a fan-out directory is to the tier.
enum Name {
    Object(ObjectId),
    /// `<id>.tmp<pid>-<n>` (or `<id>.tmp<pid>`): a file being written, by
    /// another process (this one's are left alone).
    Temporary,
    Other,
}

fn is_fanout(name: &str) -> bool {
    name.len() == 2 && name.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

fn classify(fanout: &str, name: &str) -> Name {
    let own_id =
        |s: &str| ObjectId::from_hex(s).filter(|id| id.hex() == s && s.starts_with(fanout));
    if let Some(id) = own_id(name) {
        return Name::Object(id);
    }
    match name.split_once(".tmp") {
        // This process's own files are being written now (the index is
        // rebuilt while the cache already serves).
        Some((id, rest)) if own_id(id).is_some() => {
            let (pid, seq) = rest.split_once('-').unwrap_or((rest, "0"));
            let number = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
            if number(pid) && number(seq) && pid != std::process::id().to_string() {
                Name::Temporary
            } else {
                Name::Other
            }
        }
        _ => Name::Other,
    }
}

fn starts_with_magic(path: &Path) -> bool {
    let mut b = [0u8; 8];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut b, 0))
        .is_ok_and(|()| &b == crate::object::MAGIC)
}

/// The layout and metadata of an object file, checked against its length
/// and trailer (not its checksum).
fn open_head(file: &File) -> Result<(Layout, CachedObject), CorruptObject> {
    let len = file.metadata().map_err(|_| CorruptObject::Truncated)?.len();
    let mut fixed = [0u8; HEAD_FIXED as usize];
    file.read_exact_at(&mut fixed, 0)
        .map_err(|_| CorruptObject::Truncated)?;
    let l = layout(&fixed, len)?;
    let mut t = [0u8; TRAILER as usize];
    file.read_exact_at(&mut t, len - TRAILER)
        .map_err(|_| CorruptObject::Truncated)?;
    check_trailer(&l, &t)?;
    let mut meta = vec![0u8; l.meta_len as usize];
    file.read_exact_at(&mut meta, HEAD_FIXED)
        .map_err(|_| CorruptObject::Truncated)?;
    let o = decode_meta(Bytes::from(meta), Bytes::new())?;
    Ok((l, o))
}

/// Verify a whole file (its checksum), reading it in pieces.
fn verify(path: &Path) -> Result<CachedObject, CorruptObject> {
    let file = File::open(path).map_err(|_| CorruptObject::Truncated)?;
    let (l, o) = open_head(&file)?;
    let end = l.body_offset + l.body_len + 8;
    let mut sum = Xxh3::new();
    let mut buf = vec![0u8; PIECE];
    let mut at = 0;
    while at < end {
        let n = ((end - at) as usize).min(PIECE);
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|_| CorruptObject::Truncated)?;
        sum.update(&buf[..n]);
        at += n as u64;
    }
    let mut want = [0u8; 8];
    file.read_exact_at(&mut want, end)
        .map_err(|_| CorruptObject::Truncated)?;
    if sum.digest() != u64::from_le_bytes(want) {
        return Err(CorruptObject::Checksum);
    }
    Ok(o)
}

/// An object ready to serve from its file: a small body read, a large one
/// mapped (never read through here).
fn open_object(path: &Path) -> Result<CachedObject, CorruptObject> {
    let file = File::open(path).map_err(|_| CorruptObject::Truncated)?;
    let (l, o) = open_head(&file)?;
    if (l.body_len as usize) < SHM_MIN {
        let mut body = vec![0u8; l.body_len as usize];
        file.read_exact_at(&mut body, l.body_offset)
            .map_err(|_| CorruptObject::Truncated)?;
        return Ok(o.with_body(Bytes::from(body), None, 0));
    }
    // SAFETY: the file is the tier's own, written once and renamed into
    // place; the tier never changes a file in place (a new version is a
    // new file renamed over it), so the mapping stays valid.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|_| CorruptObject::Truncated)?;
    let all = Bytes::from_owner(map);
    let body = all.slice(l.body_offset as usize..(l.body_offset + l.body_len) as usize);
    Ok(o.with_body(body, Some(Arc::new(file)), l.body_offset))
}

/// An object file being written, possibly while its body arrives: readers
/// may send what is written ([`Spool::file`] from [`Spool::body_offset`])
/// before it is complete. Dropped before [`DiskTier::commit`], its
/// temporary file is removed.
pub struct Spool {
    id: ObjectId,
    file: Arc<File>,
    /// The temporary name, until committed.
    tmp: Option<PathBuf>,
    path: PathBuf,
    sum: Xxh3,
    head_len: u64,
    body_len: u64,
    entry: DiskEntry,
    /// The tier's count of bytes being written, and this file's share.
    writing: Arc<AtomicU64>,
    counted: u64,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("path", &self.path)
            .field("body_len", &self.body_len)
            .finish()
    }
}

impl Spool {
    fn write_raw(&mut self, data: &[u8]) -> std::io::Result<()> {
        (&*self.file).write_all(data)?;
        self.sum.update(data);
        self.counted += data.len() as u64;
        self.writing.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Append body bytes (blocking).
    pub fn append(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.write_raw(data)?;
        self.body_len += data.len() as u64;
        Ok(())
    }

    /// Append `len` bytes of `from` at `offset`, read in pieces (blocking).
    pub fn append_from(&mut self, from: &File, offset: u64, len: u64) -> std::io::Result<()> {
        let mut buf = vec![0u8; PIECE.min(len as usize)];
        let mut at = 0;
        while at < len {
            let n = ((len - at) as usize).min(buf.len());
            from.read_exact_at(&mut buf[..n], offset + at)?;
            self.append(&buf[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    /// The file, for readers of what is written.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Where the body starts in the file.
    pub fn body_offset(&self) -> u64 {
        self.head_len
    }

    /// Body bytes written so far.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.writing.fetch_sub(self.counted, Ordering::Relaxed);
        if let Some(tmp) = &self.tmp {
            let _ = fs::remove_file(tmp);
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
    fn survives_reopen_and_drops_only_its_own_corrupt_files() {
        let dir = tmpdir("reopen");
        let t = DiskTier::open(&dir, 1 << 20).unwrap();
        let a = sample("/a", b"aaaa");
        let b = sample("/b", b"bbbb");
        assert!(t.write(&a) && t.write(&b));
        // Corrupt b, tear c, leave an unfinished write of ours and files
        // that are not ours.
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
        let unfinished = pc.with_extension(format!("tmp{}-3", std::process::id() + 1));
        fs::write(&unfinished, &data[..30]).unwrap();
        let strays = [
            pc.with_extension("tmp2"),
            pc.with_file_name("notes.txt"),
            pc.with_file_name(format!("{:032x}", 7u128)),
            dir.join("README"),
            dir.join("zz").join("x"),
        ];
        fs::create_dir_all(dir.join("zz")).unwrap();
        for s in &strays {
            fs::write(s, b"junk").unwrap();
        }

        let t2 = DiskTier::open(&dir, 1 << 20).unwrap();
        let (r, found) = t2.rebuild();
        assert_eq!(r.objects, 1);
        assert_eq!(r.dropped, 3);
        assert_eq!(
            r.ignored, 5,
            "README, zz, notes.txt, tmp2 and the id of another fan-out"
        );
        assert_eq!(found[0].id, a.id);
        assert_eq!(t2.read(a.id).unwrap().body, a.body);
        assert!(t2.read(b.id).is_none());
        assert!(!pb.exists() && !pc.exists() && !unfinished.exists());
        for s in &strays {
            assert_eq!(fs::read(s).unwrap(), b"junk", "{} kept", s.display());
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn refuses_a_directory_it_did_not_create() {
        let dir = tmpdir("foreign");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("photo.jpg"), b"x").unwrap();
        let e = DiskTier::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("no VCDN-DISK-TIER marker"), "{e}");
        assert_eq!(fs::read(dir.join("photo.jpg")).unwrap(), b"x");
        assert!(!dir.join(MARKER).exists());
        // Another format or version is refused too.
        fs::remove_file(dir.join("photo.jpg")).unwrap();
        fs::write(dir.join(MARKER), "vcdn-disk-tier 99\n").unwrap();
        let e = DiskTier::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
        fs::write(dir.join(MARKER), "other-thing 2\n").unwrap();
        assert!(DiskTier::open(&dir, 1 << 20).is_err());
        // Empty: marked and used.
        fs::remove_file(dir.join(MARKER)).unwrap();
        DiskTier::open(&dir, 1 << 20).unwrap();
        assert!(fs::read_to_string(dir.join(MARKER))
            .unwrap()
            .starts_with("vcdn-disk-tier 2\n"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_spooled_object_is_readable_while_written_and_served_from_its_file() {
        let dir = tmpdir("spool");
        let t = DiskTier::open(&dir, 64 << 20).unwrap();
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let o = sample("/big", b"");
        let mut s = t.begin(&o).unwrap();
        s.append(&body[..100_000]).unwrap();
        let mut part = vec![0u8; 100_000];
        s.file().read_exact_at(&mut part, s.body_offset()).unwrap();
        assert_eq!(part, body[..100_000]);
        s.append(&body[100_000..]).unwrap();
        assert!(t.commit(s));
        let got = t.read(o.id).unwrap();
        assert_eq!(got.body.len(), body.len());
        let file = got
            .file
            .clone()
            .expect("a large body is sent from its file");
        let mut back = vec![0u8; body.len()];
        file.read_exact_at(&mut back, got.file_offset).unwrap();
        assert_eq!(back, body);
        assert_eq!(got.headers, o.headers);
        // It survives a restart, verified in pieces.
        let t2 = DiskTier::open(&dir, 64 << 20).unwrap();
        assert_eq!(t2.rebuild().0.objects, 1);
        // An abandoned spool leaves nothing behind.
        let s = t.begin(&sample("/gone", b"")).unwrap();
        drop(s);
        assert_eq!(walk_count(&dir), 2, "marker and one object");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_being_written_count_against_the_capacity() {
        let dir = tmpdir("writing");
        let t = DiskTier::open(&dir, 3000).unwrap();
        let old = sample("/old", &[b'o'; 1000]);
        let recent = sample("/recent", &[b'r'; 1000]);
        assert!(t.write(&old) && t.write(&recent));
        let mut s = t.begin(&sample("/w", b"")).unwrap();
        s.append(&[b'w'; 1200]).unwrap();
        t.evict();
        assert!(
            !t.contains(old.id),
            "room is made for the file being written"
        );
        assert!(t.contains(recent.id));
        drop(s);
        assert_eq!(t.writing.load(Ordering::Relaxed), 0);
        let _ = fs::remove_dir_all(&dir);
    }

    fn walk_count(dir: &Path) -> usize {
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                if e.path().is_dir() {
                    walk_count(&e.path())
                } else {
                    1
                }
            })
            .sum()
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
