//! Fuzz the HTTP/2 protocol core alone (`vcdn_http::h2::Connection`, with
//! the HPACK decoder): the input is what a client sends after the preface,
//! cut into reads at arbitrary points; every request is answered with a
//! header block and a body as the windows allow, so the send side (flow
//! control, END_STREAM, CONTINUATION) runs too.
//!
//! Checked, besides "never panics": what the server writes is a sequence of
//! well-formed frames within the default maximum size, open streams never
//! exceed the concurrency limit, and once a connection error is returned
//! nothing more is taken.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use vcdn_http::h2::{frame, Config, Connection, Event};

fuzz_target!(|data: &[u8]| {
    let cfg = Config {
        max_concurrent_streams: 8,
        stream_window: 65_535,
        connection_window: 65_535,
        max_header_list: 4096,
        max_pending_accept_resets: 4,
        max_local_error_resets: 16,
        max_client_resets: 16,
    };
    let mut c = Connection::new(cfg);
    let mut out = std::mem::take(&mut c.out);
    let mut buf = BytesMut::from(frame::PREFACE);
    let mut events = Vec::new();
    // The first byte says where reads are cut.
    let (cut, input) = match data.split_first() {
        Some((&k, rest)) => (k as usize + 1, rest),
        None => (1, data),
    };
    let mut failed = false;
    for piece in input.chunks(cut * 7) {
        buf.extend_from_slice(piece);
        let r = c.recv(&mut buf, &mut events);
        assert!(!failed || events.is_empty(), "events after a connection error");
        failed |= r.is_err();
        for ev in events.drain(..) {
            match ev {
                Event::Request { id, request, .. } => {
                    let _ = request.finish(vcdn_http::h2::Body::Whole(0));
                    let block = vec![0x88; (id as usize * 131) % 20_000];
                    if c.send_headers(id, &block, false) {
                        c.send_data(id, &[b'x'; 70_000], true);
                    }
                }
                Event::TooLarge { id, .. } => {
                    c.send_headers(id, &[0x08, 3, b'4', b'3', b'1'], true);
                }
                Event::Data { id, data, .. } => c.release(id, data.len()),
                Event::Reset { .. } => {}
            }
        }
        assert!(c.active() <= 8, "over the concurrency limit");
        out.append(&mut c.out);
    }
    let mut at = 0;
    while at < out.len() {
        let h = frame::Head::parse(&out[at..]).expect("a whole frame header");
        assert!(h.len <= frame::DEFAULT_MAX_FRAME, "a frame over the maximum size");
        at += 9 + h.len;
        assert!(at <= out.len(), "a cut frame");
    }
});
