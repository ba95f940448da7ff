//! The delay-emulating test bed is faithful: real programs in separate
//! network namespaces see the configured round trips (ping, TCP handshakes,
//! also under load), TCP slow start doubles per round trip, rate limits and
//! drop-tail queues hold, and nothing is left behind. Needs root.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::bed::{start_in, InNode};
use vcdn_netem::testbed::{Testbed, TestbedSpec};

mod support;

const MS: Duration = Duration::from_millis(1);

/// One test bed at a time: these tests measure the forwarder's timing to
/// the millisecond, and two beds' forwarders (and their loads) on this
/// machine's two CPUs would measure each other.
static ONE_BED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_bed() -> std::sync::MutexGuard<'static, ()> {
    ONE_BED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `vcdn origin` inside `node`, listening on its address, port 8000.
fn origin_in(tb: &Testbed, node: &str) -> (InNode, SocketAddr) {
    let addr = SocketAddr::from((tb.addr(node).unwrap(), 8000));
    let p = start_in(
        tb,
        node,
        &["origin".into(), "--listen".into(), addr.to_string()],
    );
    (p, addr)
}

/// Connects from `node` (the socket lives in its namespace).
fn connect_from(tb: &Testbed, node: &str, to: SocketAddr) -> TcpStream {
    tb.run_in(node, || {
        TcpStream::connect_timeout(&to, Duration::from_secs(5))
    })
    .unwrap()
    .expect("connect")
}

/// GETs `/dynamic?size=N` on a fresh connection from `node` and returns
/// (when the request was sent, when each read returned and its length).
fn timed_get(
    tb: &Testbed,
    node: &str,
    to: SocketAddr,
    size: u64,
) -> (Instant, Vec<(Instant, usize)>) {
    let mut s = connect_from(tb, node, to);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // One write: a request split over several would wait a round trip
    // for Nagle.
    let req = format!("GET /dynamic?size={size} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let t0 = Instant::now();
    s.write_all(req.as_bytes()).unwrap();
    let mut reads = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        reads.push((Instant::now(), n));
    }
    let total: usize = reads.iter().map(|r| r.1).sum();
    assert!(total as u64 >= size, "got {total} bytes of {size}");
    (t0, reads)
}

/// ping's rtt min/avg/max (ms) from `from` to `to`.
fn ping(tb: &Testbed, from: &str, to: &str, count: u32) -> (f64, f64, f64) {
    let out = tb
        .command(from, "ping")
        .unwrap()
        .args([
            "-n",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            "0.05",
            "-W",
            "2",
        ])
        .arg(tb.addr(to).unwrap().to_string())
        .output()
        .expect("ping (iputils-ping) runs; scripts/test.sh installs it");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ping failed: {text}");
    let line = text
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .expect("ping summary");
    let v: Vec<f64> = line
        .split('=')
        .nth(1)
        .unwrap()
        .trim()
        .split('/')
        .take(3)
        .map(|x| x.trim_end_matches(" ms").parse().unwrap())
        .collect();
    (v[0], v[1], v[2])
}

/// TCP connect times (handshake round trips) from `from` to `to`, ms.
fn handshakes(tb: &Testbed, from: &str, to: SocketAddr, count: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..count)
        .map(|_| {
            tb.run_in(from, || {
                let t = Instant::now();
                let s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect");
                let d = t.elapsed();
                drop(s);
                d.as_secs_f64() * 1000.0
            })
            .unwrap()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// A TCP sink in `node` on a free port: reads and discards, counting
/// bytes. (It stays until the test ends: a measurement made again gets a
/// sink of its own.)
fn sink_in(tb: &Testbed, node: &str, moved: Arc<AtomicU64>) -> SocketAddr {
    let any = SocketAddr::from((tb.addr(node).unwrap(), 0));
    let l = tb.run_in(node, || TcpListener::bind(any)).unwrap().unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let moved = moved.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    moved.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    addr
}

/// Sends bulk data from `node` to `to` until `stop`, paced by the kernel
/// at `bps` (SO_MAX_PACING_RATE) when given, else as fast as TCP goes.
fn bulk_from(
    tb: &Testbed,
    node: &str,
    to: SocketAddr,
    bps: Option<u64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut s = connect_from(tb, node, to);
    if let Some(bps) = bps {
        let rate: u64 = bps / 8;
        // SAFETY: setsockopt with a pointer to a live u64 and its size.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::SOL_SOCKET,
                libc::SO_MAX_PACING_RATE,
                (&rate as *const u64).cast(),
                8,
            )
        };
        assert_eq!(r, 0, "SO_MAX_PACING_RATE");
    }
    std::thread::spawn(move || {
        let buf = vec![1u8; 1 << 16];
        while !stop.load(Ordering::Relaxed) {
            if s.write_all(&buf).is_err() {
                return;
            }
        }
    })
}

#[test]
fn ping_and_handshake_rtts_hold_also_under_load() {
    let _one = one_bed();
    // a–b: the measured path (100 ms, uncapped); c–d: more load on the
    // same forwarder (20 ms, 200 Mbit/s, saturated by unpaced TCP).
    let spec = TestbedSpec::new(["a", "b", "c", "d"])
        .unwrap()
        .rtt("a", "b", 100 * MS)
        .unwrap()
        .rtt("c", "d", 20 * MS)
        .unwrap()
        .rate("c", "d", 200_000_000)
        .unwrap();
    let tb = Testbed::start(spec).expect("test bed starts (needs root)");
    let (_origin, web) = origin_in(&tb, "b");
    // Only lateness (and a load slowed with it) is retried, at most twice,
    // a few seconds apart: this VM's host sometimes deschedules the
    // forwarder for milliseconds in a row (the idle ping then averages
    // 102 ms, in a phase that lasts tens of seconds), which says nothing
    // about the shim; a shim that is late or slow every time still fails,
    // and anything early (shorter than the RTT) or a load that does not
    // move fails at once.
    let mut late = Vec::new();
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_secs(5));
        }
        match rtts_hold(&tb, web) {
            Ok(()) => break,
            Err(e) => {
                eprintln!("late, measuring again: {e}");
                late.push(e);
            }
        }
    }
    assert!(late.len() < 3, "late in three measurements: {late:?}");
    assert!(
        tb.stats().max_packet <= 1500,
        "no offload: packets ≤ MTU, saw {}",
        tb.stats().max_packet
    );
}

/// Pings and handshakes a → b idle, then under load on the forwarder;
/// `Err` when they were late (see the caller).
fn rtts_hold(tb: &Testbed, web: SocketAddr) -> Result<(), String> {
    let idle_ping = ping(tb, "a", "b", 10);
    let idle_hs = handshakes(tb, "a", web, 5);

    // Load: a 50 Mbit/s TCP upload a → b on the measured link (paced, so
    // it builds no queue of its own: ping packets never wait behind a
    // burst) and an unpaced bulk c → d.
    let stop = Arc::new(AtomicBool::new(false));
    let (ab, cd) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sink_b = sink_in(tb, "b", ab.clone());
    let sink_d = sink_in(tb, "d", cd.clone());
    let loads = [
        bulk_from(tb, "a", sink_b, Some(50_000_000), stop.clone()),
        bulk_from(tb, "c", sink_d, None, stop.clone()),
    ];
    // Wait until both run at speed.
    let t = Instant::now();
    while ab.load(Ordering::Relaxed) < 3_000_000 || cd.load(Ordering::Relaxed) < 10_000_000 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the load does not move"
        );
        std::thread::sleep(10 * MS);
    }
    let (ab0, cd0, t0) = (
        ab.load(Ordering::Relaxed),
        cd.load(Ordering::Relaxed),
        Instant::now(),
    );
    let busy_ping = ping(tb, "a", "b", 20);
    let busy_hs = handshakes(tb, "a", web, 5);
    let secs = t0.elapsed().as_secs_f64();
    let mbit = |now: u64, then: u64| (now - then) as f64 * 8.0 / secs / 1e6;
    let (ab_mbit, cd_mbit) = (
        mbit(ab.load(Ordering::Relaxed), ab0),
        mbit(cd.load(Ordering::Relaxed), cd0),
    );
    stop.store(true, Ordering::Relaxed);
    for l in loads {
        let _ = l.join();
    }

    eprintln!("idle ping {idle_ping:?} handshakes {idle_hs:?}");
    eprintln!("under a→b {ab_mbit:.0} Mbit/s, c→d {cd_mbit:.0} Mbit/s: ping {busy_ping:?} handshakes {busy_hs:?}");
    eprintln!("forwarder: {:?}", tb.stats());
    // A descheduled forwarder also slows the loads (ci63: a→b 38 Mbit/s
    // with packets up to 26 ms late): measured again like lateness.
    if ab_mbit <= 40.0 || cd_mbit <= 150.0 {
        return Err(format!(
            "the load was too light: {ab_mbit:.0} and {cd_mbit:.0} Mbit/s, want > 40 and > 150 \
             (the forwarder was up to {:?} late)",
            tb.stats().max_late
        ));
    }
    // The average holds to 1 ms under load; a single late packet does not
    // say the shim is unfaithful: on this 2-vCPU VM the host may deschedule
    // the forwarder for a few ms (a fresh-clone CI run saw one ping of 20
    // at 104.7 ms under load), so the loaded maximum may be 10 % late.
    for (what, (min, avg, max), max_ok) in
        [("idle", idle_ping, 102.0), ("loaded", busy_ping, 110.0)]
    {
        assert!(
            min >= 100.0,
            "{what} ping min {min} ms, shorter than the RTT"
        );
        if avg > 101.0 || max > max_ok {
            return Err(format!(
                "{what} ping avg/max {avg}/{max} ms, want <= 101/{max_ok}"
            ));
        }
    }
    for (what, hs) in [("idle", &idle_hs), ("loaded", &busy_hs)] {
        let median = hs[hs.len() / 2];
        assert!(
            hs[0] >= 100.0,
            "{what} handshake shorter than the RTT: {hs:?}"
        );
        if median > 101.0 {
            return Err(format!(
                "{what} handshake median {median} ms, want within 1 ms of 100: {hs:?}"
            ));
        }
    }
    Ok(())
}

#[test]
fn slow_start_doubles_per_round_trip() {
    let _one = one_bed();
    // The shim runs in user space, so a busy machine can deliver a burst a
    // few ms late and tip part of it into the next round (CI once saw
    // rounds 5 and 6 as 153 / 384 KB instead of 232 / 306 KB). A shim that
    // applies a delay twice, or not at all, or drops the rate, fails every
    // attempt; a scheduling hiccup does not fail three fresh beds in a row.
    let mut problems = Vec::new();
    for attempt in 1..=3 {
        match slow_start_once() {
            Ok(()) => return,
            Err(p) => {
                eprintln!("attempt {attempt}: {p}");
                problems.push(p);
            }
        }
    }
    panic!("slow start did not double per round trip in 3 beds: {problems:#?}");
}

/// One fresh bed (fresh namespaces, so no cached TCP metrics), one 1 MB GET
/// over a 100 ms path; the shape of the transfer, or what is wrong with it.
fn slow_start_once() -> Result<(), String> {
    let rtt = 100 * MS;
    let spec = TestbedSpec::new(["client", "origin"])
        .unwrap()
        .rtt("client", "origin", rtt)
        .unwrap()
        .rate_all(100_000_000);
    let tb = Testbed::start(spec).unwrap();
    let (_origin, web) = origin_in(&tb, "origin");
    let (t0, reads) = timed_get(&tb, "client", web, 1_000_000);
    // Bytes per round: the first window arrives one RTT after the request,
    // each next one an RTT later (each burst lasts < 90 ms at 100 Mbit/s).
    let first = reads[0].0;
    let mut rounds = vec![0usize; 12];
    for (t, n) in &reads {
        let k = ((*t + 10 * MS - first).as_secs_f64() / rtt.as_secs_f64()) as usize;
        rounds[k.min(11)] += n;
    }
    while rounds.last() == Some(&0) {
        rounds.pop();
    }
    let total = reads.last().unwrap().0 - t0;
    eprintln!(
        "bytes per round trip: {rounds:?}; first byte after {:?}, last after {total:?}",
        first - t0
    );
    // 1 MB needs 7 rounds from an initial window of 10 segments.
    if rounds.len() != 7 {
        return Err(format!("{} rounds, want 7: {rounds:?}", rounds.len()));
    }
    if !(14_000..16_000).contains(&rounds[0]) {
        return Err(format!("initial window is not 10 segments: {rounds:?}"));
    }
    for k in 1..5 {
        let ratio = rounds[k] as f64 / rounds[k - 1] as f64;
        if !(1.7..=2.3).contains(&ratio) {
            return Err(format!(
                "round {} / round {k} = {ratio:.2}: {rounds:?}",
                k + 1
            ));
        }
    }
    // First byte one RTT after the request (a delay applied twice or not at
    // all is off by 80 ms or more), last one 7 RTTs plus the last window's
    // serialisation.
    if (first - t0) < rtt || (first - t0) >= rtt + 20 * MS {
        return Err(format!("first byte after {:?}", first - t0));
    }
    if total < 7 * rtt || total >= 7 * rtt + 40 * MS {
        return Err(format!("1 MB took {total:?}"));
    }
    Ok(())
}

#[test]
fn rate_limit_holds_and_full_queue_drops_tail() {
    let _one = one_bed();
    let rate = 50_000_000;
    let spec = TestbedSpec::new(["a", "b", "c"])
        .unwrap()
        .rtt("a", "b", 20 * MS)
        .unwrap()
        .rate("a", "b", rate)
        .unwrap()
        .rate("a", "c", 10_000_000)
        .unwrap()
        .queue("a", "c", 15_000)
        .unwrap();
    let tb = Testbed::start(spec).unwrap();

    // TCP goodput at 50 Mbit/s, past slow start: between the 1st and the 4th MB.
    let (_origin, web) = origin_in(&tb, "b");
    let (_, reads) = timed_get(&tb, "a", web, 4_000_000);
    let (mut got, mut from, mut to) = (0usize, None, None);
    for (t, n) in &reads {
        got += n;
        if got >= 1_000_000 && from.is_none() {
            from = Some((*t, got));
        }
        if got >= 3_900_000 && to.is_none() {
            to = Some((*t, got));
        }
    }
    let ((t1, b1), (t2, b2)) = (from.unwrap(), to.unwrap());
    let goodput = (b2 - b1) as f64 * 8.0 / (t2 - t1).as_secs_f64();
    // The link counts whole IP packets: 1448 payload bytes per 1500.
    let want = rate as f64 * 1448.0 / 1500.0;
    eprintln!(
        "goodput {:.2} Mbit/s, want {:.2}",
        goodput / 1e6,
        want / 1e6
    );
    assert!(
        (goodput / want - 1.0).abs() < 0.04,
        "goodput {goodput:.0} bit/s vs {want:.0}"
    );

    // 100 datagrams of 1500 bytes at once into a 10-packet queue.
    let c = tb.addr("c").unwrap();
    let rx = tb
        .run_in("c", || UdpSocket::bind((c, 9000)))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let tx = tb
        .run_in("a", || UdpSocket::bind((tb.addr("a").unwrap(), 0)))
        .unwrap()
        .unwrap();
    for _ in 0..100 {
        tx.send_to(&[7u8; 1472], (c, 9000)).unwrap();
    }
    let mut buf = [0u8; 2048];
    let mut received = 0;
    while rx.recv(&mut buf).is_ok() {
        received += 1;
    }
    let link = tb.link_stats("a", "c").unwrap();
    eprintln!("udp burst: {received} received, link {link:?}");
    assert_eq!(
        received as u64 + link.drops,
        100,
        "every datagram delivered or counted as dropped"
    );
    assert!(
        (10..=20).contains(&received),
        "a 10-packet queue passes about 10 of a burst, got {received}"
    );
}

#[test]
fn teardown_leaves_nothing_even_after_a_panic() {
    let names = Arc::new(std::sync::Mutex::new(Vec::new()));
    let pid = Arc::new(AtomicU64::new(0));
    let (n2, p2) = (names.clone(), pid.clone());
    let r = std::panic::catch_unwind(move || {
        let spec = TestbedSpec::new(["x", "y", "z"])
            .unwrap()
            .rtt("x", "y", 10 * MS)
            .unwrap();
        let tb = Testbed::start(spec).unwrap();
        for n in tb.nodes() {
            n2.lock()
                .unwrap()
                .push(tb.namespace(n).unwrap().to_string());
        }
        // A process left running inside a node (its Child is never killed).
        let child = tb.command("y", "sleep").unwrap().arg("60").spawn().unwrap();
        p2.store(child.id() as u64, Ordering::Relaxed);
        std::mem::forget(child);
        panic!("the test body fails");
    });
    assert!(r.is_err());
    let names = names.lock().unwrap().clone();
    assert_eq!(names.len(), 3);
    let left: Vec<String> = Testbed::existing_namespaces()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    let pid = pid.load(Ordering::Relaxed) as libc::pid_t;
    let t = Instant::now();
    // Reap it (it was our child) and check that it was killed.
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child's pid.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the process in the node still runs"
        );
        std::thread::sleep(10 * MS);
    }
}
