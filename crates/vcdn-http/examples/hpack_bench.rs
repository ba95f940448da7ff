//! Micro benchmark of the HPACK codec on the cache's hit path (not a test;
//! timing only means something on an otherwise idle machine):
//!
//! ```sh
//! cargo run --release -p vcdn-http --example hpack_bench
//! ```
//!
//! * decode an h2load-style request whose fields are all in the dynamic
//!   table after the first request (`:method GET, :scheme https, :path /x,
//!   :authority, user-agent, accept, accept-encoding`): the steady state;
//! * decode the first request (literals, Huffman, table inserts);
//! * encode a small cached response (`:status 200` and 7 fields), raw and Huffman.

use std::hint::black_box;
use std::time::Instant;

use vcdn_http::hpack::{encode_int, huffman_encode, Decoder, Encoder, DEFAULT_TABLE_SIZE};

fn huff_literal(index: usize, value: &[u8], out: &mut Vec<u8>) {
    encode_int(index, 6, 0x40, out);
    let mut v = Vec::new();
    huffman_encode(value, &mut v);
    encode_int(v.len(), 7, 0x80, out);
    out.extend_from_slice(&v);
}

fn time(label: &str, iters: u32, mut f: impl FnMut()) {
    for _ in 0..iters / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = start.elapsed().as_nanos() as f64 / iters as f64;
    println!("{label:<48} {ns:>8.1} ns");
}

fn main() {
    // First request as nghttp2 (h2load) writes it: literals with incremental
    // indexing, Huffman-coded.
    let mut first = vec![0x82, 0x87];
    huff_literal(4, b"/x", &mut first);
    huff_literal(1, b"127.0.0.1:8443", &mut first);
    huff_literal(58, b"h2load nghttp2/1.64.0", &mut first);
    huff_literal(19, b"*/*", &mut first);
    huff_literal(16, b"gzip, deflate, br", &mut first);
    // The following ones: all indexed (62 = newest).
    let next = [0x82, 0x87, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe];

    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut n = 0usize;
    d.decode(&first, 16384, |_, _| n += 1).unwrap();
    assert_eq!(n, 7);
    time(
        "decode request, all indexed (steady state)",
        2_000_000,
        || {
            let mut bytes = 0;
            let ok = d
                .decode(black_box(&next), 16384, |name, value| {
                    bytes += name.len() + value.len()
                })
                .unwrap();
            black_box((ok, bytes));
        },
    );
    time(
        "decode first request (Huffman literals, inserts)",
        500_000,
        || {
            let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
            let mut bytes = 0;
            let ok = d
                .decode(black_box(&first), 16384, |name, value| {
                    bytes += name.len() + value.len()
                })
                .unwrap();
            black_box((ok, bytes));
        },
    );

    let fields: [(&[u8], &[u8]); 7] = [
        (b"content-type", b"application/octet-stream"),
        (b"content-length", b"43"),
        (b"date", b"Fri, 27 Nov 2026 07:24:44 GMT"),
        (b"last-modified", b"Thu, 26 Nov 2026 10:00:00 GMT"),
        (b"etag", b"\"2b-5f3a1c\""),
        (b"cache-control", b"public, max-age=3600"),
        (b"age", b"12"),
    ];
    for huffman in [false, true] {
        let mut e = Encoder::new().with_huffman(huffman);
        let mut out = Vec::with_capacity(512);
        time(
            &format!("encode response, 8 fields (huffman {huffman})"),
            2_000_000,
            || {
                out.clear();
                e.status(200, &mut out);
                for (n, v) in fields {
                    e.field(n, v, &mut out);
                }
                black_box(&out);
            },
        );
        println!("{:<48} {:>8} bytes", "  block size", out.len());
    }
}
