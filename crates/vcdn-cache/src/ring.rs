//! The io_uring front end of a serving thread: accepts connections and
//! answers what can be answered at once (fresh memory hits with small
//! bodies, admission-filter redirects) from one ring, so a busy thread makes
//! one `io_uring_enter` per batch of completions instead of a `recv` and a
//! `send` system call per request. Anything else (a miss, a body to read, a
//! large or streamed body, a parse error, a request head split across reads)
//! hands the connection over, with the bytes already read, to the tokio
//! connection loop of [`crate::server`], which keeps it from then on.
//!
//! Why: `bench/stacks.sh` measured an io_uring responder 17–21 % cheaper per
//! small request than the epoll loop on the same machine.
//!
//! Each connection's receive is multishot (armed once, it completes at
//! every arrival), and its buffers come from a ring of provided buffers
//! (the kernel picks one when data arrives), so an idle connection holds
//! none. The ring runs
//! with a single issuer and deferred task work; an eventfd tells the tokio
//! runtime when completions are waiting, and the loop yields to tokio's
//! other tasks (misses, the admin API) between batches.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use vcdn_http::{parse_request, BodyFraming, Limits, Method};

use crate::metrics::{CacheStatus, HitTally};
use crate::panic;
use crate::proxy::{AtOnce, Cache};
use crate::reply::{error_reply, Reply, ReplyBody};
use crate::server::{connection_from, ConnectionSlot, Handover};

/// Bodies up to this size are answered from the ring.
const INLINE_BODY: usize = 16 * 1024;
/// Provided receive buffers per ring, and their size. A request head that
/// does not fit one buffer is handed over. Enough buffers that a batch from
/// a thousand busy connections rarely runs out (a receive that finds none
/// fails with ENOBUFS and is queued again, which costs that client latency).
const BUFFERS: u16 = 1024;
const BUF_SIZE: usize = 2048;
const BUF_GROUP: u16 = 0;
/// Requests held while an answer is being sent, at most: beyond this the
/// receive is stopped until the answer is out, so a client that sends and
/// never reads meets TCP's back-pressure instead of growing our memory.
const PENDING_MAX: usize = 16 * 1024;
/// Answers gathered for one send, at most (pipelined small requests for
/// larger objects would otherwise multiply into a large buffer).
const OUT_MAX: usize = 64 * 1024;
/// Deferred completions the kernel runs per `io_uring_enter`, at most
/// (`IO_LOCAL_TW_DEFAULT_MAX`); a batch this large may have left some.
const LOCAL_WORK_BATCH: usize = 20;
const ACCEPT: u64 = u64::MAX;
const CANCEL: u64 = u64::MAX - 1;
const OP_RECV: u64 = 0;
const OP_SEND: u64 = 1;

/// Provided buffers: a page-aligned ring of entries the kernel takes
/// buffers from, and the buffers themselves.
struct BufRing {
    entries: *mut types::BufRingEntry,
    map_len: usize,
    bufs: Vec<u8>,
    tail: u16,
}

impl BufRing {
    fn new(ring: &IoUring) -> std::io::Result<BufRing> {
        let map_len = BUFFERS as usize * std::mem::size_of::<types::BufRingEntry>();
        // SAFETY: an anonymous private mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut r = BufRing {
            entries: p.cast(),
            map_len,
            bufs: vec![0; BUFFERS as usize * BUF_SIZE],
            tail: 0,
        };
        // SAFETY: the mapping lives as long as `r`, which outlives the ring
        // (dropped after it in `serve`).
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(p as u64, BUFFERS, BUF_GROUP, 0)?;
        }
        for bid in 0..BUFFERS {
            r.give_back(bid);
        }
        Ok(r)
    }

    /// Returns buffer `bid` to the kernel.
    fn give_back(&mut self, bid: u16) {
        let idx = (self.tail & (BUFFERS - 1)) as usize;
        // SAFETY: idx < BUFFERS, inside the mapping.
        let e = unsafe { &mut *self.entries.add(idx) };
        e.set_addr(self.bufs[bid as usize * BUF_SIZE..].as_ptr() as u64);
        e.set_len(BUF_SIZE as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field overlays entry 0's reserved field; the
        // kernel reads it with acquire semantics.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    fn data(&self, bid: u16, len: usize) -> &[u8] {
        &self.bufs[bid as usize * BUF_SIZE..bid as usize * BUF_SIZE + len]
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.entries.cast(), self.map_len) };
    }
}

/// A connection served from the ring. Its receive is multishot: armed once,
/// it posts a completion for every arrival until it ends, so a keep-alive
/// request costs no new submission and no new poll registration. Nothing may
/// be in flight on a connection when it is closed or handed over (its slot
/// would be reused under a completion still to come), so those wait for
/// the receive's last completion (after a cancel) and the send's.
struct RingConn {
    fd: RawFd,
    peer: SocketAddr,
    /// A multishot receive is armed: its last completion is still to come.
    armed: bool,
    /// A cancel of that receive was submitted.
    cancelling: bool,
    /// A send is in flight.
    sending: bool,
    /// When the connection began waiting for a request, or its send began
    /// (idle and send timeouts).
    since: Instant,
    out: Vec<u8>,
    sent: usize,
    /// Requests that arrived while an answer was being sent, answered after
    /// it, in order.
    pending: BytesMut,
    /// `Connection: close`: close once the answers are sent.
    close_after: bool,
    /// The client closed its side: close once what it sent is answered.
    peer_closed: bool,
    /// Failed, timed out or refused: close as soon as nothing is in flight.
    closing: bool,
    handover: Option<Handover>,
    /// No request was parsed yet: an HTTP/2 preface (refused by the
    /// parser, so handed over) may open the connection.
    fresh: bool,
}

/// Whether this kernel gives us what the front end needs.
pub fn available() -> bool {
    IoUring::<squeue::Entry, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(8)
        .is_ok()
}

/// Serves one thread's listener from a ring until the process ends.
pub async fn serve(cache: Arc<Cache>, listener: StdListener) -> std::io::Result<()> {
    let ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        // Small rings keep an idle cache under 5 MiB resident; a full
        // submission queue is simply submitted early.
        .setup_cqsize(2048)
        .build(512)?;
    let bufs = BufRing::new(&ring)?;
    let mut k = Kernel {
        ring: ManuallyDrop::new(ring),
        bufs: ManuallyDrop::new(bufs),
    };
    // SAFETY: a fresh eventfd we own.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: efd is ours and open.
    let efd = unsafe { OwnedFd::from_raw_fd(efd) };
    k.ring.submitter().register_eventfd(efd.as_raw_fd())?;
    k.ring.completion().disable_eventfd();
    // SAFETY: the AsyncFd owns the eventfd, which stays open until dropped.
    let efd = unsafe { AsyncFd::register(efd) }?;
    let mut f = Front {
        cache: cache.clone(),
        conns: Vec::new(),
        free: Vec::new(),
        queue: VecDeque::new(),
        spare_head: Vec::new(),
        limits: Limits {
            max_request_line: cache.cfg.max_request_line,
            max_head: cache.cfg.max_header_bytes,
            max_headers: cache.cfg.max_headers,
        },
        listener_fd: listener.as_raw_fd(),
        accept_paused: None,
        now: Instant::now(),
        scratch: BytesMut::new(),
        tally: HitTally::default(),
        answering: None,
    };
    f.queue.push_back(accept_entry(f.listener_fd));
    let idle = Duration::from_millis(cache.cfg.idle_timeout_ms);
    let send_timeout = Duration::from_millis(cache.cfg.send_timeout_ms);
    let mut last_sweep = Instant::now();
    let mut last_yield = Instant::now();
    let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(256);
    // Whether the last `io_uring_enter` may have left deferred work behind
    // (it runs a bounded number of items per call), so the task-run flag
    // alone cannot say the kernel has nothing for us.
    let mut maybe_more = true;
    loop {
        // Submit what is queued and run deferred completions; skipped when
        // there is nothing to submit and the kernel flags no work, which
        // saves a system call per batch on a loaded thread.
        if !f.queue.is_empty() || maybe_more || k.ring.submission().taskrun() {
            let (submitter, mut sq, _) = k.ring.split();
            while let Some(e) = f.queue.front() {
                // SAFETY: every buffer an entry points at is owned by a
                // connection in `f.conns` (or `bufs`) until its completion.
                if unsafe { sq.push(e) }.is_err() {
                    sq.sync();
                    submitter.submit()?;
                    sq.sync();
                    continue;
                }
                f.queue.pop_front();
            }
            sq.sync();
            // SAFETY: no argument struct.
            let r = unsafe {
                submitter.enter::<libc::sigset_t>(
                    sq.len() as u32,
                    0,
                    1, // IORING_ENTER_GETEVENTS
                    None,
                )
            };
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                    return Err(e);
                }
            }
        }
        done.clear();
        f.now = Instant::now();
        {
            let mut cq = k.ring.completion();
            cq.sync();
            done.extend(cq.map(|c| (c.user_data(), c.result(), c.flags())));
        }
        maybe_more = done.len() >= LOCAL_WORK_BATCH;
        // One panic boundary per batch: a panic (a bug) fails the
        // connection whose completion it came from and the batch goes on.
        let mut next = 0;
        while next < done.len() {
            let run = panic::catch(|| {
                while let Some(&(ud, res, flags)) = done.get(next) {
                    next += 1;
                    f.complete(&mut k.bufs, ud, res, flags);
                }
            });
            if let Err(p) = run {
                let (ud, _, flags) = done[next - 1];
                f.recover(&p, ud, flags);
            }
        }
        f.cache.metrics.add_hits(&mut f.tally);
        if f.accept_paused.is_some_and(|t| t <= f.now) {
            f.accept_paused = None;
            f.queue.push_back(accept_entry(f.listener_fd));
        }
        if f.now.duration_since(last_sweep) >= Duration::from_millis(250) {
            f.sweep(idle, send_timeout);
            last_sweep = f.now;
        }
        if !done.is_empty() || !f.queue.is_empty() {
            // Let misses and timers run now and then (each
            // yield costs tokio a look at its own epoll).
            if f.now.duration_since(last_yield) >= Duration::from_micros(500) {
                tokio::task::yield_now().await;
                last_yield = Instant::now();
            }
            continue;
        }
        // Nothing to do. Let the kernel signal the eventfd again (it stays
        // quiet while we are busy, saving a wake-up per completion). Work
        // the kernel deferred while it was quiet raised the task-run flag
        // instead, so look at that flag (after a full fence, pairing with
        // the kernel's) and sleep only if it is clear: then the next
        // arrival signals the eventfd.
        k.ring.completion().enable_eventfd();
        std::sync::atomic::fence(Ordering::SeqCst);
        if k.ring.submission().taskrun() {
            k.ring.completion().disable_eventfd();
            continue;
        }
        // The eventfd is edge-triggered in tokio's epoll and every signal
        // is a new edge, so its counter need not be read.
        if let Ok(Ok(mut guard)) =
            tokio::time::timeout(Duration::from_millis(250), efd.readable()).await
        {
            guard.clear_ready();
        }
        k.ring.completion().disable_eventfd();
        // A timeout (or a wake-up lost to a kernel that ran only part of
        // its deferred work) is caught up by an enter.
        maybe_more = true;
    }
}

/// The ring and its provided buffers. Dropped normally, the ring goes
/// first. Dropped while a panic unwinds, both are leaked: operations may
/// still be in flight on them, and the kernel must never write into freed
/// memory (this only happens after a bug, which is logged).
struct Kernel {
    ring: ManuallyDrop<IoUring>,
    bufs: ManuallyDrop<BufRing>,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        // SAFETY: each is dropped once, here, and not used after.
        unsafe {
            ManuallyDrop::drop(&mut self.ring);
            ManuallyDrop::drop(&mut self.bufs);
        }
    }
}

impl Drop for Front {
    /// The front end stopped (an error, or a panic that escaped the batch
    /// boundary): its connections are closed and their counts released, so
    /// none stays counted in `connections_open` forever.
    fn drop(&mut self) {
        for c in self.conns.iter_mut().filter_map(Option::take) {
            // SAFETY: the connection's descriptor, closed once.
            unsafe { libc::close(c.fd) };
            self.cache
                .metrics
                .connections_open
                .fetch_sub(1, Ordering::Relaxed);
            if c.sending {
                // The kernel may still read it.
                std::mem::forget(c.out);
            }
        }
    }
}

fn accept_entry(fd: RawFd) -> squeue::Entry {
    opcode::AcceptMulti::new(types::Fd(fd))
        .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        .build()
        .user_data(ACCEPT)
}

fn cancel_recv(slot: usize) -> squeue::Entry {
    opcode::AsyncCancel::new((slot as u64) << 1 | OP_RECV)
        .build()
        .user_data(CANCEL)
}

/// A multishot receive into provided buffers (the kernel picks one per
/// arrival).
fn recv_entry(fd: RawFd, slot: usize) -> squeue::Entry {
    opcode::RecvMulti::new(types::Fd(fd), BUF_GROUP)
        .build()
        .user_data((slot as u64) << 1 | OP_RECV)
}

struct Front {
    cache: Arc<Cache>,
    conns: Vec<Option<RingConn>>,
    free: Vec<usize>,
    queue: VecDeque<squeue::Entry>,
    spare_head: Vec<u8>,
    limits: Limits,
    listener_fd: RawFd,
    /// After an accept error (out of descriptors, say), accepting resumes
    /// at this time instead of spinning.
    accept_paused: Option<Instant>,
    /// The time of this turn of the loop: one clock read per batch of
    /// completions instead of two per request.
    now: Instant,
    /// Received bytes are copied here (a `Bytes` for the parser) and the
    /// space is reclaimed once the requests are answered: no allocation per
    /// receive.
    scratch: BytesMut,
    /// Hits answered in this batch, added to the metrics after it.
    tally: HitTally,
    /// The connection being answered and how much of its send buffer held
    /// complete answers before the current request: after a panic, those
    /// are still sent, then a 500 for the request that panicked.
    answering: Option<(usize, usize)>,
}

impl Front {
    fn complete(&mut self, bufs: &mut BufRing, ud: u64, res: i32, flags: u32) {
        self.answering = None;
        match ud {
            ACCEPT => {
                if res >= 0 {
                    self.accepted(res);
                } else {
                    tracing::warn!(error = %std::io::Error::from_raw_os_error(-res), "accept failed");
                }
                if !cqueue::more(flags) {
                    if res < 0 {
                        self.accept_paused = Some(self.now + Duration::from_millis(20));
                    } else {
                        self.queue.push_back(accept_entry(self.listener_fd));
                    }
                }
            }
            CANCEL => {}
            _ => {
                let slot = (ud >> 1) as usize;
                if ud & 1 == OP_RECV {
                    let data = cqueue::buffer_select(flags).map(|bid| {
                        let d = bufs.data(bid, res.max(0) as usize);
                        // Reclaims the space of earlier requests, all
                        // answered (or copied into a handover) by now.
                        self.scratch.reserve(BUF_SIZE.max(d.len()));
                        self.scratch.extend_from_slice(d);
                        bufs.give_back(bid);
                        self.scratch.split().freeze()
                    });
                    self.received(slot, res, cqueue::more(flags), data);
                } else {
                    self.sent(slot, res);
                }
            }
        }
    }

    fn accepted(&mut self, fd: RawFd) {
        let m = &self.cache.metrics;
        m.connections_total.fetch_add(1, Ordering::Relaxed);
        if m.connections_open.load(Ordering::Relaxed) >= self.cache.cfg.max_connections as u64 {
            m.connections_refused.fetch_add(1, Ordering::Relaxed);
            // SAFETY: closing a descriptor we were just given.
            unsafe { libc::close(fd) };
            return;
        }
        m.connections_open.fetch_add(1, Ordering::Relaxed);
        // SAFETY: borrowing the descriptor for two socket calls.
        let sock = std::mem::ManuallyDrop::new(unsafe { socket2::Socket::from_raw_fd(fd) });
        let _ = sock.set_nodelay(true);
        let peer = sock
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        // A connection to a chunk address (`crate::chunks`) goes to the
        // tokio loop at once, which checks each request against its chunk.
        let on_chunk = self
            .cache
            .chunk_of(|| {
                sock.local_addr()?
                    .as_socket()
                    .ok_or_else(|| std::io::Error::other("not an IP socket"))
            })
            .is_some();
        let c = RingConn {
            fd,
            peer,
            armed: false,
            cancelling: false,
            sending: false,
            since: self.now,
            out: Vec::new(),
            sent: 0,
            pending: BytesMut::new(),
            close_after: false,
            peer_closed: false,
            closing: false,
            handover: on_chunk.then(|| Handover {
                fresh: true,
                ..Handover::default()
            }),
            fresh: true,
        };
        let slot = match self.free.pop() {
            Some(i) => {
                self.conns[i] = Some(c);
                i
            }
            None => {
                self.conns.push(Some(c));
                self.conns.len() - 1
            }
        };
        self.advance(slot);
    }

    fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].take() {
            // SAFETY: the connection's descriptor; nothing is in flight on it.
            unsafe { libc::close(c.fd) };
            self.cache
                .metrics
                .connections_open
                .fetch_sub(1, Ordering::Relaxed);
            self.free.push(slot);
        }
    }

    fn received(&mut self, slot: usize, res: i32, more: bool, data: Option<Bytes>) {
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        let ours = res == -libc::ECANCELED && c.cancelling;
        if !more {
            c.armed = false;
            c.cancelling = false;
        }
        match data {
            Some(d) if res > 0 => {
                c.since = self.now;
                if let Some(h) = c.handover.as_mut() {
                    h.rbuf.extend_from_slice(&d);
                } else if c.closing || c.close_after {
                    // Nothing more is answered on this connection.
                } else if c.sending || !c.pending.is_empty() {
                    c.pending.extend_from_slice(&d);
                    if c.pending.len() > PENDING_MAX && c.armed && !c.cancelling {
                        // Armed again once the answer is out.
                        c.cancelling = true;
                        self.queue.push_back(cancel_recv(slot));
                    }
                } else {
                    self.answer(slot, d);
                }
            }
            // Every buffer was taken in this batch: the receive ended and
            // is armed again below.
            _ if res == -libc::ENOBUFS => {}
            _ if res == 0 => c.peer_closed = true,
            // Our own cancel: for back-pressure, a handover or a close
            // already decided (a timeout sets `closing` when it cancels).
            _ if ours => {}
            _ => c.closing = true,
        }
        self.advance(slot);
    }

    /// After a panic in the completion `ud` (a bug, caught by the batch
    /// boundary): report it, answer that connection 500 if its answer has
    /// not begun, and close it once nothing is in flight on it.
    fn recover(&mut self, p: &panic::Caught, ud: u64, flags: u32) {
        if ud == ACCEPT {
            panic::report(&self.cache.metrics, p, "accepting a connection", None);
            if !cqueue::more(flags) {
                self.queue.push_back(accept_entry(self.listener_fd));
            }
            return;
        }
        if ud == CANCEL {
            panic::report(&self.cache.metrics, p, "on the io_uring front end", None);
            return;
        }
        let slot = (ud >> 1) as usize;
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            panic::report(&self.cache.metrics, p, "on the io_uring front end", None);
            return;
        };
        panic::report(
            &self.cache.metrics,
            p,
            "answering a request; answered 500",
            Some(c.peer),
        );
        c.pending = BytesMut::new();
        c.handover = None;
        if c.sending {
            // Its buffer belongs to the kernel until the send completes.
            c.closing = true;
        } else {
            match self.answering {
                Some((s, answered)) if s == slot => c.out.truncate(answered),
                _ => c.out.clear(),
            }
            c.sent = 0;
            let r = error_reply(
                500,
                "the cache failed on this request (an internal error, logged for the operator)",
                true,
                false,
            );
            self.cache.metrics.request(CacheStatus::Error);
            self.cache.metrics.response(500, 0);
            append(&mut c.out, r, false, &mut self.spare_head);
            c.close_after = true;
        }
        if panic::catch(|| self.advance(slot)).is_err() {
            if let Some(c) = self.conns[slot].as_mut() {
                c.closing = true;
            }
        }
    }

    /// Answers the requests in `data` into the connection's send buffer,
    /// until one that the tokio loop must take (which sets the handover).
    fn answer(&mut self, slot: usize, data: Bytes) {
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        let mut at = 0;
        while at < data.len() {
            // The usual arrival holds one request: parse it without taking
            // another reference to the buffer.
            let sliced;
            let rest = if at == 0 {
                &data
            } else {
                sliced = data.slice(at..);
                &sliced
            };
            if c.out.len() >= OUT_MAX {
                // Enough answers for one send; the rest waits for it.
                let later = std::mem::take(&mut c.pending);
                c.pending = BytesMut::from(&rest[..]);
                c.pending.extend_from_slice(&later);
                break;
            }
            let head = match parse_request(rest, &self.limits) {
                Ok(Some((head, n))) => {
                    at += n;
                    c.fresh = false;
                    head
                }
                Ok(None) => {
                    // A head split across reads: the tokio loop waits for
                    // the rest under the header timeout.
                    c.handover = Some(Handover {
                        rbuf: BytesMut::from(&rest[..]),
                        first: None,
                        head_started: Some(self.now),
                        fresh: c.fresh,
                    });
                    break;
                }
                Err(_) => {
                    // Let the tokio loop answer the error as usual (or
                    // take the connection to HTTP/2, if this was the
                    // preface of one).
                    c.handover = Some(Handover {
                        rbuf: BytesMut::from(&rest[..]),
                        fresh: c.fresh,
                        ..Default::default()
                    });
                    break;
                }
            };
            if head.body != BodyFraming::None || head.expect_continue {
                c.handover = Some(Handover {
                    rbuf: BytesMut::from(&rest[..]),
                    ..Default::default()
                });
                break;
            }
            self.answering = Some((slot, c.out.len()));
            let reply = match self.cache.at_once(
                &head,
                &mut c.out,
                INLINE_BODY,
                &mut self.spare_head,
                &mut self.tally,
            ) {
                AtOnce::Written { close: false } => continue,
                AtOnce::Written { close: true } => {
                    c.close_after = true;
                    break;
                }
                AtOnce::Reply(r) => r,
                AtOnce::Later => {
                    c.handover = Some(Handover {
                        rbuf: BytesMut::from(&rest[..]),
                        ..Default::default()
                    });
                    break;
                }
            };
            let head_only = head.method == Method::Head;
            let close = reply.close || !head.keep_alive;
            if !inline(&reply, head_only) {
                c.handover = Some(Handover {
                    rbuf: BytesMut::from(&data[at..]),
                    first: Some((reply, head_only, close)),
                    head_started: None,
                    fresh: false,
                });
                break;
            }
            append(&mut c.out, reply, head_only, &mut self.spare_head);
            if close {
                c.close_after = true;
                break;
            }
        }
    }

    /// Moves a connection on after an event: sends what is answered, then
    /// answers what arrived meanwhile, then closes, hands over or keeps
    /// its receive armed.
    fn advance(&mut self, slot: usize) {
        loop {
            let Some(c) = self.conns[slot].as_mut() else {
                return;
            };
            if c.sending {
                return;
            }
            if c.closing {
                c.out.clear();
                c.sent = 0;
            }
            if c.sent < c.out.len() {
                c.sending = true;
                c.since = self.now;
                let e = opcode::Send::new(
                    types::Fd(c.fd),
                    c.out[c.sent..].as_ptr(),
                    (c.out.len() - c.sent) as u32,
                )
                .build()
                .user_data((slot as u64) << 1 | OP_SEND);
                self.queue.push_back(e);
                return;
            }
            c.out.clear();
            c.sent = 0;
            if c.pending.is_empty() || c.closing || c.close_after || c.handover.is_some() {
                break;
            }
            let d = c.pending.split().freeze();
            self.answer(slot, d);
        }
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        let done = c.closing || c.close_after || c.handover.is_some() || c.peer_closed;
        if done {
            if c.armed {
                if !c.cancelling {
                    c.cancelling = true;
                    self.queue.push_back(cancel_recv(slot));
                }
                return;
            }
            let keep = !c.closing && !c.close_after;
            return match c.handover.take() {
                Some(h) if keep => self.hand_over(slot, h),
                _ => self.close(slot),
            };
        }
        if c.out.capacity() > 4096 {
            c.out = Vec::new(); // idle connections stay cheap
        }
        if c.pending.capacity() > 4096 {
            c.pending = BytesMut::new();
        }
        if !c.armed {
            c.armed = true;
            let fd = c.fd;
            self.queue.push_back(recv_entry(fd, slot));
        }
    }

    fn sent(&mut self, slot: usize, res: i32) {
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        c.sending = false;
        if res <= 0 {
            c.closing = true;
        } else {
            c.sent += res as usize;
            c.since = self.now;
        }
        self.advance(slot);
    }

    /// Gives the connection to the tokio loop, which keeps it.
    fn hand_over(&mut self, slot: usize, h: Handover) {
        let Some(c) = self.conns[slot].take() else {
            return;
        };
        self.free.push(slot);
        // The connection's count goes with it (released when it drops).
        let counted = ConnectionSlot::adopt(&self.cache);
        // SAFETY: the descriptor is ours and nothing is in flight on it;
        // from here the std stream owns it.
        let stream = unsafe { std::net::TcpStream::from_raw_fd(c.fd) };
        // SAFETY: the AsyncFd owns the socket from here on.
        let stream = match unsafe { AsyncFd::register(stream) } {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register connection");
                return;
            }
        };
        let peer = c.peer;
        tokio::spawn(async move {
            connection_from(counted.cache(), stream, peer, h).await;
        });
    }

    /// Cancels receives idle too long and sends stuck too long; their
    /// completions then close the connections.
    fn sweep(&mut self, idle: Duration, send_timeout: Duration) {
        let now = self.now;
        for (slot, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c else { continue };
            if c.closing {
                continue;
            }
            let waited = now.duration_since(c.since);
            let op = if c.sending && waited > send_timeout {
                self.cache.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                OP_SEND
            } else if !c.sending && c.armed && !c.cancelling && waited > idle {
                c.cancelling = true;
                OP_RECV
            } else {
                continue;
            };
            c.closing = true;
            self.queue.push_back(
                opcode::AsyncCancel::new((slot as u64) << 1 | op)
                    .build()
                    .user_data(CANCEL),
            );
        }
    }
}

/// Small enough to be copied into the send buffer.
fn inline(r: &Reply, head_only: bool) -> bool {
    match &r.body {
        ReplyBody::Empty => true,
        ReplyBody::Full(b) => head_only || b.len() <= INLINE_BODY,
        ReplyBody::Shared { bytes, .. } => head_only || bytes.len() <= INLINE_BODY,
        ReplyBody::Stream { .. } => false,
    }
}

fn append(out: &mut Vec<u8>, reply: Reply, head_only: bool, spare: &mut Vec<u8>) {
    out.extend_from_slice(&reply.head);
    let body: &[u8] = match &reply.body {
        ReplyBody::Full(b) if !head_only => b,
        ReplyBody::Shared { bytes, .. } if !head_only => bytes,
        _ => &[],
    };
    if let Some(s) = &reply.stats {
        s.served(body.len() as u64);
    }
    out.extend_from_slice(body);
    if reply.head.capacity() <= 4096 {
        *spare = reply.head;
    }
}
