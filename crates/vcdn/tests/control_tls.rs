//! The control plane over TLS as its users meet it: `vcdn up` serves HTTPS
//! with a self-signed certificate made on its first start (kept across
//! restarts, its fingerprint printed), the CLI and curl trust it, a wrong
//! fingerprint is refused saying which one was seen; plain HTTP only on
//! loopback; an operator's certificate; and services' certificates
//! uploaded, checked, shown without their key, or issued by the internal CA.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use support::up::{free_port, Up, OP};
use support::{eventually, tempdir};
use vcdn_http::client;
use vcdn_http::tls;

/// `vcdn ARGS` with the given environment (and none of the caller's API
/// settings): success, stdout, stderr.
fn vcdn(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vcdn"));
    cmd.args(args)
        .env_remove("VCDN_API")
        .env_remove("VCDN_API_FINGERPRINT")
        .env_remove("VCDN_CA_FILE")
        .env_remove("VCDN_TOKEN")
        .env("VCDN_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("vcdn runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fingerprint(up: &Up) -> String {
    std::fs::read_to_string(up.dir.join("api.fingerprint"))
        .expect("vcdn up wrote api.fingerprint")
        .trim()
        .to_string()
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_talks_https_by_default_and_refuses_a_certificate_it_was_not_told_to_trust() {
    let mut up = Up::start("tls-cli", &[]);
    let fp = fingerprint(&up);
    assert!(tls::parse_fingerprint(&fp).is_some(), "{fp}");
    // The greeting tells the user what to export.
    let export = up.greeting.last().unwrap().clone();
    assert!(
        export.contains(&format!("VCDN_API=https://{}", up.api))
            && export.contains(&format!("VCDN_API_FINGERPRINT={fp}")),
        "{export}"
    );
    for f in ["api.key", "api.crt", "ca.key", "ca.crt"] {
        assert_eq!(mode(&up.dir.join(f)), 0o600, "{f}");
    }
    let url = format!("https://{}", up.api);
    let key = up.demo_key();

    // Trusted by fingerprint: the CLI works.
    let (ok, out, err) = vcdn(
        &["service", "catalog"],
        &[
            ("VCDN_API", &url),
            ("VCDN_API_FINGERPRINT", &fp),
            ("VCDN_TOKEN", &key),
        ],
    );
    assert!(ok && out.contains("regions:"), "{out}{err}");

    // Another fingerprint: refused before the token is sent, saying which
    // certificate was seen and how to trust it.
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let (ok, _, err) = vcdn(
        &["service", "list"],
        &[
            ("VCDN_API", &url),
            ("VCDN_API_FINGERPRINT", &wrong),
            ("VCDN_TOKEN", &key),
        ],
    );
    assert!(!ok, "{err}");
    assert!(
        err.contains(&fp) && err.contains(&format!("export VCDN_API_FINGERPRINT={fp}")),
        "{err}"
    );
    // Nothing said: the system's CAs do not know a self-signed certificate.
    let (ok, _, err) = vcdn(
        &["service", "list"],
        &[("VCDN_API", &url), ("VCDN_TOKEN", &key)],
    );
    assert!(
        !ok && err.contains("not trusted") && err.contains("VCDN_API_FINGERPRINT"),
        "{err}"
    );
    // Plain HTTP to the HTTPS API: no answer, and a hint.
    let (ok, _, err) = vcdn(
        &["service", "list"],
        &[
            ("VCDN_API", &format!("http://{}", up.api)),
            ("VCDN_TOKEN", &key),
        ],
    );
    assert!(!ok && err.contains("https://"), "{err}");
    let r = client::request(up.api, "GET", "/healthz", &[], b"", Duration::from_secs(5)).await;
    assert!(r.is_err(), "plain HTTP answered: {r:?}");
    // A malformed fingerprint says what one looks like.
    let (ok, _, err) = vcdn(
        &["service", "list"],
        &[
            ("VCDN_API", &url),
            ("VCDN_API_FINGERPRINT", "abc"),
            ("VCDN_TOKEN", &key),
        ],
    );
    assert!(!ok && err.contains("64 hex"), "{err}");

    // curl trusts the self-signed certificate given as its CA (what the
    // greeting suggests).
    let curl = |extra: &[&str]| {
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(extra)
            .arg(format!("https://{}/healthz", up.api))
            .output()
            .expect("curl runs")
    };
    let out = curl(&["--cacert", up.dir.join("api.crt").to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!curl(&[]).status.success());

    // The router's admin API is HTTPS too, with a certificate of the
    // internal CA (ca.crt), and nothing answers plain HTTP there.
    let router_admin = std::net::SocketAddr::from(([127, 0, 0, 1], up.ports[2]));
    assert!(
        up.greeting
            .iter()
            .any(|l| l.contains(&format!("router admin   https://{router_admin}"))),
        "{:?}",
        up.greeting
    );
    let ca = tls::parse_chain(&std::fs::read(up.dir.join("ca.crt")).unwrap()).unwrap();
    let r = client::request_url(
        &format!("https://{router_admin}"),
        &tls::Trust::Bundle(ca),
        "GET",
        "/healthz",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    let r = client::request(
        router_admin,
        "GET",
        "/healthz",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await;
    assert!(r.is_err(), "{r:?}");

    // A restart keeps the certificate (the same fingerprint).
    up.kill();
    up.relaunch();
    assert_eq!(fingerprint(&up), fp);
    let r = up.api_client().get("/healthz").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    let (ok, out, err) = vcdn(
        &["service", "list"],
        &[
            ("VCDN_API", &format!("https://{}", up.api)),
            ("VCDN_API_FINGERPRINT", &fp),
            ("VCDN_TOKEN", &key),
        ],
    );
    assert!(ok && out.contains("NAME"), "{out}{err}");
}

/// Runs `vcdn up ARGS` expecting it to refuse to start: its stderr.
fn refused(args: &[&str]) -> String {
    let dir = tempdir("tls-refused");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .arg("up")
        .arg("--data-dir")
        .arg(&dir)
        .args([
            "--dns",
            &format!("127.0.0.1:{}", free_port()),
            "--http",
            &format!("127.0.0.1:{}", free_port()),
            "--router-admin",
            &format!("127.0.0.1:{}", free_port()),
            "--operator-token",
            OP,
        ])
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
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(!st.success(), "{err}");
            return err;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("vcdn up {args:?} started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_only_on_loopback_and_an_operator_certificate_checked_at_start() {
    // --plain-http on loopback: served, no fingerprint, the CLI says http://.
    let up = Up::start("tls-plain", &["--plain-http"]);
    assert!(!up.dir.join("api.fingerprint").exists());
    let api = up.api_client();
    assert!(api.url.starts_with("http://"), "{}", api.url);
    assert_eq!(api.get("/healthz").await.status(), 200);
    assert!(
        up.greeting
            .last()
            .unwrap()
            .contains(&format!("VCDN_API=http://{}", up.api)),
        "{:?}",
        up.greeting
    );
    let (ok, out, err) = vcdn(
        &["service", "list"],
        &[("VCDN_API", &api.url), ("VCDN_TOKEN", &up.demo_key())],
    );
    assert!(ok, "{out}{err}");
    drop(up);

    // Anywhere else it is refused before anything listens.
    let err = refused(&["--api", "192.0.2.1:8070", "--plain-http"]);
    assert!(
        err.contains("--plain-http") && err.contains("loopback"),
        "{err}"
    );
    let err = refused(&["--api", "0.0.0.0:0", "--plain-http"]);
    assert!(err.contains("loopback"), "{err}");

    // The operator's certificate: garbage, expired, and one that works.
    let dir = tempdir("tls-operator-cert");
    let (crt, key) = (dir.join("api.pem"), dir.join("api.key"));
    std::fs::write(&crt, "hello").unwrap();
    std::fs::write(&key, "world").unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let files = [
        "--tls-cert",
        crt.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let err = refused(&[&["--api", api.as_str()], &files[..]].concat());
    assert!(
        err.contains("--tls-cert") && err.contains("BEGIN CERTIFICATE"),
        "{err}"
    );
    let now = SystemTime::now();
    let old = tls::self_signed_between(
        &["127.0.0.1".into()],
        now - Duration::from_secs(30 * 86_400),
        now - Duration::from_secs(86_400),
    )
    .unwrap();
    std::fs::write(&crt, &old.cert_pem).unwrap();
    std::fs::write(&key, &old.key_pem).unwrap();
    let err = refused(&[&["--api", api.as_str()], &files[..]].concat());
    assert!(err.contains("expired"), "{err}");

    let ca = tls::Ca::create("operator test CA", 5).unwrap();
    let leaf = ca
        .issue(&["127.0.0.1".into(), "localhost".into()], 5)
        .unwrap();
    std::fs::write(&crt, &leaf.cert_pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    let up = Up::start("tls-operator", &files);
    let url = format!("https://{}", up.api);
    // Trusted through the operator's CA (VCDN_CA_FILE).
    let (ok, out, err) = vcdn(
        &["service", "list"],
        &[
            ("VCDN_API", &url),
            ("VCDN_CA_FILE", ca_file.to_str().unwrap()),
            ("VCDN_TOKEN", &up.demo_key()),
        ],
    );
    assert!(ok, "{out}{err}");
    let served = tls::parse_bundle(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes())
        .unwrap()
        .info
        .fingerprint;
    assert_eq!(fingerprint(&up), served);
}

fn cert_pair(ca: &tls::Ca, names: &[&str], days: u32) -> (String, String) {
    let m = ca
        .issue(
            &names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            days,
        )
        .unwrap();
    (m.cert_pem, m.key_pem)
}

async fn put_cert(up: &Up, token: &str, id: &str, body: &str) -> (u16, Value, String) {
    let r = up
        .api_client()
        .request(
            "PUT",
            &format!("/v1/services/{id}/certificate"),
            &[
                ("Authorization", &format!("Bearer {token}")),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
        .await
        .expect("API answers");
    assert!(
        !r.text().contains("-----BEGIN"),
        "a key came back: {}",
        r.text()
    );
    (
        r.status(),
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        r.header("content-type").unwrap_or("").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_internal_certificates_and_uploads_are_checked_and_never_shown() {
    let up = Up::start("tls-service-certs", &[]);
    let key = up.demo_key();
    let host = "video.tls.example";
    let (st, s) = up
        .call(
            &key,
            "POST",
            "/v1/services",
            Some(
                json!({"name": "tls", "origin": format!("http://{}", up.origin), "hostname": host,
                "flavor": "static", "regions": [{"region": "paris"}]}),
            ),
        )
        .await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let path = format!("/v1/services/{id}/certificate");

    // Issued by the internal CA at creation, for its hostname.
    let (st, c) = up.call(&key, "GET", &path, None).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["source"], "internal-ca", "{c}");
    assert!(c["names"].as_array().unwrap().contains(&json!(host)), "{c}");
    assert!(
        c["issuer"].as_str().unwrap().contains("vcdn internal CA"),
        "{c}"
    );
    assert!(
        c.get("key_pem").is_none() && !c.to_string().contains("-----BEGIN"),
        "{c}"
    );
    let internal_fp = c["fingerprint"].as_str().unwrap().to_string();
    let ca_pem = std::fs::read_to_string(up.dir.join("ca.crt")).unwrap();
    assert!(ca_pem.contains("BEGIN CERTIFICATE"));

    // A good upload (a test CA's certificate for the hostname).
    let test_ca = tls::Ca::create("customer test CA", 5).unwrap();
    let (crt, k) = cert_pair(&test_ca, &[host], 60);
    let body = json!({"cert_pem": crt, "key_pem": k}).to_string();
    let (st, v, _) = put_cert(&up, &key, &id, &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["source"], "uploaded");
    let uploaded_fp = tls::parse_bundle(crt.as_bytes(), k.as_bytes())
        .unwrap()
        .info
        .fingerprint;
    let (_, c) = up.call(&key, "GET", &path, None).await;
    assert_eq!(
        (c["source"].as_str(), c["fingerprint"].as_str()),
        (Some("uploaded"), Some(uploaded_fp.as_str())),
        "{c}"
    );
    assert!(c["not_after"].as_str().unwrap().ends_with('Z'), "{c}");
    // The operator sees it too.
    assert_eq!(up.call(OP, "GET", &path, None).await.0, 200);

    // Refused uploads, each with a problem document that says why.
    let (other_crt, other_key) = cert_pair(&test_ca, &[host], 60);
    let now = SystemTime::now();
    let expired = tls::self_signed_between(
        &[host.to_string()],
        now - Duration::from_secs(20 * 86_400),
        now - Duration::from_secs(86_400),
    )
    .unwrap();
    let (elsewhere_crt, elsewhere_key) = cert_pair(&test_ca, &["other.example"], 60);
    let cases = [
        (
            json!({"cert_pem": crt, "key_pem": other_key}).to_string(),
            422,
            "does not belong",
        ),
        (
            json!({"cert_pem": expired.cert_pem, "key_pem": expired.key_pem}).to_string(),
            422,
            "expired",
        ),
        (
            json!({"cert_pem": elsewhere_crt, "key_pem": elsewhere_key}).to_string(),
            422,
            "does not cover video.tls.example",
        ),
        (
            json!({"cert_pem": "garbage", "key_pem": k}).to_string(),
            422,
            "BEGIN CERTIFICATE",
        ),
        (
            json!({"cert_pem": other_crt, "key_pem": "garbage"}).to_string(),
            422,
            "private key",
        ),
        ("{not json".to_string(), 400, "not valid JSON"),
        (json!({"cert_pem": crt}).to_string(), 400, "key_pem"),
    ];
    for (body, status, why) in cases {
        let (st, p, ct) = put_cert(&up, &key, &id, &body).await;
        assert_eq!(
            (st, ct.as_str()),
            (status, "application/problem+json"),
            "{why}: {p}"
        );
        assert!(p["detail"].as_str().unwrap().contains(why), "{why}: {p}");
    }
    // Still the good one.
    let (_, c) = up.call(&key, "GET", &path, None).await;
    assert_eq!(c["fingerprint"], uploaded_fp.as_str());

    // Another customer can neither read nor set it (the service does not
    // exist for them).
    let (_, other) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "other"})))
        .await;
    let other = other["api_key"].as_str().unwrap().to_string();
    let (st, _) = up.call(&other, "GET", &path, None).await;
    assert_eq!(st, 404);
    let (st, _, _) = put_cert(&up, &other, &id, &body_for(&test_ca, host)).await;
    assert_eq!(st, 404);
    assert_eq!(up.call(&other, "DELETE", &path, None).await.0, 404);
    assert_eq!(up.call("", "GET", &path, None).await.0, 401);

    // Metrics show when it expires.
    let m = up.api_client().get("/metrics").await.text();
    assert!(
        m.contains(&format!(
            "vcdn_certificate_not_after_seconds{{service=\"{id}\",source=\"uploaded\"}}"
        )),
        "{m}"
    );

    // DELETE: back to an internal-CA certificate (a new one).
    let (st, c) = up.call(&key, "DELETE", &path, None).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["source"], "internal-ca");
    assert_ne!(c["fingerprint"], internal_fp.as_str());
    assert_ne!(c["fingerprint"], uploaded_fp.as_str());

    // A certificate with days left is reported in the events, once.
    let (crt, k) = cert_pair(&test_ca, &[host], 5);
    let (st, v, _) = put_cert(
        &up,
        &key,
        &id,
        &json!({"cert_pem": crt, "key_pem": k}).to_string(),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let expiring = || async {
        let (_, ev) = up
            .call(&key, "GET", &format!("/v1/services/{id}/events"), None)
            .await;
        ev["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "certificate_expiring")
            .map(|e| e["detail"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert!(eventually(5, || async { !expiring().await.is_empty() }).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ev = expiring().await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(
        ev[0].contains("in 4 days") || ev[0].contains("in 5 days"),
        "{ev:?}"
    );
    // No key in any event either.
    let (_, all) = up
        .call(&key, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    assert!(!all.to_string().contains("-----BEGIN"), "{all}");

    // An ended service's certificate is dropped.
    assert_eq!(
        up.call(&key, "DELETE", &format!("/v1/services/{id}"), None)
            .await
            .0,
        200
    );
    assert!(
        eventually(5, || async {
            up.call(OP, "GET", &path, None).await.0 == 404
        })
        .await
    );
}

fn body_for(ca: &tls::Ca, host: &str) -> String {
    let (c, k) = cert_pair(ca, &[host], 30);
    json!({"cert_pem": c, "key_pem": k}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_serves_its_admin_api_over_https_with_the_operators_certificate() {
    use std::io::BufRead;
    let dir = tempdir("tls-router");
    let ca = tls::Ca::create("operator test CA", 5).unwrap();
    let (crt, key) = cert_pair(&ca, &["127.0.0.1"], 5);
    let (cp, kp) = (dir.join("admin.crt"), dir.join("admin.key"));
    std::fs::write(&cp, &crt).unwrap();
    std::fs::write(&kp, &key).unwrap();
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let token = "router-admin-token-0123456789abcdef";
    let args = |c: &std::path::Path| {
        vec![
            "router".to_string(),
            "--no-dns".into(),
            "--http".into(),
            format!("127.0.0.1:{}", free_port()),
            "--admin".into(),
            admin.to_string(),
            "--admin-token".into(),
            token.into(),
            "--admin-tls-cert".into(),
            c.display().to_string(),
            "--admin-tls-key".into(),
            kp.display().to_string(),
        ]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args(&cp))
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let guard = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    loop {
        let l = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("router starts");
        if l.contains("admin on") {
            assert!(l.contains(&format!("https://{admin}")), "{l}");
            break;
        }
    }
    let trust = tls::Trust::Bundle(tls::parse_chain(ca.cert_pem.as_bytes()).unwrap());
    let r = client::request_url(
        &format!("https://{admin}"),
        &trust,
        "GET",
        "/services",
        &[("Authorization", &format!("Bearer {token}"))],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    // Another CA's certificate is not trusted.
    let other = tls::Ca::create("someone else", 5).unwrap();
    let e = client::request_url(
        &format!("https://{admin}"),
        &tls::Trust::Bundle(tls::parse_chain(other.cert_pem.as_bytes()).unwrap()),
        "GET",
        "/healthz",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("not trusted"), "{e}");
    drop(guard);

    // An expired certificate: refused at start, saying so.
    let now = SystemTime::now();
    let old = tls::self_signed_between(
        &["127.0.0.1".into()],
        now - Duration::from_secs(9 * 86_400),
        now - Duration::from_secs(86_400),
    )
    .unwrap();
    let oc = dir.join("old.crt");
    std::fs::write(&oc, &old.cert_pem).unwrap();
    std::fs::write(&kp, &old.key_pem).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args(&oc))
        .env("VCDN_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--admin-tls-cert") && err.contains("expired"),
        "{err}"
    );

    // Without a certificate the admin API is plain HTTP: refused off
    // loopback, before anything listens.
    let err = support::refused_to_start(&[
        "router",
        "--no-dns",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "192.0.2.1:8054",
        "--admin-token",
        token,
    ]);
    assert!(
        err.contains("192.0.2.1:8054") && err.contains("--admin-tls-cert"),
        "{err}"
    );
}

/// curl to a cache's HTTPS port as a browser would reach the service:
/// `--resolve` maps the service's hostname to the instance, `ca` is the
/// trust anchor. Returns (exit ok, stdout+stderr with `-v`).
fn curl_https(host: &str, addr: &str, ca: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let (ip, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new("curl")
        .args(["-sv", "--max-time", "5", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("{host}:{port}:{ip}")])
        .args(extra)
        .arg(format!("https://{host}:{port}/size/4096"))
        .output()
        .expect("curl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The whole path: a service ordered from `vcdn up` is served by its cache
/// over HTTPS (HTTP/1.1 and HTTP/2) with the certificate the internal CA
/// issued, pushed by the control plane; a certificate the customer uploads
/// then reaches the running cache (same process) and new connections use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_is_served_over_https_with_its_certificate_pushed_to_the_running_cache() {
    let up = Up::start("tls-e2e", &[]);
    let key = up.demo_key();
    let host = "video.e2e.example";
    let (st, s) = up
        .call(
            &key,
            "POST",
            "/v1/services",
            Some(
                json!({"name": "e2e", "origin": format!("http://{}", up.origin), "hostname": host,
                "flavor": "static", "regions": [{"region": "paris"}]}),
            ),
        )
        .await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    assert!(
        eventually(20, || async {
            support::up::caches(up.instance_port)
                .iter()
                .any(|c| c.flags.contains_key("--tls-listen"))
        })
        .await,
        "no cache with a TLS listener started"
    );
    let cache = &support::up::caches(up.instance_port)[0];
    let tls_addr = cache.flags["--tls-listen"].clone();
    let pid = cache.pid;
    let internal_ca = up.dir.join("ca.crt");

    // The internal CA's certificate arrives by push; then MISS, HIT, and HTTP/2.
    assert!(
        eventually(20, || async {
            curl_https(host, &tls_addr, &internal_ca, &["--http1.1"]).0
        })
        .await,
        "{}",
        curl_https(host, &tls_addr, &internal_ca, &["--http1.1"]).1
    );
    let (ok, v) = curl_https(host, &tls_addr, &internal_ca, &["--http1.1"]);
    assert!(ok && v.contains("vcdn internal CA"), "{v}");
    assert!(v.to_ascii_lowercase().contains("x-cache: hit"), "{v}");
    let (ok, v) = curl_https(host, &tls_addr, &internal_ca, &["--http2"]);
    assert!(ok && v.contains("HTTP/2 200"), "{v}");

    // The customer's own certificate: pushed to the same cache process.
    let test_ca = tls::Ca::create("customer e2e CA", 5).unwrap();
    let ca_file = up.dir.join("customer-ca.pem");
    std::fs::write(&ca_file, &test_ca.cert_pem).unwrap();
    let (st, v, _) = put_cert(&up, &key, &id, &body_for(&test_ca, host)).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        eventually(20, || async {
            curl_https(host, &tls_addr, &ca_file, &["--http2"]).0
        })
        .await,
        "{}",
        curl_https(host, &tls_addr, &ca_file, &["--http2"]).1
    );
    // The internal CA's certificate is no longer served.
    assert!(!curl_https(host, &tls_addr, &internal_ca, &[]).0);
    assert_eq!(support::up::caches(up.instance_port)[0].pid, pid);

    // Those keys went over the cache's admin API, which is HTTPS with a
    // certificate of the internal CA (its key a private file of the
    // instance's directory), and speaks nothing else.
    let admin: std::net::SocketAddr = cache.flags["--admin"].parse().unwrap();
    let key_file = std::path::PathBuf::from(&cache.flags["--admin-tls-key"]);
    assert!(
        key_file.starts_with(up.dir.join("instances")),
        "{key_file:?}"
    );
    assert_eq!(mode(&key_file), 0o600);
    let r = client::request(admin, "GET", "/healthz", &[], b"", Duration::from_secs(5)).await;
    assert!(r.is_err(), "plain HTTP answered on the admin port: {r:?}");
    let ca = tls::Trust::Bundle(tls::parse_chain(&std::fs::read(&internal_ca).unwrap()).unwrap());
    let token = std::fs::read_to_string(up.dir.join("instance-token")).unwrap();
    let r = client::request_url(
        &format!("https://{admin}"),
        &ca,
        "GET",
        "/tls/certificates",
        &[("Authorization", &format!("Bearer {}", token.trim()))],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    assert!(r.text().contains(host), "{}", r.text());
    let (ok, out, err) = vcdn(
        &["cache", "ctl", "--admin", &admin.to_string(), "stats"],
        &[
            ("VCDN_CA_FILE", &internal_ca.display().to_string()),
            ("VCDN_ADMIN_TOKEN", token.trim()),
        ],
    );
    assert!(ok && out.contains("hit_ratio"), "{out}{err}");
    // The customer's CA is not the internal one: the CLI refuses the
    // admin certificate and sends no token.
    let (ok, _, err) = vcdn(
        &[
            "cache",
            "ctl",
            "--admin",
            &admin.to_string(),
            "--ca-file",
            &ca_file.display().to_string(),
            "stats",
        ],
        &[("VCDN_ADMIN_TOKEN", token.trim())],
    );
    assert!(
        !ok && err.contains("not trusted") && err.contains("--ca-file"),
        "{err}"
    );
}
