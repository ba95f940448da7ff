//! One upstream fetch shared by every client that wants the same object
//! (request coalescing), with the body cloned to all of them as it arrives.
//!
//! This is MiniCache's "link" object and stream cloning: the fetch keeps the
//! received chunks and one position per reader (the paper's per-client ring
//! pointers). A body is held in one of three ways (chosen by `fill`):
//! - kept: every chunk stays in memory (a small object for the memory tier,
//!   whose budget the caller reserves), so late joiners start from byte 0;
//! - spooled ([`Fetch::spool_to`]): chunks are written to a file as they
//!   arrive (shared memory for the memory tier, or the disk tier) and
//!   dropped once written; readers, late joiners included, are sent the
//!   written part from the file ([`Piece::File`]), so the memory a fetch
//!   holds beyond the file is one unwritten batch whatever the size;
//! - neither (too large to cache and no disk tier, or a live stream of
//!   unknown length): chunks that every reader has passed are dropped, and
//!   the upstream read waits while the fastest reader is more than `window`
//!   bytes ahead of the slowest: memory is bounded by the window.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;
use vcdn_http::Headers;

use crate::body::Body;
use crate::key::ObjectId;
use crate::object::{CachedObject, ObjectStats};
use crate::policy::Freshness;

/// The response head of a fetch, once it has arrived.
#[derive(Debug)]
pub struct FetchedHead {
    pub status: u16,
    /// End-to-end fields to send to clients (and store).
    pub headers: Headers,
    pub content_length: Option<u64>,
    pub freshness: Freshness,
    /// Vary field names; `None` for `Vary: *`.
    pub vary: Option<Vec<Bytes>>,
    pub response_time: u64,
    pub initial_age: u64,
    /// Set when a revalidation got 304: the refreshed stored object.
    pub refreshed: Option<Arc<CachedObject>>,
}

/// Why a fetch produced no (complete) response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    /// The status to answer a client that has not yet had a response (502 or 504).
    pub status: u16,
    pub message: String,
}

#[derive(Debug)]
struct Inner {
    head: Option<Result<Arc<FetchedHead>, FetchError>>,
    /// Received chunks with their offsets.
    chunks: VecDeque<(u64, Bytes)>,
    received: u64,
    done: Option<Result<(), FetchError>>,
    /// Position of each reader, by slot.
    readers: Vec<Option<u64>>,
    /// Whether every byte since 0 is still kept.
    keep_all: bool,
    /// The file the body is written to, and how much of it is written.
    spool: Option<SpoolFile>,
    /// Whether the body is still being written to `spool` (if not, the
    /// written part stays readable and the rest follows the window).
    spooling: bool,
}

/// The readable part of a body being written to a file.
#[derive(Debug)]
struct SpoolFile {
    file: Arc<File>,
    /// Where the body starts in the file.
    body_offset: u64,
    /// Body bytes written (readable from the file).
    written: u64,
}

/// What a reader is given next: bytes, or a range of a file to send (with
/// sendfile) without reading it into memory.
#[derive(Debug, Clone)]
pub enum Piece {
    Bytes(Bytes),
    File {
        file: Arc<File>,
        offset: u64,
        len: u64,
    },
}

impl Piece {
    pub fn len(&self) -> u64 {
        match self {
            Piece::Bytes(b) => b.len() as u64,
            Piece::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop the first `n` bytes.
    pub fn advance(&mut self, n: u64) {
        match self {
            Piece::Bytes(b) => {
                let _ = b.split_to((n as usize).min(b.len()));
            }
            Piece::File { offset, len, .. } => {
                let n = n.min(*len);
                *offset += n;
                *len -= n;
            }
        }
    }

    /// Keep at most `n` bytes.
    pub fn truncate(&mut self, n: u64) {
        match self {
            Piece::Bytes(b) => b.truncate(n.min(b.len() as u64) as usize),
            Piece::File { len, .. } => *len = (*len).min(n),
        }
    }

    /// Cut this piece of a streamed body to the part a range asks for:
    /// `skip` bytes still to drop before it, at most `take` bytes still to
    /// send (both counted down). Shared by both front ends.
    pub fn clip(&mut self, skip: &mut u64, take: &mut Option<u64>) {
        if *skip > 0 {
            let n = (*skip).min(self.len());
            self.advance(n);
            *skip -= n;
        }
        if let Some(t) = take.as_mut() {
            self.truncate(*t);
            *t -= self.len();
        }
    }
}

#[derive(Debug)]
pub struct Fetch {
    /// The primary id and key this fetch fills.
    pub id: ObjectId,
    pub key: Bytes,
    /// The request fields of the client that started it (to tell, once the
    /// response's Vary is known, whether other clients may share it).
    pub leader_headers: Headers,
    pub stats: Arc<ObjectStats>,
    pub started: Instant,
    /// Largest body kept whole for caching.
    max_keep: u64,
    /// Largest distance between the fastest and the slowest reader once
    /// the body is no longer kept whole.
    window: u64,
    inner: Mutex<Inner>,
    progress: watch::Sender<u64>,
    drained: watch::Sender<u64>,
}

impl Fetch {
    pub fn new(
        key: Bytes,
        leader_headers: Headers,
        stats: Arc<ObjectStats>,
        max_keep: u64,
        window: u64,
    ) -> Arc<Fetch> {
        Arc::new(Fetch {
            id: ObjectId::of(&key),
            key,
            leader_headers,
            stats,
            started: Instant::now(),
            max_keep,
            window,
            inner: Mutex::new(Inner {
                head: None,
                chunks: VecDeque::new(),
                received: 0,
                done: None,
                readers: Vec::new(),
                keep_all: true,
                spool: None,
                spooling: false,
            }),
            progress: watch::channel(0).0,
            drained: watch::channel(0).0,
        })
    }

    /// Add a reader. It starts at byte 0 while every byte from 0 is still
    /// held (kept whole, written to a file, or nothing passed yet); after
    /// that only a stream of unknown length (live) can be joined, at the
    /// oldest byte still held. `None`: this fetch cannot serve a new client.
    pub fn join(self: &Arc<Self>) -> Option<FetchReader> {
        let mut st = self.inner.lock();
        let pos = if st.keep_all || st.spooling || holds_from_zero(&st) {
            0
        } else {
            let unknown_len = matches!(&st.head, Some(Ok(h)) if h.content_length.is_none());
            match st.chunks.front() {
                Some((start, _)) if unknown_len && st.done.is_none() => *start,
                _ => return None,
            }
        };
        let slot = match st.readers.iter().position(Option::is_none) {
            Some(i) => {
                st.readers[i] = Some(pos);
                i
            }
            None => {
                st.readers.push(Some(pos));
                st.readers.len() - 1
            }
        };
        Some(FetchReader {
            fetch: self.clone(),
            slot,
            pos,
            rx: self.progress.subscribe(),
        })
    }

    pub fn set_head(&self, head: Result<Arc<FetchedHead>, FetchError>) {
        self.inner.lock().head = Some(head);
        self.progress.send_modify(|v| *v += 1);
    }

    pub fn head(&self) -> Option<Result<Arc<FetchedHead>, FetchError>> {
        self.inner.lock().head.clone()
    }

    /// Append a chunk. Returns false when nobody wants the rest: no reader
    /// is left and the body is no longer being kept for the cache.
    pub async fn push(&self, chunk: Bytes) -> bool {
        let mut rx = self.drained.subscribe();
        {
            let mut st = self.inner.lock();
            let at = st.received;
            st.received += chunk.len() as u64;
            st.chunks.push_back((at, chunk));
            if st.keep_all && st.received > self.max_keep {
                st.keep_all = false;
            }
            trim(&mut st);
        }
        self.progress.send_modify(|v| *v += 1);
        loop {
            rx.borrow_and_update();
            {
                let mut st = self.inner.lock();
                if st.keep_all || st.spooling {
                    // Kept whole, or written to a file: readers never
                    // hold the upstream back.
                    return true;
                }
                trim(&mut st);
                let Some(slowest) = st.readers.iter().flatten().min().copied() else {
                    return false;
                };
                if st.received - slowest <= self.window {
                    return true;
                }
            }
            if rx.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.inner.lock().received
    }

    /// Stop keeping the body in memory: it will not be cached (unless it is
    /// spooled), and the window applies.
    pub fn stop_keeping(&self) {
        let mut st = self.inner.lock();
        st.keep_all = false;
        trim(&mut st);
        drop(st);
        self.drained.send_modify(|v| *v += 1);
    }

    /// From now on the body is written to `file` (its body at
    /// `body_offset`), starting with the chunks held: the caller writes
    /// what [`Fetch::unwritten`] returns and reports it with
    /// [`Fetch::written`]. A fetch kept whole can be spooled, and a spooled
    /// one moved to another file holding what was written (shared memory
    /// to disk).
    pub fn spool_to(&self, file: Arc<File>, body_offset: u64) -> bool {
        let mut st = self.inner.lock();
        if !st.keep_all && !st.spooling {
            return false;
        }
        let written = st.spool.as_ref().map_or(0, |s| s.written);
        st.keep_all = false;
        st.spooling = true;
        st.spool = Some(SpoolFile {
            file,
            body_offset,
            written,
        });
        true
    }

    /// The chunks received but not yet written to the spool file, and how
    /// many bytes they hold.
    pub fn unwritten(&self) -> (Vec<Bytes>, u64) {
        let st = self.inner.lock();
        let from = st.spool.as_ref().map_or(st.received, |s| s.written);
        let mut out = Vec::new();
        let mut n = 0;
        for (start, c) in &st.chunks {
            let end = start + c.len() as u64;
            if end > from {
                let c = c.slice((from.saturating_sub(*start)) as usize..);
                n += c.len() as u64;
                out.push(c);
            }
        }
        (out, n)
    }

    /// `n` more body bytes are in the spool file: readers are sent them
    /// from there, and their chunks are dropped.
    pub fn written(&self, n: u64) {
        let mut st = self.inner.lock();
        if let Some(s) = st.spool.as_mut() {
            s.written += n;
        }
        trim(&mut st);
    }

    /// Body bytes written to the spool file so far.
    pub fn written_to_file(&self) -> u64 {
        self.inner.lock().spool.as_ref().map_or(0, |s| s.written)
    }

    /// Stop writing to the spool file (the object turned out too large to
    /// keep): what is written stays readable, the rest follows the window.
    pub fn stop_spooling(&self) {
        let mut st = self.inner.lock();
        st.spooling = false;
        trim(&mut st);
        drop(st);
        self.drained.send_modify(|v| *v += 1);
    }

    /// Bytes held in memory by this fetch.
    pub fn held(&self) -> u64 {
        self.inner
            .lock()
            .chunks
            .iter()
            .map(|(_, c)| c.len() as u64)
            .sum()
    }

    /// Mark the body complete or failed.
    pub fn finish(&self, result: Result<(), FetchError>) {
        {
            let mut st = self.inner.lock();
            if st.head.is_none() {
                if let Err(e) = &result {
                    st.head = Some(Err(e.clone()));
                }
            }
            st.done = Some(result);
        }
        self.progress.send_modify(|v| *v += 1);
    }

    /// The whole body, if it completed and was kept whole.
    pub fn complete_body(&self) -> Option<Body> {
        let chunks: Vec<Bytes> = {
            let st = self.inner.lock();
            if !st.keep_all || !matches!(st.done, Some(Ok(()))) {
                return None;
            }
            st.chunks.iter().map(|(_, c)| c.clone()).collect()
        };
        Some(Body::assemble(&chunks))
    }

    /// (bytes received, expected length if known, readers).
    pub fn progress(&self) -> (u64, Option<u64>, usize) {
        let st = self.inner.lock();
        let len = match &st.head {
            Some(Ok(h)) => h.content_length,
            _ => None,
        };
        (st.received, len, st.readers.iter().flatten().count())
    }
}

/// Whether every byte from 0 on is still held: in the file written so far,
/// then in the chunks, with no gap.
fn holds_from_zero(st: &Inner) -> bool {
    let file_end = st.spool.as_ref().map_or(0, |s| s.written);
    match st.chunks.front() {
        Some((start, _)) => *start <= file_end,
        None => st.received == file_end,
    }
}

/// Drop the chunks that are written to the spool file, or that every
/// reader has passed, unless the body is kept whole.
fn trim(st: &mut Inner) {
    if st.keep_all {
        return;
    }
    let written = st.spool.as_ref().map_or(0, |s| s.written);
    let slowest = st
        .readers
        .iter()
        .flatten()
        .min()
        .copied()
        .unwrap_or(st.received);
    // While spooling, a reader behind is sent the file; it needs no chunk.
    let done = if st.spooling {
        written
    } else {
        slowest.max(written)
    };
    while let Some((start, c)) = st.chunks.front() {
        if start + c.len() as u64 <= done {
            st.chunks.pop_front();
        } else {
            break;
        }
    }
}

/// One client's cursor into a fetch.
#[derive(Debug)]
pub struct FetchReader {
    fetch: Arc<Fetch>,
    slot: usize,
    pos: u64,
    rx: watch::Receiver<u64>,
}

impl FetchReader {
    pub fn fetch(&self) -> &Arc<Fetch> {
        &self.fetch
    }

    /// Wait for the response head.
    pub async fn head(&mut self) -> Result<Arc<FetchedHead>, FetchError> {
        loop {
            self.rx.borrow_and_update();
            if let Some(h) = self.fetch.head() {
                return h;
            }
            if self.rx.changed().await.is_err() {
                return Err(FetchError {
                    status: 502,
                    message: "upstream fetch vanished".into(),
                });
            }
        }
    }

    /// The next bytes of the body, `Ok(None)` at its end.
    pub async fn next(&mut self) -> Result<Option<Piece>, FetchError> {
        loop {
            self.rx.borrow_and_update();
            {
                let mut st = self.fetch.inner.lock();
                let from_file = st.spool.as_ref().and_then(|s| {
                    (self.pos < s.written).then(|| Piece::File {
                        file: s.file.clone(),
                        offset: s.body_offset + self.pos,
                        len: s.written - self.pos,
                    })
                });
                if let Some(piece) = from_file {
                    self.pos += piece.len();
                    st.readers[self.slot] = Some(self.pos);
                    let notify = !st.keep_all;
                    drop(st);
                    if notify {
                        self.fetch.drained.send_modify(|v| *v += 1);
                    }
                    return Ok(Some(piece));
                }
                if self.pos < st.received {
                    let pos = self.pos;
                    let i = st
                        .chunks
                        .partition_point(|(start, c)| start + c.len() as u64 <= pos);
                    let Some((start, c)) = st.chunks.get(i) else {
                        return Err(FetchError {
                            status: 502,
                            message: "stream data no longer held".into(),
                        });
                    };
                    let out = c.slice((pos - start) as usize..);
                    self.pos += out.len() as u64;
                    st.readers[self.slot] = Some(self.pos);
                    let notify = !st.keep_all;
                    drop(st);
                    if notify {
                        self.fetch.drained.send_modify(|v| *v += 1);
                    }
                    return Ok(Some(Piece::Bytes(out)));
                }
                match &st.done {
                    Some(Ok(())) => return Ok(None),
                    Some(Err(e)) => return Err(e.clone()),
                    None => {}
                }
            }
            if self.rx.changed().await.is_err() {
                return Err(FetchError {
                    status: 502,
                    message: "upstream fetch vanished".into(),
                });
            }
        }
    }
}

impl Drop for FetchReader {
    fn drop(&mut self) {
        if let Some(r) = self.fetch.inner.lock().readers.get_mut(self.slot) {
            *r = None;
        }
        self.fetch.drained.send_modify(|v| *v += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(len: Option<u64>) -> Arc<FetchedHead> {
        Arc::new(FetchedHead {
            status: 200,
            headers: Headers::new(),
            content_length: len,
            freshness: Freshness::default(),
            vary: Some(vec![]),
            response_time: 0,
            initial_age: 0,
            refreshed: None,
        })
    }

    fn fetch(max_keep: u64, window: u64) -> Arc<Fetch> {
        Fetch::new(
            Bytes::from_static(b"/k"),
            Headers::new(),
            Arc::default(),
            max_keep,
            window,
        )
    }

    async fn read_all(mut r: FetchReader) -> Result<Vec<u8>, FetchError> {
        let mut out = Vec::new();
        while let Some(p) = r.next().await? {
            match p {
                Piece::Bytes(b) => out.extend_from_slice(&b),
                Piece::File { file, offset, len } => {
                    let mut b = vec![0u8; len as usize];
                    std::os::unix::fs::FileExt::read_exact_at(&*file, &mut b, offset).unwrap();
                    out.extend_from_slice(&b);
                }
            }
        }
        Ok(out)
    }

    #[tokio::test]
    async fn every_reader_gets_every_byte_as_it_arrives() {
        let f = fetch(1 << 20, 1 << 20);
        let readers: Vec<_> = (0..5).map(|_| f.join().unwrap()).collect();
        let tasks: Vec<_> = readers
            .into_iter()
            .map(|r| tokio::spawn(read_all(r)))
            .collect();
        f.set_head(Ok(head(None)));
        for i in 0..100u8 {
            assert!(f.push(Bytes::from(vec![i; 10])).await);
            tokio::task::yield_now().await;
        }
        // A late joiner still gets everything while the body is kept whole.
        let late = tokio::spawn(read_all(f.join().unwrap()));
        f.finish(Ok(()));
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().len(), 1000);
        }
        assert_eq!(late.await.unwrap().unwrap().len(), 1000);
        assert_eq!(f.complete_body().unwrap().bytes.len(), 1000);
    }

    #[tokio::test]
    async fn large_bodies_are_bounded_by_the_window() {
        let f = fetch(100, 300);
        let mut slow = f.join().unwrap();
        f.set_head(Ok(head(Some(10_000))));
        let writer = {
            let f = f.clone();
            tokio::spawn(async move {
                for _ in 0..100 {
                    if !f.push(Bytes::from(vec![1u8; 100])).await {
                        return false;
                    }
                }
                f.finish(Ok(()));
                true
            })
        };
        let mut got = 0;
        while let Some(b) = slow.next().await.unwrap() {
            got += b.len();
            let held: u64 = f
                .inner
                .lock()
                .chunks
                .iter()
                .map(|(_, c)| c.len() as u64)
                .sum();
            assert!(held <= 500, "held {held}");
        }
        assert_eq!(got, 10_000);
        assert!(writer.await.unwrap());
        assert!(f.complete_body().is_none());
        // A known-length body that lost its start cannot be joined.
        assert!(f.join().is_none());
    }

    #[tokio::test]
    async fn a_spooled_body_is_held_in_its_file_and_joinable_from_byte_0() {
        use std::os::unix::fs::FileExt;
        let path = std::env::temp_dir().join(format!("vcdn-spool-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        let file = Arc::new(file);
        let f = fetch(100, 100);
        let early = f.join().unwrap();
        f.set_head(Ok(head(Some(1000))));
        assert!(f.push(Bytes::from(vec![0u8; 100])).await);
        // Written after the body's 7-byte head in the file.
        assert!(f.spool_to(file.clone(), 7));
        for i in 1..10u8 {
            // Nobody reads: a spooling fetch is never held back.
            assert!(f.push(Bytes::from(vec![i; 100])).await);
            let (chunks, n) = f.unwritten();
            let at = 7 + f.inner.lock().spool.as_ref().unwrap().written;
            file.write_all_at(&chunks.concat(), at).unwrap();
            f.written(n);
            assert_eq!(f.held(), 0, "written chunks are dropped");
        }
        let late = f.join().expect("a spooling fetch is joined at byte 0");
        f.finish(Ok(()));
        let want: Vec<u8> = (0..10u8).flat_map(|i| vec![i; 100]).collect();
        assert_eq!(read_all(early).await.unwrap(), want);
        assert_eq!(read_all(late).await.unwrap(), want);
        assert!(f.complete_body().is_none(), "not for the memory tier");
    }

    #[tokio::test]
    async fn writer_stops_when_all_readers_leave_an_uncacheable_body() {
        let f = fetch(10, 100);
        let r = f.join().unwrap();
        f.set_head(Ok(head(None)));
        assert!(f.push(Bytes::from(vec![0u8; 50])).await);
        drop(r);
        assert!(!f.push(Bytes::from(vec![0u8; 50])).await);
    }

    #[tokio::test]
    async fn failure_reaches_readers() {
        let f = fetch(1000, 1000);
        let r = f.join().unwrap();
        f.set_head(Ok(head(Some(100))));
        f.push(Bytes::from_static(b"abc")).await;
        f.finish(Err(FetchError {
            status: 502,
            message: "reset".into(),
        }));
        assert!(read_all(r).await.is_err());
        assert!(f.complete_body().is_none());
    }
}
