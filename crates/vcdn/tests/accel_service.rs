//! Dynamic-content acceleration as a customer orders it (issue 17, "In the
//! product"): an accelerated service ordered through the API gets proxies
//! (an ingress in each ordered region, the egress in the origin's region),
//! serves dynamic content through its chain, and deleting it stops every
//! proxy.

mod support;

use support::resolve;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use support::up::{self, Up, OP};
use support::{eventually, origin_count, tempdir};
use vcdn_http::client;

/// `vcdn proxy` processes of service `id`: pid and command line.
fn proxies(id: &str) -> Vec<(u32, Vec<String>)> {
    proxy_processes(|args| args.windows(2).any(|w| w[0] == "--service" && w[1] == id))
}

/// Kills, when the test ends however it ends, every `vcdn proxy` listening
/// on the test's instance port (they outlive the control plane by design;
/// the `Up` guard kills only caches).
struct ProxyGuard(u16);

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        let suffix = format!(":{}", self.0);
        let on_port = |args: &[String]| {
            args.windows(2)
                .any(|w| w[0] == "--listen" && w[1].ends_with(&suffix))
        };
        for (pid, _) in proxy_processes(on_port) {
            // SAFETY: signalling a process id.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// `vcdn proxy` processes whose command line passes `keep`.
fn proxy_processes(keep: impl Fn(&[String]) -> bool) -> Vec<(u32, Vec<String>)> {
    up::vcdn_processes("proxy")
        .into_iter()
        .filter(|(_, args)| keep(args))
        .collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

/// A GET with `Host` from a client address of a region (the router
/// locates clients by their source address).
async fn get_from(source: &str, to: SocketAddr, host: &str, target: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut c = tokio::time::timeout(Duration::from_secs(5), s.connect(to))
        .await
        .expect("connect in time")
        .expect("connects");
    c.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// A proxy's or cache's admin `/stats` (the control plane's instance
/// token, kept in its data directory).
async fn stats(up: &Up, admin: &str) -> Value {
    admin_get(&up.dir, admin, "/stats").await.1
}

/// GET on a proxy's or cache's admin API: status and JSON.
async fn admin_get(dir: &std::path::Path, admin: &str, path: &str) -> (u16, Value) {
    let token = std::fs::read_to_string(dir.join("instance-token")).unwrap();
    let auth = format!("Bearer {}", token.trim());
    // HTTPS trusting only vcdn up's internal CA, as the control plane.
    let ca = vcdn_http::tls::parse_chain(&std::fs::read(dir.join("ca.crt")).unwrap()).unwrap();
    let r = client::request_url(
        &format!("https://{admin}"),
        &vcdn_http::tls::Trust::Bundle(ca),
        "GET",
        path,
        &[("Authorization", &auth)],
        b"",
        Duration::from_secs(2),
    )
    .await
    .expect("admin API answers");
    (
        r.status(),
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

/// The acceleration part of a service's graph (RTT matrix, tables).
async fn accel_graph(up: &Up, id: &str) -> Value {
    let (_, g) = up
        .call(OP, "GET", &format!("/v1/services/{id}/graph"), None)
        .await;
    g["accel"].clone()
}

/// Bytes a proxy received from its next hops and the origin (`hops`).
fn hop_bytes_received(v: &Value) -> u64 {
    v["hops"].as_object().map_or(0, |m| {
        m.values().filter_map(|h| h["received"].as_u64()).sum()
    })
}

fn requests(v: &Value) -> u64 {
    v["requests"].as_u64().unwrap_or_else(|| {
        v["requests"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accelerated_service_serves_dynamic_content_through_its_chain_and_delete_stops_every_proxy(
) {
    // The demo origin on a Marseille address (Marseille's clients are
    // 127.3.0.0/16): the egress goes there, Paris and Lyon get ingresses.
    let mut up = Up {
        child: None,
        dir: tempdir("accel-service"),
        api: SocketAddr::from(([127, 0, 0, 1], up::free_port())),
        origin: SocketAddr::from(([127, 3, 0, 1], up::free_port())),
        instance_port: up::free_port(),
        instance_tls_port: up::free_port(),
        ports: [
            up::free_port(),
            up::free_port(),
            up::free_port(),
            up::free_port(),
        ],
        extra: Vec::new(),
        started: false,
        greeting: Vec::new(),
    };
    let _proxies = ProxyGuard(up.instance_port);
    up.launch().expect("vcdn up starts");
    let [dns, http, _, _] = up.ports;
    let dns = SocketAddr::from(([127, 0, 0, 1], dns));
    let router = SocketAddr::from(([127, 0, 0, 1], http));
    let key = up.demo_key();

    let (st, s) = up
        .call(
            &key,
            "POST",
            "/v1/services",
            Some(json!({
                "name": "shop",
                "origin": format!("http://{}", up.origin),
                "hostname": "shop.demo.example",
                "flavor": "elastic",
                "regions": [{"region": "paris", "peak_users": 10}, {"region": "lyon", "peak_users": 10}],
                "acceleration": {"paths": ["/dynamic"], "uncacheable": true},
            })),
        )
        .await;
    assert_eq!(st, 201, "{s}");
    assert_eq!(s["state"], "active", "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let a = &s["acceleration"];
    assert_eq!(a["hostname"], "dyn.shop.demo.example", "{a}");
    assert_eq!(a["egress"], "marseille", "{a}");
    let paris_in = a["ingress"]["paris"].as_str().unwrap().to_string();
    let lyon_in = a["ingress"]["lyon"].as_str().unwrap().to_string();
    assert!(paris_in.starts_with("127.10."), "{a}");
    assert!(lyon_in.starts_with("127.11."), "{a}");
    let listed = a["proxies"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{a}");
    assert!(listed.iter().all(|p| p["state"] == "running"), "{a}");
    let egress = listed
        .iter()
        .find(|p| p["location"] == "marseille")
        .unwrap();
    assert_eq!(egress["roles"], json!(["egress"]));
    assert!(
        !s.to_string().contains("hop_key"),
        "the hop key is never shown"
    );

    // Three `vcdn proxy` processes with the contract's flags, secrets in
    // their environment only.
    let procs = proxies(&id);
    assert_eq!(procs.len(), 3, "{procs:?}");
    for (pid, args) in &procs {
        assert!(flag(args, "--name").is_some() && flag(args, "--egress") == Some("marseille"));
        assert_eq!(
            flag(args, "--origin"),
            Some(format!("http://{}", up.origin).as_str())
        );
        assert!(flag(args, "--instance-id").is_some());
        assert!(flag(args, "--hop-key").is_none() && flag(args, "--admin-token").is_none());
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let env = String::from_utf8_lossy(&env);
        assert!(env.contains("VCDN_PROXY_HOP_KEY=") && env.contains("VCDN_PROXY_ADMIN_TOKEN="));
    }
    let paris_proc = procs
        .iter()
        .find(|(_, a)| flag(a, "--name") == Some("paris"))
        .unwrap();
    let peers: Vec<&str> = paris_proc
        .1
        .windows(2)
        .filter(|w| w[0] == "--peer")
        .map(|w| w[1].as_str())
        .collect();
    assert_eq!(peers.len(), 2, "paris knows lyon and marseille: {peers:?}");

    // DNS: each region's clients resolve the acceleration hostname to their
    // region's ingress; the service hostname still to caches.
    let ip = |a: &str| a.split(':').next().unwrap().to_string();
    assert_eq!(
        resolve(dns, "127.1.0.1", "dyn.shop.demo.example"),
        [ip(&paris_in)]
    );
    assert_eq!(
        resolve(dns, "127.2.0.1", "dyn.shop.demo.example"),
        [ip(&lyon_in)]
    );
    let cache = resolve(dns, "127.1.0.1", "shop.demo.example");
    assert_eq!(cache.len(), 1);
    assert_ne!(cache[0], ip(&paris_in));

    // HTTP routing: an accelerated path on the service hostname is sent
    // to the client's region's ingress, path and query kept.
    let r = get_from(
        "127.2.0.1",
        router,
        "shop.demo.example",
        "/dynamic?size=1000",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 302"), "{r}");
    assert!(
        r.contains(&format!("Location: http://{lyon_in}/dynamic?size=1000"))
            || r.contains(&format!("location: http://{lyon_in}/dynamic?size=1000")),
        "{r}"
    );
    assert!(
        r.to_ascii_lowercase().contains("x-vcdn-route: accel"),
        "{r}"
    );

    // Dynamic content through the Paris ingress and the Marseille egress:
    // every request reaches the origin, byte-exact in length.
    let before = origin_count(up.origin, "/dynamic").await;
    let admin_of = |loc: &str| {
        listed
            .iter()
            .find(|p| p["location"] == loc)
            .map(|p| {
                s["graph"]["accel"]["proxies"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["id"] == p["id"])
                    .unwrap()["admin"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .unwrap()
    };
    let egress_before = hop_bytes_received(&stats(&up, &admin_of("marseille")).await);
    for _ in 0..3 {
        let r = client::request(
            paris_in.parse().unwrap(),
            "GET",
            "/dynamic?size=200000",
            &[("Host", "dyn.shop.demo.example")],
            b"",
            Duration::from_secs(10),
        )
        .await
        .expect("the ingress answers");
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(r.body.len(), 200_000);
    }
    assert_eq!(origin_count(up.origin, "/dynamic").await, before + 3);
    assert!(requests(&stats(&up, &admin_of("paris")).await) >= 3);
    assert!(
        hop_bytes_received(&stats(&up, &admin_of("marseille")).await) >= egress_before + 600_000,
        "the egress carried the chain's requests: ingress {} egress {}",
        stats(&up, &admin_of("paris")).await,
        stats(&up, &admin_of("marseille")).await
    );

    // `uncacheable`: each region's caches fetch through their ingress, so
    // a no-store answer through a cache rides the chain too.
    let caches = up::caches(up.instance_port);
    assert_eq!(caches.len(), 2, "{caches:?}");
    let ins = [paris_in.as_str(), lyon_in.as_str()];
    for c in &caches {
        let upstream = c.flags.get("--upstream").unwrap();
        assert!(
            ins.iter().any(|i| *upstream == format!("http://{i}")),
            "cache upstream {upstream} is not an ingress"
        );
    }
    let paris_before = requests(&stats(&up, &admin_of("paris")).await);
    let cache: SocketAddr = format!("{}:{}", cache[0], up.instance_port)
        .parse()
        .unwrap();
    let r = client::request(
        cache,
        "GET",
        "/dynamic?size=5000",
        &[("Host", "shop.demo.example")],
        b"",
        Duration::from_secs(10),
    )
    .await
    .expect("the cache answers");
    assert_eq!((r.status(), r.body.len()), (200, 5000));
    assert!(requests(&stats(&up, &admin_of("paris")).await) > paris_before);

    // Usage: the proxies' requests and vCPU time are billed.
    let billed = eventually(10, || async {
        let (_, v) = up
            .call(OP, "GET", &format!("/v1/services/{id}"), None)
            .await;
        let u = &v["acceleration"]["usage"];
        u["requests"].as_u64().unwrap_or(0) >= 4 && u["vcpu_seconds"].as_f64().unwrap_or(0.0) > 0.0
    })
    .await;
    assert!(billed, "proxy usage never reached the service's usage");

    // The chain controller: the proxies measure their RTTs to each other
    // and report them; the controller computes chains and sends every
    // proxy its table. A restarted control plane loses none of it: the
    // proxies keep their tables, the service keeps its matrix and tables,
    // and what it sends again is the same version.
    let admins: Vec<String> = ["paris", "lyon", "marseille"].map(admin_of).to_vec();
    let dir = up.dir.to_path_buf();
    let tables = || async {
        let mut out = Vec::new();
        for a in &admins {
            let (st, t) = admin_get(&dir, a, "/chains").await;
            out.push((st == 200).then_some(t));
        }
        out
    };
    let tables_now = || async {
        let mut t = tables().await;
        for x in t.iter_mut().flatten() {
            x.as_object_mut().unwrap().remove("age_s");
        }
        t
    };
    // Settled: every proxy reported, and every proxy holds the version the
    // service records.
    let settled = eventually(20, || async {
        let a = accel_graph(&up, &id).await;
        let v = a["chains_version"].as_u64();
        a["rtt_ms"].as_object().map(|m| m.len()) == Some(3)
            && v >= Some(1)
            && tables_now()
                .await
                .iter()
                .all(|t| t.as_ref().is_some_and(|t| t["version"].as_u64() == v))
    })
    .await;
    assert!(
        settled,
        "chain tables were not pushed: {:?}",
        tables_now().await
    );
    let version = accel_graph(&up, &id).await["chains_version"].as_u64();
    up.kill();
    let killed = std::time::Instant::now();
    // The snapshot is taken once the controller is dead: until then a moved
    // RTT may still push a newer version (it did, on a loaded CI machine),
    // and a kill in the middle of a push leaves proxies on different
    // versions. Each keeps what it holds; the restart below makes them agree.
    let before = tables_now().await;
    assert!(
        before
            .iter()
            .all(|t| t.as_ref().is_some_and(|t| t["version"].as_u64() >= Some(1))),
        "a proxy lost its table when the controller died: {before:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        tables_now().await,
        before,
        "proxies keep their tables while the controller is down"
    );
    up.relaunch();
    // Nothing was lost: the restarted controller has the matrix and the
    // tables (a version at least the one before: a report may have moved an
    // RTT meanwhile, as on a loaded machine), sends every proxy its table
    // again, and every proxy ends up holding what the service records.
    let after = accel_graph(&up, &id).await;
    assert!(after["chains_version"].as_u64() >= version, "{after}");
    assert_eq!(
        after["rtt_ms"].as_object().map(|m| m.len()),
        Some(3),
        "{after}"
    );
    let resent = eventually(10, || async {
        tables().await.iter().all(|t| {
            t.as_ref()
                .and_then(|t| t["age_s"].as_f64())
                .is_some_and(|age| age < killed.elapsed().as_secs_f64())
        })
    })
    .await;
    assert!(
        resent,
        "the restarted controller did not send the tables again"
    );
    let agree = eventually(10, || async {
        let a = accel_graph(&up, &id).await;
        let held = tables_now().await;
        ["paris", "lyon", "marseille"]
            .iter()
            .zip(&held)
            .all(|(loc, t)| {
                t.as_ref().is_some_and(|t| {
                    t["version"] == a["chains_version"] && t["chains"] == a["chains"][loc]["chains"]
                })
            })
    })
    .await;
    assert!(
        agree,
        "proxies hold {:?}, the service records {}",
        tables_now().await,
        accel_graph(&up, &id).await
    );
    let version = accel_graph(&up, &id).await["chains_version"].as_u64();

    // Only the service's own proxies may report RTTs: the operator token,
    // a customer key, an unknown service and a made-up token all get 401,
    // and a malformed report 400; the matrix is untouched.
    let forged =
        json!({"service": id, "from": "paris", "rtt_ms": {"lyon": 0.0, "marseille": 5000.0}});
    for (token, body) in [
        (OP.to_string(), forged.clone()),
        (key.clone(), forged.clone()),
        (
            "a-made-up-report-token-0123456789abcdef".to_string(),
            forged.clone(),
        ),
        (
            "a-made-up-report-token-0123456789abcdef".to_string(),
            json!({"service": "s-000000000000", "from": "paris", "rtt_ms": {}}),
        ),
    ] {
        let (st, v) = up.call(&token, "POST", "/v1/accel/rtt", Some(body)).await;
        assert_eq!(st, 401, "{v}");
    }
    let (st, _) = up
        .call(
            OP,
            "POST",
            "/v1/accel/rtt",
            Some(json!({"service": id, "rtt_ms": 3})),
        )
        .await;
    assert_eq!(st, 400);
    assert_eq!(
        accel_graph(&up, &id).await["chains_version"].as_u64(),
        version
    );

    // A killed proxy is relaunched like a cache.
    let victim = paris_proc.0;
    // SAFETY: killing the proxy process.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let healed = eventually(5, || async {
        let (_, v) = up
            .call(OP, "GET", &format!("/v1/services/{id}"), None)
            .await;
        v["acceleration"]["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["location"] == "paris" && p["state"] == "running" && p["pid"] != victim)
    })
    .await;
    assert!(healed, "the killed proxy was not replaced");

    // Delete: every proxy and cache stops, DNS forgets both names.
    let (st, v) = up
        .call(&key, "DELETE", &format!("/v1/services/{id}"), None)
        .await;
    assert_eq!((st, v["state"].as_str()), (200, Some("deleted")), "{v}");
    assert!(proxies(&id).is_empty(), "{:?}", proxies(&id));
    assert!(up::caches(up.instance_port).is_empty());
    assert!(resolve(dns, "127.1.0.1", "dyn.shop.demo.example").is_empty());
    assert!(resolve(dns, "127.1.0.1", "shop.demo.example").is_empty());
    let (_, hosts) = up.call(OP, "GET", "/v1/hosts", None).await;
    assert!(
        hosts["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["used_vcpus"] == 0),
        "{hosts}"
    );
}
