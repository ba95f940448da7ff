//! uring-static: vcdn's cache-hit response for `/size/43` served from an
//! io_uring loop — a baseline for `bench/stacks.sh` that answers "would
//! batched submission make the small-object hit path cheaper?".
//!
//! One thread, one ring (single issuer, deferred task running). A multishot
//! accept; per connection one 4 KiB receive buffer, one recv in flight, and
//! the answers to every complete request head in it sent with one send.
//! Each loop submits everything queued and reaps every completion with one
//! `io_uring_enter`. Nothing is parsed beyond finding `\r\n\r\n`.
//!
//! Usage: uring-static ADDR   (e.g. 127.0.0.1:18094)

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

const BODY: &[u8; 43] = b"0123456789abcdefghijklmnopqrstuvwxyz0123456";
const ACCEPT: u64 = u64::MAX;
const OP_RECV: u64 = 0;
const OP_SEND: u64 = 1;

struct Conn {
    fd: RawFd,
    buf: Box<[u8; 4096]>,
    filled: usize,
    out: Vec<u8>,
    sent: usize,
}

fn response(date: &str) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nDate: {date}\r\nContent-Type: application/octet-stream\r\n\
         Cache-Control: public, max-age=3600\r\nETag: \"size-43\"\r\n\
         Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nVia: 1.1 uring-static\r\nAge: 0\r\n\
         X-Cache: HIT\r\nContent-Length: 43\r\n\r\n"
    )
    .into_bytes();
    r.extend_from_slice(BODY);
    r
}

fn http_date() -> String {
    // RFC 9110 IMF-fixdate from the system clock (libc strftime, UTC).
    let mut t: libc::time_t = 0;
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let mut out = [0u8; 64];
    // SAFETY: plain libc calls on valid pointers.
    let n = unsafe {
        libc::time(&mut t);
        libc::gmtime_r(&t, &mut tm);
        libc::strftime(out.as_mut_ptr().cast(), out.len(), c"%a, %d %b %Y %H:%M:%S GMT".as_ptr(), &tm)
    };
    String::from_utf8_lossy(&out[..n]).into_owned()
}

fn push(sq: &mut squeue::SubmissionQueue<'_>, submitter: &io_uring::Submitter<'_>, e: squeue::Entry) {
    // SAFETY: every buffer an entry points at lives in `conns` until its
    // completion is reaped (a connection is freed only after that).
    while unsafe { sq.push(&e) }.is_err() {
        sq.sync();
        submitter.submit().expect("submit");
        sq.sync();
    }
}

fn main() {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .expect("usage: uring-static ADDR")
        .parse()
        .expect("ADDR must be IP:PORT");
    let listener = TcpListener::bind(addr).expect("bind");
    println!("uring-static listening on http://{}", listener.local_addr().expect("addr"));
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(4096)
        .expect("io_uring");
    let (submitter, mut sq, mut cq) = ring.split();
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut date = http_date();
    let mut resp = response(&date);
    let mut last_date = std::time::Instant::now();
    push(
        &mut sq,
        &submitter,
        opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd())).build().user_data(ACCEPT),
    );
    loop {
        sq.sync();
        match submitter.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => panic!("io_uring_enter: {e}"),
        }
        if last_date.elapsed().as_millis() >= 500 {
            let d = http_date();
            if d != date {
                date = d;
                resp = response(&date);
            }
            last_date = std::time::Instant::now();
        }
        cq.sync();
        let done: Vec<(u64, i32, u32)> = (&mut cq).map(|c| (c.user_data(), c.result(), c.flags())).collect();
        for (ud, res, flags) in done {
            if ud == ACCEPT {
                if res >= 0 {
                    let fd = res;
                    let one: libc::c_int = 1;
                    // SAFETY: setting an int option on a socket we own.
                    unsafe {
                        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&one as *const libc::c_int).cast(), 4);
                    }
                    let c = Conn { fd, buf: Box::new([0; 4096]), filled: 0, out: Vec::with_capacity(4096), sent: 0 };
                    let i = match free.pop() {
                        Some(i) => {
                            conns[i] = Some(c);
                            i
                        }
                        None => {
                            conns.push(Some(c));
                            conns.len() - 1
                        }
                    };
                    let c = conns[i].as_mut().expect("just set");
                    let e = opcode::Recv::new(types::Fd(fd), c.buf.as_mut_ptr(), 4096).build().user_data((i as u64) << 1 | OP_RECV);
                    push(&mut sq, &submitter, e);
                }
                if !cqueue::more(flags) {
                    push(&mut sq, &submitter, opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd())).build().user_data(ACCEPT));
                }
                continue;
            }
            let i = (ud >> 1) as usize;
            let Some(c) = conns[i].as_mut() else { continue };
            if ud & 1 == OP_RECV {
                if res <= 0 {
                    // SAFETY: closing our own fd; nothing else is in flight for it.
                    unsafe { libc::close(c.fd) };
                    conns[i] = None;
                    free.push(i);
                    continue;
                }
                c.filled += res as usize;
                // Answer every complete request head; keep a partial one.
                let mut start = 0;
                let data = &c.buf[..c.filled];
                let mut k = 0;
                while k + 4 <= data.len() {
                    if &data[k..k + 4] == b"\r\n\r\n" {
                        c.out.extend_from_slice(&resp);
                        start = k + 4;
                        k += 4;
                    } else {
                        k += 1;
                    }
                }
                c.buf.copy_within(start..c.filled, 0);
                c.filled -= start;
                if c.out.is_empty() {
                    if c.filled == 4096 {
                        unsafe { libc::close(c.fd) };
                        conns[i] = None;
                        free.push(i);
                        continue;
                    }
                    let e = opcode::Recv::new(types::Fd(c.fd), c.buf[c.filled..].as_mut_ptr(), (4096 - c.filled) as u32)
                        .build()
                        .user_data((i as u64) << 1 | OP_RECV);
                    push(&mut sq, &submitter, e);
                } else {
                    c.sent = 0;
                    let e = opcode::Send::new(types::Fd(c.fd), c.out.as_ptr(), c.out.len() as u32)
                        .build()
                        .user_data((i as u64) << 1 | OP_SEND);
                    push(&mut sq, &submitter, e);
                }
            } else {
                if res < 0 {
                    unsafe { libc::close(c.fd) };
                    conns[i] = None;
                    free.push(i);
                    continue;
                }
                c.sent += res as usize;
                if c.sent < c.out.len() {
                    let e = opcode::Send::new(types::Fd(c.fd), c.out[c.sent..].as_ptr(), (c.out.len() - c.sent) as u32)
                        .build()
                        .user_data((i as u64) << 1 | OP_SEND);
                    push(&mut sq, &submitter, e);
                } else {
                    c.out.clear();
                    let e = opcode::Recv::new(types::Fd(c.fd), c.buf[c.filled..].as_mut_ptr(), (4096 - c.filled) as u32)
                        .build()
                        .user_data((i as u64) << 1 | OP_RECV);
                    push(&mut sq, &submitter, e);
                }
            }
        }
    }
}
