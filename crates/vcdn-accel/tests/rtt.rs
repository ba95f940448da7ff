//! The RTT service probing real listeners on loopback and reporting to a
//! real HTTP server standing in for the controller.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::TcpListener;
use vcdn_accel::rtt::{Controller, RttConfig, RttService};
use vcdn_http::serve::{serve, Handler, Response, ServeConfig};

const TOKEN: &str = "rtt-test-token-0123456789abcdef";

/// A peer proxy: a listener that accepts and drops.
async fn peer() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    addr
}

/// An address nothing listens on.
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A controller that records the reports it accepts (and refuses a wrong token).
async fn controller(reports: Arc<Mutex<Vec<Value>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let handler: Handler = Arc::new(move |req| {
        let reports = reports.clone();
        Box::pin(async move {
            if req.head.path() != b"/v1/accel/rtt" {
                return Response::problem(404, "no such path");
            }
            if !vcdn_http::serve::bearer_matches(&req, TOKEN) {
                return Response::problem(401, "bad token");
            }
            match serde_json::from_slice::<Value>(&req.body) {
                Ok(v) => {
                    reports.lock().push(v);
                    Response::new(204, "text/plain", "")
                }
                Err(e) => Response::problem(400, &e.to_string()),
            }
        })
    });
    tokio::spawn(serve(l, ServeConfig::default(), handler));
    addr
}

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(peers: &[(&str, SocketAddr)], ctl: Option<(SocketAddr, &str)>) -> RttConfig {
    let mut c = RttConfig::new("paris", "shop");
    c.peers = peers.iter().map(|(k, a)| (k.to_string(), *a)).collect();
    c.probe_interval = Duration::from_millis(100);
    c.probe_timeout = Duration::from_millis(500);
    c.fail_after = 2;
    c.controller = ctl.map(|(a, t)| Controller {
        url: format!("http://{a}"),
        token: t.into(),
        fingerprint: None,
    });
    c
}

#[tokio::test]
async fn reports_changes_only_and_peer_set_updates() {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let ctl = controller(reports.clone()).await;
    let (a, b, dead) = (peer().await, peer().await, closed_port());
    let svc = RttService::start(config(
        &[("berlin", a), ("madrid", b), ("rome", dead)],
        Some((ctl, TOKEN)),
    ))
    .unwrap();

    // First report: both listeners measured (a loopback handshake is well
    // under 50 ms), the closed port reported unreachable.
    let first = eventually("a report with all three peers", || {
        reports
            .lock()
            .iter()
            .find(|r| r["rtt_ms"].as_object().is_some_and(|m| m.len() == 3))
            .cloned()
    })
    .await;
    assert_eq!(first["service"], "shop");
    assert_eq!(first["from"], "paris");
    for loc in ["berlin", "madrid"] {
        let ms = first["rtt_ms"][loc].as_f64().expect("a number");
        assert!(ms > 0.0 && ms < 50.0, "{loc}: {ms} ms");
    }
    assert!(first["rtt_ms"]["rome"].is_null(), "{first}");

    // Loopback RTTs stay within 1 ms of each other: ten more probe rounds
    // send no report.
    let before = reports.lock().len();
    let probes = svc.snapshot().peers["berlin"].samples;
    eventually("ten more probe rounds", || {
        (svc.snapshot().peers["berlin"].samples >= probes + 10).then_some(())
    })
    .await;
    assert_eq!(reports.lock().len(), before, "{:?}", reports.lock());

    // A new peer set: madrid leaves, rome comes up at a new address.
    let rome = peer().await;
    svc.set_peers(BTreeMap::from([
        ("berlin".to_string(), a),
        ("rome".to_string(), rome),
    ]));
    let next = eventually("a report of the new peer set", || {
        reports
            .lock()
            .iter()
            .skip(before)
            .find(|r| r["rtt_ms"]["rome"].is_number() && r["rtt_ms"].get("madrid").is_none())
            .cloned()
    })
    .await;
    assert!(next["rtt_ms"]["berlin"].is_number(), "{next}");

    let snap = svc.snapshot();
    assert!(snap.reports_sent >= 2);
    assert_eq!(snap.reports_failed, 0);
    assert!(snap.last_report_age_s.unwrap() < 10.0);
    assert!(snap.peers["rome"].reachable);
    assert!(svc.metrics().contains("vcdn_accel_rtt_ms{peer=\"berlin\"}"));
}

#[tokio::test]
async fn a_down_or_refusing_controller_changes_nothing_for_measurement() {
    let a = peer().await;
    // Nobody listens at the controller's address.
    let down = RttService::start(config(&[("berlin", a)], Some((closed_port(), TOKEN)))).unwrap();
    // The controller listens but refuses the token.
    let reports = Arc::new(Mutex::new(Vec::new()));
    let ctl = controller(reports.clone()).await;
    let refused = RttService::start(config(&[("berlin", a)], Some((ctl, "wrong-token")))).unwrap();
    for svc in [&down, &refused] {
        eventually("a failed report and a measurement", || {
            let s = svc.snapshot();
            (s.reports_failed >= 1 && s.rtt_ms["berlin"].is_some()).then_some(())
        })
        .await;
        assert_eq!(svc.snapshot().reports_sent, 0);
    }
    assert!(reports.lock().is_empty());
    // Probing goes on while the reports back off.
    let n = down.snapshot().peers["berlin"].samples;
    eventually("more samples", || {
        (down.snapshot().peers["berlin"].samples > n + 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn observed_rtts_feed_the_minimum_without_a_controller() {
    let mut c = config(&[("berlin", closed_port())], None);
    c.probe_interval = Duration::from_secs(3600);
    let svc = RttService::start(c).unwrap();
    svc.observe("berlin", Duration::from_micros(42_500));
    svc.observe("berlin", Duration::from_micros(40_100));
    svc.observe("nowhere", Duration::from_millis(1));
    let s = svc.snapshot();
    // The first probe (refused) counts one failure, below fail_after.
    assert_eq!(s.rtt_ms.get("berlin"), Some(&Some(40.1)), "{s:?}");
    assert!(!s.peers.contains_key("nowhere"));
    assert_eq!(s.controller, None);
}
