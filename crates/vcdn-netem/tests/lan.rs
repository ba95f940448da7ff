//! The layer-2 test bed holds what ANDy's reproduction relies on: a UDP
//! broadcast from any node reaches every other node on every segment, the
//! link between segments delays by its one-way delay each way and caps at
//! its rate, a node's CPU limit holds, and nothing is left behind, also
//! after a panic. Real sockets, ping and processes in real namespaces;
//! needs root.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vcdn_netem::lan::{Flavor, Lan, LanSpec, LinkSpec};

const MS: Duration = Duration::from_millis(1);

/// One test bed at a time: these tests time the forwarder to the
/// millisecond, and two at once on this machine's two CPUs would measure
/// each other.
static ONE_BED: Mutex<()> = Mutex::new(());

fn one_bed() -> std::sync::MutexGuard<'static, ()> {
    ONE_BED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Two segments ("clouds") east and west, `per` nodes each (e1.., w1..).
fn two_clouds(per: usize, link: LinkSpec) -> LanSpec {
    let mut s = LanSpec::new(["east", "west"]).unwrap().link(link);
    for i in 1..=per {
        s = s.node(&format!("e{i}"), "east").unwrap();
        s = s.node(&format!("w{i}"), "west").unwrap();
    }
    s
}

/// ping's rtt min/avg/max (ms) from `from` to `to`.
fn ping(lan: &Lan, from: &str, to: &str, count: u32) -> (f64, f64, f64) {
    let out = lan
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
        .arg(lan.addr(to).unwrap().to_string())
        .output()
        .expect("ping (iputils-ping) runs; scripts/test.sh installs it");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ping {from} → {to} failed: {text}");
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

#[test]
fn a_broadcast_reaches_every_other_node_on_both_segments_once() {
    let _one = one_bed();
    let delay = 20 * MS;
    let lan = Lan::start(two_clouds(3, LinkSpec::delay(delay))).expect("LAN starts (needs root)");
    assert_eq!(lan.broadcast(), Ipv4Addr::new(10, 78, 255, 255));
    let nodes: Vec<String> = lan.nodes().iter().map(|s| s.to_string()).collect();
    // Every node listens on the thesis's discovery port, on any address.
    let sockets: Vec<UdpSocket> = nodes
        .iter()
        .map(|n| {
            lan.run_in(n, || {
                let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 12555))?;
                s.set_broadcast(true)?;
                s.set_read_timeout(Some(20 * MS))?;
                Ok::<_, std::io::Error>(s)
            })
            .unwrap()
            .unwrap()
        })
        .collect();
    // Every node broadcasts once, naming itself, and notes when; the
    // last one to the limited broadcast address, which works too.
    let mut sent = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let to = if i + 1 == nodes.len() {
            Ipv4Addr::BROADCAST
        } else {
            lan.broadcast()
        };
        sent.push(Instant::now());
        sockets[i].send_to(n.as_bytes(), (to, 12555)).unwrap();
        std::thread::sleep(5 * MS);
    }
    // Collect what each node received for half a second after the last.
    let received: Vec<Vec<(String, Instant, Ipv4Addr)>> = std::thread::scope(|s| {
        let hs: Vec<_> = sockets
            .iter()
            .map(|sock| {
                s.spawn(move || {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 1500];
                    let end = Instant::now() + 500 * MS;
                    while Instant::now() < end {
                        if let Ok((n, from)) = sock.recv_from(&mut buf) {
                            let SocketAddr::V4(from) = from else { continue };
                            got.push((
                                String::from_utf8_lossy(&buf[..n]).into_owned(),
                                Instant::now(),
                                *from.ip(),
                            ));
                        }
                    }
                    got
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, got) in received.iter().enumerate() {
        for (i, sender) in nodes.iter().enumerate() {
            if i == r {
                continue;
            }
            let copies: Vec<_> = got.iter().filter(|g| &g.0 == sender).collect();
            assert_eq!(
                copies.len(),
                1,
                "{} got {sender}'s broadcast {} times: {got:?}",
                nodes[r],
                copies.len()
            );
            assert_eq!(copies[0].2, lan.addr(sender).unwrap(), "source address");
            // Received only by `copies[0].1`, measured after the fact:
            // an upper bound on the arrival, so only the lower bound of a
            // crossing is exact.
            let took = copies[0].1 - sent[i];
            let crosses = lan.segment_of(sender).unwrap() != lan.segment_of(&nodes[r]).unwrap();
            if crosses {
                assert!(took >= delay, "{sender} → {} took {took:?}", nodes[r]);
            }
        }
    }
    let st = lan.stats();
    eprintln!("link: {st:?}");
    for (from, to) in [("east", "west"), ("west", "east")] {
        let l = lan.link_stats(from, to).unwrap();
        assert!(l.frames >= 3 && l.drops == 0, "{l:?}");
    }
    assert!(st.max_frame <= 1514, "no offload reaches the TAPs: {st:?}");
}

#[test]
fn ping_across_is_twice_the_delay_and_within_a_segment_near_zero() {
    let _one = one_bed();
    let lan = Lan::start(two_clouds(2, LinkSpec::delay(50 * MS))).expect("LAN starts (needs root)");
    // The first ping of a pair also resolves ARP (a broadcast, one more
    // round trip across): leave it out.
    for to in ["w1", "e2"] {
        ping(&lan, "e1", to, 1);
    }
    let across = ping(&lan, "e1", "w1", 10);
    let within = ping(&lan, "e1", "e2", 10);
    lan.set_link("east", "west", LinkSpec::delay(20 * MS))
        .unwrap();
    ping(&lan, "w2", "e2", 1);
    let changed = ping(&lan, "w2", "e2", 10);
    eprintln!(
        "across {across:?}, within {within:?}, after set_link {changed:?}; {:?}",
        lan.stats()
    );
    // As the TUN test bed's tolerances: the average within 1 ms (plus the
    // bridges' half a millisecond), a single ping up to 10 % late.
    for (what, (min, avg, max), rtt) in [("across", across, 100.0), ("changed", changed, 40.0)] {
        assert!(
            min >= rtt && avg <= rtt + 1.5,
            "{what}: ping min/avg {min}/{avg} ms, want {rtt}..{}",
            rtt + 1.5
        );
        assert!(max <= rtt * 1.1, "{what}: ping max {max} ms");
    }
    assert!(
        within.1 < 1.0 && within.2 < 5.0,
        "within a segment: ping avg/max {}/{} ms",
        within.1,
        within.2
    );
    assert_eq!(lan.link("west", "east").unwrap().delay, 20 * MS);
}

#[test]
fn the_rate_cap_holds_for_a_bulk_tcp_transfer() {
    let _one = one_bed();
    let rate = 20_000_000;
    let lan = Lan::start(two_clouds(1, LinkSpec::delay(10 * MS).with_rate_bps(rate)))
        .expect("LAN starts (needs root)");
    let to = SocketAddr::from((lan.addr("w1").unwrap(), 9000));
    let listener = lan.run_in("w1", || TcpListener::bind(to)).unwrap().unwrap();
    let size = 6_000_000usize;
    let sink = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reads = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < size {
            let n = s.read(&mut buf).expect("read");
            assert!(n > 0, "early end after {got} bytes");
            got += n;
            reads.push((Instant::now(), got));
        }
        reads
    });
    let mut s = lan
        .run_in("e1", || {
            TcpStream::connect_timeout(&to, Duration::from_secs(5))
        })
        .unwrap()
        .unwrap();
    s.write_all(&vec![7u8; size]).unwrap();
    let reads = sink.join().unwrap();
    // Past slow start: from the 1st MB to the 5.5th.
    let at = |b: usize| *reads.iter().find(|r| r.1 >= b).unwrap();
    let ((t1, b1), (t2, b2)) = (at(1_000_000), at(5_500_000));
    let goodput = (b2 - b1) as f64 * 8.0 / (t2 - t1).as_secs_f64();
    // The link counts whole frames: 1448 bytes of payload in 1514.
    let want = rate as f64 * 1448.0 / 1514.0;
    let l = lan.link_stats("east", "west").unwrap();
    eprintln!(
        "goodput {:.2} Mbit/s, want {:.2}; {l:?}",
        goodput / 1e6,
        want / 1e6
    );
    assert!(
        (goodput / want - 1.0).abs() < 0.05,
        "goodput {goodput:.0} bit/s vs {want:.0}"
    );
    assert!(
        l.bytes as usize > size,
        "the transfer crossed the link: {l:?}"
    );
}

#[test]
fn a_broadcast_flood_is_held_by_the_links_queue_and_counted() {
    let _one = one_bed();
    // 10 Mbit/s with room for 10 full frames: a node that floods the
    // subnet cannot make the link buffer more, and every frame is either
    // delivered or counted as dropped.
    let link = LinkSpec::delay(5 * MS)
        .with_rate_bps(10_000_000)
        .with_queue(15_140);
    let lan = Lan::start(two_clouds(1, link)).expect("LAN starts (needs root)");
    let rx = lan
        .run_in("w1", || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 12555)))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(300 * MS)).unwrap();
    let tx = lan
        .run_in("e1", || UdpSocket::bind((lan.addr("e1").unwrap(), 0)))
        .unwrap()
        .unwrap();
    tx.set_broadcast(true).unwrap();
    for _ in 0..100 {
        tx.send_to(&[7u8; 1472], (lan.broadcast(), 12555)).unwrap();
    }
    let mut buf = [0u8; 2048];
    let mut received = 0u64;
    while rx.recv(&mut buf).is_ok() {
        received += 1;
    }
    let l = lan.link_stats("east", "west").unwrap();
    eprintln!("flood: {received} received, {l:?}");
    assert_eq!(received + l.drops, 100, "delivered or counted: {l:?}");
    assert!(
        (10..=20).contains(&received),
        "a 10-frame queue passes about 10 of a burst, got {received}"
    );
    // The link still works after the flood.
    let (min, _, _) = ping(&lan, "w1", "e1", 2);
    assert!(min >= 10.0, "ping after the flood: {min} ms");
}

/// A process's user + system CPU time (`/proc/PID/stat`), seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name's closing parenthesis: field 3 onwards.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf with a valid name.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn a_cpu_limit_holds_a_busy_loop_to_its_share() {
    let _one = one_bed();
    let spec = LanSpec::new(["dc"])
        .unwrap()
        .node("small", "dc")
        .unwrap()
        .cpus("small", 0.25)
        .unwrap()
        .node("medium", "dc")
        .unwrap()
        .flavor("medium", Flavor::M1Medium)
        .unwrap()
        .node("free", "dc")
        .unwrap();
    let lan = Lan::start(spec).expect("LAN starts (needs root)");
    let g = lan.cgroup("medium").unwrap().expect("medium has a cgroup");
    let quota = std::fs::read_to_string(g.dir().join("cpu.cfs_quota_us"))
        .or_else(|_| std::fs::read_to_string(g.dir().join("cpu.max")))
        .unwrap();
    let host = std::thread::available_parallelism().unwrap().get();
    let want = (Flavor::M1Medium.cpus_on(host) * vcdn_netem::cgroup::PERIOD_US as f64) as u64;
    assert!(
        quota.split_whitespace().next() == Some(&want.to_string()),
        "m1.medium on {host} CPUs: quota {quota:?}, want {want}"
    );
    assert!(lan.cgroup("free").unwrap().is_none());

    let busy = |node: &str| {
        lan.command(node, "sh")
            .unwrap()
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap()
    };
    let mut small = busy("small");
    let mut free = busy("free");
    let g = lan.cgroup("small").unwrap().unwrap();
    assert_eq!(
        g.pids(),
        [small.id()],
        "the process runs in the node's cgroup"
    );
    let ns_of = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let node_ns = lan
        .run_in("small", || {
            std::fs::read_link("/proc/thread-self/ns/net").unwrap()
        })
        .unwrap();
    assert_eq!(ns_of(small.id()), node_ns, "and in the node's namespace");
    std::thread::sleep(200 * MS);
    let t0 = Instant::now();
    let (s0, f0) = (cpu_seconds(small.id()), cpu_seconds(free.id()));
    let th0 = lan.cpu_throttling("small").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let secs = t0.elapsed().as_secs_f64();
    let (s1, f1) = (cpu_seconds(small.id()), cpu_seconds(free.id()));
    let th1 = lan.cpu_throttling("small").unwrap();
    let _ = small.kill();
    let _ = free.kill();
    let _ = small.wait();
    let _ = free.wait();
    let (small_share, free_share) = ((s1 - s0) / secs, (f1 - f0) / secs);
    eprintln!("limited to 0.25: {small_share:.3} CPU; unlimited: {free_share:.3} CPU; throttled {th0:?} → {th1:?}");
    assert!(
        (0.12..=0.30).contains(&small_share),
        "a 0.25-CPU node's busy loop got {small_share:.3} CPU"
    );
    assert!(
        th1.throttled > th0.throttled + 5,
        "the quota throttled it: {th0:?} → {th1:?}"
    );
    // The unlimited loop is only printed: on a machine busy with other
    // builds it may get no more than the limited one, and the throttling
    // counter already shows the quota at work.
}

#[test]
fn teardown_leaves_nothing_even_after_a_panic() {
    let _one = one_bed();
    let names = Arc::new(Mutex::new(Vec::<String>::new()));
    let groups = Arc::new(Mutex::new(Vec::<std::path::PathBuf>::new()));
    let pid = Arc::new(AtomicU64::new(0));
    let (n2, g2, p2) = (names.clone(), groups.clone(), pid.clone());
    let r = std::panic::catch_unwind(move || {
        let spec = two_clouds(1, LinkSpec::delay(5 * MS))
            .cpus("w1", 0.5)
            .unwrap();
        let lan = Lan::start(spec).unwrap();
        for n in lan.nodes() {
            n2.lock()
                .unwrap()
                .push(lan.namespace(n).unwrap().to_string());
        }
        for s in ["east", "west"] {
            n2.lock()
                .unwrap()
                .push(lan.segment_namespace(s).unwrap().to_string());
        }
        g2.lock()
            .unwrap()
            .push(lan.cgroup("w1").unwrap().unwrap().dir().to_path_buf());
        // A process left running inside a limited node (its Child is never
        // killed).
        let child = lan
            .command("w1", "sleep")
            .unwrap()
            .arg("60")
            .spawn()
            .unwrap();
        p2.store(child.id() as u64, Ordering::Relaxed);
        std::mem::forget(child);
        panic!("the test body fails");
    });
    assert!(r.is_err());
    let names = names.lock().unwrap().clone();
    assert_eq!(names.len(), 4);
    let left: Vec<String> = Lan::existing_namespaces()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    for g in groups.lock().unwrap().iter() {
        assert!(!g.exists(), "cgroup left behind: {}", g.display());
    }
    // Bridges, ports and TAPs lived in the namespaces; none was ever in
    // the host's.
    let host = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    let host = String::from_utf8_lossy(&host.stdout);
    for dev in ["vlbr0", "vltap0", "vlp0", "vlp1"] {
        assert!(!host.contains(dev), "{dev} in the host's namespace: {host}");
    }
    let pid = pid.load(Ordering::Relaxed) as libc::pid_t;
    let t = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child's pid.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            assert!(libc::WIFSIGNALED(status), "killed, not exited: {status}");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the process in the node still runs"
        );
        std::thread::sleep(10 * MS);
    }
}

#[test]
fn what_a_dead_process_left_is_removed_at_the_next_start() {
    let _one = one_bed();
    // A pid that no longer runs: a child that has exited and been reaped.
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let dead = c.id();
    c.wait().unwrap();
    let ns = format!("vcdnlan-{dead}-0-n0");
    let st = std::process::Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap();
    assert!(st.success());
    let h = vcdn_netem::cgroup::Hierarchy::detect().expect("a cgroup cpu controller");
    let g = vcdn_netem::cgroup::CpuGroup::create(&h, &ns, 0.5).unwrap();
    let dir = g.dir().to_path_buf();
    std::mem::forget(g);
    assert!(Lan::existing_namespaces().contains(&ns));
    let lan = Lan::start(LanSpec::new(["dc"]).unwrap().node("a", "dc").unwrap()).unwrap();
    assert!(
        !Lan::existing_namespaces().contains(&ns),
        "the stale namespace was removed"
    );
    assert!(!dir.exists(), "the stale cgroup was removed");
    drop(lan);
}
