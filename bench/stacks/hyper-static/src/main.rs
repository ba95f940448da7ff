//! hyper-static: the cheapest plain hyper 1.x server that sends the same
//! response as a vcdn cache hit on `/size/43` — a baseline for
//! `bench/stacks.sh`.
//!
//! One thread (tokio current_thread runtime), HTTP/1.1 only, keep-alive.
//! Every request, whatever its method or path, gets status 200, a fixed
//! 43-byte body and vcdn's hit headers. Nothing is parsed or looked up: this
//! measures hyper + tokio's per-request cost and nothing else.
//!
//! Usage: hyper-static ADDR   (e.g. 127.0.0.1:18090)

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The body vcdn's demo origin serves for /size/43.
const BODY: &[u8; 43] = b"0123456789abcdefghijklmnopqrstuvwxyz0123456";

/// vcdn's hit headers except Date and Content-Length, which hyper adds
/// itself: Date from its once-a-second cache (vcdn does the same), and
/// Content-Length from the body's exact size.
fn hit_headers() -> HeaderMap {
    let mut h = HeaderMap::with_capacity(16);
    let mut put = |k: HeaderName, v: &'static str| h.insert(k, HeaderValue::from_static(v));
    put(header::CONTENT_TYPE, "application/octet-stream");
    put(header::CACHE_CONTROL, "public, max-age=3600");
    put(header::ETAG, "\"size-43\"");
    put(header::LAST_MODIFIED, "Thu, 01 Jan 2026 00:00:00 GMT");
    put(header::VIA, "1.1 hyper-static");
    put(header::AGE, "0");
    put(HeaderName::from_static("x-cache"), "HIT");
    h
}

fn main() {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .expect("usage: hyper-static ADDR")
        .parse()
        .expect("ADDR must be IP:PORT");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("tokio runtime");
    rt.block_on(serve(addr));
}

async fn serve(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind");
    println!("hyper-static listening on http://{}", listener.local_addr().unwrap());

    // Built once; per request it is one HeaderMap clone (no hashing) and a
    // refcount bump for the static body.
    let headers = hit_headers();
    let body = Bytes::from_static(BODY);

    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        // Small responses: do not let Nagle hold them back (vcdn and nginx
        // set TCP_NODELAY too).
        let _ = stream.set_nodelay(true);
        let (headers, body) = (headers.clone(), body.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |_req: Request<Incoming>| {
                let mut resp = Response::new(Full::new(body.clone()));
                *resp.headers_mut() = headers.clone();
                async move { Ok::<_, Infallible>(resp) }
            });
            // keep_alive is hyper's default; spelled out because the benchmark
            // depends on it.
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
