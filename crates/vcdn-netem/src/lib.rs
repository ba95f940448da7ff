//! vcdn's network-path emulator: a TCP relay that makes a loopback
//! connection look like a wide-area path.
//!
//! The kernels vcdn's test beds run on may lack `sch_netem` (and tests
//! must not need root), so delay and bandwidth are emulated in user space.
//! A [`Shim`] listens on an address and relays every accepted connection
//! to one target address, and in each direction:
//!
//! - a **bottleneck link** ([`link`]): one token bucket per direction
//!   shared by every connection of the shim (all responses capped
//!   together, as behind one access link), 10 ms of the rate deep, handing
//!   quanta of 10 ms of the rate to connections in turn, so they share it
//!   fairly;
//! - then a **delay line**: every chunk that passed the link is released
//!   to the other side no earlier than the one-way delay after it passed
//!   (after it was read, uncapped); FINs and resets travel in order
//!   behind the data;
//! - a **bounded queue**: a connection direction holds at most
//!   [`PathSpec::queue_limit`] bytes read and not yet written (and the shim
//!   at most [`Limits::memory_bytes`]); when full, it stops reading and TCP
//!   holds the sender back. The rate is only reachable with a queue of at
//!   least rate × delay, which the default provides twice over.
//!
//! A new connection costs one emulated round trip before its first bytes
//! reach the target (see `relay.rs`). Delays and rates can be changed while
//! running ([`Shim::set`]).
//!
//! Accuracy: releases are timed with tokio timers (a millisecond's grain),
//! on absolute instants, so errors do not add up: an added delay is late
//! by about 1 ms, and the rate is exact over any period longer than the
//! burst (10 ms). What it does not model: loss, jitter, reordering, and
//! the sender's TCP congestion control reacting to the path (the relay's
//! own sockets see loopback), so slow start over a long path is not
//! reproduced.
//!
//! # Which emulator
//!
//! - [`Shim`] (this relay): no root, one TCP path between two loopback
//!   addresses, delay and a bandwidth cap as seen by an application (a
//!   player's throughput, a cache's upstream latency). The endpoints' TCP
//!   sees loopback, so no slow start, no loss.
//! - [`testbed`]: root, one network namespace per node, every IP packet
//!   delayed on its link. Use it when TCP's own dynamics matter: slow
//!   start, handshakes, congestion control, split-TCP proxy chains (MOSTO).
//! - [`lan`]: root, nodes on bridged Ethernet segments sharing one
//!   broadcast domain, segments joined by the same forwarder's delayed,
//!   rate-capped link, CPU quotas per node: for protocols that discover by
//!   broadcast (ANDy's telemetry agents) and the thesis's VM sizes.
//!
//! Tests are mostly synchronous, so [`Shim::spawn_thread`] runs a shim on
//! a thread with its own single-threaded runtime, stopped when dropped;
//! async callers use [`Shim::start`] on their runtime.

mod bed;
pub mod cgroup;
mod forwarder;
pub mod lan;
mod link;
mod netns;
mod relay;
mod spec;
mod stats;
pub mod testbed;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use bed::Bed;
use link::Link;
pub use spec::{Dir, Limits, PathSpec, MAX_CHUNK, MAX_DEFAULT_QUEUE, MIN_QUEUE};
use stats::Counters;
pub use stats::ShimStats;

/// What every connection of a shim shares.
pub(crate) struct Shared {
    target: SocketAddr,
    spec: watch::Sender<PathSpec>,
    limits: Limits,
    counters: Counters,
    /// Bytes all connections may still queue ([`Limits::memory_bytes`]).
    memory: Semaphore,
    up: Link,
    down: Link,
}

impl Shared {
    /// The path now (a copy: the watch's guard must not live across an
    /// await).
    fn spec_now(&self) -> PathSpec {
        *self.spec.borrow()
    }

    fn link(&self, d: Dir) -> &Link {
        match d {
            Dir::Up => &self.up,
            Dir::Down => &self.down,
        }
    }
}

/// A running relay. Dropping it stops accepting and ends every connection.
pub struct Shim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Shim {
    /// Listen on `listen` and relay to `target` through `spec`, with the
    /// default [`Limits`]. Call within a tokio runtime.
    pub async fn start(listen: SocketAddr, target: SocketAddr, spec: PathSpec) -> io::Result<Shim> {
        Shim::start_with(listen, target, spec, Limits::default()).await
    }

    /// [`Shim::start`] with explicit limits.
    pub async fn start_with(
        listen: SocketAddr,
        target: SocketAddr,
        spec: PathSpec,
        limits: Limits,
    ) -> io::Result<Shim> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let limits = Limits {
            max_connections: limits.max_connections.max(1),
            memory_bytes: limits.memory_bytes.max(2 * MAX_CHUNK),
            ..limits
        };
        let (spec_tx, _) = watch::channel(spec);
        let (up, grant_up) = Link::new(Dir::Up, spec_tx.subscribe(), limits.max_connections);
        let (down, grant_down) = Link::new(Dir::Down, spec_tx.subscribe(), limits.max_connections);
        let shared = Arc::new(Shared {
            target,
            spec: spec_tx,
            limits,
            counters: Counters::default(),
            memory: Semaphore::new(limits.memory_bytes),
            up,
            down,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(grant_up);
        tasks.spawn(grant_down);
        let task = tokio::spawn(accept(listener, shared.clone(), tasks));
        Ok(Shim { shared, addr, task })
    }

    /// Run a shim on a thread of its own (a single-threaded runtime), for
    /// synchronous callers; it stops when the returned value is dropped.
    pub fn spawn_thread(
        listen: SocketAddr,
        target: SocketAddr,
        spec: PathSpec,
    ) -> io::Result<ShimThread> {
        Shim::spawn_thread_with(listen, target, spec, Limits::default())
    }

    /// [`Shim::spawn_thread`] with explicit limits.
    pub fn spawn_thread_with(
        listen: SocketAddr,
        target: SocketAddr,
        spec: PathSpec,
        limits: Limits,
    ) -> io::Result<ShimThread> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vcdn-netem".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    let started = Shim::start_with(listen, target, spec, limits).await;
                    let ok = started.is_ok();
                    let _ = ready_tx.send(started);
                    if ok {
                        let _ = stop_rx.await;
                    }
                });
            })?;
        let shim = ready_rx
            .recv()
            .map_err(|_| io::Error::other("the netem thread ended before starting"))??;
        Ok(ShimThread {
            shim,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address every connection is relayed to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// The path now.
    pub fn spec(&self) -> PathSpec {
        self.shared.spec_now()
    }

    /// Change the path while running: delays apply to every byte not yet
    /// released (a shorter delay takes effect after the sleep in progress,
    /// a longer one at once), rates from the next quantum granted, the
    /// queue size to connections accepted from now on.
    pub fn set(&self, spec: PathSpec) {
        tracing::info!(?spec, "netem: path changed");
        self.shared.spec.send_replace(spec);
    }

    /// The counters now.
    pub fn stats(&self) -> ShimStats {
        self.shared.counters.snapshot()
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A [`Shim`] running on a thread of its own; use it as a `Shim`
/// (`local_addr`, `set`, `stats`). Dropping it stops the shim, ends its
/// connections and joins the thread.
pub struct ShimThread {
    shim: Shim,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::ops::Deref for ShimThread {
    type Target = Shim;
    fn deref(&self) -> &Shim {
        &self.shim
    }
}

impl Drop for ShimThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accept connections and relay each in a task of `tasks` (which also
/// holds the links' tasks), so that dropping this future ends them all.
async fn accept(listener: TcpListener, sh: Arc<Shared>, mut tasks: JoinSet<()>) {
    tracing::debug!(listen = ?listener.local_addr().ok(), target = %sh.target, "netem: accepting");
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((client, peer)) => {
                    let accepted = Instant::now();
                    let c = &sh.counters;
                    if c.active.load(Relaxed) >= sh.limits.max_connections as u64 {
                        c.refused.fetch_add(1, Relaxed);
                        tracing::debug!(%peer, "netem: connection refused: at max_connections");
                        let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                        continue;
                    }
                    c.active.fetch_add(1, Relaxed);
                    c.connections.fetch_add(1, Relaxed);
                    let active = relay::Active(sh.clone());
                    tasks.spawn(relay::relay(client, peer, active, accepted));
                }
                Err(e) => {
                    // Out of descriptors, most likely: wait for some to close.
                    tracing::warn!(error = %e, "netem: accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = tasks.join_next() => {}
        }
    }
}
