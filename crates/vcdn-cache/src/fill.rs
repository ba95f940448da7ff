//! How a cache fill holds the body it receives (see [`crate::fetch`]): kept
//! in memory within the memory tier's budget, written to the disk tier as it
//! arrives, or not kept at all. This is what bounds a miss's memory by the
//! configuration, whatever the object's size.

use std::sync::Arc;

use crate::body::Body;
use crate::fetch::Fetch;
use crate::object::{CachedObject, TRAILER};
use crate::proxy::Cache;
use crate::store::disk::Spool;

/// Body bytes written to the disk tier per blocking write while spooling:
/// the most a spooling fetch holds in memory (plus one upstream read).
pub const SPOOL_BATCH: u64 = 256 * 1024;

/// One fill's holding of its body.
pub(crate) struct Fill {
    cache: Arc<Cache>,
    fetch: Arc<Fetch>,
    /// The object as it will be stored, body aside; `None`: not storable.
    meta: Option<Arc<CachedObject>>,
    /// Memory-tier bytes reserved for the chunks kept.
    reserved: usize,
    /// The disk-tier file being written.
    spool: Option<Spool>,
}

impl Fill {
    /// Decide, once the head is known, how the body starts out: a body
    /// that is not storable, or declared larger than the memory tier
    /// takes, is never kept in memory.
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
            reserved: 0,
            spool: None,
        };
        if f.meta.is_none() {
            f.fetch.stop_keeping();
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
        if !self.fetch.keeping() {
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

    /// After a chunk is pushed: write a batch to the disk tier when one
    /// is ready.
    pub async fn pushed(&mut self) {
        self.write(false).await;
    }

    /// The body ended (`ok`: completely). Returns it when it was kept in
    /// memory; a spooled body is put in place on the disk tier here.
    pub async fn finish(mut self, ok: bool) -> Option<Body> {
        self.release();
        if !ok {
            return None;
        }
        if self.spool.is_some() {
            self.write(true).await;
            if let (Some(s), Some(disk)) = (self.spool.take(), self.cache.store.disk().cloned()) {
                let _ = tokio::task::spawn_blocking(move || disk.commit(s)).await;
            }
            return None;
        }
        let body = self.fetch.complete_body()?;
        if let Some(file) = &body.file {
            self.fetch.moved_to(file.clone());
        }
        Some(body)
    }

    fn release(&mut self) {
        self.cache.store.release(std::mem::take(&mut self.reserved));
    }

    /// Stop keeping the body in memory: write it to the disk tier as it
    /// arrives when there is one and the object (`size` so far or
    /// declared) may be kept there; otherwise it will not be cached.
    async fn leave_memory(&mut self, size: u64) {
        self.release();
        let disk = self.cache.store.disk().cloned();
        if let (Some(meta), Some(disk)) = (self.meta.clone(), disk) {
            if size <= self.cache.store.max_object() && size < disk.max_file() {
                match tokio::task::spawn_blocking(move || disk.begin(&meta)).await {
                    Ok(Ok(s)) => {
                        if self.fetch.spool_to(s.file().clone(), s.body_offset()) {
                            self.spool = Some(s);
                            self.write(true).await;
                            return;
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot write to the disk tier"),
                    Err(_) => {}
                }
            }
        }
        self.fetch.stop_keeping();
    }

    /// Write the chunks not yet written (`all`, or once a batch waits).
    async fn write(&mut self, all: bool) {
        let Some(disk) = self.cache.store.disk().cloned() else {
            return;
        };
        let Some(mut s) = self.spool.take() else {
            return;
        };
        let (chunks, n) = self.fetch.unwritten();
        if n == 0 || (!all && n < SPOOL_BATCH) {
            self.spool = Some(s);
            return;
        }
        if s.body_offset() + s.body_len() + n + TRAILER > disk.max_file()
            || s.body_len() + n > self.cache.store.max_object()
        {
            // Too large for the disk tier after all (a body of unknown
            // length): what is written stays readable, the file goes.
            drop(s);
            self.fetch.stop_spooling();
            return;
        }
        let written = tokio::task::spawn_blocking(move || {
            for c in &chunks {
                s.append(c)?;
            }
            Ok::<_, std::io::Error>(s)
        })
        .await;
        match written {
            Ok(Ok(s)) => {
                self.fetch.written(n);
                self.spool = Some(s);
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
