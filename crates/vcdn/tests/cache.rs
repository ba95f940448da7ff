//! The edge cache, run as a real process against the real demo origin on
//! loopback, checked the way a user would check it.

mod support;

use std::time::{Duration, Instant};

use support::*;

#[tokio::test]
async fn second_request_is_a_hit_with_age_via_and_date() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let r1 = get(c.addr, "/size/43").await;
    assert_eq!(r1.status(), 200);
    assert_eq!(x_cache(&r1), "MISS");
    assert_eq!(r1.body, synth(43));
    let r2 = get(c.addr, "/size/43").await;
    assert_eq!(x_cache(&r2), "HIT");
    assert_eq!(r2.body, synth(43));
    assert!(r2.header("date").is_some());
    assert!(r2.header("age").is_some_and(|a| a.parse::<u64>().is_ok()));
    assert!(r2.header("via").is_some_and(|v| v.starts_with("1.1 vcdn-")));
    assert_eq!(r2.header("etag"), Some("\"size-43\""));
    assert_eq!(origin_count(o.addr, "/size/43").await, 1);
    // HEAD is answered from the cache too, without a body.
    let h = request(c.addr, "HEAD", "/size/43", &[], b"").await;
    assert_eq!(x_cache(&h), "HIT");
    assert_eq!(h.header("content-length"), Some("43"));
    assert!(h.body.is_empty());
}

#[tokio::test]
async fn fifty_concurrent_clients_make_one_upstream_request() {
    let o = origin();
    let c = cache(o.addr, &[]);
    // 2 MB at 8 MB/s: the fetch lasts a quarter of a second.
    let path = "/size/2000000?rate=8000000";
    let tasks: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { get(c.addr, path).await }))
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let want = synth(2_000_000);
    for r in &results {
        assert_eq!(r.status(), 200);
        assert!(r.body == want, "every client gets the whole object");
    }
    let misses = results.iter().filter(|r| x_cache(r) == "MISS").count();
    let joined = results.iter().filter(|r| x_cache(r) == "COALESCED").count();
    assert_eq!(misses + joined, 50, "all were misses at first");
    assert_eq!(misses, 1);
    assert_eq!(
        origin_count(o.addr, "/size/2000000").await,
        1,
        "one upstream request"
    );
    assert_eq!(x_cache(&get(c.addr, path).await), "HIT");
}

/// Reads the first body bytes of a response, returning when they came.
async fn first_byte_after(addr: std::net::SocketAddr, path: &str) -> (Duration, usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let start = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let mut got = Vec::new();
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed early");
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            if got.len() > i + 4 {
                let elapsed = start.elapsed();
                // Drain the rest so the stream completes.
                while s.read(&mut buf).await.unwrap_or(0) > 0 {}
                return (elapsed, got.len());
            }
        }
    }
}

#[tokio::test]
async fn clients_get_bytes_as_they_arrive_not_after_the_whole_object() {
    let o = origin();
    let c = cache(o.addr, &[]);
    // Known length: 1 MB at 1 MB/s takes a second; bytes must flow long before.
    let a = tokio::spawn(first_byte_after(c.addr, "/size/1000000?rate=1000000"));
    let b = tokio::spawn(first_byte_after(c.addr, "/size/1000000?rate=1000000"));
    for t in [a, b] {
        let (ttfb, _) = t.await.unwrap();
        assert!(
            ttfb < Duration::from_millis(500),
            "first byte after {ttfb:?}"
        );
    }
    assert_eq!(origin_count(o.addr, "/size/1000000").await, 1);
    // Unknown length (chunked live stream): 10 pieces 100 ms apart.
    let path = "/stream?chunks=10&interval_ms=100&size=100&cc=max-age%3D60";
    let a = tokio::spawn(first_byte_after(c.addr, path));
    let b = tokio::spawn(first_byte_after(c.addr, path));
    for t in [a, b] {
        let (ttfb, _) = t.await.unwrap();
        assert!(
            ttfb < Duration::from_millis(500),
            "first chunk after {ttfb:?}"
        );
    }
    assert_eq!(origin_count(o.addr, "/stream").await, 1);
    let r = get(c.addr, path).await;
    assert_eq!(x_cache(&r), "HIT");
    assert!(r.text().starts_with("chunk 0 ") && r.text().contains("chunk 9 "));
}

#[tokio::test]
async fn objects_larger_than_memory_are_streamed_to_all_clients_once() {
    let o = origin();
    let c = cache(o.addr, &["--memory", "1M"]);
    let path = "/size/8000000?rate=40000000";
    let tasks: Vec<_> = (0..10)
        .map(|_| tokio::spawn(async move { get(c.addr, path).await }))
        .collect();
    let want = synth(8_000_000);
    for t in tasks {
        let r = t.await.unwrap();
        assert!(r.body == want);
    }
    assert_eq!(origin_count(o.addr, "/size/8000000").await, 1);
    // Too large to keep: the next request fetches again.
    assert_eq!(x_cache(&get(c.addr, path).await), "MISS");
    let stats: serde_json::Value =
        serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
    assert!(stats["memory"]["bytes"].as_u64().unwrap() <= 1 << 20);
}

#[tokio::test]
async fn purge_by_url_prefix_and_all_through_api_and_ctl() {
    let o = origin();
    let c = cache(o.addr, &[]);
    for p in ["/size/10", "/size/11", "/size/12"] {
        get(c.addr, p).await;
        assert_eq!(x_cache(&get(c.addr, p).await), "HIT");
    }
    let r = admin(&c, "POST", "/purge", r#"{"url": "/size/10"}"#).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().trim(), r#"{"purged":1}"#);
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let lower = format!("bearer {TOKEN}");
    let lowered = request(
        c.admin.unwrap(),
        "GET",
        "/stats",
        &[("Authorization", &lower)],
        b"",
    )
    .await;
    assert_eq!(lowered.status(), 200, "{}", lowered.text());
    assert_eq!(x_cache(&get(c.addr, "/size/10").await), "MISS");
    assert_eq!(x_cache(&get(c.addr, "/size/11").await), "HIT");

    // The same through `vcdn cache ctl`.
    let admin_addr = c.admin.unwrap().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "cache",
            "ctl",
            "--admin",
            &admin_addr,
            "--token",
            TOKEN,
            "purge",
            "--prefix",
            "/size/1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"purged\": 3"));
    assert_eq!(x_cache(&get(c.addr, "/size/12").await), "MISS");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args([
            "cache",
            "ctl",
            "--admin",
            &admin_addr,
            "--token",
            "wrong",
            "stats",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));

    let r = admin(&c, "POST", "/purge", r#"{"all": true}"#).await;
    assert_eq!(r.status(), 200);
    let r = admin(&c, "POST", "/purge", r#"{"nothing": 1}"#).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
}

#[tokio::test]
async fn control_api_lists_objects_with_statistics_and_prefetches() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let r = admin(&c, "POST", "/prefetch", r#"{"url": "/size/500"}"#).await;
    assert_eq!(r.status(), 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["cached"], true);
    assert_eq!(x_cache(&get(c.addr, "/size/500").await), "HIT");
    get(c.addr, "/size/500").await;
    let list: serde_json::Value =
        serde_json::from_slice(&admin(&c, "GET", "/objects", "").await.body).unwrap();
    let obj = &list["objects"][0];
    assert_eq!(obj["url"], "/size/500");
    assert_eq!(obj["hits"], 2);
    assert_eq!(obj["misses"], 1);
    assert_eq!(obj["bytes_served"], 1000);
    assert_eq!(obj["size"], 500);
    assert!(obj["last_access"].as_u64().unwrap() > 0);
    let one = admin(
        &c,
        "GET",
        &format!("/objects/{}", obj["id"].as_str().unwrap()),
        "",
    )
    .await;
    assert_eq!(one.status(), 200);
    assert!(one.text().contains("\"lifetime_s\":3600"));

    // Unauthenticated: only health and metrics.
    let admin_addr = c.admin.unwrap();
    assert_eq!(get(admin_addr, "/stats").await.status(), 401);
    assert_eq!(get(admin_addr, "/healthz").await.status(), 200);
    let m = get(admin_addr, "/metrics").await;
    assert!(m
        .text()
        .contains("vcdn_cache_requests_total{result=\"HIT\"} 2"));
    assert!(m.text().contains("vcdn_cache_memory_objects 1"));
}

#[tokio::test]
async fn disk_tier_survives_a_restart_and_drops_corrupt_files() {
    let o = origin();
    let dir = tempdir("disk");
    let d = dir.to_string_lossy().into_owned();
    let c = cache(o.addr, &["--disk", &d, "--disk-size", "64M"]);
    for p in ["/size/1000", "/size/2000"] {
        assert_eq!(x_cache(&get(c.addr, p).await), "MISS");
    }
    let written = eventually(5, || async {
        let s: serde_json::Value =
            serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
        s["disk"]["objects"] == 2
    })
    .await;
    assert!(written, "objects reach the disk tier");
    c.kill();
    // Corrupt the file of /size/2000: flip a byte in the middle.
    let files: Vec<_> = walk(&dir)
        .into_iter()
        .filter(|f| !f.ends_with("VCDN-DISK-TIER"))
        .collect();
    assert_eq!(files.len(), 2);
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if data.windows(10).any(|w| w == b"/size/2000") {
            let mut bad = data.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0xff;
            std::fs::write(f, bad).unwrap();
        }
    }
    let c = cache(o.addr, &["--disk", &d, "--disk-size", "64M"]);
    let ok = eventually(5, || async {
        let s: serde_json::Value =
            serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
        s["disk"]["objects"] == 1
    })
    .await;
    assert!(ok, "index rebuilt with the good object only");
    let r = get(c.addr, "/size/1000").await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body, synth(1000));
    assert_eq!(x_cache(&get(c.addr, "/size/2000").await), "MISS");
    assert_eq!(origin_count(o.addr, "/size/1000").await, 1);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[tokio::test]
async fn conditional_and_range_requests() {
    let o = origin();
    let c = cache(o.addr, &[]);
    get(c.addr, "/size/100").await;
    let r = get_with(c.addr, "/size/100", &[("If-None-Match", "\"size-100\"")]).await;
    assert_eq!(r.status(), 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some("\"size-100\""));
    let r = get_with(
        c.addr,
        "/size/100",
        &[("If-Modified-Since", "Fri, 02 Jan 2026 00:00:00 GMT")],
    )
    .await;
    assert_eq!(r.status(), 304);
    let r = get_with(
        c.addr,
        "/size/100",
        &[("If-Modified-Since", "Wed, 31 Dec 2025 00:00:00 GMT")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = get_with(c.addr, "/size/100", &[("Range", "bytes=10-19")]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(r.header("content-range"), Some("bytes 10-19/100"));
    assert_eq!(&r.body[..], &synth(100)[10..20]);
    let r = get_with(c.addr, "/size/100", &[("Range", "bytes=-5")]).await;
    assert_eq!(&r.body[..], &synth(100)[95..]);
    let r = get_with(c.addr, "/size/100", &[("Range", "bytes=100-")]).await;
    assert_eq!(r.status(), 416);
    assert_eq!(r.header("content-range"), Some("bytes */100"));
    // A range on a miss is cut from the streamed fill.
    let r = get_with(c.addr, "/size/5000", &[("Range", "bytes=4990-")]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(&r.body[..], &synth(5000)[4990..]);
    assert_eq!(x_cache(&get(c.addr, "/size/5000").await), "HIT");
    // Large objects are sent from shared memory with sendfile: whole and in part.
    get(c.addr, "/size/300000").await;
    let r = get(c.addr, "/size/300000").await;
    assert_eq!(x_cache(&r), "HIT");
    assert!(r.body == synth(300_000));
    let r = get_with(c.addr, "/size/300000", &[("Range", "bytes=100000-249999")]).await;
    assert_eq!(r.status(), 206);
    assert!(r.body[..] == synth(300_000)[100_000..250_000]);
}

#[tokio::test]
async fn keep_alive_and_pipelining_answer_in_order() {
    let o = origin();
    let c = cache(o.addr, &[]);
    get(c.addr, "/size/5").await;
    let req = "GET /size/5 HTTP/1.1\r\nHost: a\r\n\r\nGET /size/6 HTTP/1.1\r\nHost: a\r\n\r\nGET /size/5 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let out = raw(c.addr, req.as_bytes(), Duration::from_secs(5));
    let statuses: Vec<_> = out.match_indices("HTTP/1.1 200 OK").collect();
    assert_eq!(statuses.len(), 3, "{out}");
    let caches: Vec<&str> = out.lines().filter(|l| l.starts_with("X-Cache:")).collect();
    assert_eq!(caches, ["X-Cache: HIT", "X-Cache: MISS", "X-Cache: HIT"]);
    assert!(out.ends_with("01234"), "{out}");
}

#[tokio::test]
async fn malformed_requests_get_the_right_status() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let t = Duration::from_secs(5);
    let cases: [(&str, u16); 9] = [
        ("GET /size/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        ("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        ("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
        ("GET /size/1 HTTP/1.1\r\nHost: a\r\nX: a\r\n folded\r\n\r\n", 400),
        ("GET /size/1 HTTP/1.1\r\n\r\n", 400),
        ("GET /size/1 HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        ("POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        ("BREW /size/1 HTTP/1.1\r\nHost: a\r\n\r\n", 200),
        ("GET /size/1 HTTP/1.1\r\nHost: a\r\n\r\n", 200),
    ];
    for (req, want) in cases {
        let out = raw(c.addr, req.as_bytes(), t);
        // BREW passes through to the origin, which answers 404.
        let want = if req.starts_with("BREW") { 404 } else { want };
        assert_eq!(status_of(&out), want, "{req:?} -> {out}");
    }
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(10_000));
    assert_eq!(status_of(&raw(c.addr, long.as_bytes(), t)), 414);
    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
        "b".repeat(40_000)
    );
    assert_eq!(status_of(&raw(c.addr, big.as_bytes(), t)), 431);
    let many: String = (0..150).map(|i| format!("X-{i}: v\r\n")).collect();
    let req = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
    assert_eq!(status_of(&raw(c.addr, req.as_bytes(), t)), 431);
    let out = raw(c.addr, b"GET /size/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", t);
    assert!(
        out.contains("both Content-Length and Transfer-Encoding"),
        "{out}"
    );
    // The cache still works.
    assert_eq!(get(c.addr, "/size/1").await.status(), 200);
}

#[tokio::test]
async fn slow_clients_time_out_without_hurting_others() {
    let o = origin();
    let dir = tempdir("slowloris");
    let cfg = write_config(&dir, "header_timeout_ms = 800\n");
    let c = cache(o.addr, &["--config", &cfg]);
    let addr = c.addr;
    let slow = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let start = Instant::now();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut out = Vec::new();
        for b in b"GET /size/1 HTTP/1.1\r\nHost: slow\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            let mut buf = [0u8; 1024];
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
            if start.elapsed() > Duration::from_secs(5) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = s.read_to_end(&mut out);
        (start.elapsed(), String::from_utf8_lossy(&out).into_owned())
    });
    // Meanwhile others are served.
    for _ in 0..5 {
        assert_eq!(get(c.addr, "/size/3").await.status(), 200);
    }
    let (took, out) = slow.join().unwrap();
    assert_eq!(status_of(&out), 408, "{out}");
    assert!(took < Duration::from_secs(3), "cut after {took:?}");
}

#[tokio::test]
async fn an_origin_dying_mid_body_is_not_cached() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let path = "/size/200000?fail_after=100000";
    let r =
        vcdn_http::client::request(c.addr, "GET", path, &[], b"", Duration::from_secs(10)).await;
    assert!(
        r.is_err(),
        "the client sees a truncated response, not a complete one"
    );
    let r =
        vcdn_http::client::request(c.addr, "GET", path, &[], b"", Duration::from_secs(10)).await;
    assert!(r.is_err());
    assert_eq!(
        origin_count(o.addr, "/size/200000").await,
        2,
        "the partial object was not cached"
    );
    let s: serde_json::Value =
        serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
    assert_eq!(s["memory"]["objects"], 0);
    assert!(s["upstream"]["errors"].as_u64().unwrap() >= 2);
}

#[tokio::test]
async fn upstream_down_or_slow_gives_502_or_504_with_a_clear_body() {
    let o = origin();
    let dir = tempdir("timeouts");
    let cfg = write_config(&dir, "upstream_read_timeout_ms = 300\n");
    let c = cache(o.addr, &["--config", &cfg]);
    let r = get(c.addr, "/size/10?delay_ms=2000").await;
    assert_eq!(r.status(), 504);
    assert!(
        r.text().contains("did not answer") || r.text().contains("sent nothing"),
        "{}",
        r.text()
    );
    o.kill();
    let r = get(c.addr, "/size/10").await;
    assert_eq!(r.status(), 502);
    assert!(
        r.text().contains("cannot connect to upstream"),
        "{}",
        r.text()
    );
    assert_eq!(x_cache(&r), "ERROR");
}

#[tokio::test]
async fn stale_if_error_serves_the_stored_copy_when_the_origin_is_gone() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let path = "/size/20?cc=max-age%3D1,%20stale-if-error%3D60";
    assert_eq!(x_cache(&get(c.addr, path).await), "MISS");
    o.kill();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = get(c.addr, path).await;
    assert_eq!(r.status(), 200);
    assert_eq!(x_cache(&r), "STALE");
    assert_eq!(r.body, synth(20));
}

#[tokio::test]
async fn stale_while_revalidate_answers_at_once_and_refreshes_in_background() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let path = "/size/21?cc=max-age%3D1,%20stale-while-revalidate%3D30";
    get(c.addr, path).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = get(c.addr, path).await;
    assert_eq!(x_cache(&r), "STALE");
    let refreshed = eventually(5, || async { origin_count(o.addr, "/size/21").await == 2 }).await;
    assert!(refreshed, "revalidated in the background");
    let hit = eventually(5, || async { x_cache(&get(c.addr, path).await) == "HIT" }).await;
    assert!(hit);
}

#[tokio::test]
async fn no_cache_responses_are_revalidated_with_their_etag() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let path = "/size/30?cc=no-cache";
    assert_eq!(x_cache(&get(c.addr, path).await), "MISS");
    let r = get(c.addr, path).await;
    assert_eq!(x_cache(&r), "REVALIDATED");
    assert_eq!(r.body, synth(30));
    assert_eq!(origin_count(o.addr, "/size/30").await, 2);
    // A client's no-cache forces revalidation of a fresh object too.
    get(c.addr, "/size/31").await;
    let r = get_with(c.addr, "/size/31", &[("Cache-Control", "no-cache")]).await;
    assert_eq!(x_cache(&r), "REVALIDATED");
}

#[tokio::test]
async fn what_may_not_be_stored_is_not_stored() {
    let o = origin();
    let c = cache(o.addr, &[]);
    for cc in ["no-store", "private,%20max-age%3D60"] {
        let path = format!("/size/40?cc={cc}");
        get(c.addr, &path).await;
        let r = get(c.addr, &path).await;
        assert_eq!(x_cache(&r), "MISS", "{cc}");
    }
    // CDN-Cache-Control wins over Cache-Control (RFC 9213).
    let path = "/size/41?cc=no-store&cdn_cc=max-age%3D60";
    get(c.addr, path).await;
    assert_eq!(x_cache(&get(c.addr, path).await), "HIT");
    let path = "/size/42?cc=max-age%3D60&cdn_cc=no-store";
    get(c.addr, path).await;
    assert_eq!(x_cache(&get(c.addr, path).await), "MISS");
}

#[tokio::test]
async fn vary_keeps_one_variant_per_selected_header() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let path = "/size/50?vary=Accept-Encoding";
    let gz = [("Accept-Encoding", "gzip")];
    let br = [("Accept-Encoding", "br")];
    let r = get_with(c.addr, path, &gz).await;
    assert_eq!(r.header("x-variant"), Some("gzip"));
    let r = get_with(c.addr, path, &br).await;
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(r.header("x-variant"), Some("br"));
    let r = get_with(c.addr, path, &gz).await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.header("x-variant"), Some("gzip"));
    let r = get_with(c.addr, path, &br).await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.header("x-variant"), Some("br"));
}

#[tokio::test]
async fn unsafe_methods_pass_through_and_invalidate() {
    let o = origin();
    let c = cache(o.addr, &[]);
    get(c.addr, "/size/60").await;
    assert_eq!(x_cache(&get(c.addr, "/size/60").await), "HIT");
    let r = request(c.addr, "POST", "/size/60", &[], b"new").await;
    assert_eq!(r.status(), 200);
    assert_eq!(x_cache(&r), "PASS");
    assert_eq!(x_cache(&get(c.addr, "/size/60").await), "MISS");
    let r = request(c.addr, "POST", "/echo", &[], b"hello body").await;
    assert_eq!(r.text(), "hello body");
}

#[tokio::test]
async fn a_parent_cache_serves_a_child_cache() {
    let o = origin();
    let parent = cache(o.addr, &[]);
    let child = cache(parent.addr, &[]);
    let r = get(child.addr, "/size/70").await;
    assert_eq!(x_cache(&r), "MISS");
    let via = r.header("via").unwrap();
    assert_eq!(via.matches("vcdn-").count(), 2, "{via}");
    assert_eq!(x_cache(&get(child.addr, "/size/70").await), "HIT");
    // A second child finds it in the parent.
    let child2 = cache(parent.addr, &[]);
    get(child2.addr, "/size/70").await;
    assert_eq!(origin_count(o.addr, "/size/70").await, 1);
    let m = get(parent.admin.unwrap(), "/metrics").await;
    assert!(m
        .text()
        .contains("vcdn_cache_requests_total{result=\"HIT\"} 1"));
}

#[tokio::test]
async fn ten_thousand_idle_connections_use_bounded_memory() {
    let o = origin();
    let c = cache(o.addr, &[]);
    get(c.addr, "/size/1").await;
    let pid = c.child.id();
    let before = rss_kib(pid);
    let mut conns = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        match tokio::net::TcpStream::connect(c.addr).await {
            Ok(s) => conns.push(s),
            Err(e) => panic!("connection {i}: {e}"),
        }
    }
    let all_open = eventually(10, || async {
        let s: serde_json::Value =
            serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
        s["connections_open"].as_u64().unwrap_or(0) >= 10_000
    })
    .await;
    assert!(all_open, "the cache holds all 10,000 connections");
    let after = rss_kib(pid);
    let per_conn = (after.saturating_sub(before)) * 1024 / 10_000;
    eprintln!("RSS {before} KiB -> {after} KiB with 10,000 idle connections ({per_conn} B each)");
    assert!(
        after - before < 40 * 1024,
        "10,000 idle connections cost {} KiB",
        after - before
    );
    // And it still serves.
    assert_eq!(get(c.addr, "/size/1").await.status(), 200);
    drop(conns);
}

/// A client that pipelines requests and never reads the answers is held
/// back by TCP (the cache stops reading it), not buffered without bound.
#[tokio::test]
async fn a_client_that_never_reads_meets_back_pressure() {
    use tokio::io::AsyncWriteExt;
    let o = origin();
    let c = cache(o.addr, &[]);
    get(c.addr, "/size/16000").await;
    let pid = c.child.id();
    let before = rss_kib(pid);
    let mut s = tokio::net::TcpStream::connect(c.addr).await.unwrap();
    // 64-byte requests written 32 at a time, so that the cache's 2 KiB
    // receives hold whole requests and none is handed to the tokio loop.
    let one = format!(
        "GET /size/16000 HTTP/1.1\r\nHost: {}\r\n\r\n",
        "a".repeat(28)
    );
    assert_eq!(one.len(), 64);
    let reqs = one.repeat(32);
    let (mut written, t0) = (0usize, std::time::Instant::now());
    let blocked = loop {
        match tokio::time::timeout(Duration::from_millis(500), s.write_all(reqs.as_bytes())).await {
            Err(_) => break true,
            Ok(r) => r.unwrap(),
        }
        written += reqs.len();
        if t0.elapsed() > Duration::from_secs(10) {
            break false;
        }
    };
    let after = rss_kib(pid);
    eprintln!("{written} bytes of requests written before the cache stopped reading; RSS {before} -> {after} KiB");
    assert!(
        blocked,
        "the cache kept reading {written} bytes of requests"
    );
    assert!(after - before < 8 * 1024, "RSS {before} -> {after} KiB");
    // Others are served meanwhile.
    assert_eq!(get(c.addr, "/size/16000").await.status(), 200);
}

#[tokio::test]
async fn a_dead_pooled_upstream_connection_is_not_used() {
    let o = origin();
    let port = o.addr.to_string();
    // One serving thread: a pooled connection is taken again only by the
    // thread that opened it, and the two requests below come on two client
    // connections that could otherwise land on different threads.
    let c = cache(o.addr, &["--threads", "1"]);
    // Leaves a keep-alive connection in the pool...
    get(c.addr, "/size/80").await;
    // ...which dies with the origin; a new origin takes the same address.
    o.kill();
    let o2 = spawn(&["origin", "--listen", &port]);
    let r = get(c.addr, "/size/81").await;
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.body, synth(81));
    let s: serde_json::Value =
        serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
    // The pool saw that the origin had closed it before sending anything:
    // no request was lost to it, so none had to be retried.
    assert_eq!(s["upstream"]["retries"], 0);
    assert_eq!(origin_count(o2.addr, "/size/81").await, 1);
}

#[tokio::test]
async fn chunked_request_bodies_are_forwarded() {
    let o = origin();
    let c = cache(o.addr, &[]);
    let req = "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let out = raw(c.addr, req.as_bytes(), Duration::from_secs(5));
    assert_eq!(status_of(&out), 200, "{out}");
    assert!(out.contains("X-Cache: PASS"));
    assert!(out.ends_with("hello world"), "{out}");
}

#[tokio::test]
async fn objects_being_fetched_show_their_progress() {
    let o = origin();
    let c = cache(o.addr, &[]);
    // 400 kB at 200 kB/s: two seconds in flight.
    let slow = tokio::spawn(async move { get(c.addr, "/size/400000?rate=200000").await });
    let seen = eventually(5, || async {
        let v: serde_json::Value =
            serde_json::from_slice(&admin(&c, "GET", "/objects", "").await.body).unwrap();
        let f = &v["fetching"][0];
        let p = f["fetch_progress"].as_f64().unwrap_or(0.0);
        f["url"] == "/size/400000?rate=200000" && p > 0.0 && p < 1.0 && f["clients"] == 1
    })
    .await;
    assert!(seen, "a fetch in flight is listed with its progress");
    assert!(slow.await.unwrap().body == synth(400_000));
}

/// The io_uring front end answers hits itself and hands everything else to
/// the epoll loop; these are the seams between the two.
#[tokio::test]
async fn hits_misses_split_heads_and_idle_timeouts_on_one_keep_alive_connection() {
    use std::io::{Read, Write};
    let o = origin();
    let dir = tempdir("ring-seams");
    let cfg = write_config(&dir, "idle_timeout_ms = 400\n");
    let c = cache(o.addr, &["--config", &cfg]);
    get(c.addr, "/size/10").await; // stored
    let mut s = std::net::TcpStream::connect(c.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let read_response = |s: &mut std::net::TcpStream| -> String {
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            let n = s.read(&mut b).expect("read");
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&b[..n]);
            let t = String::from_utf8_lossy(&got).into_owned();
            if let Some(end) = t.find("\r\n\r\n") {
                let len: usize = t
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return t;
                }
            }
        }
    };
    // A hit, then a miss (handed over) on the same connection, in order.
    s.write_all(b"GET /size/10 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert!(read_response(&mut s).contains("X-Cache: HIT"));
    s.write_all(b"GET /size/11 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert!(read_response(&mut s).contains("X-Cache: MISS"));
    // A head split across two writes is answered once complete.
    let mut t = std::net::TcpStream::connect(c.addr).expect("connect");
    t.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    t.write_all(b"GET /size/10 HTTP/1.1\r\nHo").expect("write");
    std::thread::sleep(Duration::from_millis(100));
    t.write_all(b"st: x\r\n\r\n").expect("write");
    let r = read_response(&mut t);
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("X-Cache: HIT"),
        "{r}"
    );
    // An idle keep-alive connection is closed after idle_timeout_ms.
    let mut u = std::net::TcpStream::connect(c.addr).expect("connect");
    u.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    u.write_all(b"GET /size/10 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert!(read_response(&mut u).contains("X-Cache: HIT"));
    let idle_since = std::time::Instant::now();
    let mut b = [0u8; 16];
    assert_eq!(u.read(&mut b).expect("read"), 0, "closed by the cache");
    let waited = idle_since.elapsed();
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[tokio::test]
async fn the_epoll_loop_serves_everything_when_io_uring_is_off() {
    let o = origin();
    let dir = tempdir("epoll-only");
    let cfg = write_config(&dir, "io_uring = false\nheader_timeout_ms = 500\n");
    let c = cache(o.addr, &["--config", &cfg]);
    get(c.addr, "/size/5").await;
    let req = "GET /size/5 HTTP/1.1\r\nHost: a\r\n\r\nGET /size/6 HTTP/1.1\r\nHost: a\r\n\r\nGET /size/5 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let out = raw(c.addr, req.as_bytes(), Duration::from_secs(5));
    let caches: Vec<&str> = out.lines().filter(|l| l.starts_with("X-Cache:")).collect();
    assert_eq!(caches, ["X-Cache: HIT", "X-Cache: MISS", "X-Cache: HIT"]);
    let slow = raw(c.addr, b"GET /size/5 HTTP/1.1\r\n", Duration::from_secs(5));
    assert_eq!(status_of(&slow), 408, "{slow}");
}

/// GET `path` on a new connection and check, as it streams in, that the
/// body is the demo origin's synthetic object of `size` bytes. Returns
/// the X-Cache value. Nothing of the body is kept, so the test process
/// stays small however large the object.
async fn get_synthetic(addr: std::net::SocketAddr, path: &str, size: u64) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One period of the synthetic pattern, repeated to cover any read.
    const READ: usize = 64 * 1024;
    let pattern: Vec<u8> = (0..(READ + 36) as u64).map(vcdn_origin::byte_at).collect();
    let work = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = vec![0u8; READ];
        let mut head = Vec::new();
        let body_start = loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "{path}: connection closed in the head");
            head.extend_from_slice(&buf[..n]);
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let text = String::from_utf8_lossy(&head[..body_start]).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 200"), "{path}: {text}");
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        assert_eq!(field("content-length"), size.to_string(), "{path}");
        let mut pos = 0u64;
        let check = |data: &[u8], pos: &mut u64| {
            let at = (*pos % 36) as usize;
            assert!(
                data == &pattern[at..at + data.len()],
                "{path}: wrong bytes near offset {pos}"
            );
            *pos += data.len() as u64;
        };
        check(&head[body_start..], &mut pos);
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            check(&buf[..n], &mut pos);
        }
        assert_eq!(pos, size, "{path}: body length");
        field("x-cache").to_ascii_uppercase()
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .unwrap_or_else(|_| panic!("{path} took more than 60 s"))
}

/// Shared memory a process holds in memfds (object bodies), KiB: written
/// with write(2) and sent with sendfile(2), their pages are not in RSS
/// until mapped and touched, yet they are memory.
fn memfd_kib(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"))
        })
        .filter_map(|fd| std::fs::metadata(fd.path()).ok())
        .map(|m| m.len() / 1024)
        .sum()
}

/// The highest memory of a process (resident, plus shared memory held in
/// memfds), sampled every 2 ms on a thread of its own until the returned
/// guard is stopped.
struct RssPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl RssPeak {
    fn watch(pid: u32) -> RssPeak {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid) + memfd_kib(pid));
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        });
        RssPeak {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `--memory` bounds what the cache holds of objects: a 100 MB object,
/// fetched through a cache of 16 MiB (with a disk tier, then without),
/// joined while it is fetched and then sent to four clients at once from
/// the disk tier, and sixteen concurrent misses of 3 MB objects, never make
/// the process hold (resident or in shared memory) more than its idle size
/// + `--memory` + the stream window (8 MiB, the one fixed buffer of a
/// stream too large to keep) + 24 MiB for threads, sockets and allocator
/// slack.
#[tokio::test]
async fn a_large_object_stays_within_the_memory_budget() {
    const SIZE: u64 = 100_000_000;
    const SLACK_KIB: u64 = 24 * 1024;
    let path = format!("/size/{SIZE}");
    let o = origin();
    let dir = tempdir("budget");
    let d = dir.to_string_lossy().into_owned();
    // The stream window is left at its default, 8 MiB.
    let flags = ["--memory", "16M", "--threads", "2"];
    let mut with_disk = flags.to_vec();
    with_disk.extend_from_slice(&["--disk", &d, "--disk-size", "1G"]);
    for (name, extra) in [("disk tier", with_disk), ("memory only", flags.to_vec())] {
        let c = cache(o.addr, &extra);
        let pid = c.child.id();
        // Idle, with its threads and listeners up.
        assert_eq!(get(c.addr, "/size/1").await.status(), 200);
        let idle = rss_kib(pid) + memfd_kib(pid);
        let budget = idle + 16 * 1024 + 8 * 1024 + SLACK_KIB;
        let peak = RssPeak::watch(pid);
        if name == "disk tier" {
            // At 250 MB/s the miss lasts 0.4 s; a second client joins
            // when a tenth has arrived and is sent that part from the
            // file being written.
            let slow = format!("{path}?rate=250000000");
            let first = {
                let (slow, addr) = (slow.clone(), c.addr);
                tokio::spawn(async move { get_synthetic(addr, &slow, SIZE).await })
            };
            // This fetch's own entry: `/size/1`'s may still be listed
            // while its body is written to disk, at a progress of 1.0.
            let midway = eventually(10, || async {
                let v: serde_json::Value =
                    serde_json::from_slice(&admin(&c, "GET", "/objects", "").await.body).unwrap();
                v["fetching"].as_array().is_some_and(|f| {
                    f.iter().any(|e| {
                        e["url"] == slow.as_str()
                            && e["fetch_progress"].as_f64().is_some_and(|p| p > 0.1)
                    })
                })
            })
            .await;
            assert!(midway, "the miss is seen in flight");
            let late = get_synthetic(c.addr, &slow, SIZE).await;
            assert_eq!(first.await.unwrap(), "MISS");
            assert_eq!(late, "COALESCED", "the late client joins the fetch");
            let stored = eventually(10, || async {
                let s: serde_json::Value =
                    serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
                s["disk"]["objects"] == 2
            })
            .await;
            assert!(stored, "the object reaches the disk tier");
            // A body of unknown length (chunked) leaves memory for the disk
            // once it outgrows the memory tier, and is kept there.
            let chunked = "/size/20000000?chunked=1";
            let r = get(c.addr, chunked).await;
            assert!(r.body == synth(20_000_000), "chunked body");
            let r = get(c.addr, chunked).await;
            assert_eq!(x_cache(&r), "HIT");
            assert!(r.body == synth(20_000_000), "chunked body from disk");
            let hits = concurrently(4, c.addr, &slow, SIZE).await;
            assert!(hits.iter().all(|h| h == "HIT"), "disk hits: {hits:?}");
            // Parts of it, small (read) and large (sent from the file).
            for (from, to) in [(1_000u64, 1_099u64), (50_000_000, 50_999_999)] {
                let range = format!("bytes={from}-{to}");
                let r = get_with(c.addr, &slow, &[("Range", &range)]).await;
                assert_eq!(r.status(), 206, "{range}");
                assert_eq!(x_cache(&r), "HIT");
                let want: Vec<u8> = (from..=to).map(vcdn_origin::byte_at).collect();
                assert!(r.body == want, "{range}: wrong bytes");
            }
        } else {
            assert_eq!(get_synthetic(c.addr, &path, SIZE).await, "MISS");
            let again = concurrently(2, c.addr, &path, SIZE).await;
            assert!(
                again.iter().all(|h| h == "MISS" || h == "COALESCED"),
                "{again:?}"
            );
            // A body of unknown length that outgrows the memory tier is
            // passed through, whole and correct, and not kept.
            let chunked = "/size/20000000?chunked=1";
            let r = get(c.addr, chunked).await;
            assert!(r.body == synth(20_000_000), "chunked body");
            assert_eq!(x_cache(&get(c.addr, chunked).await), "MISS");
            // Sixteen misses at once of objects the memory tier takes
            // (3 MB each): the bodies in flight share its budget.
            let tasks: Vec<_> = (0..16)
                .map(|i| {
                    let addr = c.addr;
                    let size = 3_000_000 + i;
                    tokio::spawn(async move {
                        get_synthetic(addr, &format!("/size/{size}"), size).await
                    })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await.unwrap(), "MISS");
            }
        }
        let peak = peak.stop();
        eprintln!(
            "{name}: memory (RSS + memfds) idle {idle} KiB, peak {peak} KiB, budget {budget} KiB"
        );
        assert!(
            peak <= budget,
            "{name}: memory (RSS + memfds) reached {peak} KiB, over the budget of {budget} KiB (idle {idle} KiB + 16 MiB memory + 8 MiB stream window + {SLACK_KIB} KiB)"
        );
    }
}

/// `n` clients fetching the same object at once; their X-Cache values.
async fn concurrently(n: usize, addr: std::net::SocketAddr, path: &str, size: u64) -> Vec<String> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let path = path.to_string();
            tokio::spawn(async move { get_synthetic(addr, &path, size).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Every file under `dir` with a digest of its contents, to compare
/// before and after.
fn snapshot(dir: &std::path::Path) -> Vec<(std::path::PathBuf, usize, u64)> {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<_> = walk(dir)
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            data.hash(&mut h);
            (p, data.len(), h.finish())
        })
        .collect();
    files.sort();
    files
}

/// Run `vcdn ARGS`, which must exit within 10 s; its status and stderr.
fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args)
        .env("VCDN_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("vcdn starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vcdn {args:?} is still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status, err)
}

/// Pointed at a directory it did not create, the disk tier refuses to
/// start and leaves every file as it was.
#[tokio::test]
async fn disk_tier_refuses_a_directory_it_did_not_create() {
    let dir = tempdir("not-ours");
    std::fs::write(dir.join("notes.txt"), b"my notes").unwrap();
    std::fs::create_dir_all(dir.join("ab/cd")).unwrap();
    std::fs::write(dir.join("ab/report.pdf"), b"%PDF-1.4 quarterly").unwrap();
    std::fs::write(dir.join("ab/cd/photo.jpg"), [0xffu8, 0xd8, 0xff]).unwrap();
    // Looks like a cache object's name, but vcdn did not write it.
    std::fs::write(dir.join("ab/ab00000000000001"), b"not a cache object").unwrap();
    let before = snapshot(&dir);
    let d = dir.to_string_lossy().into_owned();
    let (status, err) = run_to_exit(&[
        "cache",
        "--listen",
        "127.0.0.1:0",
        "--disk",
        &d,
        "--disk-size",
        "8M",
    ]);
    assert!(
        !status.success(),
        "the cache started on a foreign directory"
    );
    assert!(err.contains(&d), "the error names the directory: {err}");
    assert!(
        err.contains("empty"),
        "the error says what to do (an empty or new directory): {err}"
    );
    assert_eq!(snapshot(&dir), before, "the directory is left as it was");
}

/// Inside its own directory, the disk tier keeps what it does not
/// recognise: stray files survive a restart, and its objects still load.
#[tokio::test]
async fn disk_tier_keeps_files_it_does_not_recognise() {
    let o = origin();
    let dir = tempdir("stray");
    let d = dir.to_string_lossy().into_owned();
    let c = cache(o.addr, &["--disk", &d, "--disk-size", "64M"]);
    assert_eq!(x_cache(&get(c.addr, "/size/1000").await), "MISS");
    let written = eventually(5, || async {
        let s: serde_json::Value =
            serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
        s["disk"]["objects"] == 1
    })
    .await;
    assert!(written, "the object reaches the disk tier");
    c.kill();
    let object = walk(&dir)
        .into_iter()
        .find(|p| {
            std::fs::read(p)
                .unwrap()
                .windows(10)
                .any(|w| w == b"/size/1000")
        })
        .expect("the object's file");
    let fanout = object.parent().unwrap().to_path_buf();
    std::fs::write(dir.join("README"), b"operator's note").unwrap();
    std::fs::write(fanout.join("stray.txt"), b"stray").unwrap();
    std::fs::write(fanout.join("00000000000000aa"), b"not ours either").unwrap();
    std::fs::create_dir_all(dir.join("zz")).unwrap();
    std::fs::write(dir.join("zz/keep.bin"), [1u8, 2, 3]).unwrap();
    let before = snapshot(&dir);
    let c = cache(o.addr, &["--disk", &d, "--disk-size", "64M"]);
    let loaded = eventually(5, || async {
        let s: serde_json::Value =
            serde_json::from_slice(&admin(&c, "GET", "/stats", "").await.body).unwrap();
        s["disk"]["objects"] == 1
    })
    .await;
    assert!(loaded, "the index is rebuilt with the object");
    let r = get(c.addr, "/size/1000").await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body, synth(1000));
    c.kill();
    assert_eq!(snapshot(&dir), before, "stray files are kept, untouched");
}

/// The admin API over TLS (`--admin-tls-cert/--admin-tls-key`): HTTPS
/// only, `vcdn cache ctl` reaches it trusting the CA or the certificate's
/// fingerprint and refuses a certificate it was not told to trust; a plain
/// admin API off loopback is refused at start, saying what to do.
#[tokio::test]
async fn the_admin_api_over_tls_speaks_https_only_and_plain_off_loopback_is_refused() {
    let dir = tempdir("cache-admin-tls");
    let (ca, cp, kp) = admin_cert(&dir);
    let o = origin();
    let c = cache(o.addr, &["--admin-tls-cert", &cp, "--admin-tls-key", &kp]);
    let admin = c.admin.expect("the cache printed its admin address");
    assert_eq!(get(c.addr, "/size/10").await.status(), 200);
    assert_admin_https_only(admin, &ca, "vcdn_cache_requests_total").await;

    let ctl = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vcdn"))
            .args([
                "cache",
                "ctl",
                "--admin",
                &admin.to_string(),
                "--token",
                TOKEN,
            ])
            .args(extra)
            .env_remove("VCDN_CA_FILE")
            .env_remove("VCDN_ADMIN_FINGERPRINT")
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    let (ok, out) = ctl(&["--ca-file", ca_file.to_str().unwrap(), "stats"]);
    assert!(ok && out.contains("hit_ratio"), "{out}");
    let b =
        vcdn_http::tls::parse_bundle(&std::fs::read(&cp).unwrap(), &std::fs::read(&kp).unwrap())
            .unwrap();
    let (ok, out) = ctl(&["--fingerprint", &b.info.fingerprint, "purge", "--all"]);
    assert!(ok, "{out}");
    // Not told whom to trust: a bare address is plain HTTP, which the TLS
    // port does not speak; the message says what to give.
    let (ok, out) = ctl(&["stats"]);
    assert!(!ok && out.contains("--ca-file"), "{out}");
    // Another certificate's fingerprint: refused before the token is sent.
    let other = vcdn_http::tls::self_signed(&["127.0.0.1".into()], 1).unwrap();
    let fp = vcdn_http::tls::parse_bundle(other.cert_pem.as_bytes(), other.key_pem.as_bytes())
        .unwrap()
        .info
        .fingerprint;
    let (ok, out) = ctl(&["--fingerprint", &fp, "stats"]);
    assert!(!ok && out.contains("refusing to send the token"), "{out}");

    // Plain HTTP off loopback: refused at start, before anything listens.
    let err = refused_to_start(&[
        "cache",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "192.0.2.1:8081",
        "--admin-token",
        TOKEN,
    ]);
    assert!(
        err.contains("192.0.2.1:8081")
            && err.contains("loopback")
            && err.contains("--admin-tls-cert")
            && err.contains("--admin-tls-cert"),
        "{err}"
    );
    // A half pair is refused by the command line.
    let err = refused_to_start(&["cache", "--admin", "127.0.0.1:0", "--admin-tls-cert", &cp]);
    assert!(err.contains("--admin-tls-key"), "{err}");
}
