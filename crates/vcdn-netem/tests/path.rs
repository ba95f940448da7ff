//! A shim in front of a real TCP server on loopback: the delays, rates,
//! queue bounds and closes a client sees.
//!
//! The server speaks a line protocol: a line "N" asks for N bytes, "reset"
//! makes it reset the connection, and at end of input it says "bye\n" and
//! closes. It counts the bytes it managed to write.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use vcdn_netem::{Limits, PathSpec, Shim};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// The test server; returns its address and the bytes it has written.
async fn server() -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind(any()).await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let written = Arc::new(AtomicU64::new(0));
    let w = written.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(serve(s, w.clone()));
        }
    });
    (addr, written)
}

async fn serve(s: TcpStream, written: Arc<AtomicU64>) {
    let _ = s.set_nodelay(true);
    let (r, mut w) = s.into_split();
    let mut lines = BufReader::new(r).lines();
    let piece = vec![b'x'; 64 << 10];
    while let Ok(Some(line)) = lines.next_line().await {
        if line == "reset" {
            let s = w.reunite(lines.into_inner().into_inner()).expect("halves");
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            return;
        }
        let mut left: usize = line.trim().parse().unwrap_or(0);
        while left > 0 {
            let n = left.min(piece.len());
            if w.write_all(&piece[..n]).await.is_err() {
                return;
            }
            written.fetch_add(n as u64, Relaxed);
            left -= n;
        }
    }
    let _ = w.write_all(b"bye\n").await;
}

/// Ask for `n` bytes on `s` and read them; the time it took.
async fn ask(s: &mut TcpStream, n: usize) -> Duration {
    let t = Instant::now();
    s.write_all(format!("{n}\n").as_bytes())
        .await
        .expect("write");
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).await.expect("answer");
    t.elapsed()
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("connect");
    let _ = s.set_nodelay(true);
    s
}

/// Wait (at most 5 s) until the shim's counters satisfy `f`: a client
/// can read bytes before the shim has counted writing them.
async fn stats_until(shim: &Shim, f: impl Fn(&vcdn_netem::ShimStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f(&shim.stats()) {
        assert!(Instant::now() < deadline, "{:?}", shim.stats());
        tokio::time::sleep(ms(10)).await;
    }
}

fn within(d: Duration, lo: u64, hi: u64) -> bool {
    d >= ms(lo) && d < ms(hi)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_costs_both_delays_and_a_new_connection_one_more() {
    let (target, _) = server().await;
    let shim = Shim::spawn_thread(any(), target, PathSpec::delay(ms(100))).expect("shim");
    let t = Instant::now();
    let mut s = connect(shim.local_addr()).await;
    // The handshake's round trip, then the request's.
    ask(&mut s, 1).await;
    let first = t.elapsed();
    assert!(within(first, 400, 500), "first answer after {first:?}");
    let mut rtts = Vec::new();
    for _ in 0..3 {
        let rtt = ask(&mut s, 1).await;
        assert!(within(rtt, 200, 300), "round trip {rtt:?}");
        rtts.push(rtt);
    }
    eprintln!("2 × 100 ms path: first answer {first:?}, round trips {rtts:?}");
    stats_until(&shim, |st| {
        (st.connections, st.active, st.bytes_up, st.bytes_down) == (1, 1, 8, 4)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_through_a_cap_takes_its_size_over_the_rate() {
    let (target, _) = server().await;
    let spec = PathSpec::default().with_rate_bps(4_000_000);
    let shim = Shim::spawn_thread(any(), target, spec).expect("shim");
    let mut s = connect(shim.local_addr()).await;
    // 1 MB at 4 Mbit/s: 2 s.
    let took = ask(&mut s, 1_000_000).await;
    assert!(within(took, 1600, 2400), "1 MB at 4 Mbit/s took {took:?}");
    eprintln!("1 MB at 4 Mbit/s: {took:?} (2 s expected)");
    stats_until(&shim, |st| st.bytes_down == 1_000_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_downloads_share_the_cap_evenly() {
    let (target, _) = server().await;
    let spec = PathSpec::default().with_rate_bps(4_000_000);
    let shim = Shim::spawn_thread(any(), target, spec).expect("shim");
    let mut a = connect(shim.local_addr()).await;
    let mut b = connect(shim.local_addr()).await;
    ask(&mut a, 1).await;
    ask(&mut b, 1).await;
    // 500 kB each, 1 MB in all at 4 Mbit/s: both take ~2 s. Had one gone
    // first, it would have taken 1 s.
    let (ta, tb) = tokio::join!(ask(&mut a, 500_000), ask(&mut b, 500_000));
    eprintln!("two 500 kB downloads at 4 Mbit/s: {ta:?} and {tb:?} (2 s expected)");
    assert!(within(ta, 1600, 2400), "{ta:?}");
    assert!(within(tb, 1600, 2400), "{tb:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_changes_of_rate_and_delay_take_effect() {
    let (target, _) = server().await;
    let slow = PathSpec::default().with_rate_bps(2_000_000);
    let shim = Shim::spawn_thread(any(), target, slow).expect("shim");
    let mut s = connect(shim.local_addr()).await;
    // 1 MB at 2 Mbit/s would take 4 s; after the first 250 kB (1 s) the
    // rate goes to 16 Mbit/s, and the other 750 kB take 0.375 s.
    let t = Instant::now();
    s.write_all(b"1000000\n").await.expect("write");
    let (mut got, mut buf) = (0, vec![0; 64 << 10]);
    let mut changed = None;
    while got < 1_000_000 {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed after {got} bytes");
        got += n;
        if got >= 250_000 && changed.is_none() {
            shim.set(PathSpec::default().with_rate_bps(16_000_000));
            changed = Some(Instant::now());
        }
    }
    let (before, after) = (
        changed.expect("changed") - t,
        changed.expect("changed").elapsed(),
    );
    eprintln!("rate 2 → 16 Mbit/s: 250 kB in {before:?}, 750 kB in {after:?}");
    assert!(within(before, 800, 1300), "{before:?}");
    assert!(within(after, 300, 700), "{after:?}");

    // A delay set now applies to the next round trip.
    shim.set(PathSpec::delay(ms(20)));
    let short = ask(&mut s, 1).await;
    shim.set(PathSpec::delay(ms(120)));
    let long = ask(&mut s, 1).await;
    assert!(within(short, 40, 120), "{short:?}");
    assert!(within(long, 240, 340), "{long:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_stops_reading_so_the_sender_is_held_back() {
    let (target, written) = server().await;
    let spec = PathSpec {
        queue_bytes: Some(64 << 10),
        ..PathSpec::default()
    };
    let shim = Shim::spawn_thread(any(), target, spec).expect("shim");
    let sock = TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(64 << 10).expect("rcvbuf");
    let mut s = sock.connect(shim.local_addr()).await.expect("connect");
    // Ask for 256 MB and read nothing: the server is stopped once the
    // kernel's buffers and the shim's queue are full.
    const ALL: u64 = 256 << 20;
    s.write_all(format!("{ALL}\n").as_bytes())
        .await
        .expect("write");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(ms(300)).await;
        let now = written.load(Relaxed);
        if now == last {
            break;
        }
        assert!(Instant::now() < deadline, "the server never stopped: {now}");
        last = now;
    }
    let st = shim.stats();
    eprintln!(
        "held back after {last} bytes; queue peak {}",
        st.queue_peak_bytes
    );
    assert!(last < ALL, "the server wrote everything");
    assert!(st.queue_peak_bytes <= 64 << 10, "{st:?}");
    assert!(st.queued_bytes <= 64 << 10, "{st:?}");
    assert!(st.queued_bytes > 0, "{st:?}");
    // Reading resumes the flow, and every byte arrives.
    let mut buf = vec![0; 1 << 20];
    let mut got = 0u64;
    while got < ALL {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed after {got} bytes");
        got += n as u64;
    }
    assert_eq!(written.load(Relaxed), ALL);
    assert!(shim.stats().queue_peak_bytes <= 64 << 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_close_reaches_the_target_after_the_data_and_the_answer_still_comes_back() {
    let (target, _) = server().await;
    let shim = Shim::spawn_thread(any(), target, PathSpec::delay(ms(50))).expect("shim");
    let t = Instant::now();
    let mut s = connect(shim.local_addr()).await;
    s.write_all(b"5\n").await.expect("write");
    s.shutdown().await.expect("shutdown");
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, b"xxxxxbye\n");
    assert!(t.elapsed() >= ms(200), "{:?}", t.elapsed());
    stats_until(&shim, |st| st.active == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_by_the_target_reaches_the_client_one_delay_later() {
    let (target, _) = server().await;
    let shim = Shim::spawn_thread(any(), target, PathSpec::delay(ms(50))).expect("shim");
    let mut s = connect(shim.local_addr()).await;
    ask(&mut s, 1).await;
    let t = Instant::now();
    s.write_all(b"reset\n").await.expect("write");
    let mut buf = [0; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(
        matches!(r, Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    assert!(within(t.elapsed(), 100, 300), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_target_closes_the_client_after_one_round_trip() {
    let dead = std::net::TcpListener::bind(any()).expect("bind");
    let target = dead.local_addr().expect("addr");
    drop(dead);
    let shim = Shim::spawn_thread(any(), target, PathSpec::delay(ms(50))).expect("shim");
    let t = Instant::now();
    let mut s = connect(shim.local_addr()).await;
    let mut buf = [0; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(!matches!(r, Ok(n) if n > 0), "{r:?}");
    assert!(within(t.elapsed(), 100, 300), "{:?}", t.elapsed());
    assert_eq!(shim.stats().connect_failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused_until_one_ends() {
    let (target, _) = server().await;
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let shim = Shim::spawn_thread_with(any(), target, PathSpec::default(), limits).expect("shim");
    let mut a = connect(shim.local_addr()).await;
    let mut b = connect(shim.local_addr()).await;
    ask(&mut a, 1).await;
    ask(&mut b, 1).await;
    // The third is reset at once (its connect may already see it).
    if let Ok(mut c) = TcpStream::connect(shim.local_addr()).await {
        let mut buf = [0; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("refused in time");
        assert!(!matches!(r, Ok(n) if n > 0), "{r:?}");
    }
    assert_eq!(shim.stats().refused, 1);
    drop(a);
    stats_until(&shim, |st| st.active == 1).await;
    let mut d = connect(shim.local_addr()).await;
    ask(&mut d, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shim_on_the_callers_runtime_stops_when_dropped() {
    let (target, _) = server().await;
    let shim = Shim::start(any(), target, PathSpec::delay(ms(10)))
        .await
        .expect("shim");
    let addr = shim.local_addr();
    let mut s = connect(addr).await;
    assert!(within(ask(&mut s, 1).await, 20, 120));
    drop(shim);
    let mut buf = [0; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(!matches!(r, Ok(n) if n > 0), "{r:?}");
}
