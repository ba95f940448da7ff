//! Fuzz the telemetry's discovery frames and what lies behind their MAC.
//!
//! Each input is tried three ways: as a raw datagram (`envelope::open`,
//! `record::open`: nothing parses without the key), and as the JSON body of
//! a frame sealed with the deployment's own keys, signed and unsigned, so
//! the fuzzer reaches the message parser, the limits and the protocol state
//! machines of a tracker, a data sink and a follower, which keep their state
//! across inputs. Never panics; the authorities' tables stay bounded.
#![no_main]

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vcdn_telemetry::envelope::{self, Freshness};
use vcdn_telemetry::keys::{KeyFile, Keyring};
use vcdn_telemetry::message::{Authority, AuthorityKind, Role, Subscription};
use vcdn_telemetry::node::{Net, Node, NodeConfig, Timers, MAX_NODES};
use vcdn_telemetry::record;

struct World {
    keys: Keyring,
    nodes: Vec<Node>,
    fresh: Freshness,
    start: Instant,
    steps: u64,
}

fn world() -> &'static Mutex<World> {
    static W: OnceLock<Mutex<World>> = OnceLock::new();
    W.get_or_init(|| {
        let keys = KeyFile::generate().keyring().unwrap();
        let start = Instant::now();
        let cfg = |name: &str, roles: Vec<Role>| NodeConfig {
            node: name.into(),
            roles,
            publish: vec!["edge.stats".into()],
            subscribe: vec![Subscription { topic: "edge.stats".into(), port: 9, host: None }],
            allowed: vec![Net::parse("127.0.0.0/8").unwrap()],
            timers: Timers::default(),
            seed: 1,
        };
        let authority = Authority {
            epoch: 100,
            bootstrap: Some("127.0.0.1:9092".into()),
            cluster_id: Some("c".into()),
            controller: Some("1@127.0.0.1:9093".into()),
            generation: 0,
        };
        let mut tracker = Node::new(cfg("tracker", vec![Role::Tracker]), start);
        tracker.become_authority(AuthorityKind::Tracker, authority.clone(), start);
        let mut sink = Node::new(cfg("sink", vec![Role::Datasink]), start);
        sink.become_authority(AuthorityKind::Datasink, authority, start);
        let follower = Node::new(
            cfg("cache", vec![Role::P2pProducer, Role::Producer, Role::DatasinkSlave, Role::P2pConsumer]),
            start,
        );
        Mutex::new(World { keys, nodes: vec![tracker, sink, follower], fresh: Freshness::new(4096), start, steps: 0 })
    })
}

fuzz_target!(|data: &[u8]| {
    let mut w = world().lock().unwrap();
    let w = &mut *w;
    let _ = envelope::open(&w.keys, data);
    let _ = record::open(&w.keys, data);
    w.steps += 1;
    let now = w.start + Duration::from_millis(w.steps * 7);
    let from = SocketAddr::from(([127, 0, 0, 1], 4000 + (w.steps % 50) as u16));
    for signed in [false, true] {
        let frame = envelope::seal_raw(&w.keys, data, signed);
        if let Ok(msg) = envelope::open(&w.keys, &frame) {
            let _ = w.fresh.check(msg.ts, &msg);
            for n in &mut w.nodes {
                n.handle(now, from, &msg);
                n.tick(now);
                while n.poll_out().is_some() {}
                while n.poll_event().is_some() {}
            }
        }
    }
    let (p, c) = w.nodes[0].tracker_size();
    assert!(p + c <= MAX_NODES);
    assert!(w.fresh.len() <= 4096);
});
