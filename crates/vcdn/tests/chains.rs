//! `vcdn chains`: the real binary answers from an RTT matrix and from a
//! topology, with chains worked out by hand.

mod support;

use std::process::Command;

use serde_json::Value;
use support::tempdir;

/// Runs `vcdn chains ARGS`: (exit ok, JSON or null, stderr).
fn chains(args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .arg("chains")
        .args(args)
        .output()
        .expect("vcdn runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.success(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn names(v: &Value) -> Vec<&str> {
    v["chain"]
        .as_array()
        .expect("chain")
        .iter()
        .map(|n| n.as_str().expect("name"))
        .collect()
}

fn close(v: &Value, want: f64) -> bool {
    (v.as_f64().expect("number") - want).abs() < 1e-6
}

/// A long direct link (90 ms) against two 50 ms hops: one round is faster
/// direct (45 ms vs 50 ms), ten rounds through the proxy (500 ms vs 855 ms).
#[test]
fn small_transfers_go_direct_large_ones_split() {
    let dir = tempdir("chains-csv");
    let csv = dir.join("rtt.csv");
    std::fs::write(&csv, "src,dst,rtt_ms\nlon,nyc,90\nlon,dub,50\ndub,nyc,50\n").unwrap();
    let csv = csv.to_str().unwrap();

    let (ok, small, err) = chains(&[
        "--rtt-matrix",
        csv,
        "--from",
        "lon",
        "--to",
        "nyc",
        "--size",
        "14600",
    ]);
    assert!(ok, "{err}");
    assert_eq!(small["rounds"], 1);
    assert_eq!(names(&small["chain"]), ["lon", "nyc"]);
    assert!(close(&small["chain"]["predicted_ms"], 45.0), "{small}");
    assert_eq!(small["chain"]["proxies"], 0);

    let (ok, large, err) = chains(&[
        "--rtt-matrix",
        csv,
        "--from",
        "lon",
        "--to",
        "nyc",
        "--size",
        "10M",
    ]);
    assert!(ok, "{err}");
    assert_eq!(large["rounds"], 10);
    assert_eq!(names(&large["chain"]), ["lon", "dub", "nyc"]);
    assert!(close(&large["chain"]["sum_rtt_ms"], 100.0));
    assert!(close(&large["chain"]["max_rtt_ms"], 50.0));
    assert!(
        close(&large["chain"]["predicted_ms"], 50.0 + 9.0 * 50.0),
        "{large}"
    );
    // The whole front, least max RTT first.
    let front = large["front"].as_array().unwrap();
    assert_eq!(front.len(), 2, "{large}");
    assert_eq!(names(&front[0]), ["lon", "dub", "nyc"]);
    assert_eq!(names(&front[1]), ["lon", "nyc"]);
    assert!(close(&front[1]["predicted_ms"], 9.5 * 90.0));

    // Unknown size is treated as large.
    let (ok, unknown, _) = chains(&["--rtt-matrix", csv, "--from", "lon", "--to", "nyc"]);
    assert!(ok);
    assert_eq!(names(&unknown["chain"]), ["lon", "dub", "nyc"]);
    assert_eq!(unknown["size_bytes"], Value::Null);

    // Errors a person can act on.
    let (ok, _, err) = chains(&["--rtt-matrix", csv, "--from", "lon", "--to", "par"]);
    assert!(!ok);
    assert!(
        err.contains("no node named \"par\"") && err.contains("lon, nyc, dub"),
        "{err}"
    );
    let (ok, _, err) = chains(&["--rtt-matrix", csv, "--from", "nyc", "--to", "lon"]);
    assert!(!ok);
    assert!(err.contains("no path from nyc to lon"), "{err}");
    let missing = dir.join("missing.csv");
    let (ok, _, err) = chains(&[
        "--rtt-matrix",
        missing.to_str().unwrap(),
        "--from",
        "a",
        "--to",
        "b",
    ]);
    assert!(!ok);
    assert!(
        err.contains("missing.csv") && err.contains("No such file"),
        "{err}"
    );
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "a,b,1\nb,a,-3\n").unwrap();
    let (ok, _, err) = chains(&[
        "--rtt-matrix",
        bad.to_str().unwrap(),
        "--from",
        "a",
        "--to",
        "b",
    ]);
    assert!(!ok);
    assert!(err.contains("line 2"), "{err}");
}

/// Abilene (Topology Zoo) completed by shortest paths: Atlanta (0) to
/// Denver (2) runs 0-4-5-2 (Indianapolis, Kansas City), one-way
/// 3.4404 + 3.6558 + 4.4621 ms, so RTT 23.1166 ms and the longest hop
/// 8.9242 ms. One round goes direct (11.5583 ms); five rounds (400 kB)
/// split at both routers: 11.5583 + 4 × 8.9242 = 47.2551 ms.
#[test]
fn topology_is_completed_and_split_at_its_routers() {
    let topo = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/topologies/zoo-Abilene.edges.csv"
    );
    let (ok, small, err) = chains(&[
        "--topology",
        topo,
        "--from",
        "0",
        "--to",
        "2",
        "--size",
        "1000",
    ]);
    assert!(ok, "{err}");
    assert_eq!(names(&small["chain"]), ["0", "2"]);
    assert!(close(&small["chain"]["predicted_ms"], 11.5583), "{small}");

    let (ok, five, err) = chains(&[
        "--topology",
        topo,
        "--from",
        "0",
        "--to",
        "2",
        "--size",
        "400000",
    ]);
    assert!(ok, "{err}");
    assert_eq!(five["rounds"], 5);
    assert_eq!(names(&five["chain"]), ["0", "4", "5", "2"]);
    assert_eq!(five["chain"]["proxies"], 2);
    assert!(close(&five["chain"]["sum_rtt_ms"], 23.1166), "{five}");
    assert!(close(&five["chain"]["max_rtt_ms"], 8.9242), "{five}");
    assert!(close(&five["chain"]["predicted_ms"], 47.2551), "{five}");

    // Two islands: no chain between them, and the answer says why.
    let dir = tempdir("chains-topo");
    let split = dir.join("split.edges.csv");
    std::fs::write(&split, "src,dst,delay_ms\n0,1,5\n2,3,5\n").unwrap();
    let (ok, _, err) = chains(&[
        "--topology",
        split.to_str().unwrap(),
        "--from",
        "0",
        "--to",
        "3",
    ]);
    assert!(!ok);
    assert!(
        err.contains("no path from 0 to 3") && err.contains("2 parts"),
        "{err}"
    );
}
