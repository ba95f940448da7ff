//! Telemetry agents (`vcdn agent`) on a real broadcast domain: one network
//! namespace per node on the layer-2 test bed, discovery by broadcast to the
//! subnet's broadcast address, data from a producer's local port to a
//! consumer's application across the network, and an authority respawned on
//! another address. Needs root.

use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use support::bed::{start_in, InNode};
use vcdn_netem::lan::{Lan, LanSpec};

mod support;

const APP: u16 = 8086;
const INGEST: u16 = 2003;

fn keys(dir: &Path) -> (String, String) {
    let (k, m) = (dir.join("keys.json"), dir.join("member.json"));
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(["telemetry", "keys", "--out"])
        .arg(&k)
        .arg("--member-out")
        .arg(&m)
        .status()
        .unwrap();
    assert!(st.success());
    (k.display().to_string(), m.display().to_string())
}

/// `vcdn agent` with node id `id` in the namespace of `node`.
fn agent_as(lan: &Lan, node: &str, id: &str, keys: &str, args: &[&str]) -> InNode {
    let mut a: Vec<String> = vec![
        "agent".into(),
        "--node".into(),
        id.into(),
        "--keys".into(),
        keys.into(),
    ];
    a.extend([
        "--broadcast".into(),
        lan.broadcast().to_string(),
        "--allow".into(),
        "10.78.0.0/16".into(),
    ]);
    a.extend(args.iter().map(|s| s.to_string()));
    start_in(lan, node, &a)
}

fn agent(lan: &Lan, node: &str, keys: &str, args: &[&str]) -> InNode {
    agent_as(lan, node, node, keys, args)
}

/// Sends a numbered line to the producer's ingest every 2 ms until `stop`,
/// from inside the producer's namespace.
fn feed(lan: &Lan, stop: Duration) {
    lan.run_in("producer", || {
        let t0 = Instant::now();
        let mut s = loop {
            match TcpStream::connect(("127.0.0.1", INGEST)) {
                Ok(s) => break s,
                Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("ingest port: {e}"),
            }
        };
        let mut i = 0u64;
        while t0.elapsed() < stop {
            let _ = writeln!(s, "m {i}");
            i += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .unwrap();
}

#[test]
fn p2p_agents_discover_each_other_by_broadcast_and_follow_a_tracker_respawned_elsewhere() {
    let dir = std::env::temp_dir().join(format!("vcdn-tlan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (authority, member) = keys(&dir);
    let spec = LanSpec::new(["dc"])
        .unwrap()
        .node("tracker-a", "dc")
        .and_then(|s| s.node("tracker-b", "dc"))
        .and_then(|s| s.node("producer", "dc"))
        .and_then(|s| s.node("consumer", "dc"))
        .unwrap();
    let lan = Lan::start(spec).expect("LAN starts (needs root)");
    // The consumer's application listens before anything else runs.
    let app = lan
        .run_in("consumer", || UdpSocket::bind(("0.0.0.0", APP)).unwrap())
        .unwrap();
    app.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // Started in the order a cold boot may take: producer, consumer, tracker.
    let _p = agent(
        &lan,
        "producer",
        &member,
        &[
            "--role",
            "p2p-producer",
            "--ingest",
            &format!("{INGEST}=metrics/tcp"),
        ],
    );
    let _c = agent(
        &lan,
        "consumer",
        &member,
        &[
            "--role",
            "p2p-consumer",
            "--subscribe",
            &format!("metrics={APP}"),
        ],
    );
    let mut tracker = agent(&lan, "tracker-a", &authority, &["--role", "tracker"]);

    let received = |within: Duration| -> Vec<u64> {
        let t0 = Instant::now();
        let mut got = Vec::new();
        let mut b = [0u8; 65536];
        while t0.elapsed() < within {
            if let Ok((n, from)) = app.recv_from(&mut b) {
                assert_eq!(
                    from.ip(),
                    lan.addr("producer").unwrap(),
                    "data come straight from the producer"
                );
                for l in String::from_utf8_lossy(&b[..n]).lines() {
                    got.push(l.trim_start_matches("m ").parse().unwrap());
                }
            }
        }
        got
    };
    std::thread::scope(|s| {
        s.spawn(|| feed(&lan, Duration::from_secs(20)));
        // Configured within the new tracker's warm-up and a renewal.
        let first = received(Duration::from_secs(5));
        assert!(!first.is_empty(), "data arrive across the network");
        // The tracker dies; another starts on another address.
        drop(std::mem::replace(
            &mut tracker,
            agent(&lan, "tracker-b", &authority, &["--role", "tracker"]),
        ));
        let after = received(Duration::from_secs(4));
        assert!(after.len() > 1000, "data keep flowing: {}", after.len());
        let gaps = after.windows(2).filter(|w| w[1] != w[0] + 1).count();
        assert_eq!(gaps, 0, "nothing lost or duplicated across the respawn");
        // A consumer that comes now can only be found through the new
        // tracker: every node follows it.
        let app2 = lan
            .run_in("consumer", || {
                UdpSocket::bind(("0.0.0.0", APP + 1)).unwrap()
            })
            .unwrap();
        app2.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
        let c2 = agent_as(
            &lan,
            "consumer",
            "consumer-2",
            &member,
            &[
                "--role",
                "p2p-consumer",
                "--subscribe",
                &format!("metrics={}", APP + 1),
            ],
        );
        let mut b = [0u8; 65536];
        let (_, from) = app2
            .recv_from(&mut b)
            .expect("the new consumer gets data through the new tracker");
        assert_eq!(from.ip(), lan.addr("producer").unwrap());
        // consumer-2 leaves cleanly (SIGTERM): its BYE takes it out of the
        // producer's destinations at once, not when its lease (6 s) ends.
        c2.terminate();
        app2.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            let _ = app2.recv_from(&mut b); // what was in flight
        }
        app2.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(
            app2.recv_from(&mut b).is_err(),
            "no data for a consumer that said BYE"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}
