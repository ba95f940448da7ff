//! The edge cache in front of an `https://` origin, run as a real process
//! on loopback against a real TLS origin (tokio-rustls with certificates
//! made by `vcdn_http::tls`): bodies intact, TLS connections kept alive and
//! sessions resumed, origins addressed by IP with a pinned name, and every
//! certificate that should not be trusted refused with a 502 that says why.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vcdn_http::tls::tokio_rustls::{self, TlsAcceptor};
use vcdn_http::tls::{self, rustls, MadeCert};

/// The byte at `i` of the origin's large object.
fn big_byte(i: usize) -> u8 {
    (i.wrapping_mul(7) % 251) as u8
}
const BIG: usize = 8 << 20;

/// A real HTTPS origin on loopback. It counts handshakes (full and
/// resumed) and requests, answers `hello PATH` (cacheable), `/big` with
/// 8 MiB, a POST with the size of its body, and closes an idle connection
/// after `idle` with a close_notify, as a real server does after its
/// keep-alive timeout. While `stall` is set, it accepts TCP connections
/// and never answers the handshake.
struct TlsOrigin {
    addr: SocketAddr,
    handshakes: Arc<AtomicU64>,
    resumed: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    stall: Arc<AtomicBool>,
}

fn tls_origin(cert: &MadeCert, idle: Duration) -> TlsOrigin {
    let bundle = tls::parse_bundle(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()).unwrap();
    let config = tls::single_cert_config(bundle, &[b"http/1.1"]);
    let acceptor = TlsAcceptor::from(config);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let o = TlsOrigin {
        addr,
        handshakes: Default::default(),
        resumed: Default::default(),
        requests: Default::default(),
        stall: Default::default(),
    };
    let (hs, res, req, stall) = (
        o.handshakes.clone(),
        o.resumed.clone(),
        o.requests.clone(),
        o.stall.clone(),
    );
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let mut held = Vec::new();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                if stall.load(Ordering::SeqCst) {
                    // Accepted, never answered.
                    held.push(s);
                    continue;
                }
                let (acceptor, hs, res, req) =
                    (acceptor.clone(), hs.clone(), res.clone(), req.clone());
                tokio::spawn(async move {
                    let Ok(s) = acceptor.accept(s).await else {
                        return;
                    };
                    hs.fetch_add(1, Ordering::SeqCst);
                    if s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        res.fetch_add(1, Ordering::SeqCst);
                    }
                    serve(s, idle, &req).await;
                });
            }
        });
    });
    o
}

async fn serve(
    mut s: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    idle: Duration,
    requests: &AtomicU64,
) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match tokio::time::timeout(idle, s.read(&mut chunk)).await {
                Err(_) => {
                    // Keep-alive timeout: close_notify, then close.
                    let _ = s.shutdown().await;
                    return;
                }
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        requests.fetch_add(1, Ordering::SeqCst);
        let mut words = head.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buf.len() < length {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..length);
        if let Some(how) = path.strip_prefix("/until-close/") {
            // A body delimited by the end of the connection, ended with a
            // close_notify, or cut by closing TCP without one (what a
            // truncation attack looks like).
            let body = "the whole body, until close";
            let msg = format!(
                "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nConnection: close\r\n\r\n{body}"
            );
            if s.write_all(msg.as_bytes()).await.is_err() || s.flush().await.is_err() {
                return;
            }
            if how.starts_with("notify") {
                let _ = s.shutdown().await;
            } else {
                let (mut tcp, _) = s.into_inner();
                let _ = tcp.shutdown().await;
            }
            return;
        }
        let (cc, body): (&str, Vec<u8>) = if method == "POST" {
            ("no-store", format!("posted {length}").into_bytes())
        } else if path == "/big" {
            ("max-age=60", (0..BIG).map(big_byte).collect())
        } else {
            ("max-age=60", format!("hello {path}").into_bytes())
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: {cc}\r\n\r\n",
            body.len()
        );
        if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
            return;
        }
    }
}

/// A TCP listener that accepts and never speaks: a TLS handshake with it
/// never completes.
fn silent_origin() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => return,
            }
        }
    });
    addr
}

/// `vcdn cache` in front of `upstream` (an https:// URL) with one serving
/// thread (so that one pool of upstream connections serves every request),
/// an admin API, and `extra` flags.
fn https_cache(dir: &std::path::Path, upstream: &str, extra: &[&str]) -> Proc {
    let config = write_config(
        dir,
        "upstream_connect_timeout_ms = 700\nupstream_read_timeout_ms = 10000\n",
    );
    let mut args = vec![
        "cache",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--admin",
        "127.0.0.1:0",
        "--admin-token",
        TOKEN,
        "--threads",
        "1",
        "--config",
        &config,
    ];
    args.extend_from_slice(extra);
    spawn(&args)
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

async fn metrics(c: &Proc) -> String {
    admin(c, "GET", "/metrics", "").await.text()
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// The answer's status and body text for a GET through the cache.
async fn fetch(c: &Proc, path: &str) -> (u16, String, String) {
    let r = get(c.addr, path).await;
    (r.status(), r.text(), x_cache(&r))
}

/// MISS then HIT with the body intact, 8 MiB intact, one TLS connection
/// for several requests, and a session resumed after the origin closed the
/// connection with close_notify, which the cache does not reuse (a POST,
/// which is never retried, goes through on a new connection).
#[tokio::test]
async fn https_origin_verified_by_a_ca_bundle() {
    let dir = tempdir("origin-tls-ca");
    let ca = tls::Ca::create("origin test CA", 30).unwrap();
    let leaf = ca.issue(&["localhost".into()], 10).unwrap();
    let o = tls_origin(&leaf, Duration::from_millis(2000));
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let url = format!("https://localhost:{}", o.addr.port());
    let c = https_cache(&dir, &url, &["--origin-ca-file", &ca_file]);

    assert_eq!(
        fetch(&c, "/a").await,
        (200, "hello /a".into(), "MISS".into())
    );
    assert_eq!(
        fetch(&c, "/a").await,
        (200, "hello /a".into(), "HIT".into())
    );
    for p in ["/b", "/c", "/d"] {
        assert_eq!(fetch(&c, p).await.0, 200);
    }
    // Last: the origin's idle timer starts once it has written the 8 MiB
    // into its socket, and a debug-build cache on a loaded CI machine once
    // took over 2 s to read them, so a request after this one found the
    // connection closed (a second handshake, rightly).
    let big = get(c.addr, "/big").await;
    assert_eq!(big.status(), 200);
    assert_eq!(big.body.len(), BIG);
    assert!(
        big.body.iter().enumerate().all(|(i, &b)| b == big_byte(i)),
        "8 MiB through TLS intact"
    );
    assert_eq!(o.requests.load(Ordering::SeqCst), 5);
    assert_eq!(
        o.handshakes.load(Ordering::SeqCst),
        1,
        "five requests over one kept-alive TLS connection"
    );

    // The origin closes the idle connection (close_notify after 2 s);
    // the cache must not send the POST into it.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let r = request(c.addr, "POST", "/form", &[], b"0123456789").await;
    assert_eq!((r.status(), r.text()), (200, "posted 10".to_string()));
    assert_eq!(o.handshakes.load(Ordering::SeqCst), 2);
    assert_eq!(
        o.resumed.load(Ordering::SeqCst),
        1,
        "the reconnect resumed the TLS session"
    );
    let m = metrics(&c).await;
    assert_eq!(metric(&m, "vcdn_cache_upstream_tls_handshakes_total"), 2);
    assert_eq!(metric(&m, "vcdn_cache_upstream_tls_resumed_total"), 1);
    assert_eq!(metric(&m, "vcdn_cache_upstream_retries_total"), 0);
}

/// An origin addressed by IP: with the name pinned it works; without, the
/// 502 says the certificate is for another name.
#[tokio::test]
async fn origin_by_ip_needs_the_pinned_name() {
    let dir = tempdir("origin-tls-ip");
    let ca = tls::Ca::create("origin test CA", 30).unwrap();
    let o = tls_origin(
        &ca.issue(&["origin.example".into()], 10).unwrap(),
        Duration::from_secs(5),
    );
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let url = format!("https://{}", o.addr);

    let pinned = https_cache(
        &dir,
        &url,
        &[
            "--origin-ca-file",
            &ca_file,
            "--origin-tls-name",
            "origin.example",
        ],
    );
    assert_eq!(
        fetch(&pinned, "/x").await,
        (200, "hello /x".into(), "MISS".into())
    );

    let unpinned = https_cache(&dir, &url, &["--origin-ca-file", &ca_file]);
    let (status, text, _) = fetch(&unpinned, "/x").await;
    assert_eq!(status, 502, "{text}");
    assert!(
        text.contains("the origin's certificate is for origin.example, not 127.0.0.1"),
        "{text}"
    );
    let m = metrics(&unpinned).await;
    assert_eq!(
        metric(
            &m,
            "vcdn_cache_upstream_tls_failures_total{reason=\"name_mismatch\"}"
        ),
        1
    );
}

/// A certificate of an unknown CA (against a bundle, and against the
/// system roots), an expired one and one for another name: each a 502
/// that says which, counted by reason; nothing is cached or retried.
#[tokio::test]
async fn certificates_that_do_not_verify_are_refused_with_the_reason() {
    let dir = tempdir("origin-tls-bad");
    let ca = tls::Ca::create("origin test CA", 30).unwrap();
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);

    // Self-signed: not issued by the CA the cache trusts.
    let stranger = tls_origin(
        &tls::self_signed(&["localhost".into()], 10).unwrap(),
        Duration::from_secs(5),
    );
    let url = format!("https://localhost:{}", stranger.addr.port());
    let c = https_cache(&dir, &url, &["--origin-ca-file", &ca_file]);
    let (status, text, _) = fetch(&c, "/x").await;
    assert_eq!(status, 502, "{text}");
    assert!(
        text.contains("the origin's certificate is not trusted: unknown issuer"),
        "{text}"
    );
    assert!(text.contains("--origin-ca-file"), "{text}");
    // Again: refused again (nothing cached), not retried.
    assert_eq!(fetch(&c, "/x").await.0, 502);
    let m = metrics(&c).await;
    assert_eq!(
        metric(
            &m,
            "vcdn_cache_upstream_tls_failures_total{reason=\"unknown_issuer\"}"
        ),
        2
    );
    assert_eq!(metric(&m, "vcdn_cache_upstream_retries_total"), 0);
    assert_eq!(stranger.requests.load(Ordering::SeqCst), 0);
    // The system roots do not know a self-signed certificate either.
    let sys = https_cache(&dir, &url, &[]);
    let (status, text, _) = fetch(&sys, "/x").await;
    assert_eq!(status, 502, "{text}");
    // (Debian's system roots hold a snakeoil CN=localhost certificate:
    // then the issuer is known by name but did not sign it.)
    assert!(
        text.contains("the origin's certificate is not trusted: "),
        "{text}"
    );
    assert!(text.contains("verified against the system roots"), "{text}");

    // Expired yesterday (trusted as its own anchor, so only the date is
    // wrong).
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let old = tls::self_signed_between(&["localhost".into()], now - 10 * day, now - day).unwrap();
    let expired = tls_origin(&old, Duration::from_secs(5));
    let old_ca = write(&dir, "old.pem", &old.cert_pem);
    let url = format!("https://localhost:{}", expired.addr.port());
    let c = https_cache(&dir, &url, &["--origin-ca-file", &old_ca]);
    let (status, text, _) = fetch(&c, "/x").await;
    assert_eq!(status, 502, "{text}");
    assert!(
        text.contains("the origin's certificate expired on "),
        "{text}"
    );
    let m = metrics(&c).await;
    assert_eq!(
        metric(
            &m,
            "vcdn_cache_upstream_tls_failures_total{reason=\"expired\"}"
        ),
        1
    );

    // Issued by the trusted CA, for another name.
    let other = tls_origin(
        &ca.issue(&["other.example".into()], 10).unwrap(),
        Duration::from_secs(5),
    );
    let url = format!("https://localhost:{}", other.addr.port());
    let c = https_cache(&dir, &url, &["--origin-ca-file", &ca_file]);
    let (status, text, _) = fetch(&c, "/x").await;
    assert_eq!(status, 502, "{text}");
    assert!(
        text.contains("the origin's certificate is for other.example, not localhost"),
        "{text}"
    );
}

/// A close-delimited body is whole only when the origin ends it with a
/// close_notify: one cut by a bare TCP close (an attacker on the path can
/// do that) is not taken for the whole body, and not stored.
#[tokio::test]
async fn a_close_delimited_body_cut_without_close_notify_is_not_stored() {
    let dir = tempdir("origin-tls-cut");
    let ca = tls::Ca::create("origin test CA", 30).unwrap();
    let o = tls_origin(
        &ca.issue(&["localhost".into()], 10).unwrap(),
        Duration::from_secs(5),
    );
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let url = format!("https://localhost:{}", o.addr.port());
    let c = https_cache(&dir, &url, &["--origin-ca-file", &ca_file]);
    let whole = "the whole body, until close";
    assert_eq!(
        fetch(&c, "/until-close/notify").await,
        (200, whole.into(), "MISS".into())
    );
    assert_eq!(
        fetch(&c, "/until-close/notify").await,
        (200, whole.into(), "HIT".into())
    );
    for _ in 0..2 {
        let r = raw(
            c.addr,
            b"GET /until-close/cut HTTP/1.1\r\nHost: a\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(r.contains("X-Cache: MISS"), "{r}");
        // Sent as it came, but never completed (no last chunk).
        assert!(!r.ends_with("0\r\n\r\n"), "{r}");
    }
    assert_eq!(
        o.requests.load(Ordering::SeqCst),
        3,
        "the cut body was not stored"
    );
}

/// An https:// upstream that is a plain HTTP server: a 502 that says so.
#[tokio::test]
async fn a_plain_http_origin_named_https_is_explained() {
    let dir = tempdir("origin-tls-plain");
    let plain = origin();
    let url = format!("https://{}", plain.addr);
    let c = https_cache(&dir, &url, &[]);
    let (status, text, _) = fetch(&c, "/x").await;
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("did not answer in TLS"), "{text}");

    // One that closes every connection at once: retried once (it may be
    // restarting), then a 502 that says what happened.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            drop(s);
        }
    });
    let c = https_cache(&dir, &format!("https://127.0.0.1:{port}"), &[]);
    let (status, text, _) = fetch(&c, "/x").await;
    assert_eq!(status, 502, "{text}");
    assert!(
        text.contains("the origin closed the connection during the TLS handshake"),
        "{text}"
    );
    let m = metrics(&c).await;
    assert_eq!(metric(&m, "vcdn_cache_upstream_retries_total"), 1);
    assert_eq!(
        metric(
            &m,
            "vcdn_cache_upstream_tls_failures_total{reason=\"handshake\"}"
        ),
        2
    );
}

/// An origin that accepts TCP and never completes the handshake: 504
/// within the connect timeout (once retried, as a connect timeout is),
/// while the cache keeps serving what it has.
#[tokio::test]
async fn a_handshake_that_never_completes_is_a_connect_timeout() {
    let dir = tempdir("origin-tls-stall");
    let ca = tls::Ca::create("origin test CA", 30).unwrap();
    let o = tls_origin(
        &ca.issue(&["localhost".into()], 10).unwrap(),
        Duration::from_millis(300),
    );
    let ca_file = write(&dir, "ca.pem", &ca.cert_pem);
    let url = format!("https://localhost:{}", o.addr.port());
    let c = https_cache(&dir, &url, &["--origin-ca-file", &ca_file]);
    assert_eq!(fetch(&c, "/cached").await.2, "MISS");
    // The origin closes the idle connection; new handshakes then hang.
    o.stall.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let t = Instant::now();
    let addr = c.addr;
    let stalled = tokio::spawn(async move {
        let r = get(addr, "/new").await;
        (r.status(), r.text(), t.elapsed())
    });
    // Meanwhile, hits are served at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let h = Instant::now();
    assert_eq!(fetch(&c, "/cached").await.2, "HIT");
    assert!(
        h.elapsed() < Duration::from_millis(600),
        "{:?}",
        h.elapsed()
    );
    let (status, text, took) = stalled.await.unwrap();
    assert_eq!(status, 504, "{text}");
    assert!(
        text.contains("did not complete the TLS handshake within 700ms"),
        "{text}"
    );
    // 700 ms connect timeout, tried twice.
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(2500),
        "{took:?}"
    );

    // A silent TCP listener from the start: the same.
    let silent = silent_origin();
    let c2 = https_cache(
        &dir,
        &format!("https://localhost:{}", silent.port()),
        &["--origin-ca-file", &ca_file],
    );
    let t = Instant::now();
    let (status, text, _) = fetch(&c2, "/y").await;
    assert_eq!(status, 504, "{text}");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    let m = metrics(&c2).await;
    assert_eq!(
        metric(
            &m,
            "vcdn_cache_upstream_tls_failures_total{reason=\"timeout\"}"
        ),
        2,
        "tried twice, as a connect timeout is"
    );

    // The origin answers handshakes again: so does the cache.
    o.stall.store(false, Ordering::SeqCst);
    assert_eq!(
        fetch(&c, "/after").await,
        (200, "hello /after".into(), "MISS".into())
    );
}

/// Flags that cannot work are refused at start, with the reason.
#[test]
fn bad_tls_flags_stop_the_start() {
    let dir = tempdir("origin-tls-flags");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
            .args(["cache", "--listen", "127.0.0.1:0", "--threads", "1"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let garbage = write(&dir, "garbage.pem", "not a certificate");
    let e = run(&[
        "--upstream",
        "https://127.0.0.1:9",
        "--origin-ca-file",
        &garbage,
    ]);
    assert!(e.contains("no certificate found"), "{e}");
    let e = run(&[
        "--upstream",
        "https://127.0.0.1:9",
        "--origin-ca-file",
        "/nonexistent/ca.pem",
    ]);
    assert!(e.contains("cannot read --origin-ca-file"), "{e}");
    let e = run(&[
        "--upstream",
        "http://127.0.0.1:9",
        "--origin-tls-name",
        "origin.example",
    ]);
    assert!(e.contains("applies to an https:// upstream only"), "{e}");
    let e = run(&[
        "--upstream",
        "https://127.0.0.1:9",
        "--origin-tls-name",
        "not a name",
    ]);
    assert!(e.contains("not a DNS name or IP address"), "{e}");
}

/// Through the control plane: a service ordered with an `https://` origin
/// and its own CA (`origin_ca_pem`) gets caches that fetch over TLS,
/// verified against that CA; a CA that is not PEM is refused at order.
#[tokio::test]
async fn a_service_with_an_https_origin_and_its_ca_is_served_over_tls() {
    use serde_json::json;
    use support::up::{Up, OP};
    let ca = tls::Ca::create("customer origin CA", 30).unwrap();
    let o = tls_origin(
        &ca.issue(&["127.0.0.1".into()], 10).unwrap(),
        Duration::from_secs(5),
    );
    let up = Up::start("origin-tls-up", &[]);
    let (st, cust) = up
        .call(OP, "POST", "/v1/customers", Some(json!({"name": "tls"})))
        .await;
    assert_eq!(st, 201, "{cust}");
    let (id, key) = (
        cust["id"].as_str().unwrap().to_string(),
        cust["api_key"].as_str().unwrap().to_string(),
    );
    // The origin is on loopback: the operator's exception.
    let (st, p) = up
        .call(
            OP,
            "PUT",
            &format!("/v1/customers/{id}/settings"),
            Some(json!({"origin_allow": [o.addr.to_string()]})),
        )
        .await;
    assert_eq!(st, 200, "{p}");
    let mut spec = json!({"name": "secure", "origin": format!("https://{}", o.addr),
        "hostname": "secure.example", "flavor": "static", "regions": [{"region": "paris"}],
        "origin_ca_pem": "not a certificate"});
    let (st, p) = up
        .call(&key, "POST", "/v1/services", Some(spec.clone()))
        .await;
    assert_eq!(st, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "origin_ca_pem", "{p}");
    spec["origin_ca_pem"] = json!(ca.cert_pem);
    let (st, s) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
    assert_eq!(st, 201, "{s}");
    let region = &s["graph"]["regions"][0];
    let address = region["instances"][0]["address"].as_str().unwrap();
    let cache: SocketAddr = address.parse().unwrap();
    let flags = support::up::caches(up.instance_port)
        .into_iter()
        .map(|c| c.flags)
        .find(|f| f.get("--listen").map(String::as_str) == Some(address))
        .expect("the cache process");
    let ca_file = flags.get("--origin-ca-file").expect("--origin-ca-file");
    assert_eq!(std::fs::read_to_string(ca_file).unwrap(), ca.cert_pem);
    let r = get(cache, "/over-tls").await;
    assert_eq!((r.status(), r.text()), (200, "hello /over-tls".to_string()));
    assert_eq!(o.handshakes.load(Ordering::SeqCst), 1);
}
