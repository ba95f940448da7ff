//! The SRv6 data path (issue 21) on the kernel's own SRv6 and BPF: a
//! client, the dispatcher, an edge (vcdn cache) and an origin (vcdn origin)
//! each in an IPv6-only network namespace, 40 ms added on the origin's
//! egress. Needs root.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::bed::{start_in, InNode};
use vcdn_netem::testbed::{Testbed, TestbedSpec};
use vcdn_srv6::agent::{Agent, AgentConfig, Filter};
use vcdn_srv6::dispatcher::{Dispatcher, DispatcherConfig};
use vcdn_srv6::route::{self, Netns, Routes};

mod support;

/// The service's chunk /64 (`vcdn name`'s prefix).
const CHUNKS: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 0);
const TABLE: u32 = 100;

fn chunk(id: u64) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(CHUNKS) | id as u128)
}

/// A SID in `node`'s /64.
fn sid(tb: &Testbed, node: &str) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(tb.addr6(node).unwrap()) | 0x100)
}

struct Plane {
    // Routes go before the programs they name; the bed last.
    _routes: Vec<Routes>,
    dispatcher: Dispatcher,
    edge: Agent,
    origin: Agent,
    _procs: Vec<InNode>,
    tb: Testbed,
}

fn plane(edge_filter: Filter) -> Plane {
    let mut spec = TestbedSpec::new(["client", "dispatcher", "edge", "origin"])
        .unwrap()
        .ipv6()
        .owns("dispatcher", CHUNKS)
        .unwrap();
    for to in ["client", "dispatcher", "edge"] {
        spec = spec
            .one_way("origin", to, Duration::from_millis(40))
            .unwrap();
    }
    let tb = Testbed::start(spec).expect("the test bed starts (needs root)");
    let ns = |n: &str| Netns::named(tb.namespace(n).unwrap());
    let (d_sid, e_sid, o_sid) = (sid(&tb, "dispatcher"), sid(&tb, "edge"), sid(&tb, "origin"));

    let mut dispatcher =
        Dispatcher::load(&DispatcherConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    dispatcher.set_service(CHUNKS, o_sid, &[e_sid]).unwrap();
    let agent = |s: Ipv6Addr, filter: Filter| {
        let a = Agent::load(&AgentConfig {
            sid: s,
            table: TABLE,
            filter,
            conns: 4096,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        a.serve_prefix(CHUNKS).unwrap();
        a.trust_dispatcher(d_sid).unwrap();
        a
    };
    let (edge, origin) = (agent(e_sid, edge_filter), agent(o_sid, Filter::AcceptAll));
    let routes = vec![
        route::dispatcher(
            &ns("dispatcher"),
            &dispatcher,
            d_sid,
            &[CHUNKS],
            &tb.device("dispatcher").unwrap(),
        )
        .unwrap(),
        route::agent(
            &ns("edge"),
            &edge,
            TABLE,
            &[CHUNKS],
            &tb.device("edge").unwrap(),
            "::/0",
        )
        .unwrap(),
        route::agent(
            &ns("origin"),
            &origin,
            TABLE,
            &[CHUNKS],
            &tb.device("origin").unwrap(),
            "::/0",
        )
        .unwrap(),
    ];
    let origin_proc = start_in(
        &tb,
        "origin",
        &["origin".into(), "--listen".into(), "[::]:80".into()],
    );
    let upstream = format!("http://[{}]:80", tb.addr6("origin").unwrap());
    let cache = start_in(
        &tb,
        "edge",
        &[
            "cache",
            "--listen",
            "[::]:80",
            "--upstream",
            &upstream,
            "--threads",
            "1",
        ]
        .map(String::from),
    );
    Plane {
        _routes: routes,
        dispatcher,
        edge,
        origin,
        _procs: vec![cache, origin_proc],
        tb,
    }
}

/// GETs `path` from `to` inside the client's namespace: (head, body).
fn get(tb: &Testbed, to: Ipv6Addr, path: &str) -> (String, Vec<u8>) {
    let path = path.to_string();
    tb.run_in("client", move || {
        let to = SocketAddr::from((to, 80));
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {to}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: video\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .unwrap_or_else(|e| panic!("read {to}{path}: {e}"));
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP answer");
        (
            String::from_utf8_lossy(&raw[..split]).into_owned(),
            raw[split + 4..].to_vec(),
        )
    })
    .unwrap()
}

fn x_cache(head: &str) -> Option<String> {
    head.lines()
        .find_map(|l| {
            l.strip_prefix("X-Cache: ")
                .or_else(|| l.strip_prefix("x-cache: "))
        })
        .map(str::to_string)
}

#[test]
fn a_popular_chunk_is_served_by_the_edge_and_an_unpopular_one_by_the_origin() {
    let p = plane(Filter::Lru(100));
    let origin = p.tb.addr6("origin").unwrap();
    let (a, b) = ("/size/150000", "/size/90000");
    let (_, a_direct) = get(&p.tb, origin, a);
    let (_, b_direct) = get(&p.tb, origin, b);
    assert_eq!(a_direct.len(), 150_000);

    // First request for chunk 1: not in the edge's filter, so the SYN goes
    // on to the origin, which answers itself (no X-Cache).
    let t0 = Instant::now();
    let (head, body) = get(&p.tb, chunk(1), a);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        x_cache(&head),
        None,
        "the origin answers a chunk outside the filter: {head}"
    );
    assert!(
        body == a_direct,
        "the origin's bytes through SRv6 ({} bytes)",
        body.len()
    );
    let first = t0.elapsed();
    // Now in the filter: the edge accepts, misses, fetches, then hits.
    let (head, body) = get(&p.tb, chunk(1), a);
    assert_eq!(x_cache(&head).as_deref(), Some("MISS"), "{head}");
    assert!(body == a_direct);
    let t1 = Instant::now();
    let (head, body) = get(&p.tb, chunk(1), a);
    assert_eq!(x_cache(&head).as_deref(), Some("HIT"), "{head}");
    assert!(body == a_direct);
    let hit = t1.elapsed();
    // An edge hit has no 40 ms origin path in it.
    assert!(hit < first, "hit {hit:?} vs origin {first:?}");
    // Another chunk, once: the origin.
    let (head, body) = get(&p.tb, chunk(2), b);
    assert_eq!(x_cache(&head), None, "{head}");
    assert!(body == b_direct);

    let e = p.edge.stats().unwrap();
    assert_eq!((e.accepted, e.rejected), (2, 2), "{e:?}");
    assert_eq!(e.replies_steered, 2, "{e:?}");
    let o = p.origin.stats().unwrap();
    assert_eq!((o.last, o.replies_steered), (o.last.max(2), 2), "{o:?}");
    let d = p.dispatcher.stats().unwrap();
    assert_eq!((d.learnt, d.conflicts, d.malformed), (4, 0, 0), "{d:?}");
    assert!(d.steered > 4, "{d:?}");
    // Replies go straight to the client: only the four SYN-ACKs crossed
    // the dispatcher.
    let to_d = |n: &str| p.tb.link_stats(n, "dispatcher").unwrap().packets;
    assert_eq!(
        to_d("edge") + to_d("origin"),
        4,
        "{d:?} {e:?} {o:?} {:?}",
        p.tb.stats()
    );
    assert!(p.tb.link_stats("edge", "client").unwrap().bytes > 300_000);
}
