//! What an unlucky operator does to the control plane: `vcdn up` killed
//! (SIGKILL) in the middle of orders and deletes, many times over; an
//! instance address held by someone else. After every restart no `vcdn
//! cache` runs that no service record owns, and every instance address
//! serves its own service (its `/healthz` proves the instance id and
//! names its service's origin).

mod support;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::eventually;
use support::up::{caches, call, Api, Up, OP};

fn live(s: &Value) -> bool {
    matches!(
        s["state"].as_str(),
        Some("scheduled" | "deploying" | "active" | "degraded" | "deleting")
    )
}

fn instances(s: &Value) -> Vec<Value> {
    s["graph"]["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["instances"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The id an instance proves in its `/healthz`.
fn identity(i: &Value) -> String {
    format!(
        "{}.{}",
        i["id"].as_str().unwrap_or(""),
        i["nonce"].as_str().unwrap_or("")
    )
}

/// What is wrong: `vcdn cache` processes no live record owns, and
/// instance addresses that serve another service than their record's.
async fn violations(up: &Up) -> Vec<String> {
    let services = up.services().await;
    let mut wrong = Vec::new();
    let mut owned: HashMap<String, (String, Option<u64>, String)> = HashMap::new();
    for s in services.iter().filter(|s| live(s)) {
        for i in instances(s) {
            owned.insert(
                i["address"].as_str().unwrap_or("").to_string(),
                (
                    identity(&i),
                    i["pid"].as_u64(),
                    s["id"].as_str().unwrap_or("").to_string(),
                ),
            );
        }
    }
    for p in caches(up.instance_port) {
        let listen = p.flags.get("--listen").cloned().unwrap_or_default();
        match owned.get(&listen) {
            None => wrong.push(format!(
                "pid {} serves {listen}, which no live record owns",
                p.pid
            )),
            Some((id, pid, sid)) => {
                if p.flags.get("--instance-id") != Some(id) || *pid != Some(p.pid as u64) {
                    wrong.push(format!(
                        "pid {} ({:?}) serves {listen}, recorded as {id} pid {pid:?} of {sid}",
                        p.pid,
                        p.flags.get("--instance-id")
                    ));
                }
            }
        }
    }
    for s in services
        .iter()
        .filter(|s| matches!(s["state"].as_str(), Some("active" | "degraded")))
    {
        for i in instances(s).iter().filter(|i| i["state"] == "running") {
            // Over HTTPS trusting the internal CA only, as the control
            // plane calls it.
            let Ok(r) = up
                .instance_admin(i["admin"].as_str().unwrap(), "/healthz")
                .await
            else {
                continue;
            };
            let h: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if h["instance_id"].as_str() != Some(identity(i).as_str())
                || h["upstream"] != s["origin"]
            {
                wrong.push(format!(
                    "{} of {} ({}) answers as {} for {}",
                    i["address"], s["id"], s["origin"], h["instance_id"], h["upstream"]
                ));
            }
        }
    }
    wrong
}

/// A small xorshift, seeded from the clock (printed, to replay a run).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_control_plane_mid_order_leaves_no_stray_and_no_mixup() {
    let seed = std::env::var("VCDN_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("chaos seed {seed} (VCDN_CHAOS_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let mut up = Up::start("crash-chaos", &[]);
    let a = up.demo_key();
    let (st, b) = up
        .call(
            OP,
            "POST",
            "/v1/customers",
            // The origin is on loopback: the operator's exception for it.
            Some(json!({"name": "beta", "origin_allow": [
                format!("127.0.0.1:{}", up.origin.port()),
                format!("[::1]:{}", up.origin.port()),
            ]})),
        )
        .await;
    assert_eq!(st, 201, "{b}");
    let b = b["api_key"].as_str().unwrap().to_string();
    let customers = [
        (a, format!("http://127.0.0.1:{}", up.origin.port())),
        (b, format!("http://localhost:{}", up.origin.port())),
    ];
    let t0 = Instant::now();
    let mut round = 0;
    // Services seen, per origin, and rounds that had caches running: the
    // orders really went through (an order refused would prove nothing).
    let mut seen: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    let mut rounds_with_caches = 0;
    while round < 100 && t0.elapsed() < Duration::from_secs(30) {
        round += 1;
        // Orders and deletes by both customers, in flight together.
        let services = up.services().await;
        for s in &services {
            if let (Some(o), Some(id)) = (s["origin"].as_str(), s["id"].as_str()) {
                seen.entry(o.to_string())
                    .or_default()
                    .insert(id.to_string());
            }
        }
        if !caches(up.instance_port).is_empty() {
            rounds_with_caches += 1;
        }
        let mut calls = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let (key, origin) = &customers[rng.below(2) as usize];
            let mine: Vec<String> = services
                .iter()
                .filter(|s| live(s) && s["state"] != "deleting")
                .filter(|s| s["origin"] == origin.as_str())
                .filter_map(|s| s["id"].as_str().map(str::to_string))
                .collect();
            let n = rng.below(1_000_000);
            let (method, path, body) = if mine.len() >= 2 || (!mine.is_empty() && rng.below(3) == 0)
            {
                (
                    "DELETE",
                    format!(
                        "/v1/services/{}",
                        mine[rng.below(mine.len() as u64) as usize]
                    ),
                    None,
                )
            } else {
                let region = ["paris", "lyon", "marseille"][rng.below(3) as usize];
                (
                    "POST",
                    "/v1/services".to_string(),
                    Some(
                        json!({"name": format!("c{n}"), "origin": origin, "hostname": format!("c{n}.example"),
                        "flavor": "static", "regions": [{"region": region}]}),
                    ),
                )
            };
            let (api, key) = (up.api_client(), key.clone());
            calls.push(tokio::spawn(async move {
                let _ = call(&api, &key, method, &path, body).await;
            }));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        up.kill();
        for c in calls {
            let _ = c.await;
        }
        up.relaunch();
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut wrong = violations(&up).await;
        while !wrong.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            wrong = violations(&up).await;
        }
        assert!(wrong.is_empty(), "round {round} (seed {seed}): {wrong:#?}");
    }
    eprintln!("{round} rounds in {:.1} s", t0.elapsed().as_secs_f64());
    assert!(round >= 10, "only {round} rounds ran");
    for (_, origin) in &customers {
        let n = seen.get(origin).map_or(0, |s| s.len());
        assert!(n >= 2, "only {n} services of {origin} were ever recorded");
    }
    assert!(
        rounds_with_caches * 4 >= round,
        "caches ran in only {rounds_with_caches} of {round} rounds"
    );
    // The stores still work: every live service is deleted, and nothing runs.
    for s in up.services().await.iter().filter(|s| live(s)) {
        let (st, v) = up
            .call(
                OP,
                "DELETE",
                &format!("/v1/services/{}", s["id"].as_str().unwrap()),
                None,
            )
            .await;
        assert!(st == 200 || st == 409, "{v}");
    }
    assert!(
        eventually(5, || async { caches(up.instance_port).is_empty() }).await,
        "{:?}",
        caches(up.instance_port)
    );
    let _: PathBuf = up.dir.to_path_buf();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_on_an_instance_address_is_a_conflict_and_relaunches_back_off() {
    let mut up = Up::start("crash-impostor", &[]);
    let origin = format!("http://127.0.0.1:{}", up.origin.port());
    let spec = json!({"name": "own", "origin": origin, "hostname": "own.example", "flavor": "static", "regions": [{"region": "lyon"}]});
    let (st, s) = up
        .call(&up.demo_key(), "POST", "/v1/services", Some(spec))
        .await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let victim = instances(&s)[0].clone();
    // The control plane dies, and so does one instance; another process
    // (a cache for someone else's origin) takes its address meanwhile.
    up.kill();
    // SAFETY: killing an instance process.
    unsafe { libc::kill(victim["pid"].as_u64().unwrap() as i32, libc::SIGKILL) };
    let address = victim["address"].as_str().unwrap();
    let admin = victim["admin"].as_str().unwrap();
    assert!(
        eventually(5, || async { TcpListener::bind(address).is_ok() }).await,
        "the instance's address was not freed"
    );
    let impostor = support::spawn(&[
        "cache",
        "--listen",
        address,
        "--upstream",
        "http://127.0.0.1:9",
        "--admin",
        admin,
        "--admin-token",
        support::TOKEN,
        "--instance-id",
        "someone-else",
        "--threads",
        "1",
    ]);
    up.launch().expect("vcdn up starts again");
    // Not active while the address is someone else's, and no tight
    // relaunch loop: a few attempts, each reported, further and further apart.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let v = up
            .call(OP, "GET", &format!("/v1/services/{id}"), None)
            .await
            .1;
        assert_ne!(
            v["state"], "active",
            "a stranger on the address was taken for the instance: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, ev) = up
        .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    let failed: Vec<&Value> = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "relaunch_failed")
        .collect();
    assert!(!failed.is_empty(), "{ev}");
    assert!(
        failed.len() <= 6,
        "{} relaunches in 2 s: {ev}",
        failed.len()
    );
    assert!(
        failed[0]["detail"]
            .as_str()
            .unwrap()
            .contains("already in use"),
        "{ev}"
    );
    assert!(
        failed.last().unwrap()["detail"]
            .as_str()
            .unwrap()
            .contains("next attempt in"),
        "{ev}"
    );
    // The stranger leaves: the instance comes back and proves who it is.
    impostor.kill();
    assert!(
        eventually(15, || async {
            up.call(OP, "GET", &format!("/v1/services/{id}"), None)
                .await
                .1["state"]
                == "active"
        })
        .await,
        "the service did not come back"
    );
    let v = up
        .call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await
        .1;
    let i = instances(&v)
        .into_iter()
        .find(|i| i["id"] == victim["id"])
        .unwrap();
    let r = up.instance_admin(admin, "/healthz").await.unwrap();
    let h: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        h["instance_id"].as_str(),
        Some(identity(&i).as_str()),
        "{h}"
    );
    assert_eq!(h["upstream"].as_str(), Some(origin.as_str()), "{h}");
}

/// The attack on adoption: while the control plane is down, a process
/// takes an instance's place with everything a local user can read (its
/// identity from the command line, the data directory's mark) but its own
/// admin certificate. The restarted control plane does not adopt it (no
/// token, no customer key is sent to it), says why in the service's
/// events, stops it and starts the real instance again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_with_its_own_admin_certificate_is_not_adopted_and_the_event_says_why() {
    let mut up = Up::start("crash-tls-impostor", &[]);
    let origin = format!("http://127.0.0.1:{}", up.origin.port());
    let spec = json!({"name": "mine", "origin": origin, "hostname": "mine.example", "flavor": "static", "regions": [{"region": "lyon"}]});
    let (st, s) = up
        .call(&up.demo_key(), "POST", "/v1/services", Some(spec))
        .await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let victim = instances(&s)[0].clone();
    let (address, admin) = (
        victim["address"].as_str().unwrap().to_string(),
        victim["admin"].as_str().unwrap().to_string(),
    );
    assert_eq!(victim["admin_https"], true, "{victim}");
    up.kill();
    // SAFETY: killing an instance process.
    unsafe { libc::kill(victim["pid"].as_u64().unwrap() as i32, libc::SIGKILL) };
    assert!(
        eventually(5, || async {
            TcpListener::bind(&address).is_ok() && TcpListener::bind(&admin).is_ok()
        })
        .await,
        "the instance's addresses were not freed"
    );
    let ip = admin.rsplit_once(':').unwrap().0.to_string();
    let own = vcdn_http::tls::self_signed(&[ip, "localhost".into()], 1).unwrap();
    let (cp, kp) = (up.dir.join("impostor.crt"), up.dir.join("impostor.key"));
    std::fs::write(&cp, &own.cert_pem).unwrap();
    std::fs::write(&kp, &own.key_pem).unwrap();
    let mark = std::fs::canonicalize(&*up.dir).unwrap();
    let mut impostor = support::spawn_env(
        &[
            "cache",
            "--listen",
            &address,
            "--upstream",
            "http://127.0.0.1:9",
            "--admin",
            &admin,
            "--admin-token",
            support::TOKEN,
            "--admin-tls-cert",
            cp.to_str().unwrap(),
            "--admin-tls-key",
            kp.to_str().unwrap(),
            "--instance-id",
            &identity(&victim),
            "--threads",
            "1",
        ],
        &[("VCDN_CONTROL_DATA_DIR", mark.to_str().unwrap())],
    );
    up.launch().expect("vcdn up starts again");
    let reconciled = || async {
        let (_, ev) = up
            .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
            .await;
        ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "reconciled")
            .cloned()
    };
    assert!(
        eventually(15, || async { reconciled().await.is_some() }).await,
        "no reconciled event"
    );
    let detail = reconciled().await.unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        detail.contains("1 re-created")
            && detail.contains("not one the internal CA issued")
            && detail.contains(&format!("https://{admin}")),
        "{detail}"
    );
    // It was stopped, and the real instance serves again under the
    // internal CA's certificate, proving its identity.
    assert!(
        {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if matches!(impostor.child.try_wait(), Ok(Some(_))) {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
        "the impostor still runs"
    );
    assert!(
        eventually(15, || async {
            up.call(OP, "GET", &format!("/v1/services/{id}"), None)
                .await
                .1["state"]
                == "active"
        })
        .await,
        "the service did not come back"
    );
    let r = up.instance_admin(&admin, "/healthz").await.unwrap();
    let h: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        h["instance_id"].as_str(),
        Some(identity(&victim).as_str()),
        "{h}"
    );
}

async fn healthz(api: &Api) -> (u16, Value) {
    let r = api.get("/healthz").await;
    (
        r.status(),
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_removed_while_running_is_reported_and_not_started_afresh() {
    let mut up = Up::start("crash-store", &[]);
    let key = up.demo_key();
    let origin = format!("http://127.0.0.1:{}", up.origin.port());
    let spec = |n: &str| json!({"name": n, "origin": origin, "hostname": format!("{n}.example"), "flavor": "static", "regions": [{"region": "paris"}]});
    let (st, s) = up
        .call(&key, "POST", "/v1/services", Some(spec("first")))
        .await;
    assert_eq!(st, 201, "{s}");
    assert_eq!(healthz(&up.api_client()).await.0, 200);

    // The unlucky operator removes the SQLite files while vcdn up runs.
    for f in ["vcdn.sqlite", "vcdn.sqlite-wal", "vcdn.sqlite-shm"] {
        let _ = std::fs::remove_file(up.dir.join(f));
    }
    let (st, h) = healthz(&up.api_client()).await;
    assert_eq!(st, 503, "{h}");
    assert!(h["reason"].as_str().unwrap().contains("removed"), "{h}");
    // Orders are refused with a problem document that says why, by the
    // operator too (whose token needs no store).
    for token in [key.as_str(), OP] {
        let r = up
            .api_client()
            .request(
                "POST",
                "/v1/customers",
                &[
                    ("Authorization", &format!("Bearer {token}")),
                    ("Content-Type", "application/json"),
                ],
                br#"{"name": "late"}"#,
            )
            .await
            .unwrap();
        assert_eq!(r.status(), 503, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.text().contains("store is unavailable"), "{}", r.text());
    }
    let (st, v) = up
        .call(
            OP,
            "DELETE",
            &format!("/v1/services/{}", s["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(st, 503, "{v}");
    assert!(
        !caches(up.instance_port).is_empty(),
        "the data plane keeps serving"
    );

    // A restart does not start afresh over what is left: the data directory
    // says a store was there, and its instances still run.
    up.kill();
    let err = up
        .launch()
        .expect_err("vcdn up must refuse an emptied store");
    assert!(
        err.contains("--reinitialise-store") && err.contains("missing or empty"),
        "{err}"
    );
    std::fs::remove_file(up.dir.join("store-id")).unwrap();
    for f in ["vcdn.sqlite", "vcdn.sqlite-wal", "vcdn.sqlite-shm"] {
        let _ = std::fs::remove_file(up.dir.join(f));
    }
    let err = up
        .launch()
        .expect_err("vcdn up must refuse a new store over running instances");
    assert!(
        err.contains("still run") && err.contains("--reinitialise-store"),
        "{err}"
    );
    // An empty database file is no fresh install either.
    std::fs::write(up.dir.join("store-id"), "st-0123456789abcdef\n").unwrap();
    std::fs::write(up.dir.join("vcdn.sqlite"), b"").unwrap();
    let err = up
        .launch()
        .expect_err("vcdn up must refuse an empty database file");
    assert!(err.contains("missing or empty"), "{err}");

    // The operator says so: a fresh store, and the instances no record owns
    // are stopped.
    up.extra = vec!["--reinitialise-store".into()];
    up.launch().expect("vcdn up starts afresh when told to");
    assert_eq!(healthz(&up.api_client()).await.0, 200);
    assert!(
        eventually(5, || async { caches(up.instance_port).is_empty() }).await,
        "{:?}",
        caches(up.instance_port)
    );
}
