//! Billing through the Kafka data sink (issue 19, point 5): `vcdn up
//! --kafka` runs a real Kafka broker, the caches it starts send their
//! `edge.stats` records there (acks from all replicas) besides the p2p
//! path, and the control plane bills them as they arrive, exactly once,
//! also across a control plane killed with SIGKILL whose consumer group is
//! then made to read everything again.
//!
//! Needs the Kafka distribution of `scripts/kafka.sh` (which
//! `scripts/test.sh` runs). The broker is stopped at the end with the
//! control plane (SIGTERM), also when a test fails, and no broker JVM of
//! a test's directory may be left.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::eventually;
use support::up::{free_port, Up, OP};

/// A `vcdn up --kafka` stopped with SIGTERM when dropped (so that its
/// broker goes too), whose broker is killed by its pid file should the
/// control plane not have stopped it.
struct KafkaUp {
    up: Up,
    kafka_port: u16,
}

impl KafkaUp {
    fn start(name: &str, model: &str) -> KafkaUp {
        let kafka_port = free_port();
        let args = [
            "--capacity-model".to_string(),
            model.to_string(),
            "--telemetry-discovery-port".into(),
            free_port().to_string(),
            "--kafka".into(),
            "--kafka-port".into(),
            kafka_port.to_string(),
            "--kafka-controller-port".into(),
            free_port().to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        KafkaUp {
            up: Up::start(name, &args),
            kafka_port,
        }
    }

    /// SIGTERM, and wait until it exited.
    fn stop(&mut self) {
        if let Some(mut c) = self.up.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for KafkaUp {
    fn drop(&mut self) {
        self.stop();
        // A test that failed between a SIGKILL and the restart leaves the
        // orphaned broker: its process group, as its pid file names it.
        let pid_file = self.up.dir.join("kafka/broker.pid");
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            if !brokers_of(&self.up.dir).is_empty() {
                // SAFETY: signalling the broker's process group.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
    }
}

/// Broker JVMs whose command line names `dir`.
fn brokers_of(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("kafka.Kafka") && c.contains(&needle))
        .collect()
}

async fn metric(up: &Up, series: &str) -> f64 {
    let text = up.api_client().get("/metrics").await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

const BILLED: &str = "vcdn_control_billing_records_total{via=\"kafka\",result=\"billed\"}";
const ALREADY: &str = "vcdn_control_billing_records_total{via=\"kafka\",result=\"already_billed\"}";

async fn service(up: &Up, id: &str) -> Value {
    up.call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await
        .1
}

/// The service's billed (requests, bytes).
async fn usage(up: &Up, id: &str) -> (u64, u64) {
    let u = &service(up, id).await["usage"];
    (
        u["requests"].as_u64().unwrap_or(0),
        u["bytes"].as_u64().unwrap_or(0),
    )
}

/// What the cache itself says it served: (requests, body bytes).
async fn served(up: &Up, admin: &str) -> (u64, u64) {
    let r = up
        .instance_admin(admin, "/stats")
        .await
        .expect("the cache's /stats");
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let requests = v["requests"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum());
    (requests, v["body_bytes_sent"].as_u64().unwrap_or(0))
}

async fn get_n(cache: SocketAddr, n: usize) {
    for _ in 0..n {
        let r = vcdn_http::client::request(
            cache,
            "GET",
            "/size/1000",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .await
        .expect("the cache answers");
        assert_eq!(r.status(), 200);
    }
}

/// Makes the billing group read its topics from the start again (as after
/// a crash that lost every commit): Kafka's own tool, once the dead
/// member's session expired and the group is empty.
fn rewind_billing_group(bootstrap: &str) {
    let dist = vcdn_telemetry::kafka::KafkaDist::locate().expect("scripts/kafka.sh ran");
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < Duration::from_secs(60) {
        let out = dist
            .java_command()
            .arg("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand")
            .args(["--bootstrap-server", bootstrap, "--group", "vcdn-billing"])
            .args([
                "--reset-offsets",
                "--to-earliest",
                "--all-topics",
                "--execute",
            ])
            .output()
            .expect("java runs");
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && last.contains("NEW-OFFSET") && last.contains("edge.stats") {
            return;
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    panic!("the billing group's offsets could not be reset: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_billed_through_kafka_exactly_once_across_a_killed_control_plane() {
    let model_dir = support::tempdir("billing-model");
    let model = support::small_capacity_model(&model_dir);
    let mut k = KafkaUp::start("billing-kafka", &model);
    let bootstrap = format!("127.0.0.1:{}", k.kafka_port);
    assert!(
        k.up.greeting
            .iter()
            .any(|l| l.contains("Kafka") && l.contains(&bootstrap)),
        "the startup output does not say where Kafka listens: {:?}",
        k.up.greeting
    );

    // A service with one cache.
    let spec = json!({"name": "bill", "origin": format!("http://{}", k.up.origin),
        "hostname": "bill.example", "flavor": "elastic",
        "regions": [{"region": "paris", "peak_users": 10}], "quality": {"min_mos": 4.0}});
    let (st, s) =
        k.up.call(&k.up.demo_key(), "POST", "/v1/services", Some(spec))
            .await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let up = &k.up;
    assert!(
        eventually(20, || async { service(up, &id).await["state"] == "active" }).await,
        "the service did not become active"
    );
    let s = service(up, &id).await;
    let inst = s["graph"]["regions"][0]["instances"][0].clone();
    let cache: SocketAddr = inst["address"].as_str().unwrap().parse().unwrap();
    let admin = inst["admin"].as_str().unwrap().to_string();

    // Records reach the control plane through Kafka (the broker starts in
    // the background: seconds, more on a loaded machine).
    let through_kafka = eventually(90, || async { metric(up, BILLED).await > 0.0 }).await;
    assert!(
        through_kafka,
        "no edge.stats record was billed through Kafka:\n{}",
        up.api_client()
            .get("/metrics")
            .await
            .text()
            .lines()
            .filter(|l| l.contains("billing") || l.contains("telemetry_records"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Usage is what the cache served, requests and bytes.
    get_n(cache, 20).await;
    let exact = eventually(20, || async {
        usage(up, &id).await == served(up, &admin).await
    })
    .await;
    assert!(
        exact,
        "usage {:?}, served {:?}",
        usage(up, &id).await,
        served(up, &admin).await
    );
    assert_eq!(usage(up, &id).await.0, 20);
    assert!(
        usage(up, &id).await.1 >= 20 * 1000,
        "{:?}",
        usage(up, &id).await
    );

    // Kafka has no authentication here: whoever reaches the broker can
    // write to edge.stats. A record sealed with another key claiming a
    // huge count for the real instance, one with the deployment's key from
    // a source that is no instance, and garbage: counted, never billed.
    let iid = inst["id"].as_str().unwrap().to_string();
    let member = vcdn_telemetry::keys::KeyFile::load(
        &up.dir.join(format!("instances/{iid}/telemetry-keys.json")),
    )
    .unwrap()
    .keyring()
    .unwrap();
    let forged = vcdn_telemetry::record::Record {
        source: iid.clone(),
        service: None,
        inc: u64::MAX,
        seq: u64::MAX,
        ts: u64::MAX,
        data: json!({"requests": {"HIT": 1_000_000_000_000u64}, "body_bytes_sent": 1u64 << 50}),
    };
    let other = vcdn_telemetry::keys::KeyFile::generate().keyring().unwrap();
    let stranger = vcdn_telemetry::record::Record {
        source: "i-stranger".into(),
        ..forged.clone()
    };
    let before = (
        metric(
            up,
            "vcdn_control_billing_records_total{via=\"kafka\",result=\"bad_mac\"}",
        )
        .await,
        metric(
            up,
            "vcdn_control_billing_records_total{via=\"kafka\",result=\"unknown_instance\"}",
        )
        .await,
        metric(
            up,
            "vcdn_control_billing_records_total{via=\"kafka\",result=\"malformed\"}",
        )
        .await,
    );
    let intruder = vcdn_telemetry::kafka::Producer::new(&bootstrap, Default::default()).unwrap();
    for frame in [
        vcdn_telemetry::record::seal(&other, &forged),
        vcdn_telemetry::record::seal(&member, &stranger),
        b"ANDR\0\0\0\0not a record".to_vec(),
    ] {
        intruder.send("edge.stats", iid.as_bytes(), &frame).unwrap();
    }
    assert!(
        intruder.flush(Duration::from_secs(20)),
        "the intruder's records were not acknowledged"
    );
    let counted = eventually(20, || async {
        metric(
            up,
            "vcdn_control_billing_records_total{via=\"kafka\",result=\"bad_mac\"}",
        )
        .await
            > before.0
            && metric(
                up,
                "vcdn_control_billing_records_total{via=\"kafka\",result=\"unknown_instance\"}",
            )
            .await
                > before.1
            && metric(
                up,
                "vcdn_control_billing_records_total{via=\"kafka\",result=\"malformed\"}",
            )
            .await
                > before.2
    })
    .await;
    assert!(counted, "the forged records were not counted");
    assert_eq!(
        usage(up, &id).await,
        served(up, &admin).await,
        "forged records were billed"
    );
    drop(intruder);

    // The control plane dies (SIGKILL: nothing flushed, its broker is
    // orphaned and keeps running); the cache keeps serving and publishing.
    k.up.kill();
    get_n(cache, 30).await;
    // Everything is delivered again after the restart: the group's
    // committed offsets go back to the start.
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || rewind_billing_group(&b))
        .await
        .unwrap();
    k.up.relaunch();
    let up = &k.up;
    get_n(cache, 10).await;
    let exact = eventually(90, || async {
        let (u, s) = (usage(up, &id).await, served(up, &admin).await);
        u == s && s.0 == 60
    })
    .await;
    assert!(
        exact,
        "after the restart: usage {:?}, served {:?}",
        usage(up, &id).await,
        served(up, &admin).await
    );
    assert!(
        metric(up, ALREADY).await > 0.0,
        "the records delivered again were not recognised as billed"
    );
    // Nothing more trickles in later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(usage(up, &id).await, served(up, &admin).await);
    assert_eq!(usage(up, &id).await.0, 60);

    // Stopped with SIGTERM, the control plane stops its broker.
    k.stop();
    let dir = k.up.dir.0.clone();
    assert!(
        eventually(20, || async { brokers_of(&dir).is_empty() }).await,
        "brokers left running: {:?}",
        brokers_of(&dir)
    );
}

#[test]
fn kafka_without_the_distribution_says_which_script_to_run() {
    let dir = support::tempdir("billing-nodist");
    let empty = support::tempdir("billing-nodist-home");
    let p = || format!("127.0.0.1:{}", free_port());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .arg("up")
        .arg("--data-dir")
        .arg(&dir.0)
        .args(["--api", &p(), "--dns", &p(), "--http", &p()])
        .args(["--router-admin", &p()])
        .args(["--operator-token", OP])
        .args(["--telemetry-discovery-port", &free_port().to_string()])
        .arg("--kafka")
        .env("VCDN_KAFKA_HOME", &empty.0)
        .env("VCDN_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vcdn up --kafka runs without the Kafka distribution");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "vcdn up --kafka started without Kafka"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scripts/kafka.sh"), "{err}");
}
