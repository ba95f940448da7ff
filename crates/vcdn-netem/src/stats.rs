//! Counters of a shim: bytes each way, connections, bytes queued.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::spec::Dir;

/// A snapshot of a shim's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShimStats {
    /// Bytes written to targets (client → target).
    pub bytes_up: u64,
    /// Bytes written to clients (target → client).
    pub bytes_down: u64,
    /// Connections accepted and relayed (refused ones not counted).
    pub connections: u64,
    /// Connections being relayed now.
    pub active: u64,
    /// Connections reset at accept because `max_connections` were active.
    pub refused: u64,
    /// Connects to the target that failed or timed out.
    pub connect_failures: u64,
    /// Bytes read and not yet written, all connections.
    pub queued_bytes: u64,
    /// The most bytes one connection direction has held at once.
    pub queue_peak_bytes: u64,
}

/// The live counters behind [`ShimStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub connections: AtomicU64,
    pub active: AtomicU64,
    pub refused: AtomicU64,
    pub connect_failures: AtomicU64,
    pub queued: AtomicU64,
    pub queue_peak: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> ShimStats {
        ShimStats {
            bytes_up: self.bytes_up.load(Relaxed),
            bytes_down: self.bytes_down.load(Relaxed),
            connections: self.connections.load(Relaxed),
            active: self.active.load(Relaxed),
            refused: self.refused.load(Relaxed),
            connect_failures: self.connect_failures.load(Relaxed),
            queued_bytes: self.queued.load(Relaxed),
            queue_peak_bytes: self.queue_peak.load(Relaxed),
        }
    }

    /// `n` bytes written in direction `d`.
    pub fn written(&self, d: Dir, n: usize) {
        match d {
            Dir::Up => &self.bytes_up,
            Dir::Down => &self.bytes_down,
        }
        .fetch_add(n as u64, Relaxed);
    }
}
