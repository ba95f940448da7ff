//! How a cache fill holds the body it receives (see [`crate::fetch`]): in
//! memory within a reservation of the memory tier, written to the disk tier
//! as it arrives, or not kept at all. This is what bounds a miss's memory
//! by the configuration, whatever the object's size.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use crate::body::{self, Body, SHM_MIN};
use crate::fetch::Fetch;
use crate::object::{CachedObject, TRAILER};
use crate::proxy::Cache;
use crate::store::disk::Spool;

/// Body bytes written to the disk tier per blocking write while spooling:
/// the most a spooling fetch holds in memory (plus one upstream read).
pub const SPOOL_BATCH: u64 = 256 * 1024;

/// Where a fill keeps its body.
enum Hold {
    /// Chunks in memory (a body still below [`SHM_MIN`]), reserved.
    Chunks,
    /// Written as it arrives to a shared-memory file that becomes the
    /// stored body (no second copy), reserved; readers are sent from it.
    Shared(Arc<File>),
    /// Written to the disk tier as it arrives.
    Disk(Box<Spool>),
    /// Not kept: it passes through the stream window.
    Pass,
}

/// One fill's holding of its body.
pub(crate) struct Fill {
    cache: Arc<Cache>,
    fetch: Arc<Fetch>,
    /// The object as it will be stored, body aside; `None`: not storable.
    meta: Option<Arc<CachedObject>>,
    hold: Hold,
    /// Memory-tier bytes reserved for what is held in memory.
    reserved: usize,
}

impl Fill {
    /// Decide, once the head is known, how the body starts out: a body
    /// that is not storable, or declared larger than the memory tier
    /// takes, is never held in memory.
    pub async fn start(
        cache: Arc<Cache>,
        fetch: Arc<Fetch>,
        meta: Option<Arc<CachedObject>>,
        content_length: Option<u64>,
    ) -> Fill {
        let mut f = Fill {
            cache,
            fetch,
            meta,
            hold: Hold::Chunks,
            reserved: 0,
        };
        if f.meta.is_none() {
            f.pass();
        } else if let Some(n) = content_length {
            if n > f.cache.store.max_memory_object() as u64 {
                f.leave_memory(n).await;
            }
        }
        f
    }

    /// Before `n` more body bytes are pushed: reserve them in the memory
    /// tier, or move the body out of memory when that is refused.
    pub async fn admit(&mut self, n: u64) {
        if !matches!(self.hold, Hold::Chunks | Hold::Shared(_)) {
            return;
        }
        let total = self.fetch.received() + n;
        if total <= self.cache.store.max_memory_object() as u64
            && self.cache.store.reserve(n as usize)
        {
            self.reserved += n as usize;
            return;
        }
        self.leave_memory(total).await;
    }

    /// After a chunk is pushed: write what is held to its file (shared
    /// memory at once, the disk tier by batches).
    pub async fn pushed(&mut self) {
        match &self.hold {
            Hold::Chunks if self.fetch.received() >= SHM_MIN as u64 => {
                match body::memfd() {
                    Ok(f) => {
                        let f = Arc::new(f);
                        if self.fetch.spool_to(f.clone(), 0) {
                            self.hold = Hold::Shared(f);
                            self.write_shared();
                        }
                    }
                    // Kept as chunks, assembled at the end.
                    Err(e) => tracing::debug!(error = %e, "memfd unavailable"),
                }
            }
            Hold::Shared(_) => self.write_shared(),
            Hold::Disk(_) => self.write_disk(false).await,
            Hold::Chunks | Hold::Pass => {}
        }
    }

    /// The body ended (`ok`: completely, and storable). Returns it when it
    /// is held in memory; a spooled body is put in place on the disk tier.
    pub async fn finish(mut self, ok: bool) -> Option<Body> {
        let body = match std::mem::replace(&mut self.hold, Hold::Pass) {
            _ if !ok => None,
            Hold::Chunks => self.fetch.complete_body(),
            Hold::Shared(f) => {
                self.hold = Hold::Shared(f.clone());
                self.write_shared();
                match self.hold {
                    Hold::Shared(_) => body::seal(f)
                        .map_err(|e| tracing::warn!(error = %e, "cannot seal a body; not kept"))
                        .ok(),
                    _ => None,
                }
            }
            Hold::Disk(s) => {
                self.hold = Hold::Disk(s);
                self.write_disk(true).await;
                if let (Hold::Disk(s), Some(disk)) = (
                    std::mem::replace(&mut self.hold, Hold::Pass),
                    self.cache.store.disk().cloned(),
                ) {
                    let _ = tokio::task::spawn_blocking(move || disk.commit(*s)).await;
                }
                None
            }
            Hold::Pass => None,
        };
        // Given back before the caller stores the body, which then counts.
        self.release();
        body
    }

    fn release(&mut self) {
        self.cache.store.release(std::mem::take(&mut self.reserved));
    }

    /// Not kept: what was written to a file stays readable, the rest
    /// follows the stream window.
    fn pass(&mut self) {
        match self.hold {
            Hold::Chunks => self.fetch.stop_keeping(),
            _ => self.fetch.stop_spooling(),
        }
        self.hold = Hold::Pass;
    }

    /// Stop holding the body in memory: write it to the disk tier as it
    /// arrives when there is one and the object (`size` so far or
    /// declared) may be kept there; otherwise it is not kept.
    async fn leave_memory(&mut self, size: u64) {
        let disk = self.cache.store.disk().cloned();
        let shared = match &self.hold {
            Hold::Shared(f) => Some(f.clone()),
            _ => None,
        };
        if let (Some(meta), Some(disk)) = (self.meta.clone(), disk) {
            if size <= self.cache.store.max_object() && size < disk.max_file() {
                // What shared memory holds is copied to the disk file first.
                let from = shared.map(|f| (f, self.fetch.written_to_file()));
                let begun = tokio::task::spawn_blocking(move || {
                    let mut s = disk.begin(&meta)?;
                    if let Some((f, n)) = from {
                        s.append_from(&f, 0, n)?;
                    }
                    Ok::<_, std::io::Error>(s)
                })
                .await;
                match begun {
                    Ok(Ok(s)) => {
                        if self.fetch.spool_to(s.file().clone(), s.body_offset()) {
                            self.hold = Hold::Disk(Box::new(s));
                            self.release();
                            self.write_disk(true).await;
                            return;
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot write to the disk tier"),
                    Err(_) => {}
                }
            }
        }
        // Shared memory already written stays reserved until the end: the
        // readers behind are sent it.
        if matches!(self.hold, Hold::Chunks) {
            self.release();
        }
        self.pass();
    }

    /// Append the chunks not yet written to the shared-memory file (a
    /// memory copy: done at once).
    fn write_shared(&mut self) {
        let Hold::Shared(f) = &self.hold else {
            return;
        };
        let (chunks, n) = self.fetch.unwritten();
        if n == 0 {
            return;
        }
        let res = chunks.iter().try_for_each(|c| (&**f).write_all(c));
        match res {
            Ok(()) => self.fetch.written(n),
            Err(e) => {
                tracing::debug!(error = %e, "cannot write to shared memory; object not kept");
                self.pass();
            }
        }
    }

    /// Write the chunks not yet written to the disk tier (`all`, or once
    /// a batch waits), on a blocking thread.
    async fn write_disk(&mut self, all: bool) {
        let Some(disk) = self.cache.store.disk().cloned() else {
            return;
        };
        let Hold::Disk(s) = std::mem::replace(&mut self.hold, Hold::Pass) else {
            return;
        };
        let mut s = s;
        let (chunks, n) = self.fetch.unwritten();
        if n == 0 || (!all && n < SPOOL_BATCH) {
            self.hold = Hold::Disk(s);
            return;
        }
        if s.body_offset() + s.body_len() + n + TRAILER > disk.max_file()
            || s.body_len() + n > self.cache.store.max_object()
        {
            // Too large for the disk tier after all (a body of unknown
            // length): the file goes once its readers are done with it.
            drop(s);
            self.fetch.stop_spooling();
            return;
        }
        let written = tokio::task::spawn_blocking(move || {
            for c in &chunks {
                s.append(c)?;
            }
            // The file being written counts against the disk tier's size.
            disk.evict();
            Ok::<_, std::io::Error>(s)
        })
        .await;
        match written {
            Ok(Ok(s)) => {
                self.fetch.written(n);
                self.hold = Hold::Disk(s);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot write to the disk tier; object not kept");
                self.fetch.stop_spooling();
            }
            Err(_) => self.fetch.stop_spooling(),
        }
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        self.release();
    }
}
