//! `vcdn calibrate` against a real cache held to a CPU share: it writes a
//! capacity model the planner can read, with sensible shapes.

use std::process::Command;

use vcdn_model::capacity::CapacityModel;

#[test]
fn calibrate_writes_a_usable_capacity_model() {
    let dir = std::env::temp_dir().join(format!("vcdn-test-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("capacity.toml");
    let run = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "calibrate",
            "--cpus",
            "0.1",
            "--seconds",
            "1",
            "--video-seconds",
            "5",
            "--out",
        ])
        .arg(&out)
        .env("VCDN_LOG", "warn")
        .output()
        .expect("vcdn calibrate runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("requests/s per vCPU") && stdout.contains("capacity model written"),
        "{stdout}"
    );
    let m = CapacityModel::from_toml(&std::fs::read_to_string(&out).unwrap())
        .expect("a valid capacity model");
    assert_eq!(m.throughput.len(), 2);
    let (small, large) = (m.requests_per_vcpu(73_262), m.requests_per_vcpu(434_830));
    assert!(small > large && large > 100.0, "{small} {large}");
    assert_eq!(m.latency[0].points.len(), 4);
    assert!(m.video[0].points.len() >= 3, "{:?}", m.video);
    // The lightest video load plays perfectly.
    assert!(m.video[0].points[0].mos > 4.5, "{:?}", m.video);
    // The planner can use it.
    assert!(m.sessions_per_vcpu(2_500.0, 2.0, 4.0) > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}
