//! The edge cache's way to its upstream, run as a real process on loopback:
//! request bodies streamed to the origin in bounded memory, slow and bad
//! bodies answered, pooled connections the origin closed not reused, and
//! the operator's origin policy applied to the addresses it connects to.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use support::*;
use vcdn_http::chunked::{ChunkedDecoder, Decoded};
use vcdn_http::{parse_request, BodyFraming, Limits};

/// FNV-1a, the checksum the counting origin answers.
fn fnv(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The byte at `i` of upload number `k`.
fn upload_byte(k: u64, i: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(k * 7) % 251) as u8
}

/// A real HTTP/1.1 origin on loopback that reads every request body as it
/// arrives (Content-Length or chunked), keeps nothing of it, and answers
/// `bytes=N fnv=HEX` with the count and checksum of what it received. It
/// keeps connections alive and closes one that stays idle for `idle`, as
/// Apache does after its KeepAliveTimeout.
struct CountingOrigin {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    /// Idle keep-alive connections the origin closed.
    idle_closed: Arc<AtomicU64>,
}

fn counting_origin(idle: Duration) -> CountingOrigin {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let requests = Arc::new(AtomicU64::new(0));
    let idle_closed = Arc::new(AtomicU64::new(0));
    let (r, c) = (requests.clone(), idle_closed.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let (r, c) = (r.clone(), c.clone());
            std::thread::spawn(move || serve_counting(s, idle, &r, &c));
        }
    });
    CountingOrigin {
        addr,
        requests,
        idle_closed,
    }
}

fn serve_counting(mut s: TcpStream, idle: Duration, requests: &AtomicU64, closed: &AtomicU64) {
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut read = |s: &mut TcpStream, buf: &mut BytesMut, t: Duration| -> Option<usize> {
        s.set_read_timeout(Some(t)).ok()?;
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                Some(n)
            }
        }
    };
    loop {
        let head = loop {
            let frozen = buf.clone().freeze();
            match parse_request(&frozen, &Limits::default()) {
                Ok(Some((h, n))) => {
                    let _ = buf.split_to(n);
                    break h;
                }
                Ok(None) => {}
                Err(_) => return,
            }
            let t = if buf.is_empty() {
                idle
            } else {
                Duration::from_secs(5)
            };
            if read(&mut s, &mut buf, t).is_none() {
                if buf.is_empty() {
                    closed.fetch_add(1, Ordering::SeqCst);
                }
                return;
            }
        };
        requests.fetch_add(1, Ordering::SeqCst);
        let (mut n, mut h) = (0u64, FNV_START);
        match head.body {
            BodyFraming::None => {}
            BodyFraming::Length(len) => {
                while n < len {
                    if buf.is_empty() && read(&mut s, &mut buf, Duration::from_secs(5)).is_none() {
                        return;
                    }
                    let take = (buf.len() as u64).min(len - n) as usize;
                    let piece = buf.split_to(take);
                    h = fnv(h, &piece);
                    n += take as u64;
                }
            }
            BodyFraming::Chunked => {
                let mut dec = ChunkedDecoder::new();
                loop {
                    match dec.decode(&mut buf) {
                        Ok(Decoded::Data(d)) => {
                            h = fnv(h, &d);
                            n += d.len() as u64;
                        }
                        Ok(Decoded::Done) => break,
                        Ok(Decoded::NeedMore) => {
                            if read(&mut s, &mut buf, Duration::from_secs(5)).is_none() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            }
        }
        let body = format!("bytes={n} fnv={h:x}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Send upload `k` of `len` bytes (chunked or with a Content-Length) and
/// return the status line and the body of the answer.
fn upload(addr: SocketAddr, k: u64, len: u64, chunked: bool) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {len}")
    };
    let head =
        format!("PUT /upload/{k} HTTP/1.1\r\nHost: a\r\n{framing}\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut piece = Vec::with_capacity(64 * 1024 + 16);
    let mut i = 0u64;
    while i < len {
        let n = (len - i).min(60_000);
        piece.clear();
        if chunked {
            piece.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        }
        piece.extend((i..i + n).map(|j| upload_byte(k, j)));
        if chunked {
            piece.extend_from_slice(b"\r\n");
        }
        s.write_all(&piece).unwrap();
        i += n;
    }
    if chunked {
        s.write_all(b"0\r\n\r\n").unwrap();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status_of(&text), body)
}

/// Twenty 8 MiB uploads at once (half chunked) through a cache: every byte
/// reaches the origin intact, and the cache's memory grows by a small
/// constant per upload, not by the size of the bodies (it was 165 MB).
#[tokio::test]
async fn concurrent_large_uploads_are_streamed_in_bounded_memory() {
    let o = counting_origin(Duration::from_secs(30));
    let c = cache(o.addr, &[]);
    let pid = c.child.id();
    // Warm up: one small upload, so the baseline includes a used connection.
    assert_eq!(upload(c.addr, 99, 1000, false).0, 200);
    let before = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while done.load(Ordering::SeqCst) == 0 {
                peak.fetch_max(rss_kib(pid), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    const LEN: u64 = 8 << 20;
    let addr = c.addr;
    let uploads: Vec<_> = (0..20u64)
        .map(|k| std::thread::spawn(move || (k, upload(addr, k, LEN, k % 2 == 1))))
        .collect();
    for u in uploads {
        let (k, (status, body)) = u.join().unwrap();
        let want = (0..LEN).fold(FNV_START, |h, i| fnv(h, &[upload_byte(k, i)]));
        assert_eq!(status, 200, "upload {k}: {body}");
        assert_eq!(body, format!("bytes={LEN} fnv={want:x}"), "upload {k}");
    }
    done.store(1, Ordering::SeqCst);
    sampler.join().unwrap();
    let grew = peak.load(Ordering::SeqCst).saturating_sub(before);
    eprintln!("RSS {before} KiB, peak +{grew} KiB during 20 uploads of 8 MiB");
    assert!(
        grew < 24 * 1024,
        "20 concurrent uploads of 8 MiB added {grew} KiB to the cache"
    );
}

/// A body trickling in (one byte every 100 ms) is cut with 408 once it
/// falls below the minimum rate, and the connection closes.
#[tokio::test]
async fn a_trickling_request_body_gets_408_and_the_connection_closes() {
    let o = counting_origin(Duration::from_secs(30));
    let dir = tempdir("trickle");
    let cfg = write_config(
        &dir,
        "request_body_grace_ms = 500\nrequest_body_min_rate = 1000\n",
    );
    let c = cache(o.addr, &["--config", &cfg]);
    let mut s = TcpStream::connect(c.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s.write_all(b"POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    let start = Instant::now();
    let mut out = Vec::new();
    let closed = loop {
        if start.elapsed() > Duration::from_secs(8) {
            break false;
        }
        let _ = s.write_all(b"x");
        let mut b = [0u8; 4096];
        match s.read(&mut b) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => {}
        }
    };
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&out);
    assert!(
        closed,
        "the connection was still open after {took:?}: {text}"
    );
    assert_eq!(status_of(&text), 408, "{text}");
    assert!(text.contains("request body"), "{text}");
    assert!(took < Duration::from_secs(4), "cut after {took:?}");
}

/// Send a request with a body, keep sending body bytes as the server
/// allows (ignoring write errors), and return what the server answered.
fn send_too_much(addr: SocketAddr, head: &str, body: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A body over `max_request_body` gets 413 and a bad chunk size 400, each
/// with a readable reason, even while the client is still sending: the
/// answer is not lost to a reset connection.
#[tokio::test]
async fn bodies_over_the_limit_get_413_and_bad_chunk_sizes_400() {
    let o = counting_origin(Duration::from_secs(30));
    let dir = tempdir("limits");
    let cfg = write_config(&dir, "max_request_body = \"1M\"\n");
    let c = cache(o.addr, &["--config", &cfg]);
    let data = vec![b'x'; 3 << 20];
    let out = send_too_much(
        c.addr,
        "POST /big HTTP/1.1\r\nHost: a\r\nContent-Length: 3145728\r\n\r\n",
        &data,
    );
    assert_eq!(status_of(&out), 413, "{out}");
    assert!(out.contains("larger than"), "{out}");
    let mut chunked = Vec::new();
    for _ in 0..48 {
        chunked.extend_from_slice(b"10000\r\n");
        chunked.extend_from_slice(&[b'y'; 0x10000]);
        chunked.extend_from_slice(b"\r\n");
    }
    let out = send_too_much(
        c.addr,
        "POST /big HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        &chunked,
    );
    assert_eq!(status_of(&out), 413, "{out}");
    let mut bad = b"5\r\nhello\r\nzz\r\n".to_vec();
    bad.extend_from_slice(&data);
    let out = send_too_much(
        c.addr,
        "POST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        &bad,
    );
    assert_eq!(status_of(&out), 400, "{out}");
    assert!(out.contains("chunk"), "{out}");
    // The cache still serves, and the origin saw no complete upload.
    let (status, body) = upload(c.addr, 1, 10, false);
    assert_eq!((status, body.starts_with("bytes=10 ")), (200, true));
}

/// An origin that closes idle keep-alive connections after 300 ms (as
/// Apache does after 5 s): a POST after that goes on a fresh connection,
/// not on the pooled one the origin closed, and gets 200, not 502.
#[tokio::test]
async fn a_post_after_the_origin_closed_the_pooled_connection_succeeds() {
    let o = counting_origin(Duration::from_millis(300));
    // One serving thread, so both requests meet the same pool.
    let c = cache(o.addr, &["--threads", "1"]);
    let r = request(c.addr, "POST", "/first", &[], b"one").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    let closed = eventually(5, || async { o.idle_closed.load(Ordering::SeqCst) >= 1 }).await;
    assert!(closed, "the origin closed its idle connection");
    let r = request(c.addr, "POST", "/second", &[], b"two").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(
        r.text(),
        format!("bytes=3 fnv={:x}", fnv(FNV_START, b"two"))
    );
    assert_eq!(o.requests.load(Ordering::SeqCst), 2);
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `--origin-policy "deny non-public"` in front of a loopback origin: the
/// cache answers 502 with the policy's reason and the origin sees nothing,
/// for client requests and for the admin API's prefetch; the refusal is
/// counted.
#[tokio::test]
async fn the_origin_policy_refuses_a_loopback_origin() {
    let o = origin();
    let c = cache(o.addr, &["--origin-policy", "deny non-public"]);
    let r = get(c.addr, "/size/10").await;
    assert_eq!(r.status(), 502, "{}", r.text());
    assert!(
        r.text().contains("refused by the operator's origin policy"),
        "{}",
        r.text()
    );
    assert!(r.text().contains(&o.addr.to_string()), "{}", r.text());
    let r = request(c.addr, "POST", "/echo", &[], b"secret").await;
    assert_eq!(r.status(), 502, "{}", r.text());
    let r = admin(&c, "POST", "/prefetch", r#"{"url": "/size/11"}"#).await;
    assert_eq!(r.status(), 502, "{}", r.text());
    assert!(r.text().contains("origin policy"), "{}", r.text());
    let m = get(c.admin.unwrap(), "/metrics").await.text();
    assert_eq!(metric(&m, "vcdn_cache_upstream_refused_total"), 3, "{m}");
    for path in ["/size/10", "/echo", "/size/11"] {
        assert_eq!(origin_count(o.addr, path).await, 0, "the origin saw {path}");
    }
}

/// An exception for the origin's own address and port lets it through.
#[tokio::test]
async fn the_origin_policy_allows_an_excepted_origin() {
    let o = origin();
    let policy = format!("deny non-public, allow {}", o.addr);
    let c = cache(o.addr, &["--origin-policy", &policy]);
    let r = get(c.addr, "/size/10").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.body, synth(10));
    // Another port on the same address stays refused.
    let other = format!("deny non-public, allow 127.0.0.1:{}", o.addr.port() ^ 1);
    let c = cache(o.addr, &["--origin-policy", &other]);
    assert_eq!(get(c.addr, "/size/10").await.status(), 502);
}

/// A name is checked on the addresses it resolves to when the cache
/// connects, not on its spelling.
#[tokio::test]
async fn the_origin_policy_checks_what_a_name_resolves_to() {
    let o = origin();
    let up = format!("http://localhost:{}", o.addr.port());
    let c = spawn(&[
        "cache",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &up,
        "--threads",
        "1",
        "--origin-policy",
        "deny non-public",
    ]);
    let r = get(c.addr, "/size/10").await;
    assert_eq!(r.status(), 502, "{}", r.text());
    assert!(r.text().contains("origin policy"), "{}", r.text());
    assert_eq!(origin_count(o.addr, "/size/10").await, 0);
}

/// A policy that does not parse stops the cache at start with the reason.
#[test]
fn an_invalid_origin_policy_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "cache",
            "--listen",
            "127.0.0.1:0",
            "--origin-policy",
            "deny nonpublic",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--origin-policy"), "{err}");
    assert!(err.contains("nonpublic"), "{err}");
}

/// A streamed body ends exactly where its framing says: a request
/// pipelined right behind a 1 MiB upload on the same connection is
/// answered too, in order.
#[tokio::test]
async fn a_request_pipelined_after_a_streamed_body_is_answered() {
    let o = counting_origin(Duration::from_secs(30));
    let c = cache(o.addr, &[]);
    let body: Vec<u8> = (0..1u64 << 20).map(|i| upload_byte(5, i)).collect();
    let mut req = b"PUT /one HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n".to_vec();
    req.extend_from_slice(&body);
    req.extend_from_slice(b"POST /two HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    let out = raw(c.addr, &req, Duration::from_secs(10));
    let first = format!("bytes=1048576 fnv={:x}", fnv(FNV_START, &body));
    let second = format!("bytes=3 fnv={:x}", fnv(FNV_START, b"abc"));
    let (a, b) = (out.find(&first), out.find(&second));
    assert!(a.is_some() && b.is_some() && a < b, "{out}");
    assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
}

/// A GET's body is not forwarded (a lookup does not take it): the GET is
/// answered, then the connection closes, since the rest of the body was
/// not read.
#[tokio::test]
async fn a_get_with_a_large_body_is_answered_then_closed() {
    let o = counting_origin(Duration::from_secs(30));
    let c = cache(o.addr, &[]);
    let mut req = b"GET /g HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n".to_vec();
    req.extend_from_slice(&vec![b'g'; 1 << 20]);
    let out = raw(c.addr, &req, Duration::from_secs(10));
    assert_eq!(status_of(&out), 200, "{out}");
    assert!(out.contains("Connection: close"), "{out}");
    assert!(out.ends_with("bytes=0 fnv=cbf29ce484222325"), "{out}");
}
