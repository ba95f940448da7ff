//! TLS at the edge: a real `vcdn cache` with `--tls-listen` in front of a
//! real `vcdn origin`, spoken to by curl, openssl s_client and a rustls
//! client; certificates chosen by SNI, replaced live, refused when wrong;
//! session resumption; and clients that attack the handshake.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use vcdn_http::tls::rustls::pki_types::ServerName;
use vcdn_http::tls::rustls::ClientConfig;
use vcdn_http::tls::tokio_rustls::TlsConnector;
use vcdn_http::tls::{self, Ca, Trust};

/// An internal CA and, in `dir/certs`, certificates it issued for
/// `a.example` and `b.example`; the CA's certificate is `dir/ca.pem`.
fn issue_certs(dir: &Path) -> Ca {
    let ca = Ca::create("vcdn edge test CA", 30).unwrap();
    std::fs::write(dir.join("ca.pem"), &ca.cert_pem).unwrap();
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    for name in ["a.example", "b.example"] {
        let m = ca.issue(&[name.to_string()], 10).unwrap();
        std::fs::write(certs.join(format!("{name}.crt")), &m.cert_pem).unwrap();
        std::fs::write(certs.join(format!("{name}.key")), &m.key_pem).unwrap();
    }
    // An OCSP response to staple with b.example's certificate (a DER
    // OCSPResponse whose status is "unauthorized": enough for a client to
    // show that it was stapled).
    std::fs::write(certs.join("b.example.ocsp"), [0x30, 0x03, 0x0a, 0x01, 0x06]).unwrap();
    ca
}

fn tls_cache(origin: SocketAddr, dir: &Path, extra: &[&str]) -> Proc {
    let certs = dir.join("certs").to_string_lossy().into_owned();
    let mut args = vec![
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert-dir",
        certs.as_str(),
    ];
    args.extend_from_slice(extra);
    cache(origin, &args)
}

/// What curl saw: its verbose log and the response (head and body).
struct Curl {
    log: String,
    head: String,
    body: Vec<u8>,
}

fn curl(dir: &Path, tls_addr: SocketAddr, host: &str, path: &str, extra: &[&str]) -> Curl {
    let out_file = dir.join(format!("curl-{}", rand_suffix()));
    let resolve = format!("{host}:{}:127.0.0.1", tls_addr.port());
    let url = format!("https://{host}:{}{path}", tls_addr.port());
    let out = Command::new("curl")
        .args(["-sS", "-v", "--http1.1", "--max-time", "20", "-D", "-"])
        .arg("--cacert")
        .arg(dir.join("ca.pem"))
        .args(["--resolve", &resolve, "-o"])
        .arg(&out_file)
        .args(extra)
        .arg(&url)
        .output()
        .expect("curl runs");
    let body = std::fs::read(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "curl {url} failed: {log}");
    Curl {
        log,
        head: String::from_utf8_lossy(&out.stdout).to_ascii_lowercase(),
        body,
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

async fn metrics(c: &Proc) -> String {
    String::from_utf8_lossy(&get(c.admin.unwrap(), "/metrics").await.body).into_owned()
}

/// The value of one metric line (name with labels, exactly).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

#[tokio::test]
async fn curl_gets_each_names_certificate_the_right_body_and_hits_over_tls_1_3_and_1_2() {
    let dir = tempdir("edge-tls-curl");
    issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let t = c.tls.expect("TLS address printed");
    for (host, version, path, max) in [
        ("a.example", "TLSv1.3", "/size/1000", None),
        ("b.example", "TLSv1.2", "/size/1001", Some("1.2")),
    ] {
        let extra: Vec<&str> = max.map(|m| vec!["--tls-max", m]).unwrap_or_default();
        for want in ["miss", "hit"] {
            let r = curl(&dir, t, host, path, &extra);
            assert!(
                r.log.contains(&format!("subject: CN={host}")),
                "{host}: wrong certificate: {}",
                r.log
            );
            assert!(
                r.log.contains(&format!("SSL connection using {version}")),
                "{host}: {}",
                r.log
            );
            assert!(
                r.log.contains("ALPN: server accepted http/1.1"),
                "{}",
                r.log
            );
            assert!(r.head.starts_with("http/1.1 200"), "{}", r.head);
            assert!(r.head.contains(&format!("x-cache: {want}")), "{}", r.head);
            let n: usize = path[6..].parse().unwrap();
            assert_eq!(r.body, synth(n), "{host} {want}: body differs");
        }
    }
    // HTTP/2 over TLS (ALPN h2), each name with its own certificate: the
    // same cache, the same answers.
    for (host, path) in [("a.example", "/size/1000"), ("b.example", "/size/1001")] {
        let r = curl(&dir, t, host, path, &["--http2"]);
        assert!(r.log.contains("ALPN: server accepted h2"), "{}", r.log);
        assert!(r.log.contains(&format!("subject: CN={host}")), "{}", r.log);
        assert!(r.head.starts_with("http/2 200"), "{}", r.head);
        assert!(r.head.contains("x-cache: hit"), "{}", r.head);
        assert_eq!(r.body, synth(path[6..].parse().unwrap()));
    }
    // A name with no certificate of its own gets the default one (the
    // first loaded), which curl then finds does not cover it.
    let r = curl(&dir, t, "other.example", "/size/1000", &["-k"]);
    assert!(r.log.contains("subject: CN=a.example"), "{}", r.log);
    assert!(r.head.contains("x-cache: hit"), "{}", r.head);
    // A large object: streamed on the miss, sent from the shared-memory
    // body on the hit (encrypted from the mapping), intact both times and
    // over both versions.
    const BIG: usize = 6 << 20;
    let path = format!("/size/{BIG}");
    for (want, extra) in [
        ("miss", vec![]),
        ("hit", vec![]),
        ("hit", vec!["--tls-max", "1.2"]),
    ] {
        let r = curl(&dir, t, "a.example", &path, &extra);
        assert!(r.head.contains(&format!("x-cache: {want}")), "{}", r.head);
        assert_eq!(r.body.len(), BIG);
        assert!(r.body == synth(BIG), "the large body differs ({want})");
    }
    // A stream of unknown length, relayed chunked as it arrives.
    let r = curl(
        &dir,
        t,
        "a.example",
        "/stream?chunks=5&interval_ms=20&size=3000",
        &[],
    );
    assert!(r.head.contains("transfer-encoding: chunked"), "{}", r.head);
    assert_eq!(r.body.len(), 15_000, "{}", r.head);
    // The same cache serves plain HTTP as before.
    let r = get(c.addr, "/size/1000").await;
    assert_eq!(x_cache(&r), "HIT");
    let m = metrics(&c).await;
    assert!(
        metric(&m, "vcdn_cache_tls_handshakes_total{result=\"ok\"}") >= 7,
        "{m}"
    );
    assert_eq!(
        metric(&m, "vcdn_cache_tls_handshakes_total{result=\"failed\"}"),
        0
    );
    assert!(m.contains("vcdn_cache_tls_certificate_not_after_seconds{name=\"a.example\"}"));
    assert!(m.contains("vcdn_cache_tls_certificate_not_after_seconds{name=\"b.example\"}"));
}

fn client_config(dir: &Path, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let ca = tls::parse_chain(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
    tls::client_config(&Trust::Bundle(ca), alpn).unwrap()
}

type Tls = vcdn_http::tls::tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn connect(cfg: &Arc<ClientConfig>, addr: SocketAddr, host: &str) -> Tls {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from(host.to_string()).unwrap(), tcp)
        .await
        .unwrap_or_else(|e| panic!("TLS to {host}: {e}"))
}

fn peer_fingerprint(s: &Tls) -> String {
    let certs = s.get_ref().1.peer_certificates().expect("a certificate");
    tls::fingerprint(certs[0].as_ref())
}

/// One keep-alive GET on `s`: status, head (lowercase) and body.
async fn http_get<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    host: &str,
    path: &str,
) -> (u16, String, Vec<u8>) {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    http_read(s).await
}

/// Read one response with a Content-Length: status, head (lowercase), body.
async fn http_read<S: AsyncRead + Unpin>(s: &mut S) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("response in time")
            .unwrap();
        assert!(n > 0, "closed before the response head");
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|v| v.trim().parse().unwrap())
        .expect("content-length");
    let mut body = buf[end..].to_vec();
    while body.len() < len {
        let mut b = vec![0u8; 65536];
        let n = s.read(&mut b).await.unwrap();
        assert!(n > 0, "closed mid-body");
        body.extend_from_slice(&b[..n]);
    }
    (head[9..12].parse().unwrap(), head, body)
}

#[tokio::test]
async fn a_certificate_replaced_live_serves_new_connections_while_old_ones_go_on() {
    let dir = tempdir("edge-tls-swap");
    let ca = issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let t = c.tls.unwrap();
    let cfg = client_config(&dir, &[b"http/1.1"]);
    let mut old = connect(&cfg, t, "a.example").await;
    let before = peer_fingerprint(&old);
    assert_eq!(old.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, _, body) = http_get(&mut old, "a.example", "/size/100").await;
    assert_eq!((status, body), (200, synth(100)));
    let m = metrics(&c).await;
    assert_eq!(
        metric(&m, "vcdn_cache_tls_connections{alpn=\"http/1.1\"}"),
        1,
        "{m}"
    );

    let new = ca.issue(&["a.example".to_string()], 20).unwrap();
    let put = serde_json::json!({"cert_pem": new.cert_pem, "key_pem": new.key_pem});
    let r = admin(&c, "PUT", "/tls/certificates/a.example", &put.to_string()).await;
    assert_eq!(r.status(), 200, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let fp = v["fingerprint"].as_str().unwrap().to_string();
    assert_ne!(fp, before);
    assert_eq!(v["names"], serde_json::json!(["a.example"]));
    assert_eq!(v["ocsp"], false);

    // New connections get the new certificate (a new client: one that
    // resumes its session keeps the certificate the session was made
    // with, as TLS intends)...
    let mut fresh = connect(&client_config(&dir, &[b"http/1.1"]), t, "a.example").await;
    assert_eq!(peer_fingerprint(&fresh), fp);
    let (status, head, _) = http_get(&mut fresh, "a.example", "/size/100").await;
    assert_eq!(status, 200);
    assert!(head.contains("x-cache: hit"), "{head}");
    // ...and the one made before the swap keeps working.
    let (status, _, body) = http_get(&mut old, "a.example", "/size/200").await;
    assert_eq!((status, body), (200, synth(200)));
    assert_eq!(peer_fingerprint(&old), before);
    // b.example is untouched.
    let other = connect(&cfg, t, "b.example").await;
    assert!(other.get_ref().1.peer_certificates().is_some());

    // ALPN: a client offering h2 gets h2 (handed to the HTTP/2 front end);
    // one without ALPN is served HTTP/1.1.
    let h2 = connect(&client_config(&dir, &[b"h2"]), t, "a.example").await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut none = connect(&client_config(&dir, &[]), t, "a.example").await;
    assert_eq!(none.get_ref().1.alpn_protocol(), None);
    assert_eq!(http_get(&mut none, "a.example", "/size/100").await.0, 200);

    // A request body larger than one read, streamed upstream as it is
    // decrypted.
    let body: Vec<u8> = (0..900_000u32).map(|i| (i % 251) as u8).collect();
    let mut s = connect(&cfg, t, "a.example").await;
    let head = format!(
        "POST /echo HTTP/1.1\r\nHost: a.example\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let (status, head, echoed) = http_read(&mut s).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("x-cache: pass"), "{head}");
    assert!(echoed == body, "the echoed body differs");
    // One too large is refused, and the connection ends with close_notify:
    // the client sees a clean end of the TLS stream, not a cut.
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: a.example\r\nContent-Length: 100000000\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed in time")
        .expect("a clean close (close_notify)");
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 413"), "{rest}");
}

#[tokio::test]
async fn the_admin_api_refuses_bad_certificates_with_reasons_and_never_shows_keys() {
    let dir = tempdir("edge-tls-admin");
    let ca = issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let good = ca.issue(&["c.example".to_string()], 5).unwrap();
    let other = ca.issue(&["c.example".to_string()], 5).unwrap();
    let day = Duration::from_secs(86_400);
    let now = std::time::SystemTime::now();
    let expired =
        tls::self_signed_between(&["c.example".to_string()], now - 10 * day, now - day).unwrap();
    let put =
        |cert: &str, key: &str| serde_json::json!({"cert_pem": cert, "key_pem": key}).to_string();
    let cases = [
        ("c.example", put("not a certificate", &good.key_pem), "no certificate found"),
        (
            "c.example",
            put(&good.cert_pem.replace("MI", "@@"), &good.key_pem),
            "malformed",
        ),
        ("c.example", put(&good.cert_pem, &other.key_pem), "does not belong"),
        ("c.example", put(&good.cert_pem, ""), "no private key"),
        ("c.example", put(&expired.cert_pem, &expired.key_pem), "expired"),
        ("d.example", put(&good.cert_pem, &good.key_pem), "does not cover d.example"),
        ("bad%20name", put(&good.cert_pem, &good.key_pem), "host name"),
        ("c.example", "{\"cert\": 1}".to_string(), "expected"),
        (
            "c.example",
            serde_json::json!({"cert_pem": good.cert_pem, "key_pem": good.key_pem, "ocsp_base64": "%%%"}).to_string(),
            "not base64",
        ),
    ];
    for (name, body, why) in cases {
        let r = admin(&c, "PUT", &format!("/tls/certificates/{name}"), &body).await;
        let text = String::from_utf8_lossy(&r.body);
        assert_eq!(r.status(), 400, "{why}: {text}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(
            v["detail"].as_str().unwrap().contains(why),
            "want {why:?} in {text}"
        );
    }
    // A wildcard with a stapled OCSP response (a DER OCSPResponse saying
    // "unauthorized": what s_client prints shows it was stapled).
    let wild = ca.issue(&["*.w.example".to_string()], 5).unwrap();
    let body = serde_json::json!({"cert_pem": wild.cert_pem, "key_pem": wild.key_pem, "ocsp_base64": "MAMKAQY="});
    let r = admin(
        &c,
        "PUT",
        "/tls/certificates/_wildcard.w.example",
        &body.to_string(),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["name"], "*.w.example");
    assert_eq!(v["ocsp"], true);
    let out = s_client(
        &dir,
        c.tls.unwrap(),
        "x.w.example",
        &["-status", "-tls1_2"],
        None,
    );
    assert!(
        out.contains("CN=*.w.example") || out.contains("CN = *.w.example"),
        "{out}"
    );
    assert!(out.contains("OCSP Response Status: unauthorized"), "{out}");
    // Stapled from the certificate directory too, over TLS 1.3.
    let out = s_client(
        &dir,
        c.tls.unwrap(),
        "b.example",
        &["-status", "-tls1_3"],
        None,
    );
    assert!(out.contains("OCSP Response Status: unauthorized"), "{out}");
    let out = s_client(&dir, c.tls.unwrap(), "a.example", &["-status"], None);
    assert!(out.contains("OCSP response: no response sent"), "{out}");

    // The list shows names, expiry and fingerprints, never a key.
    let r = admin(&c, "GET", "/tls/certificates", "").await;
    assert_eq!(r.status(), 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        !text.contains("PRIVATE KEY") && !text.contains("key_pem"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["*.w.example", "a.example", "b.example"]);
    assert!(v[1]["not_after"].as_str().unwrap().ends_with('Z'));
    assert!(v[1]["fingerprint"].as_str().unwrap().starts_with("sha256:"));

    // A wrong token is refused.
    let r = request(
        c.admin.unwrap(),
        "PUT",
        "/tls/certificates/c.example",
        &[("Authorization", "Bearer wrong-token-0123456789abcdef0123")],
        put(&good.cert_pem, &good.key_pem).as_bytes(),
    )
    .await;
    assert_eq!(r.status(), 401);
    let r = request(c.admin.unwrap(), "GET", "/tls/certificates", &[], b"").await;
    assert_eq!(r.status(), 401);

    let r = admin(&c, "GET", "/tls/certificates/_wildcard.w.example", "").await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (v["name"].as_str(), v["ocsp"].as_bool()),
        (Some("*.w.example"), Some(true))
    );

    // Delete: 204, then 404.
    let r = admin(&c, "DELETE", "/tls/certificates/_wildcard.w.example", "").await;
    assert_eq!(r.status(), 204);
    let r = admin(&c, "DELETE", "/tls/certificates/_wildcard.w.example", "").await;
    assert_eq!(r.status(), 404);
}

/// Run `openssl s_client` against the TLS port, sending one request with
/// Connection: close and reading the answer; its whole output.
fn s_client(
    dir: &Path,
    addr: SocketAddr,
    host: &str,
    extra: &[&str],
    sess: Option<(&str, &Path)>,
) -> String {
    use std::io::Write;
    let mut cmd = Command::new("openssl");
    cmd.args([
        "s_client",
        "-connect",
        &addr.to_string(),
        "-servername",
        host,
        "-ign_eof",
    ])
    .arg("-CAfile")
    .arg(dir.join("ca.pem"))
    .args(["-alpn", "http/1.1"])
    .args(extra);
    if let Some((flag, file)) = sess {
        cmd.arg(flag).arg(file);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            format!("GET /size/10 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn sessions_resume_with_tls_1_3_tickets_and_tls_1_2_tickets_and_ids() {
    let dir = tempdir("edge-tls-resume");
    issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let t = c.tls.unwrap();
    let mut resumed = 0;
    for (label, flags) in [
        ("TLS 1.3 ticket", vec!["-tls1_3"]),
        ("TLS 1.2 ticket", vec!["-tls1_2"]),
        ("TLS 1.2 session id", vec!["-tls1_2", "-no_ticket"]),
    ] {
        let sess = dir.join(format!("sess-{}", rand_suffix()));
        let first = s_client(&dir, t, "a.example", &flags, Some(("-sess_out", &sess)));
        assert!(first.contains("New, TLSv1."), "{label}: {first}");
        assert!(first.contains("HTTP/1.1 200"), "{label}: {first}");
        // Several times: the serving threads share the session state, and
        // connections land on either of the two.
        for _ in 0..4 {
            let again = s_client(&dir, t, "a.example", &flags, Some(("-sess_in", &sess)));
            assert!(
                again.contains("Reused, TLSv1."),
                "{label} not resumed: {again}"
            );
            assert!(again.contains("HTTP/1.1 200"), "{label}: {again}");
            resumed += 1;
        }
    }
    let m = metrics(&c).await;
    assert!(metric(&m, "vcdn_cache_tls_resumed_total") >= resumed, "{m}");
}

/// Connect to the TLS port and send `data` (maybe nothing), then hold the
/// connection; the returned socket tells when the server closed it.
async fn stalled(addr: SocketAddr, data: &[u8]) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    if !data.is_empty() {
        s.write_all(data).await.unwrap();
    }
    s
}

/// Wait until the server closes `s` (read returns 0 or an error), reading
/// and dropping what it sends (an alert); how long it took.
async fn closed_after(mut s: tokio::net::TcpStream, limit: Duration) -> Duration {
    let start = Instant::now();
    let mut b = [0u8; 512];
    loop {
        match tokio::time::timeout(limit.saturating_sub(start.elapsed()), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("not closed within {limit:?}"),
        }
    }
}

#[tokio::test]
async fn stalled_and_garbage_handshakes_are_cut_and_do_not_delay_other_clients() {
    let dir = tempdir("edge-tls-attack");
    issue_certs(&dir);
    let o = origin();
    let cfg = write_config(&dir, "header_timeout_ms = 2000\n");
    let c = tls_cache(o.addr, &dir, &["--config", &cfg]);
    let t = c.tls.unwrap();
    let client = client_config(&dir, &[b"http/1.1"]);
    // Warm the object and the code paths.
    let mut warm = connect(&client, t, "a.example").await;
    assert_eq!(http_get(&mut warm, "a.example", "/size/100").await.0, 200);
    drop(warm);

    // Half a ClientHello: a record header announcing 512 bytes, and 40 of them.
    let mut half = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    half.extend_from_slice(&[7u8; 29]);
    let mut held = Vec::new();
    for i in 0..50 {
        let data: &[u8] = if i % 2 == 0 { &[] } else { &half };
        held.push(stalled(t, data).await);
    }
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = metrics(&c).await;
    assert!(metric(&m, "vcdn_cache_connections_open") >= 50, "{m}");

    // Meanwhile other clients are served at once, over TLS and plain.
    for _ in 0..3 {
        let start = Instant::now();
        let mut s = connect(&client, t, "b.example").await;
        let (status, _, body) = http_get(&mut s, "b.example", "/size/100").await;
        assert_eq!((status, body), (200, synth(100)));
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "a TLS request took {took:?} beside 50 stalled handshakes"
        );
        let start = Instant::now();
        assert_eq!(get(c.addr, "/size/100").await.status(), 200);
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "a plain request took {took:?}"
        );
    }

    // Garbage instead of a ClientHello: closed at once, counted as failed.
    let garbage = stalled(t, b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n").await;
    let took = closed_after(garbage, Duration::from_secs(1)).await;
    assert!(took < Duration::from_millis(500), "garbage held {took:?}");

    // The stalled ones are closed after the handshake timeout (2 s), not
    // before, and their slots are given back.
    futures_join(
        held.into_iter()
            .map(|s| closed_after(s, Duration::from_secs(6))),
    )
    .await;
    let total = opened.elapsed();
    assert!(
        total >= Duration::from_millis(1800),
        "closed after {total:?}, before the timeout"
    );
    assert!(total < Duration::from_secs(5), "closed after {total:?}");
    let m = metrics(&c).await;
    assert_eq!(
        metric(&m, "vcdn_cache_tls_handshakes_total{result=\"timeout\"}"),
        50,
        "{m}"
    );
    assert!(
        metric(&m, "vcdn_cache_tls_handshakes_total{result=\"failed\"}") == 1,
        "{m}"
    );
    let admin_addr = c.admin.unwrap();
    assert!(
        eventually(3, || async move {
            let r = get(admin_addr, "/metrics").await;
            metric(
                &String::from_utf8_lossy(&r.body),
                "vcdn_cache_connections_open",
            ) == 0
        })
        .await,
        "connection slots not given back"
    );

    // Slowloris over TLS: a client that completes the handshake and
    // trickles its request head gets 408 at the header timeout.
    let mut slow = connect(&client, t, "a.example").await;
    let start = Instant::now();
    let mut out = Vec::new();
    for b in b"GET /size/1 HTTP/1.1\r\nHost: a.example\r\nX-Slow: "
        .iter()
        .cycle()
    {
        if slow.write_all(&[*b]).await.is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(100), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if start.elapsed() > Duration::from_secs(6) {
            break;
        }
    }
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(took < Duration::from_secs(4), "cut after {took:?}");
}

/// Await all futures (no extra crate): each on its own task.
async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn without_any_certificate_handshakes_fail_with_an_alert_and_the_cache_lives_on() {
    let dir = tempdir("edge-tls-none");
    issue_certs(&dir);
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = origin();
    let c = cache(
        o.addr,
        &[
            "--tls-listen",
            "127.0.0.1:0",
            "--tls-cert-dir",
            empty.to_str().unwrap(),
        ],
    );
    let t = c.tls.unwrap();
    let out = s_client(&dir, t, "a.example", &[], None);
    assert!(out.contains("alert"), "{out}");
    let m = metrics(&c).await;
    assert_eq!(
        metric(&m, "vcdn_cache_tls_handshakes_total{result=\"failed\"}"),
        1,
        "{m}"
    );
    assert_eq!(metric(&m, "vcdn_cache_tls_no_certificate_total"), 1, "{m}");
    assert_eq!(get(c.addr, "/size/10").await.status(), 200);
    // Pushed later, it is used at once.
    let cert = std::fs::read_to_string(dir.join("certs/a.example.crt")).unwrap();
    let key = std::fs::read_to_string(dir.join("certs/a.example.key")).unwrap();
    let body = serde_json::json!({"cert_pem": cert, "key_pem": key});
    assert_eq!(
        admin(&c, "PUT", "/tls/certificates/a.example", &body.to_string())
            .await
            .status(),
        200
    );
    let r = curl(&dir, t, "a.example", "/size/10", &[]);
    assert_eq!(r.body, synth(10));
}

#[tokio::test]
async fn idle_tls_connections_use_bounded_memory() {
    const N: usize = 1000;
    let dir = tempdir("edge-tls-idle");
    issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let t = c.tls.unwrap();
    let client = client_config(&dir, &[b"http/1.1"]);
    // Warm up: the object, the session caches, the allocator's arenas.
    for _ in 0..20 {
        let mut s = connect(&client, t, "a.example").await;
        assert_eq!(http_get(&mut s, "a.example", "/size/100").await.0, 200);
    }
    let pid = c.child.id();
    let heap_before = metric(&metrics(&c).await, "vcdn_cache_heap_bytes");
    let before = rss_kib(pid);
    let mut conns = Vec::with_capacity(N);
    for _ in 0..N {
        // Each does a request, so it is past the handshake and idle in the
        // connection loop, as a browser's keep-alive connection is.
        let mut s = connect(&client, t, "a.example").await;
        assert_eq!(http_get(&mut s, "a.example", "/size/100").await.0, 200);
        conns.push(s);
    }
    let m = metrics(&c).await;
    assert_eq!(
        metric(&m, "vcdn_cache_tls_connections{alpn=\"http/1.1\"}"),
        N as u64,
        "{m}"
    );
    // Past the second after which an idle connection gives back the
    // buffers it kept for its next request.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = rss_kib(pid);
    let heap_after = metric(&metrics(&c).await, "vcdn_cache_heap_bytes");
    let per_conn = after.saturating_sub(before) * 1024 / N as u64;
    let heap_per_conn = heap_after.saturating_sub(heap_before) / N as u64;
    eprintln!(
        "RSS {before} KiB -> {after} KiB, heap {heap_before} -> {heap_after} B with {N} idle TLS connections ({per_conn} B, heap {heap_per_conn} B each)"
    );
    // About 5.9 KiB of heap and 6.5 KiB resident (debug build): rustls's
    // unbuffered connection (its 1.2 KiB struct, the traffic keys, small
    // queues; no buffer: vcdn holds received bytes only while a record is
    // partial), the connection's future (1.3 KiB), the task and the
    // socket's registration. A receive or record buffer kept while idle
    // (4 KiB and more), or a handshake's state left in the task, go over.
    assert!(
        heap_per_conn < 7 * 1024,
        "an idle TLS connection holds {heap_per_conn} B of heap"
    );
    assert!(
        per_conn < 9 * 1024,
        "an idle TLS connection costs {per_conn} B of resident memory"
    );
    // They all still work.
    for s in conns.iter_mut().step_by(100) {
        assert_eq!(http_get(s, "a.example", "/size/100").await.0, 200);
    }
}

#[tokio::test]
async fn an_object_larger_than_memory_arrives_intact_over_tls_from_the_disk_tier() {
    let dir = tempdir("edge-tls-disk");
    issue_certs(&dir);
    let disk = dir.join("disk");
    let o = origin();
    let c = tls_cache(
        o.addr,
        &dir,
        &[
            "--memory",
            "1M",
            "--disk",
            disk.to_str().unwrap(),
            "--disk-size",
            "64M",
        ],
    );
    let t = c.tls.unwrap();
    const SIZE: usize = 5 << 20;
    let path = format!("/size/{SIZE}");
    // The miss is sent from the file being written, the hit from the
    // stored file (mapped), both encrypted in user space.
    for want in ["miss", "hit", "hit"] {
        let r = curl(&dir, t, "b.example", &path, &[]);
        assert!(r.head.contains(&format!("x-cache: {want}")), "{}", r.head);
        assert!(r.body == synth(SIZE), "the body differs ({want})");
    }
    assert_eq!(origin_count(o.addr, &path).await, 1);
}

#[tokio::test]
async fn idle_and_send_timeouts_hold_over_tls() {
    let dir = tempdir("edge-tls-timeouts");
    issue_certs(&dir);
    let o = origin();
    let cfg = write_config(&dir, "idle_timeout_ms = 1000\nsend_timeout_ms = 1000\n");
    let c = tls_cache(o.addr, &dir, &["--config", &cfg]);
    let t = c.tls.unwrap();
    let client = client_config(&dir, &[b"http/1.1"]);
    // Idle after a request: closed (with close_notify) after the idle timeout.
    let mut idle = connect(&client, t, "a.example").await;
    assert_eq!(http_get(&mut idle, "a.example", "/size/100").await.0, 200);
    let start = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest))
        .await
        .expect("closed in time")
        .expect("a clean close (close_notify)");
    let took = start.elapsed();
    assert!(rest.is_empty());
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(3),
        "idle connection closed after {took:?}"
    );
    // A client that asks for a large object and never reads is dropped
    // after the send timeout, and its slot given back.
    let path = format!("/size/{}", 8 << 20);
    let mut warm = connect(&client, t, "a.example").await;
    assert_eq!(http_get(&mut warm, "a.example", &path).await.0, 200);
    drop(warm);
    let before = metric(&metrics(&c).await, "vcdn_cache_client_timeouts_total");
    let mut stuck = connect(&client, t, "a.example").await;
    stuck
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: a.example\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let admin_addr = c.admin.unwrap();
    let dropped = eventually(6, || async move {
        let m = String::from_utf8_lossy(&get(admin_addr, "/metrics").await.body).into_owned();
        metric(&m, "vcdn_cache_client_timeouts_total") > before
            && metric(&m, "vcdn_cache_connections_open") == 0
    })
    .await;
    assert!(dropped, "a client that does not read was not dropped");
    drop(stuck);
}

/// TLS 1.3 key updates from the client, asking the server to update its
/// keys too: the server answers with its own KeyUpdate (seen by openssl)
/// before its next records, and requests go on over the new keys, many
/// times over, small and large answers alike.
#[tokio::test]
async fn client_key_updates_are_answered_and_requests_go_on() {
    let dir = tempdir("edge-tls-keyupdate");
    issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let t = c.tls.unwrap();
    let client = client_config(&dir, &[b"http/1.1"]);
    let mut s = connect(&client, t, "a.example").await;
    assert_eq!(http_get(&mut s, "a.example", "/size/100").await.0, 200);
    for i in 0..20 {
        s.get_mut().1.refresh_traffic_keys().unwrap();
        // The KeyUpdate leaves with the request, in the same write.
        let size = if i % 5 == 4 { 1 << 20 } else { 100 + i };
        let (status, _, body) = http_get(&mut s, "a.example", &format!("/size/{size}")).await;
        assert_eq!(status, 200, "after key update {i}");
        assert!(body == synth(size), "body after key update {i}");
    }

    // openssl's `K` command: a KeyUpdate with update_requested; -msg shows
    // the server's own KeyUpdate coming back, then the answer.
    let run = {
        let dir = dir.to_path_buf();
        move || {
            use std::io::Write;
            let mut child = Command::new("openssl")
                .args(["s_client", "-connect", &t.to_string()])
                .args([
                    "-servername",
                    "a.example",
                    "-tls1_3",
                    "-alpn",
                    "http/1.1",
                    "-msg",
                ])
                .arg("-CAfile")
                .arg(dir.join("ca.pem"))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("openssl runs");
            let mut stdin = child.stdin.take().unwrap();
            std::thread::sleep(Duration::from_millis(300));
            // The server answers an update before its next record (a second
            // request before that is answered by the same update): an
            // update, a request, twice.
            for close in ["keep-alive", "close"] {
                stdin.write_all(b"K\n").unwrap();
                std::thread::sleep(Duration::from_millis(200));
                let req = format!(
                    "GET /size/10 HTTP/1.1\r\nHost: a.example\r\nConnection: {close}\r\n\r\n"
                );
                stdin.write_all(req.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
            }
            drop(stdin);
            let out = child.wait_with_output().unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let out = tokio::task::spawn_blocking(run).await.unwrap();
    let sent = out
        .matches(">>> TLS 1.3, Handshake [length 0005], KeyUpdate")
        .count();
    let answered = out
        .matches("<<< TLS 1.3, Handshake [length 0005], KeyUpdate")
        .count();
    assert_eq!((sent, answered), (2, 2), "{out}");
    // Each update is answered before the answer to the request after it.
    let first = out
        .find("<<< TLS 1.3, Handshake [length 0005], KeyUpdate")
        .unwrap();
    let last = out
        .rfind("<<< TLS 1.3, Handshake [length 0005], KeyUpdate")
        .unwrap();
    assert_eq!(out[first..last].matches("HTTP/1.1 200").count(), 1, "{out}");
    assert_eq!(out[last..].matches("HTTP/1.1 200").count(), 1, "{out}");
}

/// A request whose TLS record is trickled a byte at a time, never whole:
/// the partial record (held in the connection's receive buffer, the only
/// time it has one) gives no request bytes, so the connection is as idle
/// as a silent one and closed at the idle timeout, not later.
#[tokio::test]
async fn a_record_trickled_byte_by_byte_is_cut_at_the_idle_timeout() {
    use std::io::{Read, Write};
    use vcdn_http::tls::rustls::ClientConnection;
    let dir = tempdir("edge-tls-trickle");
    issue_certs(&dir);
    let o = origin();
    let cfg = write_config(&dir, "idle_timeout_ms = 2000\n");
    let c = tls_cache(o.addr, &dir, &["--config", &cfg]);
    let t = c.tls.unwrap();
    let client = client_config(&dir, &[b"http/1.1"]);
    let (took, plain) = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(t).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let name = ServerName::try_from("a.example").unwrap();
        let mut conn = ClientConnection::new(client, name).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).unwrap();
        }
        conn.writer()
            .write_all(b"GET /size/1 HTTP/1.1\r\nHost: a.example\r\nX-Pad: 0123456789\r\n\r\n")
            .unwrap();
        let mut record = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut record).unwrap();
        }
        // About 90 bytes at 10 a second: 9 s, far past the timeout.
        assert!(record.len() > 60, "{}", record.len());
        tcp.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let start = Instant::now();
        let mut plain = Vec::new();
        for b in &record[..record.len() - 1] {
            if tcp.write_all(&[*b]).is_err() {
                break;
            }
            match conn.read_tls(&mut tcp) {
                Ok(0) => break,
                Ok(_) => {
                    let state = conn.process_new_packets().unwrap();
                    let _ = conn.reader().read_to_end(&mut plain);
                    if state.peer_has_closed() {
                        break;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        (start.elapsed(), plain)
    })
    .await
    .unwrap();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );
    let text = String::from_utf8_lossy(&plain);
    assert!(!text.contains("200 OK"), "{text}");
}

/// A handshake message larger than a record is joined across records in
/// vcdn's receive buffer (grown for it, freed after): a 40 KiB one that is
/// no ClientHello is refused with an alert once whole, one announced over
/// 64 KiB is refused at its first record; neither panics nor holds its
/// connection, and the cache serves on.
#[tokio::test]
async fn handshake_messages_across_records_are_joined_or_refused_within_bounds() {
    let dir = tempdir("edge-tls-bighello");
    issue_certs(&dir);
    let o = origin();
    let c = tls_cache(o.addr, &dir, &[]);
    let t = c.tls.unwrap();
    for (declared, sent) in [(40 * 1024usize, 40 * 1024usize), (100 * 1024, 48 * 1024)] {
        let mut msg = vec![
            0x01,
            (declared >> 16) as u8,
            (declared >> 8) as u8,
            declared as u8,
        ];
        msg.resize(4 + sent, 0);
        let mut wire = Vec::new();
        for rec in msg.chunks(16 * 1024) {
            wire.extend_from_slice(&[0x16, 0x03, 0x01, (rec.len() >> 8) as u8, rec.len() as u8]);
            wire.extend_from_slice(rec);
        }
        let mut s = tokio::net::TcpStream::connect(t).await.unwrap();
        let start = Instant::now();
        // The server may close before it has read everything.
        let _ = s.write_all(&wire).await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "{declared}: connection held");
        assert!(start.elapsed() < Duration::from_secs(2), "{declared}");
        if declared == sent {
            // Read whole, then refused: a fatal decode_error alert, then FIN.
            assert_eq!(got, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 50], "{read:?}");
        } else if let Some(first) = got.first() {
            // Refused at once: the alert, or a reset for the unread rest.
            assert_eq!(*first, 0x15, "{declared}: not an alert: {got:?}");
        }
    }
    let client = client_config(&dir, &[b"http/1.1"]);
    let mut s = connect(&client, t, "a.example").await;
    assert_eq!(http_get(&mut s, "a.example", "/size/100").await.0, 200);
    let m = metrics(&c).await;
    assert_eq!(metric(&m, "vcdn_cache_panics_total"), 0, "{m}");
    assert_eq!(
        metric(&m, "vcdn_cache_tls_handshakes_total{result=\"failed\"}"),
        2,
        "{m}"
    );
}
