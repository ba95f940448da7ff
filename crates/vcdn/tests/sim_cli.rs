//! `vcdn sim` and `vcdn sim sweep` as a user runs them: the summary, the
//! JSON and the per-session CSV agree, bad input gets a message that says
//! what is wrong, and a sweep runs every combination.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::tempdir;

const VCDN: &str = env!("CARGO_BIN_EXE_vcdn");

fn vcdn(args: &[&str]) -> Output {
    Command::new(VCDN).args(args).output().expect("vcdn runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A small Germany: five requests a second for five minutes.
const SMALL: [&str; 6] = ["sim", "--country", "DE", "--rate", "5", "--arrivals-s"];

#[test]
fn a_run_writes_a_summary_a_json_and_one_csv_line_per_session_that_agree() {
    let dir = tempdir("sim-run");
    let json = dir.join("run.json");
    let csv = dir.join("sessions.csv");
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend([
        "300",
        "--sites",
        "autoscaled",
        "--instance-mbps",
        "200",
        "--vod-share",
        "0.5",
        "--vod-titles",
        "10000",
        "--vod-cache-titles",
        "100",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--sessions-csv",
        csv.to_str().unwrap(),
    ]);
    let out = vcdn(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("start time (s)"), "{stdout}");
    assert!(stdout.contains("VoD "), "{stdout}");
    assert!(stdout.contains("instance-s"), "{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sessions = r["sessions"].as_u64().unwrap();
    assert!((1_200..1_800).contains(&sessions), "{sessions}");
    assert_eq!(r["unfinished"], 0);
    // One CSV line per session, and their mean start time is the summary's.
    let lines: Vec<String> = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert!(lines[0].starts_with("id,access,channel"), "{}", lines[0]);
    assert_eq!(lines.len() as u64, sessions + 1);
    let col = |name: &str| lines[0].split(',').position(|c| c == name).unwrap();
    let (start, vod) = (col("start_s"), col("vod"));
    let mean: f64 = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(start).unwrap().parse::<f64>().unwrap())
        .sum::<f64>()
        / sessions as f64;
    let want = r["qoe"]["start_s"]["mean"].as_f64().unwrap();
    assert!((mean - want).abs() < 1e-5, "{mean} vs {want}");
    // VoD: about half the sessions, each with what its site did.
    let vod_lines = lines[1..]
        .iter()
        .filter(|l| !l.split(',').nth(vod - 1).unwrap().is_empty())
        .count() as u64;
    assert_eq!(vod_lines, r["vod"]["sessions"].as_u64().unwrap());
    assert!(vod_lines * 3 > sessions && vod_lines * 3 < 2 * sessions);
    let shares: f64 = ["hit", "miss", "bypass", "no_cache"]
        .iter()
        .map(|k| r["vod"][k].as_f64().unwrap())
        .sum();
    assert!((shares - 1.0).abs() < 1e-9);
    // The CDFs for the figures: 101 values each, never decreasing.
    for key in ["vm_peak_mbps", "as_peak_vms", "start_s", "buffering_events"] {
        let xs: Vec<f64> = r["cdfs"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(xs.len(), 101, "{key}");
        assert!(xs.windows(2).all(|w| w[0] <= w[1]), "{key}: {xs:?}");
    }
}

#[test]
fn bad_input_is_refused_with_a_message_that_says_what_to_do() {
    let dir = tempdir("sim-bad");
    let caida = dir.join("rel.txt");
    let roles = dir.join("roles.csv");
    std::fs::write(&caida, "1|2|-1\nthis is not a relationship\n").unwrap();
    std::fs::write(&roles, "asn,role,weight\n1,content,0\n2,access,1\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["sim", "--country", "XX"], "Table 2 has US, DE"),
        (
            vec!["sim", "--topology", "/nonexistent/x"],
            "/nonexistent/x",
        ),
        (
            vec![
                "sim",
                "--caida",
                caida.to_str().unwrap(),
                "--roles",
                roles.to_str().unwrap(),
            ],
            "line 2",
        ),
        (vec!["sim", "--rate=-3"], "rate must be > 0"),
        (vec!["sim", "--static-share", "2"], "between 0 and 1"),
        (
            vec!["sim", "--sites", "fixed", "--min-mos", "9"],
            "between 1 and 5",
        ),
        (
            vec!["sim", "--vod-share", "0.5", "--vod-titles", "0"],
            "at least one title",
        ),
        (
            vec![
                "sim",
                "--sites",
                "fixed",
                "--vod-share",
                "1",
                "--vod-filter",
                "big",
            ],
            "auto, none or a number",
        ),
    ];
    for (args, want) in cases {
        let out = vcdn(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_sweep_runs_every_combination_and_refuses_a_typo_before_running_any() {
    let dir = tempdir("sim-sweep");
    let out_dir = dir.join("out");
    let out = vcdn(&[
        "sim",
        "sweep",
        "--vary",
        "boot-ms=0,5000",
        "--vary",
        "boot=wait,origin",
        "--jobs",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
        "--",
        "--country",
        "FR",
        "--rate",
        "5",
        "--arrivals-s",
        "120",
        "--on-demand",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let csv = std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    let summary = |name: &str| -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap()
    };
    for name in [
        "boot-ms=0,boot=wait",
        "boot-ms=0,boot=origin",
        "boot-ms=5000,boot=wait",
        "boot-ms=5000,boot=origin",
    ] {
        assert!(summary(name)["sessions"].as_u64().unwrap() > 400, "{name}");
    }
    // Requests that wait 5 s for their cache start later than with none.
    let start = |name: &str| summary(name)["qoe"]["start_s"]["mean"].as_f64().unwrap();
    assert!(start("boot-ms=5000,boot=wait") > start("boot-ms=0,boot=wait") + 0.5);

    let typo_dir = dir.join("typo");
    let out = vcdn(&[
        "sim",
        "sweep",
        "--vary",
        "boot-ms=0,100",
        "--vary",
        "bot=wait",
        "--out",
        typo_dir.to_str().unwrap(),
        "--",
        "--country",
        "FR",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--bot"), "{}", text(&out.stderr));
    assert!(!typo_dir.join("sweep.csv").exists());
}
