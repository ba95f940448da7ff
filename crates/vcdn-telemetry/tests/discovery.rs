//! The agent on real UDP sockets on loopback: discovery by broadcast to
//! 127.255.255.255, the peer-to-peer data path, attacks on the protocol,
//! and a tracker respawned while data flows. Each test has a discovery port
//! of its own, so tests run in parallel without hearing each other.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vcdn_telemetry::agent::{Agent, AgentConfig, Ingest};
use vcdn_telemetry::envelope::{self, Reject};
use vcdn_telemetry::keys::{KeyFile, Keyring};
use vcdn_telemetry::message::{Authority, AuthorityKind, Body, Message, Role, Subscription};

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

struct Setup {
    port: u16,
    keys: KeyFile,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            port: free_udp_port(),
            keys: KeyFile::generate(),
        }
    }

    fn cfg(&self, node: &str, roles: &[Role]) -> AgentConfig {
        let mut c = AgentConfig::loopback(node, roles.to_vec());
        c.discovery_port = self.port;
        c
    }

    fn authority_keys(&self) -> Arc<Keyring> {
        Arc::new(self.keys.keyring().unwrap())
    }

    fn member_keys(&self) -> Arc<Keyring> {
        Arc::new(self.keys.member_only().keyring().unwrap())
    }

    async fn tracker(&self, node: &str) -> Agent {
        let a = Agent::start(self.cfg(node, &[Role::Tracker]), self.authority_keys())
            .await
            .unwrap();
        a.become_authority(
            AuthorityKind::Tracker,
            Authority {
                epoch: now_ms(),
                bootstrap: None,
                cluster_id: None,
                controller: None,
                generation: 0,
            },
        );
        a
    }

    async fn consumer(&self, node: &str, topic: &str, port: u16) -> Agent {
        let mut c = self.cfg(node, &[Role::P2pConsumer]);
        c.subscribe = vec![Subscription {
            topic: topic.into(),
            port,
            host: None,
        }];
        Agent::start(c, self.member_keys()).await.unwrap()
    }

    async fn producer(&self, node: &str, topic: &str) -> Agent {
        let mut c = self.cfg(node, &[Role::P2pProducer]);
        c.ingest = vec![Ingest {
            port: 0,
            topic: topic.into(),
            tcp: false,
        }];
        Agent::start(c, self.member_keys()).await.unwrap()
    }
}

async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2p_nodes_in_any_start_order_deliver_data() {
    // tracker (t), producer (p), consumer (c) in every order.
    for order in ["tpc", "tcp", "ptc", "pct", "ctp", "cpt"] {
        let s = Setup::new();
        let app = UdpSocket::bind("127.0.0.1:0").unwrap();
        app.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let app_port = app.local_addr().unwrap().port();
        let (mut t, mut p, mut c) = (None, None, None);
        for who in order.chars() {
            match who {
                't' => t = Some(s.tracker("tracker").await),
                'p' => p = Some(s.producer("cache-1", "edge.stats").await),
                _ => c = Some(s.consumer("supervisor", "edge.stats", app_port).await),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (p, c) = (p.unwrap(), c.unwrap());
        // Configured within the warm-up of a new tracker plus a renewal.
        wait_for("destinations", Duration::from_secs(6), || {
            !p.destinations("edge.stats").is_empty()
        })
        .await;
        assert!(p.configured() && c.configured(), "{order}");
        let ingest = p.ingest_addrs()[0];
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"latency,id=1 sentat=1", ingest).unwrap();
        let mut buf = [0u8; 100];
        let (n, _) = app.recv_from(&mut buf).expect("the datum arrives");
        assert_eq!(&buf[..n], b"latency,id=1 sentat=1", "{order}");
        drop(t);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_takes_well_under_a_second_when_the_authority_runs() {
    let s = Setup::new();
    let _t = s.tracker("tracker").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c = s.consumer("supervisor", "edge.stats", 9).await;
    let took = wait_for("configured", Duration::from_secs(1), || c.configured()).await;
    let reported = c
        .metrics()
        .discovery_ms
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(reported > 0 && reported < 1000, "{reported} ms");
    eprintln!("discovery: {took:?} (agent says {reported} ms)");
}

/// A node holding the keys broadcasts; an attacker on the same host hears it
/// (it can bind the discovery port too) and replays it, and forges others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_stale_messages_are_ignored_and_counted() {
    let s = Setup::new();
    let victim = s.consumer("victim", "edge.stats", 9).await;
    // Capture a real, signed TRECONFIG from a tracker that then leaves.
    let spy = std::net::UdpSocket::bind(("0.0.0.0", 0)).unwrap();
    let spy2 = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    spy2.set_reuse_address(true).unwrap();
    spy2.bind(&SocketAddr::from(([0, 0, 0, 0], s.port)).into())
        .unwrap();
    let spy2: UdpSocket = spy2.into();
    spy2.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let tracker = s.tracker("tracker").await;
    wait_for("configured", Duration::from_secs(2), || victim.configured()).await;
    let mut captured = None;
    let mut buf = [0u8; 9000];
    while captured.is_none() {
        let (n, _) = spy2.recv_from(&mut buf).unwrap();
        let msg = envelope::open(&s.keys.member_only().keyring().unwrap(), &buf[..n]).unwrap();
        if matches!(msg.body, Body::TrackerReconfig { .. }) {
            captured = Some(buf[..n].to_vec());
        }
    }
    let captured = captured.unwrap();
    // Sent as broadcasts: every agent on the host gets them (a unicast to
    // the shared port would reach only one of the sockets bound to it).
    spy.set_broadcast(true).unwrap();
    let to = SocketAddr::from(([127, 255, 255, 255], s.port));
    let before = |r| victim.metrics().rejected(r);
    let (replay0, mac0, sig0, stale0) = (
        before(Reject::Replay),
        before(Reject::BadMac),
        before(Reject::BadSignature),
        before(Reject::Stale),
    );

    // 1. Replay of the captured beacon.
    spy.send_to(&captured, to).unwrap();
    // 2. A bit flipped in it: the MAC fails.
    let mut flipped = captured.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 1;
    spy.send_to(&flipped, to).unwrap();
    // 3. A member-key holder (a broken-into cache) forges a TRECONFIG with a
    //    higher epoch: MAC right, no authority signature.
    let member = s.keys.member_only().keyring().unwrap();
    let forged = Message {
        v: 1,
        node: "evil".into(),
        inc: 1,
        seq: 1,
        ts: now_ms(),
        port: spy.local_addr().unwrap().port(),
        body: Body::Hello {
            roles: vec![Role::Tracker],
            publish: vec![],
            subscribe: vec![],
        },
    };
    // `seal` refuses to sign without the key, so forge by hand: a HELLO
    // frame whose JSON says tracker-reconfig.
    let mut frame = envelope::seal(&member, &forged);
    // The JSON starts after the 10-byte header and the 32-byte MAC (which
    // may itself hold a '{' byte).
    let body_at = 42 + frame[42..].iter().position(|b| *b == b'{').unwrap();
    let evil = br#"{"v":1,"node":"evil","inc":1,"seq":2,"ts":TS,"port":1,"type":"tracker-reconfig","authority":{"epoch":99999999999999}}"#;
    let evil = String::from_utf8_lossy(evil).replace("TS", &now_ms().to_string());
    frame.truncate(body_at);
    frame.extend_from_slice(evil.as_bytes());
    // Recompute the MAC as a member can (HMAC over all but the tag).
    let mac_file = &s.keys.mac[0];
    let key_bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&mac_file.key[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &key_bytes);
    let mut data = frame[..10].to_vec();
    data.extend_from_slice(&frame[42..]);
    let tag = aws_lc_rs::hmac::sign(&k, &data);
    frame[10..42].copy_from_slice(tag.as_ref());
    spy.send_to(&frame, to).unwrap();
    // 4. A stale but properly made message (an old capture's timestamp).
    let stale = Message {
        ts: now_ms() - 120_000,
        seq: 3,
        ..forged.clone()
    };
    spy.send_to(&envelope::seal(&member, &stale), to).unwrap();

    let after = |r| victim.metrics().rejected(r);
    let counted = || {
        (
            after(Reject::Replay) - replay0,
            after(Reject::BadMac) - mac0,
            after(Reject::BadSignature) - sig0,
            after(Reject::Stale) - stale0,
        )
    };
    let t0 = Instant::now();
    while {
        let (r, m, g, t) = counted();
        r == 0 || m == 0 || g == 0 || t == 0
    } {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "(replay, bad MAC, bad signature, stale) counted: {:?}",
            counted()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The victim still follows the real tracker.
    let mut text = String::new();
    victim.metrics().render(&mut text);
    assert!(
        text.contains("vcdn_telemetry_rejected_total{reason=\"bad_signature\"} 1"),
        "{text}"
    );
    drop(tracker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_respawned_tracker_leaves_no_gap_over_100ms_in_delivery() {
    let s = Setup::new();
    let app = UdpSocket::bind("127.0.0.1:0").unwrap();
    app.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let app_port = app.local_addr().unwrap().port();
    let t1 = s.tracker("tracker-1").await;
    let p = s.producer("cache-1", "edge.stats").await;
    let _c = s.consumer("supervisor", "edge.stats", app_port).await;
    wait_for("destinations", Duration::from_secs(6), || {
        !p.destinations("edge.stats").is_empty()
    })
    .await;
    // 1 datum a millisecond, as the thesis's reconfiguration demo (§5.2).
    let ingest = p.ingest_addrs()[0];
    let sender = std::thread::spawn(move || {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let t0 = Instant::now();
        let mut i = 0u64;
        while t0.elapsed() < Duration::from_secs(7) {
            s.send_to(format!("m {i}").as_bytes(), ingest).unwrap();
            i += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        i
    });
    // Kill the tracker (no BYE) after 1 s; a new one on another node at 1.5 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(t1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _t2 = s.tracker("tracker-2").await;
    let receiver = std::thread::spawn(move || {
        let mut buf = [0u8; 100];
        let mut last = Instant::now();
        let mut max_gap = Duration::ZERO;
        let mut n = 0;
        while let Ok((_, _)) = app.recv_from(&mut buf) {
            max_gap = max_gap.max(last.elapsed());
            last = Instant::now();
            n += 1;
        }
        (n, max_gap)
    });
    let sent = tokio::task::spawn_blocking(move || sender.join().unwrap())
        .await
        .unwrap();
    let (got, max_gap) = tokio::task::spawn_blocking(move || receiver.join().unwrap())
        .await
        .unwrap();
    eprintln!("sent {sent}, received {got} after the kill, largest gap {max_gap:?}");
    assert!(max_gap < Duration::from_millis(100), "gap {max_gap:?}");
    assert!(got > 3000, "{got}");
    assert!(p.destinations("edge.stats").len() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_leaves_with_bye_stops_receiving_at_once() {
    let s = Setup::new();
    let _t = s.tracker("tracker").await;
    let p = s.producer("cache-1", "edge.stats").await;
    let c = s.consumer("supervisor", "edge.stats", 7).await;
    wait_for("destinations", Duration::from_secs(6), || {
        !p.destinations("edge.stats").is_empty()
    })
    .await;
    c.shutdown().await;
    wait_for("dropped", Duration::from_millis(500), || {
        p.destinations("edge.stats").is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_deployments_agents_are_not_heard() {
    let s = Setup::new();
    let t = s.tracker("tracker").await;
    let mut other = Setup::new();
    other.port = s.port; // same port, other keys
    let c = other.consumer("supervisor", "edge.stats", 7).await;
    // One beacon interval: the tracker's TRECONFIG reaches the consumer.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert!(!c.configured());
    let dropped =
        |a: &Agent| a.metrics().rejected(Reject::BadMac) + a.metrics().rejected(Reject::UnknownKey);
    assert!(
        dropped(&c) > 0,
        "the consumer dropped the tracker's beacons"
    );
    assert!(dropped(&t) > 0, "the tracker dropped the consumer's HELLOs");
}
