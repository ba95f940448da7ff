//! Relay cost, splice vs sockmap, same run: bytes relayed per CPU-second
//! over loopback. Run with
//! `cargo test -p vcdn-accel --test relay_cost -- --ignored --nocapture`
//! (add `--release` for optimised user space; the relaying is kernel work).
//!
//! Source and sink are threads of this process; the relay runs on its own
//! thread. Reported per mode: the relay thread's own CPU (user+sys), and
//! the whole cost = this process's CPU + the kernel workers' CPU (sockmap
//! sends redirected skbs from a kworker, and its verdict runs in the
//! source's softirq) minus the same for a direct source → sink transfer.
//! The splice relay here exists only for this comparison (the proxy's own
//! lives in `splice.rs`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use vcdn_accel::sockmap::Sockmap;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn cpu(who: i32) -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// CPU seconds of all kernel worker threads (kworker, ksoftirqd).
fn kernel_workers() -> f64 {
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(s) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = s.rsplit_once(')') else {
            continue;
        };
        if !(head.contains("(kworker") || head.contains("(ksoftirqd")) {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 13 {
            total +=
                (f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0)) / tick;
        }
    }
    total
}

fn splice_exact(from: &TcpStream, to: &TcpStream, n: u64, pipe: (i32, i32)) {
    let mut left = n;
    while left > 0 {
        let got = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                pipe.1,
                std::ptr::null_mut(),
                left.min(1 << 20) as usize,
                libc::SPLICE_F_MOVE,
            )
        };
        assert!(got > 0, "splice in: {}", std::io::Error::last_os_error());
        let mut out = got as usize;
        while out > 0 {
            let put = unsafe {
                libc::splice(
                    pipe.0,
                    std::ptr::null_mut(),
                    to.as_raw_fd(),
                    std::ptr::null_mut(),
                    out,
                    libc::SPLICE_F_MOVE,
                )
            };
            assert!(put > 0, "splice out: {}", std::io::Error::last_os_error());
            out -= put as usize;
        }
        left -= got as u64;
    }
}

/// The source sends `count` exchanges of `size` bytes, each only after the
/// sink has the previous one and the relay (if any) has returned: a hop
/// carries one exchange at a time, and the proxy sends the next request
/// only after it relayed the previous answer.
fn endpoints(
    mut source: TcpStream,
    mut sink: TcpStream,
    size: u64,
    count: u32,
    relayed: Option<std::sync::mpsc::Receiver<()>>,
) -> (std::thread::JoinHandle<()>, std::thread::JoinHandle<()>) {
    let (done, next) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let buf = vec![b'x'; 1 << 20];
        for _ in 0..count {
            let mut left = size;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                source.write_all(&buf[..n]).unwrap();
                left -= n as u64;
            }
            let _ = next.recv();
            if let Some(r) = &relayed {
                let _ = r.recv();
            }
        }
    });
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..count {
            let mut left = size;
            while left > 0 {
                let n = sink.read(&mut buf[..left.min(1 << 20) as usize]).unwrap();
                assert!(n > 0);
                left -= n as u64;
            }
            let _ = done.send(());
        }
    });
    (writer, reader)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Splice,
    Sockmap,
}

/// Move `count` exchanges of `size` bytes; returns (wall, relay thread
/// CPU, process + kernel worker CPU).
fn run(mode: Mode, size: u64, count: u32, map: &Sockmap) -> (f64, f64, f64) {
    let (source, from) = pair();
    let (to, sink) = pair();
    for s in [&source, &from, &to, &sink] {
        s.set_nodelay(true).unwrap();
    }
    let t0 = (Instant::now(), cpu(libc::RUSAGE_SELF), kernel_workers());
    let (relayed, relays) = std::sync::mpsc::channel::<()>();
    let (writer, reader) = endpoints(source, sink, size, count, Some(relays));
    let relay_cpu = match mode {
        Mode::Splice => {
            let mut p = [0; 2];
            unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) };
            unsafe {
                libc::fcntl(p[1], 1031 /* F_SETPIPE_SZ */, 1 << 20)
            };
            let c0 = cpu(libc::RUSAGE_THREAD);
            for _ in 0..count {
                splice_exact(&from, &to, size, (p[0], p[1]));
                let _ = relayed.send(());
            }
            let c = cpu(libc::RUSAGE_THREAD) - c0;
            unsafe { libc::close(p[0]) };
            unsafe { libc::close(p[1]) };
            c
        }
        Mode::Sockmap => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                from.set_nonblocking(true).unwrap();
                to.set_nonblocking(true).unwrap();
                let f = tokio::net::TcpStream::from_std(from).unwrap();
                let t = tokio::net::TcpStream::from_std(to).unwrap();
                let c0 = cpu(libc::RUSAGE_THREAD);
                for _ in 0..count {
                    map.relay_exact(&f, &t, size, Duration::from_secs(20))
                        .await
                        .unwrap();
                    let _ = relayed.send(());
                }
                cpu(libc::RUSAGE_THREAD) - c0
            })
        }
    };
    writer.join().unwrap();
    reader.join().unwrap();
    (
        t0.0.elapsed().as_secs_f64(),
        relay_cpu,
        cpu(libc::RUSAGE_SELF) - t0.1 + kernel_workers() - t0.2,
    )
}

/// A direct run needs the source connected to the sink itself.
fn run_direct(size: u64, count: u32) -> (f64, f64, f64) {
    let (source, sink) = pair();
    let t0 = (Instant::now(), cpu(libc::RUSAGE_SELF), kernel_workers());
    let (writer, reader) = endpoints(source, sink, size, count, None);
    writer.join().unwrap();
    reader.join().unwrap();
    (
        t0.0.elapsed().as_secs_f64(),
        0.0,
        cpu(libc::RUSAGE_SELF) - t0.1 + kernel_workers() - t0.2,
    )
}

#[test]
#[ignore]
fn relay_cost_splice_vs_sockmap() {
    let map = Sockmap::new(16).expect("sockmap loads");
    let gbit = |bytes: f64, s: f64| bytes * 8.0 / 1e9 / s;
    for (name, size, count) in [
        ("500 KB x 400", 500_000u64, 400u32),
        ("1 GiB x 1", 1 << 30, 1),
    ] {
        let bytes = (size * count as u64) as f64;
        for round in 1..=3 {
            let (dw, _, dc) = run_direct(size, count);
            println!(
                "{name} round {round}: direct   {:6.2} Gbit/s, process+kworkers {dc:.3} s",
                gbit(bytes, dw)
            );
            for mode in [Mode::Splice, Mode::Sockmap] {
                let (w, rc, all) = run(mode, size, count, &map);
                let extra = (all - dc).max(1e-3);
                println!(
                    "{name} round {round}: {:8} {:6.2} Gbit/s, relay thread {rc:.3} s = {:7.1} Gbit per CPU-s; relay incl. kernel work {extra:.3} s = {:6.1} Gbit per CPU-s",
                    format!("{mode:?}"),
                    gbit(bytes, w),
                    gbit(bytes, rc.max(1e-3)),
                    gbit(bytes, extra),
                );
            }
        }
    }
}
