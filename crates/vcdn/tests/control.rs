//! The control plane as its users meet it: `vcdn up --demo`, a vCDN ordered
//! with the CLI, users of two regions resolving it to different caches,
//! content fetched through them, a cache killed and replaced, load that
//! makes it scale out, the service deleted and every process gone; the API's
//! access rules and errors; a restart that keeps and adopts everything;
//! lease expiry; and the same life on PostgreSQL.

mod support;

use support::{region_instances as instances, resolve};

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::up::{free_port, Api};
use support::{eventually, tempdir, TempDir};
use vcdn_http::client;

const OP: &str = "operator-secret-0123456789abcdef0123";

/// A running `vcdn up`; on drop it is killed, and so is every cache
/// instance it started (they outlive the control plane by design).
struct Up {
    child: Option<Child>,
    dir: TempDir,
    api: SocketAddr,
    dns: SocketAddr,
    origin: SocketAddr,
    instance_port: u16,
    instance_tls_port: u16,
    extra: Vec<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        self.stop();
        for pid in instance_pids(self.instance_port) {
            // SAFETY: signalling a process id.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// Pids of `vcdn cache` processes listening on `port` (on any address).
fn instance_pids(port: u16) -> Vec<u32> {
    let suffix = format!(":{port}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
            args.windows(2)
                .any(|w| w[0] == b"--listen" && w[1].ends_with(suffix.as_bytes()))
                && args.iter().any(|a| *a == b"cache")
        })
        .collect()
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

impl Up {
    fn start(name: &str, extra: &[&str]) -> Up {
        let dir = tempdir(name);
        let mut up = Up {
            child: None,
            dir,
            api: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dns: SocketAddr::from(([127, 0, 0, 1], free_port())),
            origin: SocketAddr::from(([127, 0, 0, 1], free_port())),
            instance_port: free_port(),
            instance_tls_port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        up.launch();
        up
    }

    fn launch(&mut self) {
        use std::io::BufRead;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vcdn"));
        cmd.arg("up")
            .arg("--data-dir")
            .arg(&self.dir)
            .args([
                "--api",
                &self.api.to_string(),
                "--dns",
                &self.dns.to_string(),
            ])
            .args([
                "--http",
                &format!("127.0.0.1:{}", free_port()),
                "--router-admin",
                &format!("127.0.0.1:{}", free_port()),
            ])
            .args([
                "--operator-token",
                OP,
                "--demo",
                "--demo-origin",
                &self.origin.to_string(),
            ])
            .args([
                "--instance-port",
                &self.instance_port.to_string(),
                "--instance-tls-port",
                &self.instance_tls_port.to_string(),
                "--instance-admin-port",
                &free_port().to_string(),
            ])
            .args(&self.extra)
            .env("VCDN_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("vcdn up starts");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains("Order a first vCDN") => break,
                Ok(_) => {}
                Err(_) => panic!("vcdn up did not print its greeting within 20 s"),
            }
        }
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn key(&self) -> String {
        std::fs::read_to_string(self.dir.join("demo-customer-key"))
            .expect("demo customer key")
            .trim()
            .to_string()
    }

    /// `vcdn service|customer ARGS` with the demo customer's key.
    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        self.cli_as(&self.key(), args)
    }

    fn cli_as(&self, token: &str, args: &[&str]) -> (bool, String, String) {
        let api = self.api_client();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vcdn"));
        cmd.args(args)
            .env("VCDN_API", &api.url)
            .env("VCDN_TOKEN", token)
            .env_remove("VCDN_API_FINGERPRINT")
            .env_remove("VCDN_CA_FILE");
        if let Some(fp) = api.fingerprint(&self.dir) {
            cmd.env("VCDN_API_FINGERPRINT", fp);
        }
        let out = cmd.output().expect("vcdn CLI runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value, String) {
        let auth = format!("Bearer {token}");
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut h = vec![("Content-Type", "application/json")];
        if !token.is_empty() {
            h.push(("Authorization", auth.as_str()));
        }
        let r = self
            .api_client()
            .request(method, path, &h, body.as_bytes())
            .await
            .expect("API answers");
        let ct = r.header("content-type").unwrap_or("").to_string();
        (
            r.status(),
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            ct,
        )
    }

    /// The API over HTTPS, trusting the fingerprint in the data directory.
    fn api_client(&self) -> Api {
        Api::of(self.api, &self.dir)
    }

    async fn service(&self, id: &str) -> Value {
        self.call(OP, "GET", &format!("/v1/services/{id}"), None)
            .await
            .1
    }

    fn origin_url(&self) -> String {
        format!("http://{}", self.origin)
    }
}

fn all_pids(v: &Value) -> Vec<u64> {
    v["graph"]["regions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["instances"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| i["pid"].as_u64())
        })
        .collect()
}

/// X-Cache of two GETs of the same object through one cache.
async fn two_gets(cache: SocketAddr) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..2 {
        let r = client::request(cache, "GET", "/size/4096", &[], b"", Duration::from_secs(5))
            .await
            .expect("cache answers");
        assert_eq!(r.status(), 200);
        out.push(
            r.header("x-cache")
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string(),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_route_fetch_heal_scale_and_delete_a_vcdn() {
    let model_dir = tempdir("control-model");
    let model = support::small_capacity_model(&model_dir);
    let up = Up::start("control-e2e", &["--capacity-model", &model]);
    let origin = up.origin_url();

    // Order with the CLI: two regions, 10 viewers each, MOS 4.
    let (ok, out, err) = up.cli(&[
        "service",
        "create",
        "demo",
        "--origin",
        &origin,
        "--hostname",
        "video.demo.example",
        "--flavor",
        "elastic",
        "--region",
        "paris=10",
        "--region",
        "lyon=10",
        "--min-mos",
        "4.0",
        "--lease",
        "1h",
    ]);
    assert!(ok, "create failed: {err}");
    assert!(out.contains("state     active"), "{out}");
    let (ok, list, _) = up.cli(&["service", "list"]);
    assert!(
        ok && list.contains("demo") && list.contains("paris:1") && list.contains("lyon:1"),
        "{list}"
    );
    let s = up.service("demo").await;
    let id = s["id"].as_str().unwrap().to_string();

    // Users in Paris and Lyon resolve the hostname to different caches.
    let paris = resolve(up.dns, "127.1.0.1", "video.demo.example");
    let lyon = resolve(up.dns, "127.2.0.1", "video.demo.example");
    assert_eq!(paris.len(), 1, "{paris:?}");
    assert!(
        paris[0].starts_with("127.10."),
        "paris users get a paris cache: {paris:?}"
    );
    assert!(
        lyon[0].starts_with("127.11."),
        "lyon users get a lyon cache: {lyon:?}"
    );

    // Content through the Paris cache: MISS, then HIT.
    let cache: SocketAddr = format!("{}:{}", paris[0], up.instance_port)
        .parse()
        .unwrap();
    let get = || async move {
        client::request(cache, "GET", "/size/4096", &[], b"", Duration::from_secs(5))
            .await
            .expect("cache answers")
    };
    let first = get().await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.body.len(), 4096);
    assert!(
        first.header("x-cache").unwrap().starts_with("MISS"),
        "{:?}",
        first.header("x-cache")
    );
    assert!(get().await.header("x-cache").unwrap().starts_with("HIT"));
    // And through the Lyon cache, which has its own copy.
    let lyon_cache: SocketAddr = format!("{}:{}", lyon[0], up.instance_port).parse().unwrap();
    let statuses: Vec<String> = two_gets(lyon_cache).await;
    assert_eq!(statuses, ["MISS", "HIT"], "lyon cache");

    // Kill the Paris cache: replaced (same address) and serving within 2 s.
    let victim = instances(&s, "paris")[0]["pid"].as_u64().unwrap();
    // SAFETY: killing the instance process.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let t0 = Instant::now();
    let healed = eventually(2, || async {
        let v = up.service(&id).await;
        let i = &instances(&v, "paris")[0];
        i["pid"].as_u64().is_some_and(|p| p != victim) && i["state"] == "running"
    })
    .await;
    assert!(healed, "the killed cache was not replaced within 2 s");
    let took = t0.elapsed();
    assert_eq!(get().await.status(), 200, "the replacement serves");
    let (_, ev, _) = up.cli(&["service", "events", "demo"]);
    assert!(
        ev.contains("healed") && ev.contains(&format!("pid {victim}")),
        "{ev}"
    );
    eprintln!("replaced a killed cache in {took:?}");

    // Load: 40 viewers' connections on the Paris cache (one carries 20 at
    // MOS 4): the supervisor scales Paris out.
    let conns: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(cache).unwrap())
        .collect();
    let scaled = eventually(15, || async {
        let p = instances(&up.service(&id).await, "paris");
        p.len() >= 2 && p.iter().all(|i| i["state"] == "running")
    })
    .await;
    assert!(scaled, "no scale-out under load");
    let v = up.service(&id).await;
    assert_eq!(instances(&v, "lyon").len(), 1, "lyon had no load");
    let answers = resolve(up.dns, "127.1.0.1", "video.demo.example");
    assert!(
        answers.len() >= 2,
        "the router answers with the new caches too: {answers:?}"
    );
    // Load gone: it scales back in.
    drop(conns);
    let shrunk = eventually(45, || async {
        instances(&up.service(&id).await, "paris").len() < instances(&v, "paris").len()
    })
    .await;
    assert!(shrunk, "no scale-in after the load went away");
    let (_, ev, _) = up.cli(&["service", "events", "demo"]);
    assert!(
        ev.contains("scaled_out") && ev.contains("scaled_in"),
        "{ev}"
    );

    // Usage and cost are reported.
    let (ok, usage, _) = up.cli(&["service", "usage", "demo"]);
    assert!(ok && usage.contains("on_demand"), "{usage}");
    let bill = up
        .call(OP, "GET", &format!("/v1/services/{id}/usage"), None)
        .await
        .1;
    // Requests a crashed cache served after its last poll are lost to
    // accounting; the replacement's are counted.
    assert!(bill["requests"].as_u64().unwrap() >= 1, "{bill}");
    assert!(bill["vcpu_hours"].as_f64().unwrap() > 0.0, "{bill}");

    // Delete: every process gone, DNS forgets the name, capacity freed.
    let pids = all_pids(&up.service(&id).await);
    let (ok, out, err) = up.cli(&["service", "delete", "demo"]);
    assert!(ok, "{err}");
    assert!(out.contains("deleted"), "{out}");
    for p in &pids {
        assert!(!alive(*p), "instance pid {p} still runs after delete");
    }
    assert!(instance_pids(up.instance_port).is_empty());
    assert!(resolve(up.dns, "127.1.0.1", "video.demo.example").is_empty());
    let hosts = up.call(OP, "GET", "/v1/hosts", None).await.1;
    assert!(
        hosts["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["used_vcpus"] == 0),
        "{hosts}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_customers_apart_and_explains_errors() {
    let up = Up::start("control-api", &[]);
    let a = up.key();
    let (st, b, _) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "other"})))
        .await;
    assert_eq!(st, 201);
    let b_id = b["id"].as_str().unwrap().to_string();
    let b = b["api_key"].as_str().unwrap().to_string();
    // The demo origin is on loopback: B needs the operator's exception.
    let (st, p, _) = up
        .call(
            OP,
            "PUT",
            &format!("/v1/customers/{b_id}/settings"),
            Some(json!({"origin_allow": [up.origin.to_string()]})),
        )
        .await;
    assert_eq!(st, 200, "{p}");

    // The OpenAPI document is served and describes the paths we use.
    let (st, doc, _) = up.call("", "GET", "/v1/openapi.json", None).await;
    assert_eq!(st, 200);
    for p in [
        "/v1/services",
        "/v1/services/{id}",
        "/v1/services/{id}/events",
        "/v1/catalog",
        "/v1/hosts",
        "/v1/customers",
        "/v1/settings",
        "/v1/customers/{id}/settings",
    ] {
        assert!(
            doc["paths"].get(p).is_some(),
            "{p} missing from the OpenAPI document"
        );
    }

    // A method the resource does not allow: 405 with what it allows
    // (RFC 9110); a path that is no resource: 404.
    let auth = format!("Bearer {a}");
    let r = up
        .api_client()
        .request(
            "PATCH",
            "/v1/services",
            &[("Authorization", auth.as_str())],
            b"",
        )
        .await
        .unwrap();
    assert_eq!((r.status(), r.header("allow")), (405, Some("GET, POST")));
    let r = up
        .api_client()
        .request(
            "PUT",
            "/v1/services/x/events",
            &[("Authorization", auth.as_str())],
            b"",
        )
        .await
        .unwrap();
    assert_eq!((r.status(), r.header("allow")), (405, Some("GET")));
    assert_eq!(up.call(&a, "GET", "/v1/nonsense", None).await.0, 404);

    // No token: 401 problem+json.
    let (st, p, ct) = up.call("", "GET", "/v1/services", None).await;
    assert_eq!((st, ct.as_str()), (401, "application/problem+json"));
    assert!(p["detail"].as_str().unwrap().contains("Bearer"));
    // Customers cannot use operator resources.
    assert_eq!(up.call(&a, "GET", "/v1/hosts", None).await.0, 403);
    assert_eq!(
        up.call(&a, "POST", "/v1/customers", Some(json!({"name": "x"})))
            .await
            .0,
        403
    );
    // The operator does not order services for itself.
    let spec = json!({"name": "demo", "origin": up.origin_url(), "hostname": "video.demo.example", "flavor": "elastic",
        "regions": [{"region": "paris", "peak_users": 500}, {"region": "lyon", "peak_users": 200}],
        "quality": {"min_mos": 4.0}, "lease": {"duration_s": 7200}});
    assert_eq!(
        up.call(OP, "POST", "/v1/services", Some(spec.clone()))
            .await
            .0,
        403
    );

    // Routing in the network layer is not offered by a platform started
    // without --srv6: 409, saying why and what to order instead.
    let mut srv6 = spec.clone();
    srv6["routing"] = json!("srv6");
    let (st, p, ct) = up.call(&a, "POST", "/v1/services", Some(srv6)).await;
    assert_eq!((st, ct.as_str()), (409, "application/problem+json"), "{p}");
    let why = p["detail"].as_str().unwrap();
    assert!(
        why.contains("--srv6") && why.contains("routing \"dns\""),
        "{why}"
    );

    // The request, as is, from customer A.
    let (st, s, _) = up
        .call(&a, "POST", "/v1/services", Some(spec.clone()))
        .await;
    assert_eq!(st, 201, "{s}");
    assert_eq!(s["state"], "active");
    assert_eq!(s["entry_point"]["dns_server"], up.dns.to_string());
    let id = s["id"].as_str().unwrap();
    // B sees nothing of it.
    assert_eq!(
        up.call(&b, "GET", &format!("/v1/services/{id}"), None)
            .await
            .0,
        404
    );
    assert_eq!(
        up.call(&b, "DELETE", &format!("/v1/services/{id}"), None)
            .await
            .0,
        404
    );
    assert_eq!(
        up.call(&b, "GET", "/v1/services", None).await.1["services"],
        json!([])
    );
    // Same hostname again: 409 with the reason.
    let (st, p, _) = up
        .call(&b, "POST", "/v1/services", Some(spec.clone()))
        .await;
    assert_eq!(st, 409);
    assert!(
        p["detail"].as_str().unwrap().contains("already taken"),
        "{p}"
    );

    // Bad input: clear errors.
    let (st, p, _) = up
        .call(&b, "POST", "/v1/services", Some(json!({"name": "x"})))
        .await;
    assert_eq!(st, 400);
    assert!(
        p["detail"].as_str().unwrap().contains("missing field"),
        "{p}"
    );
    let mut bad = spec.clone();
    bad["hostname"] = json!("other.example");
    bad["regions"][0]["region"] = json!("atlantis");
    let (st, p, _) = up.call(&b, "POST", "/v1/services", Some(bad)).await;
    assert_eq!(st, 422);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("unknown region atlantis"),
        "{p}"
    );
    // More than the region's hosts hold: 409 naming the region and the shortfall.
    let mut big = spec.clone();
    big["name"] = json!("big");
    big["hostname"] = json!("big.example");
    big["regions"] = json!([{"region": "lyon", "peak_users": 10_000_000}]);
    big["flavor"] = json!("elastic");
    let (st, p, _) = up.call(&b, "POST", "/v1/services", Some(big)).await;
    assert_eq!(st, 409, "{p}");
    let d = p["detail"].as_str().unwrap();
    assert!(d.contains("lyon"), "{d}");
    // CLI errors are readable.
    let (ok, _, err) = up.cli_as(&b, &["service", "show", id]);
    assert!(
        !ok && err.contains("404") && err.contains("no service"),
        "{err}"
    );

    // Flavors: static is fixed; the catalog lists both.
    let (ok, cat, _) = up.cli(&["service", "catalog"]);
    assert!(
        ok && cat.contains("static") && cat.contains("elastic") && cat.contains("paris"),
        "{cat}"
    );
    let (st, s2, _) = up.call(&b, "POST", "/v1/services", Some(json!({"name": "fixed", "origin": up.origin_url(), "hostname": "fixed.example", "flavor": "static", "regions": [{"region": "marseille"}]}))).await;
    assert_eq!(st, 201, "{s2}");
    assert_eq!(instances(&s2, "marseille").len(), 2);
    assert_eq!(s2["cost"]["scheme"], "flat_rate");
    // Two static instances are spread over the two Marseille hosts.
    let hosts: Vec<String> = instances(&s2, "marseille")
        .iter()
        .map(|i| i["host"].as_str().unwrap().to_string())
        .collect();
    assert_ne!(hosts[0], hosts[1]);

    // Purge and prefetch go to every cache of the service.
    let (st, r, _) = up
        .call(
            &b,
            "POST",
            &format!("/v1/services/{}/prefetch", s2["id"].as_str().unwrap()),
            Some(json!({"url": "/size/100"})),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["instances"].as_array().unwrap().len(), 2);
    assert!(
        r["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["status"] == 200),
        "{r}"
    );
    // Purge takes one of url, prefix or all: an unknown member is a
    // malformed body (400, as everywhere), none or two are 422.
    let purge = format!("/v1/services/{}/purge", s2["id"].as_str().unwrap());
    for (body, want) in [
        (json!({"nothing": 1}), 400),
        (json!({}), 422),
        (json!({"all": true, "url": "/size/100"}), 422),
        (json!({"all": false}), 422),
    ] {
        let (st, p, _) = up.call(&b, "POST", &purge, Some(body.clone())).await;
        assert_eq!(st, want, "{body}: {p}");
    }

    // Path segments are percent-decoded: marseille%2D1 is marseille-1.
    let (st, p, _) = up.call(OP, "DELETE", "/v1/hosts/marseille%2D1", None).await;
    assert_eq!(st, 409, "{p}");
    let (st, p, _) = up.call(OP, "DELETE", "/v1/hosts/%FF", None).await;
    assert_eq!(st, 400, "{p}");
    // What needs no credentials says what it allows without asking for any.
    let r = up
        .api_client()
        .request("POST", "/healthz", &[], b"")
        .await
        .unwrap();
    assert_eq!((r.status(), r.header("allow")), (405, Some("GET, HEAD")));

    // A host in use cannot be removed.
    assert_eq!(
        up.call(OP, "DELETE", "/v1/hosts/marseille-1", None).await.0,
        409
    );

    // Metrics.
    let r = up.api_client().get("/metrics").await;
    assert!(
        r.text()
            .contains("vcdn_control_services{state=\"active\"} 2"),
        "{}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_keeps_services_and_adopts_instances() {
    let mut up = Up::start("control-restart", &[]);
    let spec = json!({"name": "keep", "origin": up.origin_url(), "hostname": "keep.example", "flavor": "static", "regions": [{"region": "paris"}, {"region": "lyon"}]});
    let (st, s, _) = up.call(&up.key(), "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let pids = all_pids(&s);
    assert_eq!(pids.len(), 4);

    // Stop the control plane; one cache dies while it is away.
    up.stop();
    for p in &pids {
        assert!(alive(*p), "caches keep serving without the control plane");
    }
    // SAFETY: killing an instance process.
    unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) };
    // The service is made one ordered before origin policies existed.
    {
        let store =
            vcdn_control::store::Store::open(&up.dir, &vcdn_control::store::OpenOptions::default())
                .await
                .expect("the store opens");
        let mut doc: Value = store
            .get("service", &id)
            .await
            .unwrap()
            .expect("the service");
        assert!(doc["origin_policy"]
            .as_str()
            .is_some_and(|p| p.contains("deny")));
        doc.as_object_mut().unwrap().remove("origin_policy");
        store.put("service", &id, &doc).await.unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    up.launch();

    let v = up.service(&id).await;
    assert_eq!(v["state"], "active", "{v}");
    // It gets the operator's policy at start, and the re-created cache
    // enforces it.
    let now = all_pids(&v);
    let fresh = now
        .iter()
        .find(|p| !pids.contains(p))
        .expect("a re-created cache");
    let cmdline = std::fs::read(format!("/proc/{fresh}/cmdline")).unwrap();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    assert!(
        args.windows(2)
            .any(|w| w[0] == b"--origin-policy" && w[1].starts_with(b"deny 0.0.0.0/8")),
        "the re-created cache runs without the policy: {}",
        String::from_utf8_lossy(&cmdline)
    );
    assert_eq!(now.len(), 4);
    assert!(!now.contains(&pids[0]), "the dead one is re-created");
    for p in &pids[1..] {
        assert!(now.contains(p), "a live instance is adopted, not restarted");
    }
    let (_, ev, _) = up
        .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    let text = ev.to_string();
    assert!(text.contains("3 instances adopted, 1 re-created"), "{text}");
    // The router is configured again.
    assert_eq!(resolve(up.dns, "127.2.0.1", "keep.example").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_the_service() {
    let up = Up::start("control-lease", &[]);
    let spec = json!({"name": "brief", "origin": up.origin_url(), "hostname": "brief.example", "flavor": "elastic",
        "regions": [{"region": "paris", "peak_users": 10}], "lease": {"duration_s": 2}});
    let (st, s, _) = up.call(&up.key(), "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let pids = all_pids(&s);
    assert!(
        eventually(6, || async { up.service(&id).await["state"] == "expired" }).await,
        "the lease did not end the service"
    );
    assert!(pids.iter().all(|p| !alive(*p)));
    assert!(resolve(up.dns, "127.1.0.1", "brief.example").is_empty());
    // A lease that starts later is scheduled (202), holding its capacity.
    let later = json!({"name": "later", "origin": up.origin_url(), "hostname": "later.example", "flavor": "static",
        "regions": [{"region": "lyon"}], "lease": {"start": now_s() + 3600, "duration_s": 60}});
    let (st, s, _) = up
        .call(&up.key(), "POST", "/v1/services", Some(later))
        .await;
    assert_eq!((st, s["state"].as_str()), (202, Some("scheduled")), "{s}");
    let hosts = up.call(OP, "GET", "/v1/hosts", None).await.1;
    let used: u64 = hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["used_vcpus"].as_u64().unwrap())
        .sum();
    assert_eq!(used, 2);
}

/// A throwaway PostgreSQL cluster from Debian's packages, run as the
/// `postgres` user in a temporary directory.
struct Postgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
}

impl Postgres {
    fn start(name: &str) -> Postgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is installed (scripts/test.sh installs it)")
            .flatten()
            .map(|e| e.path().join("bin"))
            .find(|p| p.join("initdb").exists())
            .expect("initdb in /usr/lib/postgresql/*/bin");
        let dir = tempdir(name);
        let data = dir.join("data");
        let port = free_port();
        let as_pg = |args: &[&str]| {
            let out = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .args(args)
                .output()
                .expect("runuser");
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .unwrap();
        as_pg(&[
            bin.join("initdb").to_str().unwrap(),
            "-D",
            data.to_str().unwrap(),
            "--auth=trust",
            "-U",
            "postgres",
        ]);
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            dir.display()
        );
        as_pg(&[
            bin.join("pg_ctl").to_str().unwrap(),
            "-D",
            data.to_str().unwrap(),
            "-o",
            &opts,
            "-l",
            dir.join("log").to_str().unwrap(),
            "-w",
            "start",
        ]);
        let out = Command::new(bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-c",
                "CREATE DATABASE vcdn",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Postgres { dir, bin, port }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args([
                "-D",
                self.dir.join("data").to_str().unwrap(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_keeps_the_state_across_a_restart() {
    let pg = Postgres::start("control-pg");
    let url = format!("postgresql://postgres@127.0.0.1:{}/vcdn", pg.port);
    let mut up = Up::start("control-postgres", &["--database-url", &url]);
    let r = up.api_client().get("/healthz").await;
    assert!(r.text().contains("postgresql"), "{}", r.text());
    let spec = json!({"name": "pg", "origin": up.origin_url(), "hostname": "pg.example", "flavor": "elastic", "regions": [{"region": "lyon", "peak_users": 100}]});
    let (st, s, _) = up.call(&up.key(), "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    up.stop();
    // A fresh data directory: everything must come from PostgreSQL (the
    // customer key file is kept so the demo customer stays the same).
    let key = up.key();
    let _ = std::fs::remove_file(up.dir.join("vcdn.sqlite"));
    up.launch();
    let (st, v, _) = up
        .call(&key, "GET", &format!("/v1/services/{id}"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "active");
    let (_, ev, _) = up
        .call(&key, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    assert!(ev.to_string().contains("reconciled"), "{ev}");
    assert_eq!(resolve(up.dns, "127.2.0.1", "pg.example").len(), 1);
    // Its history is kept in PostgreSQL too: the first 10 s bucket closes.
    let series = format!("/v1/services/{id}/timeseries?step=10");
    assert!(
        eventually(30, || async {
            let (st, v, _) = up.call(&key, "GET", &series, None).await;
            st == 200
                && v["regions"][0]["region"] == "lyon"
                && v["regions"][0]["instances"][0] == json!(1.0)
        })
        .await,
        "{}",
        up.call(&key, "GET", &series, None).await.1
    );
    let (st, _, _) = up
        .call(&key, "DELETE", &format!("/v1/services/{id}"), None)
        .await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_reporting_a_low_mos_make_the_service_scale_out() {
    let model_dir = tempdir("control-qoe-model");
    let model = support::small_capacity_model(&model_dir);
    let up = Up::start("control-qoe", &["--capacity-model", &model]);
    let key = up.key();
    let spec = json!({"name": "q", "origin": up.origin_url(), "hostname": "q.example", "flavor": "elastic",
        "regions": [{"region": "paris", "peak_users": 5}], "quality": {"min_mos": 4.5}});
    let (st, s, _) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    assert_eq!(instances(&s, "paris").len(), 1);
    // Idle: the model expects a perfect MOS.
    assert!(
        eventually(5, || async {
            up.service(&id).await["qoe"]["paris"]["estimated_mos"]
                .as_f64()
                .is_some_and(|m| m >= 4.5)
        })
        .await
    );
    let (st, p, _) = up
        .call(
            &key,
            "POST",
            &format!("/v1/services/{id}/qoe"),
            Some(json!({"region": "lyon", "mos": 3.0})),
        )
        .await;
    assert_eq!(st, 422, "{p}");
    let (st, _, _) = up
        .call(
            &key,
            "POST",
            &format!("/v1/services/{id}/qoe"),
            Some(json!({"region": "paris", "mos": 3.0})),
        )
        .await;
    assert_eq!(st, 204);
    let grew = eventually(8, || async {
        instances(&up.service(&id).await, "paris").len() >= 2
    })
    .await;
    assert!(grew, "no scale-out on a reported MOS under the target");
    let v = up.service(&id).await;
    assert_eq!(
        v["qoe"]["paris"]["reported_mos"].as_f64(),
        Some(3.0),
        "{}",
        v["qoe"]
    );
    // The event follows once the new instance serves.
    let recorded = eventually(5, || async {
        let (_, ev, _) = up
            .call(&key, "GET", &format!("/v1/services/{id}/events"), None)
            .await;
        ev.to_string().contains("qoe_below_target")
    })
    .await;
    assert!(recorded, "no qoe_below_target event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn players_report_their_mos_and_the_service_scales_out() {
    let up = Up::start("control-player-qoe", &[]);
    let key = up.key();
    let spec = json!({"name": "pq", "origin": up.origin_url(), "hostname": "pq.example", "flavor": "elastic",
        "regions": [{"region": "lyon", "peak_users": 5}], "quality": {"min_mos": 4.5}});
    let (st, s, _) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let cache = instances(&s, "lyon")[0]["address"]
        .as_str()
        .unwrap()
        .to_string();
    // The lowest representation scores well under 4.5 (its picture
    // quality), so the players' own reports ask for more capacity.
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "player",
            "--quiet",
            "--sessions",
            "3",
            "--duration",
            "18",
            "--quality",
            "lowest",
        ])
        .args(["--url", &format!("http://{cache}/dash/vod/t/manifest.mpd")])
        .args([
            "--qoe-to",
            &format!("{}/v1/services/pq/qoe", up.api_client().url),
            "--qoe-fingerprint",
            &up.api_client().fingerprint(&up.dir).unwrap(),
            "--qoe-token",
            &key,
            "--qoe-region",
            "lyon",
        ])
        .output()
        .expect("player runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = up.service("pq").await;
    let reported = v["qoe"]["lyon"]["reported_mos"].as_f64();
    assert!(reported.is_some_and(|m| m < 4.5), "{}", v["qoe"]);
    assert!(
        eventually(5, || async {
            instances(&up.service("pq").await, "lyon").len() >= 2
        })
        .await,
        "no scale-out"
    );
}

/// Requests a cache has answered, from its /metrics (HTTPS, trusting
/// `vcdn up`'s internal CA in `dir`).
async fn cache_requests(dir: &std::path::Path, admin: &str) -> u64 {
    cache_metric(dir, admin, "vcdn_cache_requests_total{").await
}

/// The sum of an instance's metric lines that start with `name`.
async fn cache_metric(dir: &std::path::Path, admin: &str, name: &str) -> u64 {
    let ca = vcdn_http::tls::parse_chain(&std::fs::read(dir.join("ca.crt")).unwrap()).unwrap();
    let r = client::request_url(
        &format!("https://{admin}"),
        &vcdn_http::tls::Trust::Bundle(ca),
        "GET",
        "/metrics",
        &[],
        b"",
        Duration::from_secs(2),
    )
    .await
    .expect("metrics");
    r.text()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn players_resolving_the_name_spread_over_the_caches_dns_gives() {
    let up = Up::start("control-player-dns", &[]);
    let key = up.key();
    let spec = json!({"name": "dp", "origin": up.origin_url(), "hostname": "dp.example", "flavor": "static",
        "regions": [{"region": "paris"}]});
    let (st, s, _) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let caches = instances(&s, "paris");
    assert_eq!(caches.len(), 2, "{s}");
    let port = caches[0]["address"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let before = [
        cache_requests(&up.dir, caches[0]["admin"].as_str().unwrap()).await,
        cache_requests(&up.dir, caches[1]["admin"].as_str().unwrap()).await,
    ];
    let report = up.dir.join("dns-player.json");
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "player",
            "--quiet",
            "--sessions",
            "12",
            "--duration",
            "4",
            "--quality",
            "lowest",
        ])
        .args([
            "--url",
            &format!("http://dp.example:{port}/dash/vod/t/manifest.mpd"),
        ])
        .args(["--dns", &up.dns.to_string(), "--report"])
        .arg(&report)
        .output()
        .expect("player runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["summary"]["failed"], 0, "{}", r["summary"]);
    assert_eq!(r["summary"]["started"], 12, "{}", r["summary"]);
    for (c, b) in caches.iter().zip(before) {
        let n = cache_requests(&up.dir, c["admin"].as_str().unwrap()).await - b;
        assert!(n >= 12, "{} answered only {n} requests", c["address"]);
    }
    // A name the vCDN does not serve is a clear error.
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "player",
            "--quiet",
            "--url",
            &format!("http://nope.example:{port}/m.mpd"),
        ])
        .args(["--dns", &up.dns.to_string()])
        .output()
        .expect("player runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resolving nope.example"), "{err}");
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A request to `api` sent from the loopback address `source`: status and
/// Retry-After.
async fn call_from(api: &Api, source: &str, auth: &str, path: &str) -> (u16, Option<u64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use vcdn_http::tls::{self, tokio_rustls};
    let addr: SocketAddr = api.url.split("://").nth(1).unwrap().parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let s = sock.connect(addr).await.expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: api\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
    );
    let mut out = Vec::new();
    let exchange = async {
        if api.url.starts_with("https://") {
            let cfg = tls::client_config(&api.trust, &[]).unwrap();
            let name = tls::rustls::pki_types::ServerName::from(addr.ip());
            let mut s = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, s)
                .await
                .expect("TLS handshake");
            s.write_all(req.as_bytes()).await.unwrap();
            s.read_to_end(&mut out).await
        } else {
            let mut s = s;
            s.write_all(req.as_bytes()).await.unwrap();
            s.read_to_end(&mut out).await
        }
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let retry = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_string)
        })
        .and_then(|v| v.trim().parse().ok());
    (status, retry)
}

/// Runs `vcdn ARGS` expecting it to refuse to start: its stderr.
fn refused_at_start(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args)
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(!st.success(), "vcdn {args:?} exited 0: {err}");
            return err;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("vcdn {args:?} started with a weak token");
}

#[test]
fn admin_apis_refuse_a_weak_token_at_start() {
    let dir = tempdir("control-weak-token");
    let api = format!("127.0.0.1:{}", free_port());
    let err = refused_at_start(&[
        "up",
        "--data-dir",
        dir.to_str().unwrap(),
        "--api",
        &api,
        "--dns",
        &format!("127.0.0.1:{}", free_port()),
        "--http",
        &format!("127.0.0.1:{}", free_port()),
        "--router-admin",
        &format!("127.0.0.1:{}", free_port()),
        "--operator-token",
        "x",
    ]);
    assert!(
        err.contains("--operator-token") && err.contains("32"),
        "{err}"
    );
    let err = refused_at_start(&[
        "cache",
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--admin",
        &format!("127.0.0.1:{}", free_port()),
        "--admin-token",
        "short-token",
        "--upstream",
        "http://127.0.0.1:9",
    ]);
    assert!(err.contains("--admin-token") && err.contains("32"), "{err}");
    let err = refused_at_start(&[
        "router",
        "--no-dns",
        "--admin",
        &format!("127.0.0.1:{}", free_port()),
        "--admin-token",
        "short-token",
    ]);
    assert!(err.contains("--admin-token") && err.contains("32"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_case_bearer_works_and_failed_tokens_are_throttled_per_source() {
    let up = Up::start("control-auth", &[]);
    // RFC 9110 §11.1: the scheme is case-insensitive.
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let (st, _) = call_from(
            &up.api_client(),
            "127.0.0.1",
            &format!("{scheme} {OP}"),
            "/v1/hosts",
        )
        .await;
        assert_eq!(st, 200, "{scheme}");
    }
    // Ten wrong tokens from one source: 401 each; then 429 with Retry-After,
    // even with the right token (a throttled source cannot test guesses).
    for i in 0..10 {
        let (st, _) = call_from(&up.api_client(), "127.0.0.77", "Bearer guess", "/v1/hosts").await;
        assert_eq!(st, 401, "attempt {i}");
    }
    let (st, retry) = call_from(&up.api_client(), "127.0.0.77", "Bearer guess", "/v1/hosts").await;
    assert_eq!(st, 429);
    assert!(retry.is_some_and(|s| (1..=60).contains(&s)), "{retry:?}");
    let (st, _) = call_from(
        &up.api_client(),
        "127.0.0.77",
        &format!("Bearer {OP}"),
        "/v1/hosts",
    )
    .await;
    assert_eq!(st, 429);
    // Another source is not affected, neither with the right token nor a wrong one.
    let (st, _) = call_from(
        &up.api_client(),
        "127.0.0.78",
        &format!("Bearer {OP}"),
        "/v1/hosts",
    )
    .await;
    assert_eq!(st, 200);
    let (st, _) = call_from(&up.api_client(), "127.0.0.78", "Bearer guess", "/v1/hosts").await;
    assert_eq!(st, 401);
    let r = up.api_client().get("/metrics").await;
    assert!(
        r.text().contains("vcdn_control_auth_failures_total 11")
            && r.text().contains("vcdn_control_auth_throttled_total 2"),
        "{}",
        r.text()
    );
}

/// The problem document's `errors` member: field -> detail.
fn field_errors(p: &Value) -> Vec<(String, String)> {
    p["errors"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["field"].as_str().unwrap_or("").to_string(),
                        e["detail"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_with_bad_numbers_names_or_leases_are_refused_saying_what_to_fix() {
    let up = Up::start("control-validate", &[]);
    let key = up.key();
    let later = now_s() + 3600;
    // Scheduled an hour ahead: nothing starts, the checks are the same.
    let good = json!({"name": "ok", "origin": up.origin_url(), "hostname": "ok.example", "flavor": "elastic",
        "regions": [{"region": "paris", "peak_users": 10}], "quality": {}, "lease": {"start": later, "duration_s": 3600}});
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/lease/start", json!(1u64 << 62), "lease.start"),
        ("/lease/duration_s", json!(u64::MAX), "lease.duration_s"),
        (
            "/lease",
            json!({"start": later, "end": u64::MAX}),
            "lease.end",
        ),
        (
            "/regions/0/bitrate_kbps",
            json!(-2000.0),
            "regions[0].bitrate_kbps",
        ),
        (
            "/regions/0/requests_per_s",
            json!(-5.0),
            "regions[0].requests_per_s",
        ),
        ("/regions/0/chunk_s", json!(0.0), "regions[0].chunk_s"),
        ("/regions", json!([]), "regions"),
        ("/hostname", json!("127.0.0.1"), "hostname"),
        ("/hostname", json!("video.example.com."), "hostname"),
        ("/hostname", json!("-bad.example"), "hostname"),
        ("/hostname", json!("localhost"), "hostname"),
        (
            "/origin",
            json!(format!("{}/a b", up.origin_url())),
            "origin",
        ),
        (
            "/origin",
            json!(format!("{}/#frag", up.origin_url())),
            "origin",
        ),
        (
            "/origin",
            json!(format!("http://user@{}", up.origin)),
            "origin",
        ),
        ("/origin", json!("ftp://example.com/"), "origin"),
        ("/quality/percentile", json!(0), "quality.percentile"),
        ("/name", json!("Bad Name"), "name"),
    ];
    for (pointer, value, field) in cases {
        let mut spec = good.clone();
        let (parent, member) = pointer.rsplit_once('/').unwrap();
        spec.pointer_mut(parent).unwrap()[member] = value.clone();
        let (st, p, ct) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
        assert_eq!(
            (st, ct.as_str()),
            (422, "application/problem+json"),
            "{field} = {value}: {p}"
        );
        let errs = field_errors(&p);
        assert!(
            errs.iter().any(|(f, d)| f == field && !d.is_empty()),
            "{field} = {value}: {p}"
        );
    }
    // Several bad fields are all named in one answer.
    let mut spec = good.clone();
    spec["hostname"] = json!("10.0.0.1");
    spec["regions"][0]["bitrate_kbps"] = json!(-1.0);
    let (st, p, _) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 422);
    assert_eq!(field_errors(&p).len(), 2, "{p}");
    // Names are case-insensitive and stored in lower case; unique across customers.
    let mut spec = good.clone();
    spec["hostname"] = json!("OK.Example");
    let (st, s, _) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 202, "{s}");
    assert_eq!(s["hostname"], "ok.example");
    assert!(
        s["cost"]["total"].as_f64().is_some_and(f64::is_finite),
        "{s}"
    );
    let (_, other, _) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "other"})))
        .await;
    let other_id = other["id"].as_str().unwrap().to_string();
    let other_key = other["api_key"].as_str().unwrap().to_string();
    let mut spec = good.clone();
    spec["name"] = json!("mine");
    spec["hostname"] = json!("ok.EXAMPLE");
    spec["origin"] = json!("http://93.184.215.14/");
    let (st, p, _) = up
        .call(&other_key, "POST", "/v1/services", Some(spec))
        .await;
    assert_eq!(st, 409, "{p}");

    // Lease limits: 90 days ahead and one year long at most by default; the
    // operator changes them.
    let (st, settings, _) = up.call(OP, "GET", "/v1/settings", None).await;
    assert_eq!(st, 200, "{settings}");
    assert_eq!(settings["lease"]["max_start_ahead_s"], 90 * 86400);
    assert_eq!(settings["lease"]["max_duration_s"], 365 * 86400);
    let mut far = good.clone();
    far["name"] = json!("far");
    far["hostname"] = json!("far.example");
    far["lease"]["start"] = json!(now_s() + 100 * 86400);
    let (st, p, _) = up
        .call(&key, "POST", "/v1/services", Some(far.clone()))
        .await;
    assert_eq!(st, 422, "{p}");
    assert!(
        p["errors"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("90 days"),
        "{p}"
    );
    let mut s2 = settings.clone();
    s2["lease"]["max_start_ahead_s"] = json!(200 * 86400);
    let (st, p, _) = up.call(OP, "PUT", "/v1/settings", Some(s2)).await;
    assert_eq!(st, 200, "{p}");
    let (st, p, _) = up.call(&key, "POST", "/v1/services", Some(far)).await;
    assert_eq!(st, 202, "{p}");
    // Customers cannot change settings; nonsense settings are refused.
    assert_eq!(up.call(&key, "GET", "/v1/settings", None).await.0, 403);
    let mut bad = settings.clone();
    bad["origin_policy"] = json!("allow everything");
    assert_eq!(up.call(OP, "PUT", "/v1/settings", Some(bad)).await.0, 422);

    // Quotas: per customer, with the operator's default and an override.
    assert_eq!(settings["quota"]["max_services"], 10);
    let (st, p, _) = up
        .call(
            OP,
            "PUT",
            &format!("/v1/customers/{other_id}/settings"),
            Some(json!({"quota": {"max_services": 1, "max_vcpus": 2}})),
        )
        .await;
    assert_eq!(st, 200, "{p}");
    let mut spec = good.clone();
    spec["name"] = json!("one");
    spec["hostname"] = json!("one.example");
    spec["origin"] = json!("http://93.184.215.14/");
    spec["regions"] = json!([{"region": "lyon", "peak_users": 10}]);
    let (st, p, _) = up
        .call(&other_key, "POST", "/v1/services", Some(spec.clone()))
        .await;
    assert_eq!(st, 202, "{p}");
    spec["name"] = json!("two");
    spec["hostname"] = json!("two.example");
    let (st, p, _) = up
        .call(&other_key, "POST", "/v1/services", Some(spec.clone()))
        .await;
    assert_eq!(st, 409, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("1 service"), "{p}");
    // The vCPU quota counts what the order would reserve.
    up.call(
        OP,
        "PUT",
        &format!("/v1/customers/{other_id}/settings"),
        Some(json!({"quota": {"max_services": 5, "max_vcpus": 2}})),
    )
    .await;
    spec["flavor"] = json!("static");
    spec["regions"] = json!([{"region": "lyon"}]);
    let (st, p, _) = up
        .call(&other_key, "POST", "/v1/services", Some(spec))
        .await;
    assert_eq!(st, 409, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("vCPU"), "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origins_on_the_platform_or_private_networks_are_refused() {
    let up = Up::start("control-origin", &[]);
    let key = up.key();
    let (_, other, _) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "other"})))
        .await;
    let other_id = other["id"].as_str().unwrap().to_string();
    let other_key = other["api_key"].as_str().unwrap().to_string();
    let later = now_s() + 3600;
    let order = |name: &str, origin: String| {
        json!({"name": name, "origin": origin, "hostname": format!("{name}.example"), "flavor": "static",
            "regions": [{"region": "paris"}], "lease": {"start": later, "duration_s": 3600}})
    };
    let refused = [
        (format!("http://{}/", up.api), up.api.to_string()),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "169.254.169.254:80".into(),
        ),
        ("http://10.0.0.1/".into(), "10.0.0.1:80".into()),
        (
            format!("http://localhost:{}/", up.origin.port()),
            format!(":{}", up.origin.port()),
        ),
        (
            format!("http://127.10.0.1:{}/", up.instance_port),
            format!("127.10.0.1:{}", up.instance_port),
        ),
    ];
    for (who, k) in [("demo", &key), ("other", &other_key)] {
        for (i, (origin, addr)) in refused.iter().enumerate() {
            if who == "demo" && origin.contains("localhost") {
                // Its exception is for the demo origin's address, which
                // localhost may name.
                continue;
            }
            let (st, p, ct) = up
                .call(
                    k,
                    "POST",
                    "/v1/services",
                    Some(order(&format!("{who}{i}"), origin.clone())),
                )
                .await;
            assert_eq!(
                (st, ct.as_str()),
                (422, "application/problem+json"),
                "{who} {origin}: {p}"
            );
            let d = p["detail"].as_str().unwrap();
            assert!(
                d.contains(addr.as_str()) && d.contains("operator"),
                "{who} {origin}: {d}"
            );
            assert_eq!(p["errors"][0]["field"], "origin", "{p}");
        }
    }
    // The demo customer may use the demo origin (an exception for exactly it).
    let (st, p, _) = up
        .call(
            &key,
            "POST",
            "/v1/services",
            Some(order("demo", up.origin_url())),
        )
        .await;
    assert_eq!(st, 202, "{p}");
    // Another customer may not, until the operator adds an exception for it.
    let (st, p, _) = up
        .call(
            &other_key,
            "POST",
            "/v1/services",
            Some(order("theirs", up.origin_url())),
        )
        .await;
    assert_eq!(st, 422, "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains(&up.origin.to_string()),
        "{p}"
    );
    let (st, p, _) = up
        .call(
            OP,
            "PUT",
            &format!("/v1/customers/{other_id}/settings"),
            Some(json!({"origin_allow": [up.origin.to_string()]})),
        )
        .await;
    assert_eq!(st, 200, "{p}");
    let (st, p, _) = up
        .call(
            &other_key,
            "POST",
            "/v1/services",
            Some(order("theirs", up.origin_url())),
        )
        .await;
    assert_eq!(st, 202, "{p}");
    // An exception never opens the platform's own addresses.
    up.call(
        OP,
        "PUT",
        &format!("/v1/customers/{other_id}/settings"),
        Some(json!({"origin_allow": ["127.0.0.0/8"]})),
    )
    .await;
    let (st, p, _) = up
        .call(
            &other_key,
            "POST",
            "/v1/services",
            Some(order("api", format!("http://{}/", up.api))),
        )
        .await;
    assert_eq!(st, 422, "{p}");
    // An exception must be an address rule.
    let (st, _, _) = up
        .call(
            OP,
            "PUT",
            &format!("/v1/customers/{other_id}/settings"),
            Some(json!({"origin_allow": ["everything"]})),
        )
        .await;
    assert_eq!(st, 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_store_emptied_while_running_is_reported_and_not_started_afresh() {
    let pg = Postgres::start("control-pg-lost-db");
    let url = format!("postgresql://postgres@127.0.0.1:{}/vcdn", pg.port);
    let mut up = Up::start("control-pg-lost", &["--database-url", &url]);
    let api = up.api_client();
    let healthz = || async {
        let r = api.get("/healthz").await;
        (r.status(), r.text())
    };
    assert_eq!(healthz().await.0, 200);
    // Someone empties the database under the running control plane.
    let out = Command::new(pg.bin.join("psql"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "vcdn",
        ])
        .args(["-c", "TRUNCATE docs, events, meta"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (st, text) = healthz().await;
    assert_eq!(st, 503, "{text}");
    assert!(text.contains("emptied or replaced"), "{text}");
    let (st, v, ct) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "late"})))
        .await;
    assert_eq!((st, ct.as_str()), (503, "application/problem+json"), "{v}");
    // A restart refuses to take the empty database for a fresh install.
    up.stop();
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(["up", "--database-url", &url, "--data-dir"])
        .arg(&up.dir)
        .args([
            "--api",
            "127.0.0.1:0",
            "--dns",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ])
        .args(["--router-admin", "127.0.0.1:0", "--operator-token", OP])
        .env("VCDN_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("missing or empty") && err.contains("--reinitialise-store"),
        "{err}"
    );
}

/// A service that orders routing "srv6" on a platform started with
/// `--srv6` (as root): every chunk has its own address in the service's
/// /64, and the kernel chooses the server on each SYN. A chunk seen for the
/// first time is rejected by the edge's filter and served by the origin
/// gateway; seen again, the edge admits and serves it (MISS, then HIT). A
/// request for another chunk's path on a chunk's address is refused 421.
/// Deleting the service removes its nodes from the SR domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_routed_with_srv6_is_served_at_chunk_addresses_through_the_kernels_filter() {
    use vcdn_content::{content_id, ChunkId, ContentPrefix};
    /// The SR domain is removed whatever the outcome (dropped after `up`,
    /// whose instances keep their nodes while they run).
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for e in std::fs::read_dir("/run/netns")
                .into_iter()
                .flatten()
                .flatten()
            {
                let n = e.file_name().to_string_lossy().into_owned();
                if n == "vcdn-pop" || n.starts_with("vcdn-sr-") {
                    let _ = Command::new("ip").args(["netns", "del", &n]).status();
                }
            }
        }
    }
    let _cleanup = Cleanup;
    let model_dir = tempdir("control-srv6-model");
    let model = support::small_capacity_model(&model_dir);
    let up = Up::start("control-srv6", &["--capacity-model", &model, "--srv6"]);
    let (ok, out, err) = up.cli(&[
        "service",
        "create",
        "chunks",
        "--origin",
        &up.origin_url(),
        "--hostname",
        "chunks.demo.example",
        "--flavor",
        "elastic",
        "--region",
        "paris=10",
        "--lease",
        "1h",
        "--routing",
        "srv6",
    ]);
    assert!(ok, "create failed: {err}");
    assert!(out.contains("state     active"), "{out}");
    assert!(
        out.contains("chunks    fd76:6364:c:"),
        "the entry point names the chunk prefix: {out}"
    );
    let s = up.service("chunks").await;
    let prefix: ContentPrefix = s["entry_point"]["srv6"]["chunk_prefix"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let edge = instances(&s, "paris")[0].clone();
    let gateway = s["graph"]["srv6"]["gateway"].clone();
    let node = |i: &Value| {
        std::path::Path::new("/run/netns").join(format!("vcdn-sr-{}", i["id"].as_str().unwrap()))
    };
    assert!(
        node(&edge).exists() && node(&gateway).exists(),
        "a namespace per node"
    );
    let metric = |i: &Value, name: &'static str| {
        let admin = i["admin"].as_str().unwrap().to_string();
        let dir = up.dir.0.clone();
        async move { cache_metric(&dir, &admin, name).await }
    };
    let at =
        |path: &str| SocketAddr::new(prefix.address(ChunkId(content_id(None, path))).into(), 80);
    // `vcdn name path` gives customers the same address.
    let named = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(["name", "path", "--prefix"])
        .arg(s["entry_point"]["srv6"]["chunk_prefix"].as_str().unwrap())
        .arg("/size/5000")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&named.stdout).trim(),
        at("/size/5000").ip().to_string()
    );
    let get = |path: &'static str| async move {
        client::request(
            at(path),
            "GET",
            path,
            &[("Host", "chunks.demo.example")],
            b"",
            Duration::from_secs(5),
        )
        .await
        .expect("a chunk address answers")
    };

    // Until the router's health checks make the edge a candidate, the
    // dispatcher sends chunks to the gateway alone; then a new chunk is
    // one the edge's filter has not seen, and rejects.
    let tries = std::sync::atomic::AtomicU64::new(0);
    let candidate = eventually(15, || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = format!("/size/{}", 100 + n);
        let addr = at(&path);
        let r = client::request(
            addr,
            "GET",
            &path,
            &[("Host", "chunks.demo.example")],
            b"",
            Duration::from_secs(5),
        )
        .await
        .expect("a chunk address answers");
        assert_eq!(r.status(), 200);
        metric(&edge, "vcdn_cache_srv6_rejected_total").await > 0
    })
    .await;
    assert!(
        candidate,
        "the edge never became a candidate of the dispatcher"
    );
    let (accepted, rejected, passed, served) = (
        metric(&edge, "vcdn_cache_srv6_accepted_total").await,
        metric(&edge, "vcdn_cache_srv6_rejected_total").await,
        metric(&gateway, "vcdn_cache_srv6_last_total").await,
        metric(&edge, "vcdn_cache_requests_total{").await,
    );

    // Seen for the first time: the edge's filter passes the SYN on, the
    // origin gateway answers.
    let first = get("/size/5000").await;
    assert_eq!((first.status(), first.body.len()), (200, 5000));
    assert_eq!(
        metric(&edge, "vcdn_cache_srv6_rejected_total").await,
        rejected + 1
    );
    // (The gateway accepts every packet as the last segment.)
    let passed_now = metric(&gateway, "vcdn_cache_srv6_last_total").await;
    assert!(passed_now > passed, "the gateway took the connection");
    assert_eq!(
        metric(&edge, "vcdn_cache_requests_total{").await,
        served,
        "a rejected chunk costs the edge no request"
    );
    // Seen again: admitted, the edge serves it, then from its store.
    let second = get("/size/5000").await;
    assert_eq!(second.body.len(), 5000);
    assert!(second.header("x-cache").unwrap().starts_with("MISS"));
    let third = get("/size/5000").await;
    assert!(third.header("x-cache").unwrap().starts_with("HIT"));
    assert_eq!(
        metric(&edge, "vcdn_cache_srv6_accepted_total").await,
        accepted + 2
    );
    assert_eq!(
        metric(&gateway, "vcdn_cache_srv6_last_total").await,
        passed_now,
        "admitted chunks do not reach the gateway"
    );

    // Another chunk's path on this chunk's address: 421, not fetched.
    let wrong = client::request(
        at("/size/5000"),
        "GET",
        "/size/6000",
        &[("Host", "chunks.demo.example")],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(wrong.status(), 421, "{}", wrong.text());

    // Deleted: its nodes leave the SR domain.
    let (ok, _, err) = up.cli(&["service", "delete", "chunks"]);
    assert!(ok, "{err}");
    let gone = eventually(10, || async {
        !node(&edge).exists() && !node(&gateway).exists()
    })
    .await;
    assert!(gone, "the service's namespaces are removed");
}

/// `vcdn up --srv6` without the rights to build the SR domain (here: not
/// root) does not start, and says what it lacks and how to start instead.
#[test]
fn srv6_without_root_is_refused_at_start_saying_why() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("control-srv6-nobody");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let port = || format!("127.0.0.1:{}", free_port());
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_vcdn"))
        .arg("up")
        .arg("--data-dir")
        .arg(dir.join("up"))
        .args(["--srv6", "--plain-http", "--api", &port(), "--dns", &port()])
        .args(["--http", &port(), "--router-admin", &port()])
        .env("VCDN_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("setpriv (util-linux) runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without root: {err}");
    assert!(
        err.contains("--srv6")
            && err.contains("not running as root")
            && err.contains("start without --srv6"),
        "{err}"
    );
}
