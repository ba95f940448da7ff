//! HTTP caching points of RFC 9110/9111/9213 checked end to end: a real
//! `vcdn cache` process in front of a scripted origin on loopback, with
//! curl as the client where what a user sees matters (curl -v shows 1xx
//! responses).
//!
//! - 1xx interim responses (RFC 9110 §15.2): 103 Early Hints pass through
//!   with their Link fields, are never stored (the next request is a HIT
//!   without a 103), are not sent to an HTTP/1.0 client, go only to the
//!   client that started a shared fetch, are bounded (more than 10 is a
//!   502), and an upstream 100 Continue is not forwarded (the cache answers
//!   Expect itself, once).
//! - CDN-Cache-Control (RFC 9213) as a Structured Fields Dictionary: a
//!   wrong-typed `max-age="60"` is ignored and Cache-Control's 5 s govern;
//!   `no-store=?0, max-age=30` is stored for 30 s.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use support::*;
use vcdn_http::{parse_request, BodyFraming, Limits};

/// A scripted HTTP/1.1 origin: each path has its answer (interim heads,
/// then a final response), and requests are counted per path.
struct Origin {
    addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, u64>>>,
}

impl Origin {
    fn count(&self, path: &str) -> u64 {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

const HINT: &str = "Link: </style.css>; rel=preload; as=style";

fn final_200(fields: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\n{fields}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// What the origin writes for `path`, as (bytes, pause after them).
fn script(path: &str) -> Vec<(String, Duration)> {
    let now = Duration::ZERO;
    let hints = format!(
        "HTTP/1.1 103 Early Hints\r\n{HINT}\r\nLink: </app.js>; rel=preload; as=script\r\n\r\n"
    );
    match path {
        "/hints" => vec![
            (hints, now),
            (final_200("Cache-Control: max-age=60\r\n", "hinted"), now),
        ],
        "/hints-slow" => vec![
            (hints, Duration::from_millis(800)),
            (final_200("Cache-Control: max-age=60\r\n", "slow"), now),
        ],
        "/many-hints" => {
            let mut v: Vec<_> = (0..11).map(|_| (hints.clone(), now)).collect();
            v.push((final_200("", "never"), now));
            v
        }
        "/switch" => vec![(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
                .into(),
            now,
        )],
        "/continue" => vec![
            ("HTTP/1.1 100 Continue\r\n\r\n".into(), now),
            (final_200("Cache-Control: max-age=60\r\n", "continued"), now),
        ],
        "/upload" => vec![
            ("HTTP/1.1 100 Continue\r\n\r\n".into(), now),
            (hints, now),
            (final_200("", "stored"), now),
        ],
        "/cdn-wrong-type" => vec![(
            final_200(
                "Cache-Control: max-age=5\r\nCDN-Cache-Control: max-age=\"60\"\r\nAge: 2\r\n",
                "five",
            ),
            now,
        )],
        "/cdn-boolean" => vec![(
            final_200(
                "Cache-Control: no-store\r\nCDN-Cache-Control: no-store=?0, max-age=30\r\nAge: 27\r\n",
                "thirty",
            ),
            now,
        )],
        _ => vec![(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".into(),
            now,
        )],
    }
}

fn scripted_origin() -> Origin {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let c = counts.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let c = c.clone();
            std::thread::spawn(move || serve(s, &c));
        }
    });
    Origin { addr, counts }
}

fn serve(mut s: TcpStream, counts: &Mutex<HashMap<String, u64>>) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let (head, n) = loop {
            if let Ok(Some(h)) = parse_request(&buf.clone().freeze(), &Limits::default()) {
                break h;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        };
        let _ = buf.split_to(n);
        if let BodyFraming::Length(len) = head.body {
            while (buf.len() as u64) < len {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            let _ = buf.split_to(len as usize);
        }
        let path = String::from_utf8_lossy(head.path()).into_owned();
        *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
        for (bytes, pause) in script(&path) {
            if s.write_all(bytes.as_bytes()).is_err() {
                return;
            }
            std::thread::sleep(pause);
        }
        if path == "/switch" {
            return;
        }
    }
}

/// `curl -v` over HTTP/1.1 (or `--http1.0`): the response heads it shows
/// (`< ` lines, in order) and the body.
fn curl(addr: SocketAddr, path: &str, extra: &[&str]) -> (Vec<String>, String) {
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "10"])
        .args(extra)
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("curl runs");
    let err = String::from_utf8_lossy(&out.stderr);
    let heads = err
        .lines()
        .filter_map(|l| l.strip_prefix("< "))
        .map(|l| l.trim_end().to_string())
        .collect();
    (heads, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn count(lines: &[String], prefix: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(prefix)).count()
}

fn pos(lines: &[String], prefix: &str) -> usize {
    lines
        .iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {lines:#?}"))
}

#[test]
fn early_hints_reach_the_client_and_are_never_stored() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    let (heads, body) = curl(c.addr, "/hints", &["--http1.1"]);
    assert_eq!(body, "hinted");
    let hints = pos(&heads, "HTTP/1.1 103 Early Hints");
    let fin = pos(&heads, "HTTP/1.1 200");
    assert!(hints < fin, "{heads:#?}");
    // The 103 carries its Link fields (and this cache's Via), not the
    // final response's.
    let interim = &heads[hints..fin];
    assert!(interim.iter().any(|l| l == HINT), "{heads:#?}");
    assert!(
        interim.iter().any(|l| l.starts_with("Link: </app.js>")),
        "{heads:#?}"
    );
    assert!(interim.iter().any(|l| l.starts_with("Via: ")), "{heads:#?}");
    assert!(
        !interim.iter().any(|l| l.starts_with("Cache-Control")),
        "{heads:#?}"
    );
    assert!(heads.iter().any(|l| l == "X-Cache: MISS"), "{heads:#?}");

    // Stored without its 103: the next request is a hit with none.
    let (heads, body) = curl(c.addr, "/hints", &["--http1.1"]);
    assert_eq!(body, "hinted");
    assert_eq!(count(&heads, "HTTP/1.1 103"), 0, "{heads:#?}");
    assert!(heads.iter().any(|l| l == "X-Cache: HIT"), "{heads:#?}");
    assert_eq!(o.count("/hints"), 1);
}

/// Over HTTP/2 (h2c) the 103 arrives as informational HEADERS before the
/// answer, and is not stored either.
#[test]
fn early_hints_reach_an_http2_client_too() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    let (heads, body) = curl(c.addr, "/hints", &["--http2-prior-knowledge"]);
    assert_eq!(body, "hinted");
    let hints = pos(&heads, "HTTP/2 103");
    let fin = pos(&heads, "HTTP/2 200");
    assert!(hints < fin, "{heads:#?}");
    let interim = &heads[hints..fin];
    assert!(
        interim.iter().any(|l| l.starts_with("link: </app.js>")),
        "{heads:#?}"
    );
    assert!(
        !interim.iter().any(|l| l.starts_with("cache-control")),
        "{heads:#?}"
    );
    let (heads, _) = curl(c.addr, "/hints", &["--http2-prior-knowledge"]);
    assert_eq!(count(&heads, "HTTP/2 103"), 0, "{heads:#?}");
    assert!(heads.iter().any(|l| l == "x-cache: HIT"), "{heads:#?}");
    assert_eq!(o.count("/hints"), 1);
}

/// RFC 9110 §15.2: no 1xx to an HTTP/1.0 client.
#[test]
fn an_http10_client_gets_no_interim_response() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    let (heads, body) = curl(c.addr, "/hints", &["--http1.0"]);
    assert_eq!(body, "hinted");
    assert_eq!(count(&heads, "HTTP/1.1 103"), 0, "{heads:#?}");
    assert_eq!(count(&heads, "HTTP/1.1 200"), 1, "{heads:#?}");
    assert_eq!(o.count("/hints"), 1, "it was a miss");
}

/// A shared fetch: the client that started it gets the 103, a client that
/// joins it gets the final response only.
#[test]
fn a_coalesced_client_gets_no_interim_response() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    let req = "GET /hints-slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let mut first = TcpStream::connect(c.addr).unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    first.write_all(req.as_bytes()).unwrap();
    // Wait for the 103 before the second client asks (the origin holds the
    // final response back 800 ms).
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        assert!(Instant::now() < deadline, "no 103 in time");
        let n = first.read(&mut b).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 103 Early Hints\r\n"));
    let second = raw(c.addr, req.as_bytes(), Duration::from_secs(5));
    let _ = first.read_to_end(&mut got);
    let first = String::from_utf8_lossy(&got);
    assert!(first.contains("\r\n\r\nHTTP/1.1 200 OK\r\n"), "{first}");
    assert!(first.ends_with("slow"), "{first}");
    assert!(second.starts_with("HTTP/1.1 200 OK\r\n"), "{second}");
    assert!(second.contains("X-Cache: COALESCED\r\n"), "{second}");
    assert!(!second.contains(" 103 "), "{second}");
    assert!(second.ends_with("slow"), "{second}");
    assert_eq!(o.count("/hints-slow"), 1);
}

/// More than 10 interim responses, or a 101 nobody asked for: 502 with a
/// reason; an upstream 100 Continue to a GET is dropped.
#[test]
fn interim_responses_are_bounded_and_checked() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    let (heads, body) = curl(c.addr, "/many-hints", &["--http1.1"]);
    assert_eq!(count(&heads, "HTTP/1.1 502"), 1, "{heads:#?}");
    assert!(count(&heads, "HTTP/1.1 103") <= 10, "{heads:#?}");
    assert!(
        body.contains("more than 10 interim (1xx) responses"),
        "{body}"
    );

    let (heads, body) = curl(c.addr, "/switch", &["--http1.1"]);
    assert_eq!(count(&heads, "HTTP/1.1 502"), 1, "{heads:#?}");
    assert_eq!(count(&heads, "HTTP/1.1 101"), 0, "{heads:#?}");
    assert!(body.contains("101 Switching Protocols"), "{body}");

    let (heads, body) = curl(c.addr, "/continue", &["--http1.1"]);
    assert_eq!(body, "continued");
    assert_eq!(count(&heads, "HTTP/1.1 100"), 0, "{heads:#?}");
}

/// `Expect: 100-continue` on an upload: the client sees the cache's own
/// 100 once (not the origin's too), then the origin's 103, then the answer.
#[test]
fn an_upload_gets_one_continue_and_the_early_hints() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    let (heads, body) = curl(
        c.addr,
        "/upload",
        &[
            "--http1.1",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            "payload",
        ],
    );
    assert_eq!(body, "stored");
    assert_eq!(count(&heads, "HTTP/1.1 100 Continue"), 1, "{heads:#?}");
    let (cont, hints, fin) = (
        pos(&heads, "HTTP/1.1 100"),
        pos(&heads, "HTTP/1.1 103"),
        pos(&heads, "HTTP/1.1 200"),
    );
    assert!(cont < hints && hints < fin, "{heads:#?}");
    assert!(heads[hints..fin].iter().any(|l| l == HINT), "{heads:#?}");
}

/// A GET through the cache's control client, with the X-Cache verdict.
async fn verdict(c: &Proc, path: &str) -> (String, String) {
    let r = get(c.addr, path).await;
    assert_eq!(r.status(), 200, "{}", r.text());
    (x_cache(&r), r.text())
}

/// RFC 9213 with RFC 8941 types: `CDN-Cache-Control: max-age="60"` (a
/// String) is invalid, so the field is ignored and `Cache-Control:
/// max-age=5` governs. The origin says `Age: 2`, so the object is fresh
/// for about 3 s more under 5 s and 58 s under 60 s.
#[tokio::test]
async fn a_wrong_typed_cdn_cache_control_falls_back_to_cache_control() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    assert_eq!(
        verdict(&c, "/cdn-wrong-type").await,
        ("MISS".into(), "five".into())
    );
    assert_eq!(verdict(&c, "/cdn-wrong-type").await.0, "HIT");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let (x, body) = verdict(&c, "/cdn-wrong-type").await;
    assert_eq!(body, "five");
    assert_ne!(
        x, "HIT",
        "still fresh after 5 s of age: max-age=\"60\" was obeyed"
    );
    assert_eq!(o.count("/cdn-wrong-type"), 2);
}

/// `CDN-Cache-Control: no-store=?0, max-age=30` overrides `Cache-Control:
/// no-store`: stored, fresh for 30 s (the origin says `Age: 27`).
#[tokio::test]
async fn cdn_cache_control_no_store_false_caches_for_its_max_age() {
    let o = scripted_origin();
    let c = cache(o.addr, &[]);
    assert_eq!(
        verdict(&c, "/cdn-boolean").await,
        ("MISS".into(), "thirty".into())
    );
    assert_eq!(verdict(&c, "/cdn-boolean").await.0, "HIT");
    assert_eq!(o.count("/cdn-boolean"), 1);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_ne!(
        verdict(&c, "/cdn-boolean").await.0,
        "HIT",
        "fresh past 30 s"
    );
    assert_eq!(o.count("/cdn-boolean"), 2);
}
