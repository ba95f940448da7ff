//! Proxy chains over an emulated wide-area path (issue 17's tests on the
//! packet-level test bed): client, ingress, transport, egress and origin
//! each in a network namespace, links with real one-way delays and a
//! rate, so each hop has its own TCP slow start. A transfer through three
//! proxies returns the same bytes as the origin and is faster than the
//! direct transfer for a multi-round size; when the transport proxy is
//! killed, new requests fall back to a shorter chain within a second.
//! Needs root.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::bed::{start_in, InNode};
use vcdn_netem::testbed::{Testbed, TestbedSpec};

mod support;

const KEY: &str = "hop-key-0123456789abcdef0123456789";
const TOKEN: &str = "admin-token-0123456789abcdef012345";
const NODES: [&str; 5] = ["client", "ingress", "transport", "egress", "origin"];
/// Where each node sits on a line, in ms of round trip: the RTT of a pair
/// is the distance (at least 1 ms). Direct client–origin: 122 ms; the
/// chain's hops: 1, 60, 60, 1.
const AT: [u64; 5] = [0, 1, 61, 121, 122];

fn bed() -> Testbed {
    let mut spec = TestbedSpec::new(NODES).unwrap().rate_all(100_000_000);
    for (i, a) in NODES.iter().enumerate() {
        for (j, b) in NODES.iter().enumerate().skip(i + 1) {
            let ms = AT[j].abs_diff(AT[i]).max(1);
            spec = spec.rtt(a, b, Duration::from_millis(ms)).unwrap();
        }
    }
    for p in ["ingress", "transport", "egress"] {
        spec = spec.keep_window(p).unwrap();
    }
    Testbed::start(spec).expect("the test bed starts (needs root)")
}

fn addr(tb: &Testbed, node: &str, port: u16) -> SocketAddr {
    SocketAddr::from((tb.addr(node).unwrap(), port))
}

fn proxy(tb: &Testbed, name: &str, peers: &[&str], chains: Option<&str>) -> InNode {
    let mut args: Vec<String> = [
        "proxy",
        "--name",
        name,
        "--listen",
        &addr(tb, name, 8080).to_string(),
        // On the node's own loopback: a plain admin API is refused on
        // any other address.
        "--admin",
        "127.0.0.1:9080",
        "--admin-token",
        TOKEN,
        "--service",
        "shop",
        "--origin",
        &format!("http://{}", addr(tb, "origin", 8000)),
        "--hop-key",
        KEY,
        "--egress",
        "egress",
    ]
    .map(String::from)
    .to_vec();
    for p in peers {
        args.extend(["--peer".into(), format!("{p}={}", addr(tb, p, 8080))]);
    }
    if let Some(c) = chains {
        args.extend(["--chains".into(), c.into()]);
    }
    start_in(tb, name, &args)
}

/// GETs `path` from `node` on a fresh connection: (status line, body,
/// time from connect to the last byte).
fn fetch(tb: &Testbed, node: &str, to: SocketAddr, path: &str) -> (String, Vec<u8>, Duration) {
    let path = path.to_string();
    tb.run_in(node, move || {
        let t0 = Instant::now();
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap_or_else(|e| {
            panic!(
                "read the answer of {to}{path} after {} bytes: {e}",
                raw.len()
            )
        });
        let took = t0.elapsed();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP answer");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head.lines().next().unwrap_or("").to_string();
        (status, raw[split + 4..].to_vec(), took)
    })
    .unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn a_chain_of_three_proxies_is_faster_than_direct_and_falls_back_when_one_dies() {
    let tb = bed();
    let _origin = start_in(
        &tb,
        "origin",
        &[
            "origin".into(),
            "--listen".into(),
            addr(&tb, "origin", 8000).to_string(),
        ],
    );
    let _egress = proxy(&tb, "egress", &[], None);
    let mut transport = Some(proxy(&tb, "transport", &["egress"], None));
    let dir = std::env::temp_dir().join(format!("vcdn-accel-chain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("chains.json");
    std::fs::write(
        &table,
        r#"{"version":1,"egress":"egress","chains":[{"max_rounds":20,"chain":["ingress","transport","egress"]}]}"#,
    )
    .unwrap();
    let _ingress = proxy(&tb, "ingress", &["transport", "egress"], table.to_str());
    let _ = std::fs::remove_dir_all(&dir);

    // 500 KB: five slow-start rounds on a fresh connection.
    let path = "/size/500000";
    let (status, want, _) = fetch(&tb, "client", addr(&tb, "origin", 8000), path);
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(want.len(), 500_000);
    let ingress = addr(&tb, "ingress", 8080);
    // The ingress's pools are pre-opened and warmed at start; give the
    // warm-up exchanges (one round trip of the chain each) time to end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body, _) = fetch(&tb, "client", ingress, path);
        if status.contains(" 200 ") && body == want {
            break;
        }
        assert!(Instant::now() < deadline, "the chain answers: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut direct = Vec::new();
    let mut chained = Vec::new();
    for _ in 0..3 {
        direct.push(fetch(&tb, "client", addr(&tb, "origin", 8000), path).2);
        let (status, body, took) = fetch(&tb, "client", ingress, path);
        assert!(status.contains(" 200 "), "{status}");
        assert!(body == want, "the chain changed the bytes");
        chained.push(took);
    }
    let (d, c) = (median(direct), median(chained));
    eprintln!("500 KB over 122 ms: direct {d:?}, through 3 proxies {c:?}");
    assert!(c < d, "the chain ({c:?}) is faster than direct ({d:?})");

    // The transport dies: the next request already takes ingress → egress
    // (or goes straight to the origin), within a second.
    drop(transport.take());
    let t0 = Instant::now();
    let (status, body, _) = fetch(&tb, "client", ingress, path);
    assert!(
        status.contains(" 200 "),
        "after the transport died: {status}"
    );
    assert!(body == want);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "fell back in {:?}",
        t0.elapsed()
    );
}
