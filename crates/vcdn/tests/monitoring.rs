//! What an operator's monitoring sees of a running `vcdn up`: the history
//! the control plane keeps for the charts (`/v1/services/{id}/timeseries`,
//! `/v1/timeseries`), and a real Prometheus (Debian's) that finds every
//! instance through `/v1/prometheus/targets`, scrapes it and stores its
//! series with the service, customer, region, host and role labels; every
//! query of the shipped Grafana dashboard (`deploy/grafana/vcdn.json`)
//! then runs on what it stored.

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::eventually;
use support::up::{free_port, Up, OP};

async fn service(up: &Up, id: &str) -> Value {
    up.call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await
        .1
}

fn sum(v: &Value) -> f64 {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .sum()
}

/// A Prometheus server of its own (Debian's `prometheus`), killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: support::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes every second what `vcdn up`'s service discovery lists (its
    /// `/metrics` over HTTPS, trusting the internal CA), and the control
    /// plane itself, as `deploy/prometheus/prometheus.yml` shows.
    fn start(up: &Up) -> Prometheus {
        let dir = support::tempdir("prometheus");
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let shipped = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/prometheus/prometheus.yml"
        ))
        .expect("deploy/prometheus/prometheus.yml");
        let config = shipped
            .replace("15s", "1s")
            .replace("127.0.0.1:8070", &up.api.to_string())
            .replace("/var/lib/vcdn", &up.dir.display().to_string())
            .replace(
                "/etc/prometheus/vcdn-operator-token",
                &dir.join("token").display().to_string(),
            );
        std::fs::write(dir.join("token"), OP).unwrap();
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus runs (apt install prometheus)");
        Prometheus {
            child,
            url: format!("http://{listen}"),
            _dir: dir,
        }
    }

    /// `GET /api/v1/PATH?query=Q`: (status, data).
    async fn api(&self, path: &str, query: &str) -> (String, Value) {
        let addr: SocketAddr = self.url.trim_start_matches("http://").parse().unwrap();
        let q: String = url_encode(query);
        let r = vcdn_http::client::request(
            addr,
            "GET",
            &format!("/api/v1/{path}?query={q}"),
            &[],
            b"",
            Duration::from_secs(10),
        )
        .await;
        match r {
            Ok(r) => {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                (
                    v["status"].as_str().unwrap_or("").to_string(),
                    if v["status"] == "success" {
                        v["data"].clone()
                    } else {
                        v
                    },
                )
            }
            Err(e) => ("unreachable".into(), json!(e.to_string())),
        }
    }

    async fn query(&self, q: &str) -> Vec<Value> {
        let (_, d) = self.api("query", q).await;
        d["result"].as_array().cloned().unwrap_or_default()
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_prometheus_show_what_a_service_served_with_its_labels() {
    let up = Up::start("monitoring", &[]);
    let id = up.order("watched", "paris", 10).await;
    let s = service(&up, &id).await;
    let inst = s["graph"]["regions"][0]["instances"][0].clone();
    let cache: SocketAddr = inst["address"].as_str().unwrap().parse().unwrap();
    for _ in 0..3 {
        let r = vcdn_http::client::request(
            cache,
            "GET",
            "/size/2000",
            &[],
            b"",
            Duration::from_secs(5),
        )
        .await
        .expect("the cache answers");
        assert_eq!(r.status(), 200);
    }

    // The history: the three requests (one miss, two hits) in Paris's
    // 10 s buckets once they close, with one instance and the cost.
    let path = format!("/v1/services/{id}/timeseries?step=10");
    let mut last = Value::Null;
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let mut seen = false;
    while !seen && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (st, v) = up.call(&up.demo_key(), "GET", &path, None).await;
        assert_eq!(st, 200, "{v}");
        let paris = &v["regions"][0];
        seen = paris["region"] == "paris"
            && sum(&paris["requests"]) >= 3.0
            && paris["hit_ratio"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h.as_f64().is_some_and(|h| h > 0.0));
        last = v;
    }
    assert!(seen, "the requests did not show in the history: {last}");
    let paris = &last["regions"][0];
    assert_eq!(sum(&paris["requests"]), 3.0, "{last}");
    assert!(sum(&paris["bytes"]) >= 6000.0, "{last}");
    let n = paris["t"].as_array().unwrap().len();
    for col in [
        "requests",
        "bytes",
        "hit_ratio",
        "instances",
        "load",
        "mos_estimated",
        "mos_reported",
    ] {
        assert_eq!(
            paris[col].as_array().map(Vec::len),
            Some(n),
            "{col} is a column like t"
        );
    }
    assert!(
        paris["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i == &json!(1.0)),
        "{last}"
    );
    assert_eq!(last["step_s"], 10);
    assert_eq!(last["target_mos"], 4.0);
    assert!(sum(&last["total"]["cost"]) > 0.0, "{last}");

    // The CLI prints it per region.
    let api = up.api_client();
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(["service", "history", &id, "--since", "10m"])
        .env("VCDN_API", &api.url)
        .env("VCDN_TOKEN", up.demo_key())
        .env("VCDN_API_FINGERPRINT", api.fingerprint(&up.dir).unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("REQ/S") && text.contains("paris"), "{text}");

    // Another customer cannot read it; a customer cannot read the
    // platform's; the operator reads the platform's, summed per region.
    let (st, other) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "other"})))
        .await;
    assert_eq!(st, 201, "{other}");
    let other_key = other["api_key"].as_str().unwrap();
    let (st, p) = up.call(other_key, "GET", &path, None).await;
    assert_eq!(st, 404, "{p}");
    let (st, p) = up.call(&up.demo_key(), "GET", "/v1/timeseries", None).await;
    assert_eq!(st, 403, "{p}");
    let (st, all) = up.call(OP, "GET", "/v1/timeseries?step=10", None).await;
    assert_eq!(st, 200, "{all}");
    assert!(sum(&all["regions"][0]["requests"]) >= 3.0, "{all}");
    for bad in ["step=60", "from=abc", "from=10&to=5"] {
        let (st, p) = up
            .call(OP, "GET", &format!("/v1/timeseries?{bad}"), None)
            .await;
        assert_eq!(st, 422, "{bad}: {p}");
        assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()), "{p}");
    }

    // Service discovery lists the cache's metrics address with its labels.
    let (st, targets) = up.call(OP, "GET", "/v1/prometheus/targets", None).await;
    assert_eq!(st, 200, "{targets}");
    let (st, _) = up
        .call(&up.demo_key(), "GET", "/v1/prometheus/targets", None)
        .await;
    assert_eq!(st, 403, "customers do not see the platform's targets");
    let group = targets
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["labels"]["instance_id"] == inst["id"])
        .unwrap_or_else(|| panic!("the cache is not a target: {targets}"));
    assert_eq!(group["targets"], json!([inst["admin"]]));
    let customer = s["customer"].as_str().unwrap();
    let want = json!({"service": id, "service_name": "watched", "customer": customer, "region": "paris",
        "host": inst["host"], "role": "cache", "instance_id": inst["id"], "__scheme__": "https"});
    assert_eq!(group["labels"], want);
    assert!(
        targets
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["labels"]["role"] == "router"),
        "{targets}"
    );

    // A real Prometheus finds, scrapes and labels it.
    let prom = Prometheus::start(&up);
    let q = format!("up{{service=\"{id}\"}}");
    let mut up_series = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut found = false;
    while !found && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        up_series = prom.query(&q).await;
        found = up_series.iter().any(|r| r["value"][1] == "1");
    }
    assert!(found, "Prometheus did not scrape the cache: {up_series:?}");
    let m = &up_series[0]["metric"];
    for (k, v) in [
        ("customer", customer),
        ("region", "paris"),
        ("role", "cache"),
        ("service_name", "watched"),
    ] {
        assert_eq!(m[k], v, "{m}");
    }
    assert_eq!(m["host"], inst["host"]);
    assert_eq!(m["instance_id"], inst["id"]);
    let served = prom
        .query(&format!(
            "vcdn_cache_requests_total{{service=\"{id}\",result=\"HIT\"}}"
        ))
        .await;
    assert_eq!(
        served.first().map(|r| r["value"][1].clone()),
        Some(json!("2")),
        "{served:?}"
    );
    // The router and the control plane are scraped too; a rate needs two
    // scrapes of each.
    for q in [
        "up{role=\"router\"} == 1".to_string(),
        "up{role=\"control\"} == 1".to_string(),
        format!("sum(rate(vcdn_cache_requests_total{{service=\"{id}\"}}[30s]))"),
        "rate(vcdn_router_health_checks_total[30s])".to_string(),
        "rate(vcdn_control_api_requests_total[30s])".to_string(),
    ] {
        assert!(
            eventually(30, || async { prom.query(&q).await.len() == 1 }).await,
            "{q}: {:?}",
            prom.query(&q).await
        );
    }
    let (_, names) = prom.api("label/__name__/values", "").await;
    let names: Vec<String> = serde_json::from_value(names).unwrap_or_default();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/vcdn.json"
        ))
        .unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = stack.pop() {
        stack.extend(p["panels"].as_array().into_iter().flatten());
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push((
                p["title"].as_str().unwrap_or("").to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let mut empty = Vec::new();
    for (title, e) in &exprs {
        let q = e
            .replace("$__rate_interval", "30s")
            .replace("$__interval", "5s")
            .replace("$__range", "1h")
            .replace("$service", &id)
            .replace("$region", "paris");
        let (status, data) = prom.api("query", &q).await;
        assert_eq!(status, "success", "{title}: {q}: {data}");
        let proxies = q.contains("vcdn_proxy_") || q.contains("vcdn_accel_");
        for name in metric_names(&q) {
            assert!(
                proxies || names.contains(&name),
                "{title}: no metric {name} in Prometheus"
            );
        }
        if data["result"].as_array().is_none_or(Vec::is_empty) && !proxies {
            empty.push(title.clone());
        }
    }
    assert!(empty.is_empty(), "panels without data: {empty:?}");
}

/// The `vcdn_…` metric names a query uses.
fn metric_names(q: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = q;
    while let Some(i) = rest.find("vcdn_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        out.push(name);
    }
    out
}
