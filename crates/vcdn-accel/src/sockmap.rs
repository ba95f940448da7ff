//! The sockmap relay: moves exactly `n` bytes from one TCP socket to
//! another inside the kernel with a BPF `sk_skb` stream-verdict program, the
//! alternative to the splice relay (same contract as
//! `relay_exact(from, to, n)`).
//!
//! Two `SOCKHASH` maps keyed by socket cookie: `sources` carries the verdict
//! program, so only the `from` sockets of running relays are intercepted;
//! `targets` has no program (a `to` socket's own receive path stays
//! untouched) and is where the verdict redirects to. A `HASH` map `relays`
//! holds per `from` cookie the `to` cookie, a byte counter, a limit and an
//! excess counter: the program adds each skb's length to the counter and
//! calls `bpf_sk_redirect_hash` to the egress of `to` while the sum stays
//! within the limit, and drops (counting the excess) an skb that would
//! cross it, so bytes a source sends past `n` never reach `to` (the relay
//! then fails). The program is hand-assembled eBPF (31 instructions) loaded
//! with raw `bpf(2)`: no BPF toolchain is needed.
//!
//! User space learns progress by polling the counter on a short timer. When
//! it reaches `n` the relay removes `from` (no more redirects), waits until
//! `to`'s write queue has taken every counted byte (`tcpi_bytes_acked` +
//! `SIOCOUTQ`: the kernel sends redirected skbs from a work queue, and
//! removing `to` earlier would drop them), then removes `to`.
//!
//! Bytes that were already queued on `from` before it joined the map are
//! not seen by the verdict until more data arrives, so they are copied in
//! user space first, always emptying the receive queue (see `drain`: the
//! verdict takes whole skbs, and a half-read one would be sent twice and
//! stall the socket); if the counter stalls with bytes still waiting, the
//! relay leaves the map and copies the rest itself (rare, correct, slower).
//! "Waiting" compares the bytes received since the relay's start in the
//! source's stream (what was queued at the start included) with those
//! redirected or copied: counted from the moment of the call instead, the
//! bytes queued before it hid as many stuck ones, and the relay stalled
//! until its timeout (the flaky sockmap chain test, 1 run in 20–40 under
//! load, none in 240 since).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
const BPF_PROG_TYPE_SK_SKB: u32 = 14;
const BPF_SK_SKB_STREAM_VERDICT: u32 = 5;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_GET_SOCKET_COOKIE: i32 = 46;
const BPF_FUNC_SK_REDIRECT_HASH: i32 = 72;
const SO_COOKIE: libc::c_int = 57;
const SIOCOUTQ: libc::c_ulong = 0x5411;
/// Offset of `tcpi_bytes_acked` in `struct tcp_info`.
const TCPI_BYTES_ACKED: usize = 120;
/// Offset of `tcpi_bytes_received`.
const TCPI_BYTES_RECEIVED: usize = 128;

/// One eBPF instruction.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// The verdict program: count the skb's bytes for its relay and redirect
/// it to the relay's target while the count stays within the relay's limit;
/// drop (and count as excess) an skb that would cross it; pass what belongs
/// to no relay. User space polls the counter, so without the limit a
/// source that sends past `n` before the poll notices would have its next
/// bytes redirected too (the kernel cannot split an skb here).
fn verdict_program(relays: RawFd, targets: RawFd) -> Vec<Insn> {
    const MOV64_X: u8 = 0xbf;
    const MOV64_K: u8 = 0xb7;
    const ADD64_K: u8 = 0x07;
    const ADD64_X: u8 = 0x0f;
    const STX_DW: u8 = 0x7b;
    const LDX_W: u8 = 0x61;
    const LDX_DW: u8 = 0x79;
    const ATOMIC_ADD_DW: u8 = 0xdb;
    const LD_IMM64: u8 = 0x18;
    const JEQ_K: u8 = 0x15;
    const JGT_X: u8 = 0x2d;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const PSEUDO_MAP_FD: u8 = 1;
    vec![
        insn(MOV64_X, 6, 1, 0, 0),                       // 0: r6 = skb
        insn(CALL, 0, 0, 0, BPF_FUNC_GET_SOCKET_COOKIE), // 1: r0 = cookie(skb)
        insn(STX_DW, 10, 0, -8, 0),                      // 2: fp[-8] = r0
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, relays),     // 3: r1 = &relays
        insn(0, 0, 0, 0, 0),                             // 4
        insn(MOV64_X, 2, 10, 0, 0),                      // 5: r2 = fp
        insn(ADD64_K, 2, 0, 0, -8),                      // 6: r2 = fp - 8
        insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),   // 7: r0 = relays[cookie]
        insn(JEQ_K, 0, 0, 20, 0),                        // 8: none: pass (29)
        insn(MOV64_X, 7, 0, 0, 0),                       // 9: r7 = relay
        insn(LDX_W, 1, 6, 0, 0),                         // 10: r1 = skb->len
        insn(LDX_DW, 2, 7, 8, 0),                        // 11: r2 = relay.bytes
        insn(ADD64_X, 2, 1, 0, 0),                       // 12: r2 += len
        insn(LDX_DW, 3, 7, 16, 0),                       // 13: r3 = relay.limit
        insn(JGT_X, 2, 3, 11, 0),                        // 14: r2 > r3: drop (26)
        insn(STX_DW, 7, 2, 8, 0),                        // 15: relay.bytes = r2
        insn(LDX_DW, 1, 7, 0, 0),                        // 16: r1 = relay.target
        insn(STX_DW, 10, 1, -16, 0),                     // 17: fp[-16] = target
        insn(MOV64_X, 1, 6, 0, 0),                       // 18: r1 = skb
        insn(LD_IMM64, 2, PSEUDO_MAP_FD, 0, targets),    // 19: r2 = &targets
        insn(0, 0, 0, 0, 0),                             // 20
        insn(MOV64_X, 3, 10, 0, 0),                      // 21: r3 = fp
        insn(ADD64_K, 3, 0, 0, -16),                     // 22: r3 = fp - 16
        insn(MOV64_K, 4, 0, 0, 0),                       // 23: r4 = 0 (egress)
        insn(CALL, 0, 0, 0, BPF_FUNC_SK_REDIRECT_HASH),  // 24: redirect
        insn(EXIT, 0, 0, 0, 0),                          // 25
        insn(ATOMIC_ADD_DW, 7, 1, 24, 0),                // 26: relay.excess += len
        insn(MOV64_K, 0, 0, 0, 0),                       // 27: SK_DROP
        insn(EXIT, 0, 0, 0, 0),                          // 28
        insn(MOV64_K, 0, 0, 0, 1),                       // 29: pass: SK_PASS
        insn(EXIT, 0, 0, 0, 0),                          // 30
    ]
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<libc::c_long> {
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Pack 32-bit fields into a `bpf_attr` (little-endian words).
fn attr(words: &[u32]) -> [u64; 16] {
    let mut a = [0u64; 16];
    for (i, w) in words.iter().enumerate() {
        a[i / 2] |= (*w as u64) << (32 * (i % 2));
    }
    a
}

fn map_create(kind: u32, key: u32, value: u32, max: u32) -> io::Result<OwnedFd> {
    let fd = bpf(BPF_MAP_CREATE, &mut attr(&[kind, key, value, max]))?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn map_op(cmd: libc::c_long, map: &OwnedFd, key: *const u8, value: *const u8) -> io::Result<()> {
    let mut a = attr(&[map.as_raw_fd() as u32, 0]);
    a[1] = key as u64;
    a[2] = value as u64;
    bpf(cmd, &mut a).map(drop)
}

fn cookie(fd: RawFd) -> io::Result<u64> {
    let mut v = 0u64;
    let mut len = 8 as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&mut v as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Bytes ever written into `fd`'s TCP send path: acknowledged plus still
/// queued. Acked is read first, so a concurrent ACK can only make this
/// undercount (never claim a byte that is not in the queue yet).
fn written_total(fd: RawFd) -> io::Result<u64> {
    let info = tcp_info(fd)?;
    let acked = u64::from_ne_bytes(
        info[TCPI_BYTES_ACKED..TCPI_BYTES_ACKED + 8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    let mut outq: libc::c_int = 0;
    if unsafe { libc::ioctl(fd, SIOCOUTQ as _, &mut outq) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(acked + outq.max(0) as u64)
}

/// Where a stalled relay's bytes stopped, for its error. (`FIONREAD` cannot
/// say: on a socket in a sockmap it counts the psock's queue, not TCP's.)
fn state(
    ffd: RawFd,
    from_base: u64,
    counted: u64,
    copied: u64,
    tfd: RawFd,
    to_base: u64,
) -> String {
    let received = received_total(ffd).map_or(0, |r| r.saturating_sub(from_base));
    format!(
        "source: {received} received, {counted} redirected, {copied} copied, peer {}; target: {}",
        if peer_closed(ffd) { "closed" } else { "open" },
        target_state(tfd, to_base)
    )
}

/// A relay target's progress: bytes taken into its send path since `base`,
/// and how many of them still wait in its send queue.
fn target_state(tfd: RawFd, base: u64) -> String {
    let written = written_total(tfd).map_or(0, |w| w.saturating_sub(base));
    let mut outq: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int.
    unsafe { libc::ioctl(tfd, SIOCOUTQ as _, &mut outq) };
    format!("{written} taken, {outq} unsent")
}

fn readable_bytes(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    if unsafe { libc::ioctl(fd, libc::FIONREAD as _, &mut n) } != 0 {
        return 0;
    }
    n.max(0) as usize
}

/// Per relay: the target's cookie, the bytes redirected so far, how many
/// the verdict may redirect, and the bytes it dropped past that limit.
/// Only the source's receive path writes `bytes` (serialised by the
/// socket's lock), and user space rewrites the entry only while the source
/// is out of the map.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RelayEntry {
    target: u64,
    bytes: u64,
    limit: u64,
    excess: u64,
}

/// The loaded program and its maps; one per process is enough, relays run
/// concurrently up to `max_relays`.
pub struct Sockmap {
    sources: OwnedFd,
    targets: OwnedFd,
    relays: OwnedFd,
    _prog: OwnedFd,
    /// How long the counter may stand still with bytes waiting before the
    /// relay finishes in user space.
    pub stall: Duration,
    /// The counter is polled this often.
    pub poll: Duration,
}

impl Sockmap {
    /// Create the maps and load and attach the verdict program (needs
    /// CAP_BPF and CAP_NET_ADMIN). The error says what the kernel refused,
    /// with the verifier's log for a rejected program.
    pub fn new(max_relays: u32) -> io::Result<Sockmap> {
        let sources = map_create(BPF_MAP_TYPE_SOCKHASH, 8, 8, max_relays)?;
        let targets = map_create(BPF_MAP_TYPE_SOCKHASH, 8, 8, max_relays)?;
        let relays = map_create(BPF_MAP_TYPE_HASH, 8, 32, max_relays)?;
        let prog = verdict_program(relays.as_raw_fd(), targets.as_raw_fd());
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let mut a = attr(&[BPF_PROG_TYPE_SK_SKB, prog.len() as u32]);
        a[1] = prog.as_ptr() as u64;
        a[2] = license.as_ptr() as u64;
        a[3] = 1 | ((log.len() as u64) << 32); // log_level 1, log_size
        a[4] = log.as_mut_ptr() as u64;
        let fd = bpf(BPF_PROG_LOAD, &mut a).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            io::Error::new(
                e.kind(),
                format!(
                    "loading the sk_skb verdict program: {e}: {}",
                    String::from_utf8_lossy(&log[..end]).trim()
                ),
            )
        })?;
        let prog_fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        bpf(
            BPF_PROG_ATTACH,
            &mut attr(&[
                sources.as_raw_fd() as u32,
                prog_fd.as_raw_fd() as u32,
                BPF_SK_SKB_STREAM_VERDICT,
                0,
            ]),
        )
        .map_err(|e| io::Error::new(e.kind(), format!("attaching the verdict program: {e}")))?;
        Ok(Sockmap {
            sources,
            targets,
            relays,
            _prog: prog_fd,
            stall: Duration::from_millis(5),
            poll: Duration::from_millis(1),
        })
    }

    fn entry(&self, key: u64) -> RelayEntry {
        let mut e = RelayEntry::default();
        match map_op(
            BPF_MAP_LOOKUP_ELEM,
            &self.relays,
            (&key as *const u64).cast(),
            (&mut e as *mut RelayEntry).cast(),
        ) {
            Ok(()) => e,
            Err(_) => RelayEntry::default(),
        }
    }

    fn counted(&self, key: u64) -> u64 {
        self.entry(key).bytes
    }

    fn set_entry(&self, key: u64, e: &RelayEntry) -> io::Result<()> {
        map_op(
            BPF_MAP_UPDATE_ELEM,
            &self.relays,
            (&key as *const u64).cast(),
            (e as *const RelayEntry).cast(),
        )
    }

    /// Move exactly `n` bytes from `from` to `to` in the kernel; returns
    /// once they are all in `to`'s send path. `from` must carry nothing
    /// else until then. Fails on a closed `from`, or after `timeout`
    /// without progress.
    pub async fn relay_exact(
        &self,
        from: &TcpStream,
        to: &TcpStream,
        n: u64,
        timeout: Duration,
    ) -> io::Result<()> {
        let (ffd, tfd) = (from.as_raw_fd(), to.as_raw_fd());
        let (fc, tc) = (cookie(ffd)?, cookie(tfd)?);
        // The source's base is where the relay starts in its stream: bytes
        // already queued on it count as received for this relay.
        let to_base = written_total(tfd)?;
        let from_base = received_total(ffd)?.saturating_sub(readable_bytes(ffd) as u64);
        let entry = RelayEntry {
            target: tc,
            limit: n,
            ..RelayEntry::default()
        };
        let tfd64 = tfd as u64;
        map_op(
            BPF_MAP_UPDATE_ELEM,
            &self.targets,
            (&tc as *const u64).cast(),
            (&tfd64 as *const u64).cast(),
        )?;
        let mut guard = Joined {
            map: self,
            from: None,
            to: Some(tc),
            relay: None,
        };
        self.set_entry(fc, &entry)?;
        guard.relay = Some(fc);
        // Bytes copied in user space: those queued on `from` before it
        // joins the map, which the verdict sees only when more arrive (and
        // none will if they filled the window).
        let mut copied = 0u64;
        let mut last_move = Instant::now();
        loop {
            let counted = self.counted(fc);
            if readable_bytes(ffd) > 0 && counted + copied < n {
                // Let the target send every redirected byte first: order.
                self.flushed(tfd, to_base, counted + copied, timeout)
                    .await?;
                copied += self.drain(from, to, n - counted - copied, timeout).await?;
                last_move = Instant::now();
            }
            if counted + copied >= n {
                break;
            }
            if peer_closed(ffd) {
                // Pass on what did arrive before leaving the maps.
                guard.leave_source();
                let _ = self
                    .flushed(tfd, to_base, self.counted(fc) + copied, timeout)
                    .await;
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "sockmap relay: source closed after {} of {n} bytes",
                        counted + copied
                    ),
                ));
            }
            // Join and wait for the counter to reach `n`; the verdict may
            // redirect only what user space has not copied.
            self.set_entry(
                fc,
                &RelayEntry {
                    limit: n - copied,
                    ..self.entry(fc)
                },
            )?;
            let ffd64 = ffd as u64;
            map_op(
                BPF_MAP_UPDATE_ELEM,
                &self.sources,
                (&fc as *const u64).cast(),
                (&ffd64 as *const u64).cast(),
            )?;
            guard.from = Some(fc);
            let mut last = counted;
            loop {
                let e = self.entry(fc);
                let c = e.bytes;
                if c + copied >= n || e.excess > 0 {
                    break;
                }
                if c != last {
                    (last, last_move) = (c, Instant::now());
                } else if last_move.elapsed() >= self.stall {
                    // No progress for the whole timeout, whatever the
                    // reason: fail (also when bytes were received but are
                    // seen neither by the verdict nor in the queue).
                    if last_move.elapsed() >= timeout {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "sockmap relay: {} of {n} bytes after {timeout:?} ({})",
                                c + copied,
                                state(ffd, from_base, c, copied, tfd, to_base)
                            ),
                        ));
                    }
                    // Received but not seen by the verdict: stuck in the
                    // queue. Or the source is gone. Leave and look.
                    let received = received_total(ffd)?.saturating_sub(from_base);
                    if received > c + copied || peer_closed(ffd) {
                        break;
                    }
                }
                tokio::time::sleep(self.poll).await;
            }
            guard.leave_source();
            if self.entry(fc).excess > 0 {
                break;
            }
        }
        let e = self.entry(fc);
        if e.excess > 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "sockmap relay: {} bytes arrived where {n} were expected",
                    e.bytes + e.excess + copied
                ),
            ));
        }
        // Every redirected byte must be in `to`'s queue before it leaves
        // the map.
        self.flushed(tfd, to_base, n, timeout).await?;
        drop(guard);
        Ok(())
    }

    /// Copy in user space what is queued on `from`, up to `left` bytes,
    /// reading until the queue is empty. Reading less than all that is
    /// queued could leave an skb half read (new segments coalesce into the
    /// last queued skb between a `FIONREAD` and the read), and the verdict
    /// gets whole skbs (`tcp_read_skb`): it would redirect the half already
    /// copied a second time, count it twice and move the socket's
    /// `copied_seq` past what arrived, after which the kernel stops calling
    /// the verdict (no data looks ready) and the relay stalls.
    async fn drain(
        &self,
        from: &TcpStream,
        to: &TcpStream,
        left: u64,
        timeout: Duration,
    ) -> io::Result<u64> {
        let mut buf = vec![0u8; left.min(1 << 20) as usize];
        let mut copied = 0u64;
        while copied < left {
            let want = (left - copied).min(buf.len() as u64) as usize;
            // A plain non-blocking recv: tokio's `try_read` answers
            // WouldBlock without asking the kernel until its reactor has
            // seen the socket readable.
            let got = unsafe {
                libc::recv(
                    from.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    want,
                    libc::MSG_DONTWAIT,
                )
            };
            if got == 0 {
                break;
            }
            if got < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            crate::conn::write_all(to, &buf[..got as usize], timeout).await?;
            copied += got as u64;
        }
        Ok(copied)
    }

    /// Wait until `to` has taken `bytes` into its send path since `base`.
    async fn flushed(
        &self,
        tfd: RawFd,
        base: u64,
        bytes: u64,
        timeout: Duration,
    ) -> io::Result<()> {
        let start = Instant::now();
        while written_total(tfd)?.saturating_sub(base) < bytes {
            if start.elapsed() >= timeout {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "sockmap relay: {bytes} redirected bytes not sent within {timeout:?} (target: {})",
                        target_state(tfd, base)
                    ),
                ));
            }
            tokio::time::sleep(self.poll).await;
        }
        Ok(())
    }
}

/// Bytes ever received on `fd` (`tcpi_bytes_received`).
fn received_total(fd: RawFd) -> io::Result<u64> {
    let info = tcp_info(fd)?;
    Ok(u64::from_ne_bytes(
        info[TCPI_BYTES_RECEIVED..TCPI_BYTES_RECEIVED + 8]
            .try_into()
            .unwrap_or([0; 8]),
    ))
}

fn tcp_info(fd: RawFd) -> io::Result<[u8; 256]> {
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < TCPI_BYTES_RECEIVED + 8 {
        return Err(io::Error::other(
            "kernel's tcp_info has no tcpi_bytes_received",
        ));
    }
    Ok(info)
}

/// Whether `fd`'s peer has closed its side (state CLOSE_WAIT or later).
fn peer_closed(fd: RawFd) -> bool {
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // TCP_ESTABLISHED = 1; anything else means the stream is ending.
    r == 0 && info[0] != 1
}

/// Removes a relay's sockets and entry from the maps, also on errors.
struct Joined<'a> {
    map: &'a Sockmap,
    from: Option<u64>,
    to: Option<u64>,
    relay: Option<u64>,
}

impl Joined<'_> {
    fn leave_source(&mut self) {
        if let Some(c) = self.from.take() {
            let _ = map_op(
                BPF_MAP_DELETE_ELEM,
                &self.map.sources,
                (&c as *const u64).cast(),
                std::ptr::null(),
            );
        }
    }
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        self.leave_source();
        if let Some(c) = self.relay.take() {
            let _ = map_op(
                BPF_MAP_DELETE_ELEM,
                &self.map.relays,
                (&c as *const u64).cast(),
                std::ptr::null(),
            );
        }
        if let Some(c) = self.to.take() {
            let _ = map_op(
                BPF_MAP_DELETE_ELEM,
                &self.map.targets,
                (&c as *const u64).cast(),
                std::ptr::null(),
            );
        }
    }
}
