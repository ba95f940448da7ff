//! The demo origin's synthetic DASH content, as a player and a cache see
//! it: MPDs that name real segments, segment sizes from the CDNaaS paper's
//! Table II, a live channel whose segments appear in real time, and a
//! dynamic endpoint no cache may keep.

mod support;

use std::time::Duration;

use support::*;
use vcdn_origin::dash;

#[tokio::test]
async fn vod_titles_have_an_mpd_and_table_ii_segments_that_a_cache_keeps() {
    let origin = spawn(&["origin", "--listen", "127.0.0.1:0", "--seed", "3"]);
    let cache = cache(origin.addr, &[]);

    let mpd = get(cache.addr, "/dash/vod/bunny/manifest.mpd").await;
    assert_eq!(mpd.status(), 200);
    assert_eq!(mpd.header("content-type"), Some("application/dash+xml"));
    let text = mpd.text();
    assert!(
        text.contains("mediaPresentationDuration=\"PT476S\""),
        "{text}"
    );
    assert!(
        text.contains("media=\"$RepresentationID$/$Number$.m4s\""),
        "{text}"
    );

    // Every representation named in the MPD serves segments of the sizes
    // the seed fixes, through the cache: a miss, then a hit.
    for r in &dash::REPRESENTATIONS {
        assert!(text.contains(&format!("id=\"{}\"", r.id)));
        for n in [1u64, 2, 238] {
            let path = format!("/dash/vod/bunny/{}/{n}.m4s", r.id);
            let first = get(cache.addr, &path).await;
            assert_eq!(first.status(), 200, "{path}");
            assert_eq!(
                first.body.len() as u64,
                dash::segment_size(3, "bunny", r, n),
                "{path}"
            );
            assert!(first.body.len() as u64 >= r.min && first.body.len() as u64 <= r.max);
            assert!(
                x_cache(&get(cache.addr, &path).await).starts_with("HIT"),
                "{path}"
            );
        }
        let init = get(origin.addr, &format!("/dash/vod/bunny/{}/init.mp4", r.id)).await;
        assert_eq!(init.body.len() as u64, dash::INIT_BYTES);
    }
    assert_eq!(
        get(origin.addr, "/dash/vod/bunny/ultra/1.m4s")
            .await
            .status(),
        404
    );
    assert_eq!(
        get(origin.addr, "/dash/vod/bunny/low/0.m4s").await.status(),
        404
    );
    assert_eq!(
        get(origin.addr, "/dash/vod/bunny/manifest.mpd?duration_s=0")
            .await
            .status(),
        400
    );
    assert_eq!(
        get(origin.addr, "/dash/vod/../x/manifest.mpd")
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn a_live_channel_publishes_a_segment_every_two_seconds() {
    let origin = origin();
    let mpd = get(origin.addr, "/dash/live/news/manifest.mpd").await;
    assert_eq!(mpd.status(), 200);
    assert!(mpd.text().contains("type=\"dynamic\""), "{}", mpd.text());
    assert_eq!(mpd.header("cache-control"), Some("public, max-age=1"));
    // Segment 3 covers seconds 4-6 of the channel: not there yet.
    let early = get(origin.addr, "/dash/live/news/high/3.m4s").await;
    assert_eq!(early.status(), 404);
    assert!(early.text().contains("available in"), "{}", early.text());
    let ok = eventually(8, || async {
        get(origin.addr, "/dash/live/news/high/3.m4s")
            .await
            .status()
            == 200
    })
    .await;
    assert!(ok, "live segment 3 never appeared");
}

#[tokio::test]
async fn dynamic_content_is_made_per_request_and_never_cached() {
    let origin = origin();
    let cache = cache(origin.addr, &[]);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = get(cache.addr, "/dynamic?size=5000").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.body.len(), 5000);
        assert_eq!(r.header("cache-control"), Some("private, no-store"));
        assert!(!x_cache(&r).starts_with("HIT"));
        seen.push(r.header("x-generated").unwrap().to_string());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "every response is generated anew: {seen:?}");
    assert_eq!(origin_count(origin.addr, "/dynamic").await, 3);
}
