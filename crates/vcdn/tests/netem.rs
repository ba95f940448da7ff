//! `vcdn netem` as a process in front of `vcdn origin`: what a client of
//! the emulated path sees.

mod support;

use std::time::{Duration, Instant};

use support::*;

#[tokio::test]
async fn a_get_through_netem_takes_the_added_round_trips_and_a_large_object_the_capped_time() {
    let origin = origin();
    let target = origin.addr.to_string();
    let shim = spawn(&[
        "netem",
        "--listen",
        "127.0.0.1:0",
        "--target",
        &target,
        "--delay-ms",
        "50",
        "--down-rate-kbit",
        "8000",
    ]);

    // A small object on a new connection: the handshake's round trip and
    // the request's, 2 × 100 ms.
    let t = Instant::now();
    let r = get(shim.addr, "/size/43").await;
    let took = t.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(r.body, synth(43));
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(320),
        "GET /size/43 took {took:?}"
    );

    // 1 MB at 8 Mbit/s: 1 s, plus the two round trips.
    let t = Instant::now();
    let r = get(shim.addr, "/size/1000000").await;
    let took = t.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(r.body.len(), 1_000_000);
    assert!(
        took >= Duration::from_millis(1150) && took < Duration::from_millis(1450),
        "GET /size/1000000 took {took:?}"
    );

    // Uploads are not capped (only --down-rate-kbit was given).
    let body = vec![b'u'; 1_000_000];
    let t = Instant::now();
    let r = request(shim.addr, "POST", "/size/43", &[], &body).await;
    assert_eq!(r.status(), 200);
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn netem_refuses_a_target_it_cannot_resolve() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "netem",
            "--listen",
            "127.0.0.1:0",
            "--target",
            "no-such-host.invalid:80",
        ])
        .output()
        .expect("vcdn runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot resolve --target"), "{err}");
}
