//! `vcdn proxy` chains as real processes on loopback, in front of the demo
//! origin: byte-identical answers through ingress → transport → egress,
//! pooled hop connections reused, hostile hop headers refused while the
//! proxy keeps serving, fallback when a proxy dies, bad client requests
//! answered with the right status, SIGTERM draining an exchange in flight.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::*;
use vcdn_accel::wire::{Framing, HopHeader, Kind};

const KEY: &str = "hop-key-0123456789abcdef0123456789";

fn proxy(name: &str, origin: SocketAddr, peers: &[(&str, SocketAddr)], extra: &[&str]) -> Proc {
    let o = format!("http://{origin}");
    let peer_args: Vec<String> = peers.iter().map(|(n, a)| format!("{n}={a}")).collect();
    let mut args = vec![
        "proxy",
        "--name",
        name,
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--admin-token",
        TOKEN,
        "--service",
        "shop",
        "--origin",
        &o,
        "--hop-key",
        KEY,
        // Tests run in the host's network namespace: leave its sysctl alone.
        "--keep-sysctl",
    ];
    for p in &peer_args {
        args.extend_from_slice(&["--peer", p]);
    }
    args.extend_from_slice(extra);
    spawn(&args)
}

/// Origin, egress `e`, transport `t`, ingress `i` whose table sends every
/// size along i → t → e.
async fn chain(extra: &[&str]) -> (Proc, Proc, Proc, Proc) {
    let origin = origin();
    let e = proxy("e", origin.addr, &[], extra);
    let t = proxy("t", origin.addr, &[("e", e.addr)], extra);
    let i = proxy("i", origin.addr, &[("t", t.addr), ("e", e.addr)], extra);
    let table = r#"{"version":1,"egress":"e","chains":[{"max_rounds":3,"chain":["i","t","e"]},{"max_rounds":20,"chain":["i","t","e"]}]}"#;
    let r = admin(&i, "PUT", "/chains", table).await;
    assert_eq!(r.status(), 200, "{}", r.text());
    (origin, e, t, i)
}

async fn metric(p: &Proc, name: &str) -> f64 {
    let r = get(p.admin.expect("admin"), "/metrics").await;
    r.text()
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_chain_of_three_returns_identical_bytes_and_reuses_hop_connections() {
    let (origin, e, t, i) = chain(&[]).await;
    for n in [1_000usize, 500_000, 3_000_000] {
        for chunked in ["", "?chunked=1"] {
            let path = format!("/size/{n}{chunked}");
            let r = get(i.addr, &path).await;
            assert_eq!(r.status(), 200, "{path}");
            assert_eq!(r.body.len(), n, "{path}");
            assert!(r.body[..] == synth(n)[..], "{path}: bytes differ");
            assert_eq!(r.header("transfer-encoding").is_some(), !chunked.is_empty());
        }
    }
    // A dynamic answer, and a POST whose body goes up the chain and back.
    let r = get(i.addr, "/dynamic?size=70000").await;
    assert_eq!((r.status(), r.body.len()), (200, 70_000));
    let body: Vec<u8> = (0..300_000u32).map(|x| (x % 253) as u8).collect();
    let r = request(
        i.addr,
        "POST",
        "/echo",
        &[("Content-Type", "application/octet-stream")],
        &body,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.body[..] == body[..], "echoed body differs");
    // A chunked request body.
    let mut s = TcpStream::connect(i.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("hello world"),
        "{out}"
    );
    // A keep-alive client: several requests on one connection.
    let mut s = TcpStream::connect(i.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for n in [10usize, 20_000, 30] {
        write!(s, "GET /dynamic?size={n} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let (status, body) = read_response(&mut s);
        assert_eq!((status, body.len()), (200, n));
    }
    // Pooled hop connections were used, and bytes counted per hop.
    assert!(metric(&i, "vcdn_proxy_hop_connections_reused_total").await >= 8.0);
    assert!(metric(&t, "vcdn_proxy_hop_connections_reused_total").await >= 8.0);
    assert!(metric(&e, "vcdn_proxy_origin_connections_reused_total").await >= 8.0);
    assert!(
        metric(
            &i,
            "vcdn_proxy_hop_bytes_total{hop=\"t\",direction=\"received\"}"
        )
        .await
            > 7e6
    );
    assert_eq!(
        metric(&i, "vcdn_proxy_chain_choices_total{proxies=\"3\"}").await,
        12.0
    );
    // The size estimate learnt /size/ (seen: no longer unknown).
    assert!(metric(&i, "vcdn_proxy_rounds_class_total{rounds=\"unknown\"}").await < 12.0);
    let st: serde_json::Value =
        serde_json::from_slice(&admin(&i, "GET", "/stats", "").await.body).unwrap();
    assert_eq!(st["requests"], 12);
    assert!(st["bytes"].as_u64().unwrap() > 7_000_000);
    assert!(st["cpu_seconds"].as_f64().is_some());
    drop(origin);
}

/// Reads one HTTP/1.1 response with a Content-Length.
fn read_response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).expect("response head");
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("body");
    (status_of(&text), body)
}

/// Sends `bytes` on a new connection to `to` and returns what comes back.
fn hop_raw(to: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn header(chain: &[&str], key: &str) -> Vec<u8> {
    HopHeader {
        kind: Kind::Exchange,
        service: "shop".into(),
        chain: chain.iter().map(|s| s.to_string()).collect(),
        body: Framing::None,
        head_len: 0,
    }
    .encode(b"GET /size/10 HTTP/1.1\r\nHost: x\r\n\r\n", key.as_bytes())
}

#[tokio::test]
async fn hostile_hop_headers_are_refused_and_the_proxy_keeps_serving() {
    let (_origin, _e, t, i) = chain(&[]).await;
    let mut oversize = b"VCDNHOP\x01\xff\xff".to_vec();
    oversize.extend_from_slice(&[0u8; 64]);
    // The encoder takes any string: a next hop that is an address.
    let address = header(&["t", "127.0.0.1:1"], KEY);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage after the magic",
            b"VCDNHOP\x01\x00\x05\x09\x09\x09\x09\x09".to_vec(),
            "malformed",
        ),
        (
            "unknown version",
            b"VCDNHOP\x07\x00\x05xxxxx".to_vec(),
            "version",
        ),
        ("oversize", oversize, "too large"),
        (
            "bad tag",
            header(&["t", "e"], "another-key-0123456789abcdef012345"),
            "authentication",
        ),
        ("no tag key", header(&["t", "e"], ""), "authentication"),
        (
            "unknown next hop",
            header(&["t", "nowhere"], KEY),
            "unknown next hop",
        ),
        ("an address as next hop", address, "invalid name"),
        ("wrong receiver", header(&["x", "e"], KEY), "this proxy is"),
    ];
    for (what, bytes, want) in &cases {
        let out = hop_raw(t.addr, bytes);
        assert_eq!(out.first(), Some(&b'E'), "{what}: {out:?}");
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        assert!(text.contains(want), "{what}: {text}");
    }
    assert_eq!(
        metric(&t, "vcdn_proxy_errors_total{kind=\"header_refused\"}").await,
        cases.len() as f64
    );
    // The same header with the key is served.
    let out = hop_raw(t.addr, &header(&["t", "e"], KEY));
    assert_eq!(out.first(), Some(&b'R'));
    assert!(out.ends_with(&synth(10)));
    // And the chain still works for clients.
    let r = get(i.addr, "/size/100000").await;
    assert!(r.status() == 200 && r.body[..] == synth(100_000)[..]);
}

#[tokio::test]
async fn a_proxy_killed_mid_chain_makes_the_ingress_fall_back_within_a_second() {
    let (origin, e, t, i) = chain(&[]).await;
    assert_eq!(get(i.addr, "/size/1000").await.status(), 200);
    t.kill();
    let killed = Instant::now();
    let r = get(i.addr, "/dynamic?size=50000").await;
    assert_eq!((r.status(), r.body.len()), (200, 50_000));
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    assert!(metric(&i, "vcdn_proxy_chain_choices_total{proxies=\"2\"}").await >= 1.0);
    // The egress dies too: the ingress goes straight to the origin.
    e.kill();
    let killed = Instant::now();
    let r = get(i.addr, "/size/200000").await;
    assert!(r.status() == 200 && r.body[..] == synth(200_000)[..]);
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    assert!(metric(&i, "vcdn_proxy_chain_choices_total{proxies=\"1\"}").await >= 1.0);
    let h: serde_json::Value =
        serde_json::from_slice(&get(i.admin.unwrap(), "/healthz").await.body).unwrap();
    assert_eq!(h["status"], "ok");
    assert!(h["down_hops"].as_array().unwrap().len() == 2, "{h}");
    drop(origin);
}

#[tokio::test]
async fn the_ingress_refuses_bad_requests_with_the_right_status() {
    let origin = origin();
    let i = proxy(
        "i",
        origin.addr,
        &[],
        &["--header-timeout-ms", "300", "--instance-id", "px-1"],
    );
    let t = Duration::from_secs(5);
    assert_eq!(status_of(&raw(i.addr, b"GARBAGE\r\n\r\n", t)), 400);
    assert_eq!(status_of(&raw(i.addr, b"GET / HTTP/1.1\r\n\r\n", t)), 400); // no Host
    let big = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
        "a".repeat(40_000)
    );
    assert_eq!(status_of(&raw(i.addr, big.as_bytes(), t)), 431);
    let r = raw(
        i.addr,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
        t,
    );
    assert_eq!(status_of(&r), 413);
    assert!(r.contains("application/problem+json"), "{r}");
    let slow = Instant::now();
    assert_eq!(status_of(&raw(i.addr, b"GET / HTTP/1.1\r\nHo", t)), 408);
    assert!(slow.elapsed() < Duration::from_secs(3));
    // Alone (no peers, no table) it is its own egress.
    let r = get(i.addr, "/size/5000").await;
    assert!(r.status() == 200 && r.body[..] == synth(5000)[..]);
    let h: serde_json::Value =
        serde_json::from_slice(&get(i.admin.unwrap(), "/healthz").await.body).unwrap();
    assert_eq!(
        (h["status"].as_str(), h["instance"].as_str()),
        (Some("ok"), Some("px-1"))
    );
    assert_eq!(h["instance_id"], "px-1");
    // The admin API wants its token beyond /healthz and /metrics.
    assert_eq!(get(i.admin.unwrap(), "/stats").await.status(), 401);
    assert_eq!(admin(&i, "PUT", "/chains", r#"{"version":1,"egress":"e","chains":[{"max_rounds":1,"chain":["i","10.0.0.1:80","e"]}]}"#).await.status(), 400);
    assert_eq!(
        admin(&i, "PUT", "/peers", r#"{"peers":{"e":"not an address"}}"#)
            .await
            .status(),
        400
    );
}

#[tokio::test]
async fn sigterm_finishes_the_exchange_in_flight() {
    let (origin, _e, _t, mut i) = chain(&[]).await;
    // 300 KB at 400 KB/s: the answer takes about 0.75 s.
    let addr = i.addr;
    let fetch = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /size/300000?rate=400000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        read_response(&mut s)
    });
    let adm = i.admin.unwrap();
    assert!(
        eventually(5, || async {
            let r = get(adm, "/healthz").await;
            let h: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            h["exchanges_in_flight"].as_u64() == Some(1)
        })
        .await
    );
    // SAFETY: signalling the child process we started.
    unsafe { libc::kill(i.child.id() as i32, libc::SIGTERM) };
    let (status, body) = fetch.join().unwrap();
    assert_eq!(status, 200);
    assert!(body[..] == synth(300_000)[..]);
    let code = support::exited_within(&mut i.child, 5, "the proxy did not exit");
    assert!(code.success(), "{code:?}");
    assert!(TcpStream::connect(addr).is_err());
    drop(origin);
}

/// A SIGTERM the moment the proxy says where it listens is a clean stop
/// (exit 0 after the drain), not the default action's kill: the handler is
/// in place before the proxy is ready.
#[tokio::test]
async fn sigterm_right_after_ready_is_a_clean_stop() {
    let origin = origin();
    for _ in 0..5 {
        let mut p = proxy("i", origin.addr, &[], &[]);
        // SAFETY: signalling the child process we started.
        unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) };
        let code = support::exited_within(&mut p.child, 5, "the proxy did not exit");
        assert!(code.success(), "{code:?}");
    }
}

#[tokio::test]
async fn an_idle_proxy_exits() {
    let origin = origin();
    let mut p = proxy("i", origin.addr, &[], &["--idle-exit", "1"]);
    support::exited_within(&mut p.child, 5, "no idle exit");
}

/// `--relay sockmap` (needs root here, as the test command runs): bodies of
/// known length go through the BPF redirect at every proxy of the chain,
/// and the client gets the same bytes as with splice.
#[tokio::test]
async fn a_chain_relaying_through_sockmap_returns_identical_bytes() {
    let (origin, _e, _t, i) = chain(&["--relay", "sockmap"]).await;
    for n in [1usize, 70_000, 500_000, 3_000_000] {
        let path = format!("/size/{n}");
        let r = get(i.addr, &path).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.body.len(), n, "{path}");
        assert!(r.body[..] == synth(n)[..], "{path}: bytes differ");
    }
    // A request body up the chain and back, and a keep-alive client.
    let body: Vec<u8> = (0..300_000u32).map(|x| (x % 253) as u8).collect();
    let r = request(i.addr, "POST", "/echo", &[], &body).await;
    assert_eq!(r.status(), 200);
    assert!(r.body[..] == body[..], "echoed body differs");
    let mut s = TcpStream::connect(i.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for n in [10usize, 200_000, 30, 1_000_000] {
        write!(s, "GET /size/{n} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let (status, got) = read_response(&mut s);
        assert_eq!(status, 200);
        assert!(
            got[..] == synth(n)[..],
            "keep-alive /size/{n}: bytes differ"
        );
    }
    drop(origin);
}

/// The proxy's admin API over TLS: HTTPS only; plain off loopback refused
/// at start.
#[tokio::test]
async fn the_admin_api_over_tls_speaks_https_only_and_plain_off_loopback_is_refused() {
    let dir = tempdir("proxy-admin-tls");
    let (ca, cp, kp) = admin_cert(&dir);
    let origin = origin();
    let p = proxy(
        "e",
        origin.addr,
        &[],
        &["--admin-tls-cert", &cp, "--admin-tls-key", &kp],
    );
    let admin = p.admin.expect("the proxy printed its admin address");
    assert_admin_https_only(admin, &ca, "vcdn_proxy_open_connections").await;
    let o = format!("http://{}", origin.addr);
    let err = refused_to_start(&[
        "proxy",
        "--name",
        "e",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "192.0.2.1:9080",
        "--admin-token",
        TOKEN,
        "--service",
        "shop",
        "--origin",
        &o,
        "--keep-sysctl",
    ]);
    assert!(
        err.contains("192.0.2.1:9080") && err.contains("--admin-tls-cert"),
        "{err}"
    );
}
