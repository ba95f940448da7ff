//! Fuzz the cache's whole request path, not only its parser: the input is
//! the bytes a client sends on one connection, and every request in it goes
//! parse → the proxy's decision (`Cache::at_once`, then `Cache::handle`) →
//! the reply as the connection loop writes it, against a real `Cache` built
//! in-process in front of the real demo origin (`vcdn-origin`) on a loopback
//! socket. Misses, coalescing, ranges, conditionals, passes, invalidation
//! and the store all run for real.
//!
//! Checked, besides "never panics": every reply head (also those written
//! straight into the batch buffer by the hit path) parses as a valid
//! HTTP/1.1 response with the status the reply says; a body is never
//! longer than its Content-Length; a HEAD gets no body.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;
use vcdn_cache::metrics::HitTally;
use vcdn_cache::proxy::AtOnce;
use vcdn_cache::reply::{error_reply, Reply, ReplyBody};
use vcdn_cache::{Cache, CacheConfig};
use vcdn_http::chunked::{ChunkedDecoder, Decoded};
use vcdn_http::{parse_request, parse_response, BodyFraming, Limits, Method, ResponseHead};

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
            ..CacheConfig::default()
        })
        .expect("cache");
        World {
            rt,
            cache: Arc::new(cache),
        }
    })
}

/// A complete, valid response head at the start of `out`; its length.
fn check_head(out: &[u8], status: Option<u16>) -> (ResponseHead, usize) {
    let buf = Bytes::copy_from_slice(out);
    let (head, n) = match parse_response(&buf, &Limits::default()) {
        Ok(Some(h)) => h,
        other => panic!(
            "the cache wrote an invalid response head ({other:?}):\n{}",
            String::from_utf8_lossy(out)
        ),
    };
    if let Some(s) = status {
        assert_eq!(
            head.status, s,
            "status line differs from the reply's status"
        );
    }
    (head, n)
}

fn content_length(head: &ResponseHead) -> Option<u64> {
    let v = head.headers.get(b"content-length")?;
    Some(
        std::str::from_utf8(v)
            .ok()
            .and_then(|l| l.parse().ok())
            .expect("numeric Content-Length"),
    )
}

/// Write a reply as the connection loop does: head, then the body (a
/// stream read to its end, bounded in time), and check it.
async fn write(reply: Reply, head_only: bool) {
    let mut out = reply.head.clone();
    let (head, n) = check_head(&out, Some(reply.status));
    assert_eq!(n, out.len(), "bytes after the reply head");
    let declared = content_length(&head);
    let body_len: u64 = match reply.body {
        ReplyBody::Empty => 0,
        ReplyBody::Full(b) | ReplyBody::Shared { bytes: b, .. } => {
            if head_only {
                0
            } else {
                out.extend_from_slice(&b);
                b.len() as u64
            }
        }
        ReplyBody::Stream {
            mut reader,
            mut skip,
            take,
            ..
        } => {
            assert!(!head_only, "a streamed body for HEAD");
            let mut sent = 0u64;
            loop {
                let next = tokio::time::timeout(Duration::from_secs(1), reader.next()).await;
                match next {
                    Ok(Ok(Some(mut b))) => {
                        let k = skip.min(b.len());
                        b.advance(k);
                        skip -= k;
                        sent += b.len();
                        if let Some(t) = take.filter(|&t| sent >= t) {
                            sent = t;
                            break;
                        }
                        if sent >= 1 << 20 {
                            // Enough of an endless or huge stream: the
                            // client leaves, as a real one may.
                            break;
                        }
                    }
                    Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
                }
            }
            sent
        }
    };
    if let Some(d) = declared {
        assert!(
            body_len <= d,
            "body of {body_len} bytes > Content-Length {d}"
        );
    }
}

/// The request body that follows a head, as the connection loop reads it
/// (`None`: incomplete or invalid; the loop would wait or answer 400).
fn take_body(rest: &mut Bytes, framing: BodyFraming) -> Option<Bytes> {
    match framing {
        BodyFraming::None => Some(Bytes::new()),
        BodyFraming::Length(n) => {
            let n = usize::try_from(n).ok().filter(|&n| n <= rest.len())?;
            Some(rest.split_to(n))
        }
        BodyFraming::Chunked => {
            let mut buf = BytesMut::from(&rest[..]);
            let mut dec = ChunkedDecoder::new();
            let mut body = BytesMut::new();
            loop {
                match dec.decode(&mut buf) {
                    Ok(Decoded::Data(d)) => body.extend_from_slice(&d),
                    Ok(Decoded::Done) => {
                        *rest = buf.freeze();
                        return Some(body.freeze());
                    }
                    Ok(Decoded::NeedMore) | Err(_) => return None,
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let cache = &w.cache;
    let limits = Limits::default();
    let peer = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut rest = Bytes::copy_from_slice(data);
    w.rt.block_on(async {
        let mut spare = Vec::new();
        let mut tally = HitTally::default();
        // At most 8 pipelined requests per input.
        for _ in 0..8 {
            let (head, n) = match parse_request(&rest, &limits) {
                Ok(Some(h)) => h,
                Ok(None) => return,
                Err(e) => {
                    write(error_reply(e.status(), &e.to_string(), true, false), false).await;
                    return;
                }
            };
            let _ = rest.split_to(n);
            let Some(body) = take_body(&mut rest, head.body) else {
                return;
            };
            let head_only = head.method == Method::Head;
            let mut out = Vec::new();
            let reply = match cache.at_once(&head, &mut out, 16 * 1024, &mut spare, &mut tally) {
                AtOnce::Written { .. } => {
                    let (h, n) = check_head(&out, Some(200));
                    let body = if head_only {
                        0
                    } else {
                        content_length(&h).unwrap_or(0)
                    };
                    assert_eq!(
                        n as u64 + body,
                        out.len() as u64,
                        "hit body and Content-Length differ"
                    );
                    continue;
                }
                AtOnce::Reply(r) => r,
                AtOnce::Later => {
                    match tokio::time::timeout(
                        Duration::from_secs(5),
                        cache.handle(&head, body, peer),
                    )
                    .await
                    {
                        Ok(r) => r,
                        Err(_) => panic!("the cache did not answer within 5 s"),
                    }
                }
            };
            let close = reply.close || !head.keep_alive;
            write(reply, head_only).await;
            if close {
                return;
            }
        }
    });
});
