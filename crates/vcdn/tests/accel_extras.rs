//! vcdn-accel's extras with real processes on loopback: reactive start
//! (`vcdn reactive` holding a socket for `vcdn origin --listen-fd 3`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const VCDN: &str = env!("CARGO_BIN_EXE_vcdn");

/// A `vcdn reactive` holder; its stdout (and its servers', which inherit
/// it) is drained into `lines`. Killed when dropped (its server then gets
/// SIGTERM through PR_SET_PDEATHSIG).
struct Holder {
    child: Child,
    addr: SocketAddr,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    started: std::cell::Cell<usize>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn drain(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

fn holder(bin: &str, server: &[&str]) -> Holder {
    let mut child = Command::new(bin)
        .args(["reactive", "--listen", "127.0.0.1:0", "--"])
        .arg(bin)
        .args(server)
        .env("VCDN_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vcdn reactive starts");
    let lines = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let first = lines
        .recv_timeout(Duration::from_secs(10))
        .expect("the holder prints its address");
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|s| s.split([',', ' ']).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    Holder {
        child,
        addr,
        lines,
        stderr,
        started: std::cell::Cell::new(0),
    }
}

impl Holder {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Servers started so far (each prints its address).
    fn starts(&self) -> usize {
        let new = self
            .lines
            .try_iter()
            .filter(|l| l.contains("vcdn origin listening on"))
            .count();
        self.started.set(self.started.get() + new);
        self.started.get()
    }
}

/// The holder's running children (its server), from /proc.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// GET `path` on a fresh connection; the time from connect to the first
/// response byte, and the whole response.
fn get(addr: SocketAddr, path: &str) -> (Duration, String) {
    let start = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut first = [0u8; 1];
    s.read_exact(&mut first).expect("a response");
    let ttfb = start.elapsed();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("the whole response");
    let mut text = String::from_utf8_lossy(&first).into_owned();
    text.push_str(&String::from_utf8_lossy(&rest));
    (ttfb, text)
}

#[test]
fn reactive_start_serves_the_first_connection_restarts_after_idle_and_stops_on_sigterm() {
    let h = holder(VCDN, &["origin", "--listen-fd", "3", "--idle-exit", "0.3"]);
    // Holding: no server runs before a connection arrives.
    std::thread::sleep(Duration::from_millis(100));
    assert!(children(h.pid()).is_empty());
    assert_eq!(h.starts(), 0);

    // The first connection is served through a cold start.
    let (_, r) = get(h.addr, "/size/1000");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.ends_with(&"0123456789abcdefghijklmnopqrstuvwxyz".repeat(28)[..1000]));
    let first_server = children(h.pid());
    assert_eq!(first_server.len(), 1);
    // More connections while it runs go to the same server.
    let (_, r) = get(h.addr, "/healthz");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert_eq!(children(h.pid()), first_server);

    // Idle for 0.3 s: the server exits, the holder holds again.
    wait_for("the idle server to exit", 10, || {
        children(h.pid()).is_empty()
    });
    assert!(!alive(first_server[0]));
    // The next connection starts it again.
    let (_, r) = get(h.addr, "/healthz");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let second = children(h.pid());
    assert_eq!(second.len(), 1);
    assert_ne!(second, first_server);
    wait_for("two server starts", 5, || h.starts() == 2);

    // SIGTERM to the holder while its server runs stops both.
    let _ = get(h.addr, "/healthz");
    let server = children(h.pid());
    assert_eq!(server.len(), 1);
    unsafe { libc::kill(h.pid() as i32, libc::SIGTERM) };
    let mut h = h;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = h.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "holder ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
    wait_for("no process left", 5, || !alive(server[0]));
    // The port is free again: nothing holds it.
    assert!(TcpStream::connect_timeout(&h.addr, Duration::from_secs(1)).is_err());
}

#[test]
fn a_failing_server_is_restarted_with_backoff_and_the_client_waits() {
    // fd 9 is not open in the server: it exits with an error at once.
    let h = holder(VCDN, &["origin", "--listen-fd", "9", "--idle-exit", "1"]);
    let mut c = TcpStream::connect(h.addr).expect("the holder's queue takes the connection");
    std::thread::sleep(Duration::from_millis(1500));
    let log: Vec<String> = h.stderr.try_iter().collect();
    let failures = log.iter().filter(|l| l.contains("server failed")).count();
    // Backoff 0.2, 0.4, 0.8 s: at most 4 attempts in 1.5 s, not hundreds.
    assert!((2..=4).contains(&failures), "{failures} failures: {log:#?}");
    assert!(log.iter().any(|l| l.contains("--listen-fd 9")), "{log:#?}");
    // The client is neither served nor refused: it waits in the queue.
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let e = c.read(&mut [0u8; 1]).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{e}"
    );
}

/// `vcdn proxy --reactive`: the proxy's own reactive start. The holder
/// keeps the port; the first client is served by a proxy started for it,
/// which exits when idle and is started again by the next client.
/// A process killed when dropped, also when the test fails.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_reactive_proxy_starts_on_the_first_connection_and_again_after_idle() {
    let mut origin = Command::new(VCDN)
        .args(["origin", "--listen", "127.0.0.1:0"])
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("vcdn origin starts");
    let out = drain(origin.stdout.take().unwrap());
    let _origin = Kill(origin);
    let line = out
        .recv_timeout(Duration::from_secs(10))
        .expect("the origin prints its address");
    let origin_addr: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split([',', ' ', '/']).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let mut child = Command::new(VCDN)
        .args([
            "proxy",
            "--reactive",
            "--name",
            "solo",
            "--listen",
            "127.0.0.1:0",
        ])
        .args([
            "--service",
            "shop",
            "--origin",
            &format!("http://{origin_addr}"),
        ])
        .args(["--idle-exit", "1", "--keep-sysctl"])
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("vcdn proxy --reactive starts");
    let lines = drain(child.stdout.take().unwrap());
    let holder = child.id();
    let _holder = Kill(child);
    let first = lines
        .recv_timeout(Duration::from_secs(10))
        .expect("it prints its address");
    let addr: SocketAddr = first
        .split("http://")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    assert!(
        children(holder).is_empty(),
        "no proxy runs before a client comes"
    );
    for round in 0..2 {
        let (ttfb, resp) = get(addr, "/size/1000");
        assert!(resp.starts_with("HTTP/1.1 200"), "round {round}: {resp}");
        assert!(
            resp.ends_with(&"x".repeat(10)) || resp.len() > 1000,
            "{resp}"
        );
        eprintln!("round {round}: first byte after {ttfb:?} (proxy started for it)");
        assert_eq!(children(holder).len(), 1, "one proxy serves");
        wait_for("the proxy to exit idle", 10, || children(holder).is_empty());
    }
}
