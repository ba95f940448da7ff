//! Fuzz the HTTP/2 front end whole: the input is what a client sends on an
//! h2c connection after the preface (frames, HPACK blocks, anything), served
//! by `vcdn_cache::h2front` with a real `Cache` in front of the real demo
//! origin on a loopback socket. `vcdn_http::h2` parses the frames and
//! `vcdn_http::hpack` the header blocks into the HTTP/1.1 head the strict
//! parser reads; `h2front` answers and turns the reply back into HTTP/2.
//!
//! Checked, besides "never panics": no panic is caught by the front end's
//! own panic boundaries either (they would hide a bug from the fuzzer), and
//! what the server writes is a sequence of well-formed frames.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;
use vcdn_cache::{Cache, CacheConfig};

struct World {
    rt: Runtime,
    cache: Arc<Cache>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let origin = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("origin listener");
            let addr = l.local_addr().expect("origin address");
            tokio::spawn(vcdn_origin::run(l));
            addr
        });
        let cache = Cache::new(CacheConfig {
            upstream: format!("http://{origin}"),
            memory: 4 << 20,
            threads: 1,
            upstream_connect_timeout_ms: 500,
            upstream_read_timeout_ms: 2_000,
            max_request_body: 64 << 10,
            stream_window: 256 << 10,
            header_timeout_ms: 1_000,
            idle_timeout_ms: 1_000,
            send_timeout_ms: 1_000,
            request_body_idle_timeout_ms: 1_000,
            ..CacheConfig::default()
        })
        .expect("cache");
        vcdn_cache::panic::install_hook();
        World {
            rt,
            cache: Arc::new(cache),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let out = w
        .rt
        .block_on(vcdn_cache::h2front::serve_bytes(w.cache.clone(), data));
    assert_eq!(
        w.cache
            .metrics
            .panics
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "a panic was caught serving this input"
    );
    // The server's side: frames, each with a 9-byte header and its length.
    let mut at = 0;
    while at + 9 <= out.len() {
        let len = u32::from_be_bytes([0, out[at], out[at + 1], out[at + 2]]) as usize;
        assert!(len <= 16_384, "a frame over the default maximum size");
        at += 9 + len;
    }
});
