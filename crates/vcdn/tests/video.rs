//! A real player through a vCDN: dash.js in headless Chromium plays the
//! decodable title `vcdn origin --video-dir` serves, through a `vcdn cache`,
//! and reports what a viewer saw. Needs Debian's ffmpeg, chromium and
//! chromium-driver (scripts/test.sh installs them).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{cache, get, origin_count, spawn, x_cache};
use vcdn_origin::video::{ensure_title, TitleSpec};
use vcdn_player::browser::{watch, Browser};

/// The 2 s title, 40 s long, made once per target directory (~20 s) and
/// reused by later runs.
fn title_dir() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("video");
    let t0 = Instant::now();
    ensure_title(&dir, TitleSpec::new(2, 40).expect("spec")).expect("the title is made");
    eprintln!("title ready in {:.1} s", t0.elapsed().as_secs_f64());
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dash_js_plays_the_title_through_a_cache_without_stalls() {
    let dir = title_dir();
    let dir_s = dir.to_string_lossy().into_owned();
    let origin = spawn(&[
        "origin",
        "--listen",
        "127.0.0.1:0",
        "--video-dir",
        &dir_s,
        "--video-seconds",
        "40",
        "--video-segments",
        "2",
    ]);
    let edge = cache(origin.addr, &[]);

    // What the origin serves, as a cache in front sees it.
    let mpd = get(edge.addr, "/video/testsrc-2s/manifest.mpd").await;
    assert_eq!(mpd.status(), 200, "{}", mpd.text());
    assert_eq!(mpd.header("content-type"), Some("application/dash+xml"));
    assert!(mpd.header("cache-control").unwrap_or("").contains("public"));
    assert!(mpd.text().contains(r#"bandwidth="2500000""#));
    let seg = get(edge.addr, "/video/testsrc-2s/chunk-stream3-00001.m4s").await;
    assert_eq!(seg.header("content-type"), Some("audio/mp4"));
    let gone = get(edge.addr, "/video/testsrc-2s/..%2f..%2fCargo.toml").await;
    assert_eq!(gone.status(), 404);

    let page = format!("http://{}/watch", edge.addr);
    let (stats, cpu_s, wall) = tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        let b = Browser::start().expect("headless Chromium starts");
        b.open(&page).expect("the watch page opens");
        let s = watch(&b, Duration::from_secs(14)).expect("the page reports its stats");
        (s, b.cpu_s(), t0.elapsed())
    })
    .await
    .expect("browser thread");
    let top = stats.top_video_kbps();
    eprintln!(
        "dash.js: start-up {:?} ms, {} stalls ({:.0} ms), {} video + {} audio segments, now {} kbit/s (top fetched {top}), {} switches, at {:.1} s; Chromium {cpu_s:.1} s CPU in {:.1} s",
        stats.startup_ms,
        stats.stalls,
        stats.stall_ms,
        stats.media_segments("video"),
        stats.media_segments("audio"),
        stats.bitrate_kbps,
        stats.switches,
        stats.position_s,
        wall.as_secs_f64()
    );
    let ladder: Vec<f64> = stats
        .segments
        .iter()
        .filter(|s| !s.init && s.media_type.as_deref() == Some("video"))
        .filter_map(|s| s.quality_kbps)
        .collect();
    eprintln!("video segments' kbit/s in fetch order: {ladder:?}");
    assert!(stats.errors.is_empty(), "player errors: {:?}", stats.errors);
    let startup = stats.startup_ms.expect("playback started");
    assert!(startup < 3000.0, "start-up took {startup} ms");
    assert_eq!(stats.stalls, 0, "a viewer saw stalls: {stats:?}");
    assert!(stats.position_s > 8.0, "played only {} s", stats.position_s);
    assert!(stats.media_segments("video") >= 6, "{:?}", stats.segments);
    assert!(stats.media_segments("audio") >= 6, "{:?}", stats.segments);
    // Unthrottled on loopback, dash.js's throughput rule climbs the ladder.
    assert_eq!(top, 2500.0, "never reached the top representation");

    // The cache kept what the player fetched: a second viewer's request
    // is a hit and the origin served each object once.
    let first = stats
        .segments
        .iter()
        .find(|s| !s.init && s.media_type.as_deref() == Some("video"))
        .and_then(|s| s.url.clone())
        .expect("a video segment url");
    let path = &first[first.find("/video/").expect("path")..];
    let again = get(edge.addr, path).await;
    assert_eq!(again.status(), 200);
    assert!(
        x_cache(&again).contains("HIT"),
        "{path}: {}",
        x_cache(&again)
    );
    assert_eq!(origin_count(origin.addr, path).await, 1, "{path}");
    assert_eq!(
        origin_count(origin.addr, "/player/dash.all.min.js").await,
        1
    );
}
