//! vcdn processes in the nodes of the layer-2 test bed (`vcdn_netem::lan`),
//! as the ANDy reproduction runs them: started by the same harness as in
//! the TUN test bed, inside their node's namespace and CPU limit, reached
//! across the emulated link. Needs root.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::bed::start_in;
use vcdn_netem::lan::{Flavor, Lan, LanSpec, LinkSpec};

mod support;

const MS: Duration = Duration::from_millis(1);

#[test]
fn an_origin_in_a_limited_node_serves_across_the_link() {
    let spec = LanSpec::new(["east", "west"])
        .unwrap()
        .link(LinkSpec::delay(30 * MS))
        .node("client", "east")
        .unwrap()
        .node("origin", "west")
        .unwrap()
        .flavor("origin", Flavor::M1Medium)
        .unwrap();
    let lan = Lan::start(spec).expect("LAN starts (needs root)");
    let web = SocketAddr::from((lan.addr("origin").unwrap(), 8000));
    let origin = start_in(
        &lan,
        "origin",
        &["origin".into(), "--listen".into(), web.to_string()],
    );
    let g = lan.cgroup("origin").unwrap().expect("a limited node");
    assert_eq!(g.pids(), [origin.0.id()], "vcdn runs in the node's cgroup");

    let get = || {
        lan.run_in("client", || {
            let t = Instant::now();
            let mut s = TcpStream::connect_timeout(&web, Duration::from_secs(5)).unwrap();
            let handshake = t.elapsed();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET /dynamic?size=1000 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut body = Vec::new();
            s.read_to_end(&mut body).unwrap();
            (handshake, String::from_utf8_lossy(&body).into_owned())
        })
        .unwrap()
    };
    // The first connect also resolves ARP across the link.
    let _ = get();
    let (handshake, response) = get();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        handshake >= 60 * MS && handshake < 70 * MS,
        "a handshake is one 60 ms round trip: {handshake:?}"
    );
}
