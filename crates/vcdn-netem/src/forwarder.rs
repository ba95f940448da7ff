//! The forwarder shared by the packet-level test beds: one thread that
//! reads packets (IP packets from TUN devices, [`crate::testbed`]) or
//! frames (Ethernet frames from TAP devices, [`crate::lan`]) from every
//! device and writes each to the device(s) its router names after the
//! link's one-way delay, behind the link's rate limit and drop-tail queue.
//!
//! Every link is a store-and-forward bottleneck: a packet starts
//! serialising when the link is free (`busy_until`), takes `len × 8 / rate`
//! and arrives `delay` after its last bit left. The bytes still waiting to
//! be serialised are the queue; a packet that would not fit is dropped
//! (drop tail). Released packets wait in one timer heap ordered by arrival
//! time; the thread sleeps in `ppoll` until the earliest arrival or a
//! readable device, with nanosecond timeouts and, when allowed, real-time
//! priority so that a busy machine does not make it late.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes the delay lines of all links may hold together; beyond it packets
/// are dropped (an unlimited link with a long delay would otherwise buffer
/// whatever the senders' windows allow).
pub const MAX_IN_FLIGHT: usize = 256 << 20;

/// Packets read from one TUN before the forwarder looks at the others and
/// at the timer heap.
const READ_BURST: usize = 64;

/// One link's settings (changeable while running) and counters.
#[derive(Default)]
pub(crate) struct LinkCtl {
    pub delay_ns: AtomicU64,
    /// Bit/s; 0: not limited.
    pub rate_bps: AtomicU64,
    pub queue_bytes: AtomicU64,
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub drops: AtomicU64,
}

/// What the forwarder shares with the test bed that started it.
pub(crate) struct Shared {
    /// The number of devices.
    pub n: usize,
    /// Link i → j at `i * n + j`.
    pub links: Vec<LinkCtl>,
    /// Packets the router found no device for (not IPv4, unknown
    /// destination).
    pub unroutable: AtomicU64,
    /// The largest packet read from a device (≤ MTU, plus the Ethernet
    /// header on a TAP, unless the kernel handed segmentation offload to
    /// the device).
    pub max_packet: AtomicU64,
    /// How late the forwarder released packets: the worst, in ns, and how
    /// many were more than 1 ms late.
    pub max_late_ns: AtomicU64,
    pub late_over_1ms: AtomicU64,
}

impl Shared {
    /// `n` devices, every link unlimited with no delay.
    pub fn new(n: usize) -> Shared {
        Shared {
            n,
            links: (0..n * n).map(|_| LinkCtl::default()).collect(),
            unroutable: AtomicU64::new(0),
            max_packet: AtomicU64::new(0),
            max_late_ns: AtomicU64::new(0),
            late_over_1ms: AtomicU64::new(0),
        }
    }

    /// Sets link `from → to`: one-way delay, rate (`None`: unlimited) and
    /// drop-tail queue in bytes (only with a rate).
    pub fn set(&self, from: usize, to: usize, delay: Duration, rate: Option<u64>, queue: u64) {
        let c = &self.links[from * self.n + to];
        c.delay_ns.store(delay.as_nanos() as u64, Relaxed);
        c.rate_bps.store(rate.unwrap_or(0), Relaxed);
        c.queue_bytes.store(queue, Relaxed);
    }

    /// The largest lateness so far.
    pub fn max_late(&self) -> Duration {
        Duration::from_nanos(self.max_late_ns.load(Relaxed))
    }
}

/// Where a packet read from device `from` goes: the router pushes the
/// indices of the devices to `to` (none: unroutable; `from` itself is
/// ignored). Runs on the forwarder thread, for every packet.
pub(crate) trait Router: Send + 'static {
    fn route(&mut self, from: usize, pkt: &[u8], to: &mut Vec<usize>);
}

/// A forwarder running on a thread of its own; dropping it stops the
/// thread and closes the devices (a TUN or TAP device vanishes with its
/// last descriptor).
pub(crate) struct Forwarder {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Starts forwarding between `devices` (index i is device i of
    /// `shared`), routed by `router`.
    pub fn spawn(
        name: &str,
        shared: Arc<Shared>,
        devices: Vec<OwnedFd>,
        router: impl Router,
    ) -> io::Result<Forwarder> {
        let (stop_rx, stop) = eventfd()?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(shared, devices, router, stop_rx))?;
        Ok(Forwarder {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to an open eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), 8) };
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// An eventfd as (reader, writer) — two descriptors of the same counter.
fn eventfd() -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: eventfd(2) and fcntl(2) return new descriptors we own.
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let dup = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
        if dup < 0 {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok((OwnedFd::from_raw_fd(fd), OwnedFd::from_raw_fd(dup)))
    }
}

/// A packet on its way: due at its destination at `due`.
struct Pending {
    due: Instant,
    seq: u64,
    link: usize,
    to: usize,
    data: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

/// Per-link state only the forwarder thread touches.
#[derive(Clone, Copy)]
struct LinkClock {
    /// When the link finishes serialising what it has accepted.
    busy_until: Instant,
    /// The latest arrival scheduled, so a live delay cut never reorders.
    last_due: Instant,
}

/// Runs until `stop` (an eventfd) becomes readable.
fn run(shared: Arc<Shared>, tuns: Vec<OwnedFd>, mut router: impl Router, stop: OwnedFd) {
    realtime();
    let n = shared.n;
    let start = Instant::now();
    let mut clocks = vec![
        LinkClock {
            busy_until: start,
            last_due: start
        };
        n * n
    ];
    let mut heap: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
    let mut in_flight = 0usize;
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65536];
    let mut to_all = Vec::new();
    let mut fds: Vec<libc::pollfd> = tuns
        .iter()
        .chain(std::iter::once(&stop))
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let timeout = heap
            .peek()
            .map(|Reverse(p)| p.due.saturating_duration_since(Instant::now()));
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: fds is a valid array of pollfd of the given length; tsp
        // is null or points to a live timespec; no signal mask is passed.
        let r = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                tsp,
                std::ptr::null(),
            )
        };
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            tracing::error!(error = %io::Error::last_os_error(), "test bed forwarder: ppoll failed");
            return;
        }
        if r > 0 {
            if fds[n].revents != 0 {
                return;
            }
            for (from, pfd) in fds.iter_mut().take(n).enumerate() {
                if pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                    // The device is gone (its namespace was deleted): stop
                    // polling it rather than spin.
                    pfd.fd = -1;
                    continue;
                }
                if pfd.revents & libc::POLLIN == 0 {
                    continue;
                }
                for _ in 0..READ_BURST {
                    // SAFETY: buf is a valid writable buffer of buf.len() bytes.
                    let len = unsafe { libc::read(pfd.fd, buf.as_mut_ptr().cast(), buf.len()) };
                    if len <= 0 {
                        break;
                    }
                    let pkt = &buf[..len as usize];
                    shared.max_packet.fetch_max(pkt.len() as u64, Relaxed);
                    to_all.clear();
                    router.route(from, pkt, &mut to_all);
                    to_all.retain(|&to| to != from && to < n);
                    if to_all.is_empty() {
                        shared.unroutable.fetch_add(1, Relaxed);
                        continue;
                    }
                    let now = Instant::now();
                    for &to in &to_all {
                        let link = from * n + to;
                        let ctl = &shared.links[link];
                        let Some(due) = admit(ctl, &mut clocks[link], now, pkt.len())
                            .filter(|_| in_flight + pkt.len() <= MAX_IN_FLIGHT)
                        else {
                            ctl.drops.fetch_add(1, Relaxed);
                            continue;
                        };
                        ctl.packets.fetch_add(1, Relaxed);
                        ctl.bytes.fetch_add(pkt.len() as u64, Relaxed);
                        in_flight += pkt.len();
                        seq += 1;
                        heap.push(Reverse(Pending {
                            due,
                            seq,
                            link,
                            to,
                            data: pkt.to_vec(),
                        }));
                    }
                }
            }
        }
        let now = Instant::now();
        while heap.peek().is_some_and(|Reverse(p)| p.due <= now) {
            let Reverse(p) = heap.pop().expect("peeked");
            in_flight -= p.data.len();
            let late = Instant::now().saturating_duration_since(p.due);
            shared
                .max_late_ns
                .fetch_max(late.as_nanos() as u64, Relaxed);
            if late > Duration::from_millis(1) {
                shared.late_over_1ms.fetch_add(1, Relaxed);
            }
            // SAFETY: the fd is open (owned by `tuns`) and data is a valid
            // buffer of data.len() bytes.
            let w = unsafe {
                libc::write(tuns[p.to].as_raw_fd(), p.data.as_ptr().cast(), p.data.len())
            };
            if w < 0 {
                shared.links[p.link].drops.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Puts a packet of `len` bytes on a link at `now`: when it arrives, or
/// `None` if the link's queue is full.
fn admit(ctl: &LinkCtl, clock: &mut LinkClock, now: Instant, len: usize) -> Option<Instant> {
    let delay = Duration::from_nanos(ctl.delay_ns.load(Relaxed));
    let rate = ctl.rate_bps.load(Relaxed);
    let mut sent = now;
    if rate > 0 {
        let start = clock.busy_until.max(now);
        let backlog = (start - now).as_nanos() * rate as u128 / 8_000_000_000;
        if backlog + len as u128 > ctl.queue_bytes.load(Relaxed) as u128 {
            return None;
        }
        let serialise = Duration::from_nanos((len as u128 * 8_000_000_000 / rate as u128) as u64);
        clock.busy_until = start + serialise;
        sent = clock.busy_until;
    }
    let due = (sent + delay).max(clock.last_due);
    clock.last_due = due;
    Some(due)
}

/// Asks for real-time scheduling and a 1 ns timer slack, so wake-ups are
/// on time on a busy machine. Best effort: without the privilege the
/// forwarder runs at normal priority (and is less precise under load).
fn realtime() {
    // SAFETY: plain syscalls on the calling thread with valid arguments.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        let p = libc::sched_param { sched_priority: 10 };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "test bed forwarder runs without real-time priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl(delay_ms: u64, rate_bps: u64, queue: u64) -> LinkCtl {
        let c = LinkCtl::default();
        c.delay_ns.store(delay_ms * 1_000_000, Relaxed);
        c.rate_bps.store(rate_bps, Relaxed);
        c.queue_bytes.store(queue, Relaxed);
        c
    }

    #[test]
    fn unlimited_link_only_delays() {
        let t0 = Instant::now();
        let mut clk = LinkClock {
            busy_until: t0,
            last_due: t0,
        };
        let c = ctl(50, 0, 0);
        assert_eq!(
            admit(&c, &mut clk, t0, 1500),
            Some(t0 + Duration::from_millis(50))
        );
    }

    #[test]
    fn rate_serialises_and_queue_drops_tail() {
        let t0 = Instant::now();
        let mut clk = LinkClock {
            busy_until: t0,
            last_due: t0,
        };
        // 12 Mbit/s: a 1500-byte packet takes 1 ms; the queue holds 3 packets.
        let c = ctl(10, 12_000_000, 4500);
        let ms = Duration::from_millis;
        assert_eq!(admit(&c, &mut clk, t0, 1500), Some(t0 + ms(11)));
        assert_eq!(admit(&c, &mut clk, t0, 1500), Some(t0 + ms(12)));
        assert_eq!(admit(&c, &mut clk, t0, 1500), Some(t0 + ms(13)));
        assert_eq!(
            admit(&c, &mut clk, t0, 1500),
            None,
            "4th packet overflows the queue"
        );
        // 1 ms later one packet has left: room again.
        assert_eq!(admit(&c, &mut clk, t0 + ms(1), 1500), Some(t0 + ms(14)));
    }

    #[test]
    fn cutting_the_delay_never_reorders() {
        let t0 = Instant::now();
        let mut clk = LinkClock {
            busy_until: t0,
            last_due: t0,
        };
        let c = ctl(50, 0, 0);
        let first = admit(&c, &mut clk, t0, 100).unwrap();
        c.delay_ns.store(1_000_000, Relaxed);
        let second = admit(&c, &mut clk, t0 + Duration::from_millis(1), 100).unwrap();
        assert!(second >= first);
    }
}
