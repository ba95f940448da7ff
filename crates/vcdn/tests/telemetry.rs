//! The platform on its own telemetry (issue 19, point 5, peer-to-peer
//! mode): `vcdn up` is the tracker, the caches it starts discover it and
//! publish their `/stats` as `edge.stats` records, and the supervisor takes
//! its view of them from those records. Each test runs its own `vcdn up`
//! on its own discovery port.
//!
//! - a service's caches are discovered, their counters reach the control
//!   plane through telemetry, and the usage it bills is what they served;
//! - a forged `edge.stats` datagram (another key) and one from a source
//!   that is no instance change nothing and are counted;
//! - the API publishes players' QoE reports (`qoe.reports`) and the router
//!   its routing decisions (`router.decisions`) to whoever subscribes;
//! - a cache killed and restarted (a new incarnation) is not counted twice,
//!   and one stopped says it drains (`edge.events`);
//! - with `/stats` polling off, the supervisor scales a service out from
//!   telemetry alone, and the time from a load step to the decision is
//!   printed beside the same step under polling alone.

mod support;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::eventually;
use support::up::{caches, free_port, Up, OP};
use vcdn_telemetry::agent::{Agent, AgentConfig};
use vcdn_telemetry::keys::KeyFile;
use vcdn_telemetry::message::{Role, Subscription};
use vcdn_telemetry::record::{
    self, Record, TOPIC_EDGE_STATS, TOPIC_QOE_REPORTS, TOPIC_ROUTER_DECISIONS,
};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A `vcdn up --demo` with its own discovery port (0: no telemetry) and
/// the small model.
fn up(name: &str, model: &str, telemetry: bool, extra: &[&str]) -> (Up, u16) {
    let port = if telemetry { free_port() } else { 0 };
    let mut args = vec![
        "--capacity-model".to_string(),
        model.to_string(),
        "--telemetry-discovery-port".into(),
        port.to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (Up::start(name, &args), port)
}

/// One line of the control API's `/metrics`, by name and labels.
async fn metric(up: &Up, series: &str) -> f64 {
    let text = up.api_client().get("/metrics").await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn service(up: &Up, id: &str) -> Value {
    up.call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await
        .1
}

fn instances(v: &Value) -> Vec<Value> {
    v["graph"]["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["instances"].as_array().cloned().unwrap_or_default())
        .collect()
}

async fn usage_requests(up: &Up, id: &str) -> u64 {
    service(up, id).await["usage"]["requests"]
        .as_u64()
        .unwrap_or(0)
}

async fn get(cache: SocketAddr, path: &str) -> u16 {
    vcdn_http::client::request(cache, "GET", path, &[], b"", Duration::from_secs(5))
        .await
        .map_or(0, |r| r.status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_publish_their_counters_and_forgeries_and_restarts_change_nothing() {
    let model_dir = support::tempdir("telemetry-model");
    let model = support::small_capacity_model(&model_dir);
    let (up, port) = up("telemetry-feed", &model, true, &[]);
    let id = up.order("feed", "paris", 10).await;
    let s = service(&up, &id).await;
    let inst = instances(&s)[0].clone();
    let iid = inst["id"].as_str().unwrap().to_string();
    let cache: SocketAddr = inst["address"].as_str().unwrap().parse().unwrap();

    // The cache was handed a member-only key file (0600) and the flags.
    let procs = caches(up.instance_port);
    let p = procs
        .iter()
        .find(|c| c.flags.get("--telemetry-node") == Some(&iid))
        .expect("the cache runs with --telemetry-node INSTANCE_ID");
    assert_eq!(
        p.flags.get("--telemetry-discovery-port"),
        Some(&port.to_string())
    );
    let key_path = p.flags.get("--telemetry-keys").expect("--telemetry-keys");
    assert_eq!(
        Path::new(key_path),
        up.dir.join(format!("instances/{iid}/telemetry-keys.json"))
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(key_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the key file is the owner's only");
    }
    let member = KeyFile::load(Path::new(key_path)).unwrap();
    assert!(
        member.authority_private.is_none(),
        "a cache holds no authority key"
    );

    // Discovered, and its counters arrive by telemetry: the control plane
    // takes the instance's statistics from records, and the cache's own
    // /metrics show what its agent sent.
    let fed = eventually(15, || async {
        metric(
            &up,
            "vcdn_control_telemetry_records_total{topic=\"edge.stats\",result=\"accepted\"}",
        )
        .await
            > 10.0
            && metric(&up, "vcdn_control_instance_stats_telemetry_total").await > 0.0
    })
    .await;
    if !fed {
        let m = up.api_client().get("/metrics").await.text();
        let log =
            std::fs::read_to_string(up.dir.join(format!("logs/{iid}.log"))).unwrap_or_default();
        panic!(
            "no edge.stats record reached the control plane:\n{}\ncache log:\n{log}",
            m.lines()
                .filter(|l| l.contains("telemetry"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        metric(&up, "vcdn_control_telemetry_events_total{event=\"start\"}").await >= 1.0,
        "the cache's start event did not arrive"
    );
    let r = up
        .instance_admin(inst["admin"].as_str().unwrap(), "/metrics")
        .await
        .expect("the cache's /metrics");
    let text = r.text();
    let sent = text
        .lines()
        .find_map(|l| l.strip_prefix("vcdn_telemetry_data_sent_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(sent > 0, "the cache's agent sent nothing:\n{text}");
    assert!(text.contains("vcdn_telemetry_configured 1"), "{text}");

    // Usage is what the cache served.
    for _ in 0..20 {
        assert_eq!(get(cache, "/size/1000").await, 200);
    }
    assert!(
        eventually(5, || async { usage_requests(&up, &id).await == 20 }).await,
        "usage {} after 20 requests",
        usage_requests(&up, &id).await
    );

    // Forgeries. The attacker learns where records go the way any member
    // does (an agent on the segment; one on the network sees the traffic
    // anyway), then sends records the supervisor must not believe: one
    // sealed with another key claiming a huge count for the real
    // instance, and one with the right key from a source that is no
    // instance.
    let keys = Arc::new(member.keyring().unwrap());
    let mut cfg = AgentConfig::loopback("intruder", vec![Role::P2pProducer]);
    cfg.discovery_port = port;
    cfg.publish = vec![TOPIC_EDGE_STATS.into()];
    let spy = Agent::start(cfg, keys.clone()).await.unwrap();
    assert!(
        eventually(10, || async {
            !spy.destinations(TOPIC_EDGE_STATS).is_empty()
        })
        .await,
        "the test's agent got no destination for edge.stats"
    );
    let dests = spy.destinations(TOPIC_EDGE_STATS);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut data = r#"{"instance_id": "X", "boot_ms": 1, "requests": {"hit": 1000000000000}, "body_bytes_sent": 1, "connections_open": 10000}"#
        .replace("X", &format!("{iid}.{}", inst["nonce"].as_str().unwrap()));
    let forged = Record {
        source: iid.clone(),
        service: None,
        inc: u64::MAX,
        seq: u64::MAX,
        ts: now_ms(),
        data: serde_json::from_str(&data).unwrap(),
    };
    let other = KeyFile::generate().keyring().unwrap();
    let bad_before = metric(
        &up,
        "vcdn_control_telemetry_records_total{topic=\"edge.stats\",result=\"bad_mac\"}",
    )
    .await;
    for d in &dests {
        sock.send_to(&record::seal(&other, &forged), d).unwrap();
    }
    data = data.replace(&iid, "i-stranger");
    let stranger = Record {
        source: "i-stranger".into(),
        data: serde_json::from_str(&data).unwrap(),
        ..forged.clone()
    };
    for d in &dests {
        sock.send_to(&record::seal(&keys, &stranger), d).unwrap();
    }
    let counted = eventually(5, || async {
        metric(
            &up,
            "vcdn_control_telemetry_records_total{topic=\"edge.stats\",result=\"bad_mac\"}",
        )
        .await
            > bad_before
            && metric(
                &up,
                "vcdn_control_telemetry_records_total{topic=\"edge.stats\",result=\"unknown_source\"}",
            )
            .await
                >= 1.0
    })
    .await;
    assert!(counted, "the forged records were not counted");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = service(&up, &id).await;
    assert_eq!(
        after["usage"]["requests"].as_u64(),
        Some(20),
        "forged records changed the usage: {}",
        after["usage"]
    );
    assert_eq!(
        instances(&after).len(),
        1,
        "a forged load of 10000 connections scaled the service"
    );
    spy.shutdown().await;

    // What the API and the router publish: a consumer of qoe.reports and
    // router.decisions gets a player's report and the router's counts.
    let mut cfg = AgentConfig::loopback("watcher", vec![Role::P2pConsumer]);
    cfg.discovery_port = port;
    let inbox = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    cfg.subscribe = [TOPIC_QOE_REPORTS, TOPIC_ROUTER_DECISIONS]
        .iter()
        .map(|t| Subscription {
            topic: t.to_string(),
            port: inbox.local_addr().unwrap().port(),
            host: None,
        })
        .collect();
    let watcher = Agent::start(cfg, keys.clone()).await.unwrap();
    let router_http = SocketAddr::from(([127, 0, 0, 1], up.ports[1]));
    let routed = vcdn_http::client::request(
        router_http,
        "GET",
        "/size/1000",
        &[("Host", "feed.example")],
        b"",
        Duration::from_secs(5),
    )
    .await
    .expect("the router answers");
    assert_eq!(routed.status(), 302);
    let (mut qoe, mut routed_counts) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = vec![0u8; 65536];
    let mut reported = Instant::now() - Duration::from_secs(10);
    while (qoe.is_none() || routed_counts.is_none()) && Instant::now() < deadline {
        // Reported again each second until the watcher is a destination.
        if qoe.is_none() && reported.elapsed() > Duration::from_secs(1) {
            reported = Instant::now();
            let (st, _) = up
                .call(
                    &up.demo_key(),
                    "POST",
                    &format!("/v1/services/{id}/qoe"),
                    Some(json!({"region": "paris", "mos": 4.2})),
                )
                .await;
            assert_eq!(st, 204);
        }
        let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(300), inbox.recv_from(&mut buf)).await
        else {
            continue;
        };
        let r = record::open(&keys, &buf[..n]).expect("records are sealed with the key");
        match r.source.as_str() {
            "control" => qoe = Some(r),
            "router" => {
                let n: u64 = r.data["regions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["caches"].as_array().cloned().unwrap_or_default())
                    .map(|c| c["edge"].as_u64().unwrap_or(0) + c["origin"].as_u64().unwrap_or(0))
                    .sum();
                if r.service.as_deref() == Some(id.as_str()) && n >= 1 {
                    routed_counts = Some(r);
                }
            }
            other => panic!("a record of {other} on qoe.reports or router.decisions"),
        }
    }
    let qoe = qoe.expect("no qoe.reports record");
    assert_eq!(qoe.service.as_deref(), Some(id.as_str()));
    assert_eq!(qoe.data["mos"].as_f64(), Some(4.2));
    assert_eq!(qoe.data["region"], "paris");
    assert!(
        routed_counts.is_some(),
        "no router.decisions record counting the routed request"
    );
    watcher.shutdown().await;

    // A new incarnation: the cache is killed and replaced (its counters
    // start from zero); nothing is counted twice, nothing lost.
    let pid = inst["pid"].as_u64().unwrap();
    // SAFETY: killing the instance process.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let healed = eventually(10, || async {
        let i = &instances(&service(&up, &id).await)[0];
        i["pid"].as_u64().is_some_and(|p| p != pid) && i["state"] == "running"
    })
    .await;
    assert!(healed, "the killed cache was not replaced");
    for _ in 0..10 {
        assert_eq!(get(cache, "/size/1000").await, 200);
    }
    assert!(
        eventually(5, || async { usage_requests(&up, &id).await == 30 }).await,
        "usage {} after 20 + 10 requests across a restart",
        usage_requests(&up, &id).await
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(usage_requests(&up, &id).await, 30, "counted twice later");
    assert!(
        metric(&up, "vcdn_control_telemetry_events_total{event=\"start\"}").await >= 2.0,
        "the replacement's start event did not arrive"
    );

    // Deleted: its cache is stopped (SIGTERM) and says it drains.
    let (st, v) = up
        .call(
            &up.demo_key(),
            "DELETE",
            &format!("/v1/services/{id}"),
            None,
        )
        .await;
    assert!(st < 300, "{v}");
    let drained = eventually(10, || async {
        metric(&up, "vcdn_control_telemetry_events_total{event=\"drain\"}").await >= 1.0
    })
    .await;
    assert!(drained, "no drain event from the stopped cache");
}

/// Time from a step of 40 viewers' connections (two instances' worth) on
/// the one cache of a fresh service to the supervisor's scale-out
/// decision (the `scaled_out` event's time less the launch it reports).
async fn reaction(up: &Up, name: &str, region: &str) -> Duration {
    let id = up.order(name, region, 10).await;
    let inst = instances(&service(up, &id).await)[0].clone();
    let cache: SocketAddr = inst["address"].as_str().unwrap().parse().unwrap();
    // Settled: the supervisor has seen the idle instance for a while.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let step = now_ms();
    let conns: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(cache).unwrap())
        .collect();
    let mut decided = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while decided.is_none() && Instant::now() < deadline {
        let (_, ev) = up
            .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
            .await;
        decided = ev["events"].as_array().into_iter().flatten().find_map(|e| {
            if e["kind"] != "scaled_out" {
                return None;
            }
            let at = e["at_ms"].as_u64()?;
            let detail = e["detail"].as_str()?;
            let launch_ms: f64 = detail
                .rsplit("serving after ")
                .next()?
                .trim_end_matches(" ms")
                .parse()
                .ok()?;
            Some(at.saturating_sub(launch_ms as u64))
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(conns);
    let at = decided.unwrap_or_else(|| panic!("{name}: no scale-out within 20 s of the load step"));
    Duration::from_millis(at.saturating_sub(step))
}

/// The reaction times of load steps, each on a fresh service in a region
/// of its own (each has the capacity for the instances a step adds).
async fn reactions(up: &Up, name: &str) -> Vec<Duration> {
    let mut out = Vec::new();
    for region in REGIONS {
        out.push(reaction(up, &format!("{name}-{region}"), region).await);
    }
    out
}

const REGIONS: [&str; 3] = ["paris", "lyon", "marseille"];
const ROUNDS: usize = REGIONS.len();

fn mean_ms(d: &[Duration]) -> f64 {
    d.iter().map(|d| d.as_secs_f64() * 1000.0).sum::<f64>() / d.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_scales_out_from_telemetry_alone_with_polling_off() {
    let model_dir = support::tempdir("telemetry-scale-model");
    let model = support::small_capacity_model(&model_dir);

    // Telemetry alone: never a poll.
    let (tele, _) = up("telemetry-only", &model, true, &["--no-stats-polling"]);
    let by_telemetry = reactions(&tele, "fast").await;
    assert_eq!(
        metric(&tele, "vcdn_control_instance_stats_polled_total").await,
        0.0,
        "the supervisor polled /stats with polling off"
    );
    assert!(metric(&tele, "vcdn_control_instance_stats_telemetry_total").await > 0.0);
    drop(tele);

    // The same steps under polling alone (no telemetry).
    let (poll, _) = up("telemetry-polling", &model, false, &[]);
    let by_polling = reactions(&poll, "slow").await;
    assert_eq!(
        metric(&poll, "vcdn_control_instance_stats_telemetry_total").await,
        0.0
    );
    drop(poll);

    let ms = |d: &[Duration]| {
        d.iter()
            .map(|d| format!("{}", d.as_millis()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "scale-out decision after a load step ({ROUNDS} steps each): telemetry {:.0} ms mean ({} ms), polling {:.0} ms mean ({} ms)",
        mean_ms(&by_telemetry),
        ms(&by_telemetry),
        mean_ms(&by_polling),
        ms(&by_polling)
    );
    // Not slower than polling. Polling answers at the next once-a-second
    // sample (0-1 s after the step, then the polls), telemetry within a
    // tick or two of the records; the margin is for a loaded machine.
    assert!(
        mean_ms(&by_telemetry) <= mean_ms(&by_polling) + 500.0,
        "telemetry {by_telemetry:?} vs polling {by_polling:?}"
    );
}

/// With polling off, telemetry is the liveness signal too: a cache that
/// stops publishing (SIGSTOP: its process is there, its records are not)
/// is taken for hung after the unresponsive window and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_polling_off_a_silent_cache_is_taken_for_hung_and_replaced() {
    let model_dir = support::tempdir("telemetry-silent-model");
    let model = support::small_capacity_model(&model_dir);
    let (up, _) = up("telemetry-silent", &model, true, &["--no-stats-polling"]);
    let id = up.order("silent", "lyon", 10).await;
    let inst = instances(&service(&up, &id).await)[0].clone();
    let pid = inst["pid"].as_u64().unwrap();
    assert!(
        eventually(10, || async {
            metric(&up, "vcdn_control_instance_stats_telemetry_total").await > 0.0
        })
        .await,
        "no edge.stats record used"
    );
    // SAFETY: signalling the instance process.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let t0 = Instant::now();
    let replaced = eventually(60, || async {
        let i = &instances(&service(&up, &id).await)[0];
        i["pid"].as_u64().is_some_and(|p| p != pid) && i["state"] == "running"
    })
    .await;
    // SAFETY: signalling a process id (gone if it was replaced).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(replaced, "the silent cache was not replaced");
    let took = t0.elapsed();
    let (_, ev) = up
        .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    let ev = ev.to_string();
    assert!(
        ev.contains("unresponsive") && ev.contains("no edge.stats record"),
        "{ev}"
    );
    assert!(
        took >= Duration::from_secs(25),
        "replaced after {took:?}, before the unresponsive window"
    );
    eprintln!("a silent cache was replaced after {took:?}");
}
