//! The state machine against hand-made frames (header blocks of literal
//! fields without Huffman, as RFC 7541 §6.2.2 writes them).

use super::*;
use crate::h2::frame::*;

fn lit(out: &mut Vec<u8>, n: &str, v: &str) {
    out.push(0);
    assert!(n.len() < 127 && v.len() < 127);
    out.push(n.len() as u8);
    out.extend_from_slice(n.as_bytes());
    out.push(v.len() as u8);
    out.extend_from_slice(v.as_bytes());
}

fn block(method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    lit(&mut b, ":method", method);
    lit(&mut b, ":scheme", "http");
    lit(&mut b, ":authority", "test");
    lit(&mut b, ":path", path);
    for (n, v) in extra {
        lit(&mut b, n, v);
    }
    b
}

fn fr(ty: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    head(&mut out, payload.len(), ty, flags, id);
    out.extend_from_slice(payload);
    out
}

/// A connection past the preface and the client's SETTINGS.
fn open(cfg: Config) -> Connection {
    let mut c = Connection::new(cfg);
    let mut b = BytesMut::from(PREFACE);
    b.extend_from_slice(&fr(SETTINGS, 0, 0, &[]));
    let mut ev = Vec::new();
    c.recv(&mut b, &mut ev).unwrap();
    assert!(ev.is_empty());
    c.out.clear();
    c
}

fn feed(c: &mut Connection, bytes: &[u8]) -> (Result<(), Error>, Vec<Event>) {
    let mut b = BytesMut::from(bytes);
    let mut ev = Vec::new();
    let r = c.recv(&mut b, &mut ev);
    (r, ev)
}

/// The frames written, as (type, flags, stream, payload).
fn written(c: &mut Connection) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let out = std::mem::take(&mut c.out);
    let mut v = Vec::new();
    let mut at = 0;
    while let Some(h) = Head::parse(&out[at..]) {
        v.push((
            h.ty,
            h.flags,
            h.stream,
            out[at + 9..at + 9 + h.len].to_vec(),
        ));
        at += 9 + h.len;
    }
    assert_eq!(at, out.len());
    v
}

fn code(p: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(p[at..at + 4].try_into().unwrap())
}

/// The connection error's reason, checked against the GOAWAY written.
fn conn_error(c: &mut Connection, bytes: &[u8]) -> Reason {
    let (r, _) = feed(c, bytes);
    let e = r.expect_err("a connection error");
    let w = written(c);
    let g = w.iter().find(|f| f.0 == GOAWAY).expect("GOAWAY");
    assert_eq!(code(&g.3, 4), e.reason as u32);
    assert!(c.failed());
    e.reason
}

fn stream_error(c: &mut Connection, bytes: &[u8]) -> (u32, u32) {
    let (r, _) = feed(c, bytes);
    r.expect("no connection error");
    let w = written(c);
    let rst = w.iter().find(|f| f.0 == RST_STREAM).expect("RST_STREAM");
    (rst.2, code(&rst.3, 0))
}

#[test]
fn settings_go_first_and_the_client_preface_is_checked() {
    let mut c = Connection::new(Config::default());
    let w = written(&mut c);
    assert_eq!(w[0].0, SETTINGS);
    assert_eq!((w[1].0, w[1].2), (WINDOW_UPDATE, 0));
    // A preface in pieces is fine; a wrong one is not.
    let (r, _) = feed(&mut c, &PREFACE[..10]);
    assert!(r.is_ok() && c.awaiting_preface());
    let mut c = Connection::new(Config::default());
    c.out.clear();
    assert_eq!(
        conn_error(&mut c, b"GET / HTTP/1.1\r\n"),
        Reason::ProtocolError
    );
    // The first frame must be SETTINGS.
    let mut c = Connection::new(Config::default());
    c.out.clear();
    let mut b = PREFACE.to_vec();
    b.extend_from_slice(&fr(PING, 0, 0, &[0; 8]));
    assert_eq!(conn_error(&mut c, &b), Reason::ProtocolError);
}

#[test]
fn a_request_becomes_an_event_and_its_answer_frames() {
    let mut c = open(Config::default());
    let (r, ev) = feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block("GET", "/a", &[]),
        ),
    );
    r.unwrap();
    let Event::Request {
        id: 1,
        request,
        end_stream: true,
    } = &ev[0]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(
        String::from_utf8(request.clone().finish(crate::h2::Body::Whole(0))).unwrap(),
        "GET /a HTTP/1.1\r\nhost: test\r\n\r\n"
    );
    assert!(c.send_headers(1, &[0x88], false));
    assert_eq!(c.send_data(1, b"hello", true), 5);
    assert_eq!(c.active(), 0, "closed both ways");
    let w = written(&mut c);
    assert_eq!(w[0], (HEADERS, END_HEADERS, 1, vec![0x88]));
    assert_eq!(w[1], (DATA, END_STREAM, 1, b"hello".to_vec()));
    assert!(!c.send_headers(1, &[0x88], true), "the stream is gone");
}

#[test]
fn frame_errors_have_their_codes() {
    let cases: Vec<(Vec<u8>, Reason)> = vec![
        (fr(DATA, 0, 0, b"x"), Reason::ProtocolError),
        (fr(DATA, 0, 1, b"x"), Reason::ProtocolError), // idle stream
        (fr(HEADERS, END_HEADERS, 0, &[]), Reason::ProtocolError),
        (fr(HEADERS, END_HEADERS, 2, &[]), Reason::ProtocolError),
        (fr(RST_STREAM, 0, 1, &[0; 4]), Reason::ProtocolError),
        (fr(RST_STREAM, 0, 0, &[0; 4]), Reason::ProtocolError),
        (fr(SETTINGS, 0, 1, &[]), Reason::ProtocolError),
        (fr(SETTINGS, 0, 0, &[0; 5]), Reason::FrameSizeError),
        (fr(SETTINGS, ACK, 0, &[0; 6]), Reason::FrameSizeError),
        (
            fr(SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 2]),
            Reason::ProtocolError,
        ),
        (
            fr(SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0]),
            Reason::FlowControlError,
        ),
        (
            fr(SETTINGS, 0, 0, &[0, 5, 0, 0, 0, 1]),
            Reason::ProtocolError,
        ),
        (fr(PING, 0, 0, &[0; 7]), Reason::FrameSizeError),
        (fr(PING, 0, 1, &[0; 8]), Reason::ProtocolError),
        (
            fr(PUSH_PROMISE, END_HEADERS, 1, &[0; 4]),
            Reason::ProtocolError,
        ),
        (fr(GOAWAY, 0, 1, &[0; 8]), Reason::ProtocolError),
        (fr(WINDOW_UPDATE, 0, 0, &[0; 4]), Reason::ProtocolError),
        (fr(WINDOW_UPDATE, 0, 0, &[0; 3]), Reason::FrameSizeError),
        (
            fr(WINDOW_UPDATE, 0, 1, &[0, 0, 0, 1]),
            Reason::ProtocolError,
        ),
        (fr(CONTINUATION, END_HEADERS, 1, &[]), Reason::ProtocolError),
        (fr(DATA, 0, 1, &vec![0; 16_385]), Reason::FrameSizeError),
    ];
    for (bytes, want) in cases {
        let mut c = open(Config::default());
        assert_eq!(conn_error(&mut c, &bytes), want, "{:?}", &bytes[..9]);
    }
    // Padding as long as the frame.
    let mut c = open(Config::default());
    let mut b = fr(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &block("GET", "/", &[]),
    );
    b.extend_from_slice(&fr(DATA, PADDED, 1, &[3, 0, 0]));
    assert_eq!(conn_error(&mut c, &b), Reason::ProtocolError);
    // An HPACK block that does not decode.
    let mut c = open(Config::default());
    assert_eq!(
        conn_error(&mut c, &fr(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff])),
        Reason::CompressionError
    );
    // Unknown frame types are ignored.
    let mut c = open(Config::default());
    let (r, ev) = feed(&mut c, &fr(0xfa, 0, 0, b"whatever"));
    assert!(r.is_ok() && ev.is_empty());
}

#[test]
fn stream_states_are_enforced() {
    // A new stream below the last one; HEADERS on a closed stream.
    let mut c = open(Config::default());
    let mut b = fr(
        HEADERS,
        END_HEADERS | END_STREAM,
        5,
        &block("GET", "/", &[]),
    );
    b.extend_from_slice(&fr(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &block("GET", "/", &[]),
    ));
    assert_eq!(conn_error(&mut c, &b), Reason::StreamClosed);
    // DATA on a half-closed (remote) stream: STREAM_CLOSED on the stream.
    let mut c = open(Config::default());
    let mut b = fr(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &block("GET", "/", &[]),
    );
    b.extend_from_slice(&fr(DATA, 0, 1, b"x"));
    assert_eq!(stream_error(&mut c, &b), (1, Reason::StreamClosed as u32));
    // A stream that depends on itself.
    let mut c = open(Config::default());
    let mut p = vec![0, 0, 0, 1, 16];
    p.extend_from_slice(&block("GET", "/", &[]));
    let b = fr(HEADERS, END_HEADERS | END_STREAM | PRIORITY_FLAG, 1, &p);
    assert_eq!(stream_error(&mut c, &b), (1, Reason::ProtocolError as u32));
    // PRIORITY of the wrong size: a stream error; a good one is ignored.
    let mut c = open(Config::default());
    assert_eq!(
        stream_error(&mut c, &fr(PRIORITY, 0, 3, &[0; 4])),
        (3, Reason::FrameSizeError as u32)
    );
    let mut c = open(Config::default());
    let (r, ev) = feed(&mut c, &fr(PRIORITY, 0, 3, &[0, 0, 0, 0, 16]));
    assert!(r.is_ok() && ev.is_empty() && c.out.is_empty());
    // Malformed requests: PROTOCOL_ERROR on the stream.
    for extra in [("connection", "close"), ("te", "gzip"), ("Upper", "x")] {
        let mut c = open(Config::default());
        let b = fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block("GET", "/", &[extra]),
        );
        assert_eq!(stream_error(&mut c, &b), (1, Reason::ProtocolError as u32));
    }
    // Trailers without END_STREAM.
    let mut c = open(Config::default());
    let mut b = fr(HEADERS, END_HEADERS, 1, &block("POST", "/", &[]));
    let mut t = Vec::new();
    lit(&mut t, "x-trailer", "1");
    b.extend_from_slice(&fr(HEADERS, END_HEADERS, 1, &t));
    assert_eq!(conn_error(&mut c, &b), Reason::ProtocolError);
}

#[test]
fn content_length_must_match_the_data() {
    let mut c = open(Config::default());
    let mut b = fr(
        HEADERS,
        END_HEADERS,
        1,
        &block("POST", "/", &[("content-length", "5")]),
    );
    b.extend_from_slice(&fr(DATA, 0, 1, b"abc"));
    b.extend_from_slice(&fr(DATA, END_STREAM, 1, b"d"));
    let (r, ev) = feed(&mut c, &b);
    r.unwrap();
    assert!(
        matches!(ev.last(), Some(Event::Reset { id: 1, .. })),
        "{ev:?}"
    );
    let w = written(&mut c);
    assert_eq!(code(&w.last().unwrap().3, 0), Reason::ProtocolError as u32);
    // Right: data events, the last with end.
    let mut c = open(Config::default());
    let mut b = fr(
        HEADERS,
        END_HEADERS,
        1,
        &block("POST", "/", &[("content-length", "4")]),
    );
    b.extend_from_slice(&fr(DATA, PADDED, 1, &[2, b'a', b'b', b'c', 0, 0]));
    b.extend_from_slice(&fr(DATA, END_STREAM, 1, b"d"));
    let (r, ev) = feed(&mut c, &b);
    r.unwrap();
    assert_eq!(
        ev[1..],
        [
            Event::Data {
                id: 1,
                data: Bytes::from_static(b"abc"),
                end: false
            },
            Event::Data {
                id: 1,
                data: Bytes::from_static(b"d"),
                end: true
            }
        ]
    );
}

#[test]
fn flow_control_both_ways() {
    let cfg = Config {
        stream_window: 65_535,
        connection_window: 65_535,
        ..Config::default()
    };
    // Receiving: more than the stream window is FLOW_CONTROL_ERROR.
    let mut c = open(Config {
        connection_window: 1 << 20,
        ..cfg.clone()
    });
    let mut b = fr(HEADERS, END_HEADERS, 1, &block("POST", "/", &[]));
    for _ in 0..3 {
        b.extend_from_slice(&fr(DATA, 0, 1, &[0; 16_384]));
    }
    b.extend_from_slice(&fr(DATA, 0, 1, &[0; 16_383]));
    let (r, _) = feed(&mut c, &b);
    r.unwrap();
    c.out.clear();
    assert_eq!(
        stream_error(&mut c, &fr(DATA, 0, 1, &[0; 16])),
        (1, Reason::FlowControlError as u32)
    );
    // The connection window: over it is a connection error.
    let mut c = open(cfg.clone());
    let mut b = Vec::new();
    for id in [1, 3] {
        b.extend_from_slice(&fr(HEADERS, END_HEADERS, id, &block("POST", "/", &[])));
        for _ in 0..2 {
            b.extend_from_slice(&fr(DATA, 0, id, &[0; 16_384]));
        }
    }
    b.extend_from_slice(&fr(DATA, 0, 3, &[0; 16]));
    assert_eq!(conn_error(&mut c, &b), Reason::FlowControlError);
    // Released bytes come back as WINDOW_UPDATEs once half a window.
    let mut c = open(cfg.clone());
    let mut b = fr(HEADERS, END_HEADERS, 1, &block("POST", "/", &[]));
    b.extend_from_slice(&fr(DATA, 0, 1, &[0; 16_384]));
    b.extend_from_slice(&fr(DATA, 0, 1, &[0; 16_384]));
    feed(&mut c, &b).0.unwrap();
    c.release(1, 32_768);
    let w = written(&mut c);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w
        .iter()
        .all(|f| f.0 == WINDOW_UPDATE && code(&f.3, 0) == 32_768));

    // Sending: the peer's windows bound DATA; WINDOW_UPDATE and SETTINGS
    // move them; overflow is an error.
    let mut c = open(cfg.clone());
    feed(&mut c, &fr(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]))
        .0
        .unwrap();
    feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block("GET", "/", &[]),
        ),
    )
    .0
    .unwrap();
    c.out.clear();
    assert_eq!(c.capacity(1), 10);
    assert_eq!(c.send_data(1, &[1; 25], true), 10);
    assert_eq!(c.capacity(1), 0);
    assert_eq!(c.send_data(1, &[1; 15], true), 0);
    feed(&mut c, &fr(WINDOW_UPDATE, 0, 1, &[0, 0, 0, 5]))
        .0
        .unwrap();
    assert_eq!(c.capacity(1), 5);
    feed(&mut c, &fr(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 20]))
        .0
        .unwrap();
    assert_eq!(c.capacity(1), 15);
    assert_eq!(c.send_data(1, &[1; 15], true), 15);
    assert!(!c.can_send(1));
    let mut c = open(cfg.clone());
    feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block("GET", "/", &[]),
        ),
    )
    .0
    .unwrap();
    c.out.clear();
    assert_eq!(
        stream_error(&mut c, &fr(WINDOW_UPDATE, 0, 1, &[0x7f, 0xff, 0xff, 0xff])),
        (1, Reason::FlowControlError as u32)
    );
    let mut c = open(cfg);
    assert_eq!(
        conn_error(&mut c, &fr(WINDOW_UPDATE, 0, 0, &[0x7f, 0xff, 0xff, 0xff])),
        Reason::FlowControlError
    );
}

#[test]
fn header_blocks_join_across_continuation_and_are_bounded() {
    let mut c = open(Config::default());
    let blk = block("GET", "/joined", &[("x-a", "1")]);
    let (a, rest) = blk.split_at(5);
    let (b, d) = rest.split_at(7);
    let mut bytes = fr(HEADERS, END_STREAM, 1, a);
    bytes.extend_from_slice(&fr(CONTINUATION, 0, 1, b));
    bytes.extend_from_slice(&fr(CONTINUATION, END_HEADERS, 1, d));
    let (r, ev) = feed(&mut c, &bytes);
    r.unwrap();
    assert!(matches!(&ev[0], Event::Request { id: 1, request, .. }
        if request.head.starts_with(b"GET /joined HTTP/1.1\r\n")));
    // Another frame inside a block.
    let mut c = open(Config::default());
    let mut bytes = fr(HEADERS, END_STREAM, 1, a);
    bytes.extend_from_slice(&fr(PING, 0, 0, &[0; 8]));
    assert_eq!(conn_error(&mut c, &bytes), Reason::ProtocolError);
    // A CONTINUATION of another stream.
    let mut c = open(Config::default());
    let mut bytes = fr(HEADERS, END_STREAM, 1, a);
    bytes.extend_from_slice(&fr(CONTINUATION, END_HEADERS, 3, b));
    assert_eq!(conn_error(&mut c, &bytes), Reason::ProtocolError);
    // A flood: many empty CONTINUATIONs, or too many bytes.
    let mut c = open(Config::default());
    let mut bytes = fr(HEADERS, END_STREAM, 1, a);
    for _ in 0..100 {
        bytes.extend_from_slice(&fr(CONTINUATION, 0, 1, &[]));
    }
    assert_eq!(conn_error(&mut c, &bytes), Reason::EnhanceYourCalm);
    let mut c = open(Config {
        max_header_list: 4096,
        ..Config::default()
    });
    let mut bytes = fr(HEADERS, END_STREAM, 1, a);
    for _ in 0..3 {
        bytes.extend_from_slice(&fr(CONTINUATION, 0, 1, &[0; 10_000]));
    }
    assert_eq!(conn_error(&mut c, &bytes), Reason::EnhanceYourCalm);
    // A list over the limit that fits the block bound: TooLarge (431).
    let mut c = open(Config {
        max_header_list: 100,
        ..Config::default()
    });
    let big = "v".repeat(100);
    let (r, ev) = feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block("GET", "/", &[("x-big", &big)]),
        ),
    );
    r.unwrap();
    assert_eq!(
        ev,
        [Event::TooLarge {
            id: 1,
            end_stream: true
        }]
    );
    assert!(c.can_send(1));
}

#[test]
fn streams_over_the_limit_are_refused_and_resets_are_bounded() {
    let mut c = open(Config {
        max_concurrent_streams: 2,
        ..Config::default()
    });
    let mut b = Vec::new();
    for id in [1, 3, 5] {
        b.extend_from_slice(&fr(HEADERS, END_HEADERS, id, &block("POST", "/", &[])));
    }
    assert_eq!(stream_error(&mut c, &b), (5, Reason::RefusedStream as u32));
    assert_eq!(c.active(), 2);
    // A stream the client resets is gone, with an event.
    let (r, ev) = feed(&mut c, &fr(RST_STREAM, 0, 1, &[0, 0, 0, 8]));
    r.unwrap();
    assert_eq!(
        ev,
        [Event::Reset {
            id: 1,
            by_client: true
        }]
    );
    assert!(!c.can_send(1));

    // Rapid reset within one read.
    let mut c = open(Config::default());
    let mut b = Vec::new();
    for i in 0..30u32 {
        let id = 1 + 2 * i;
        b.extend_from_slice(&fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &block("GET", "/", &[]),
        ));
        b.extend_from_slice(&fr(RST_STREAM, 0, id, &[0, 0, 0, 8]));
    }
    assert_eq!(conn_error(&mut c, &b), Reason::EnhanceYourCalm);
    // Paced: resets of answered streams, one read each.
    let mut c = open(Config {
        max_client_resets: 10,
        ..Config::default()
    });
    let mut err = None;
    for i in 0..30u32 {
        let id = 1 + 2 * i;
        let (r, _) = feed(
            &mut c,
            &fr(
                HEADERS,
                END_HEADERS | END_STREAM,
                id,
                &block("GET", "/", &[]),
            ),
        );
        r.unwrap();
        c.send_headers(id, &[0x88], true);
        if let Err(e) = feed(&mut c, &fr(RST_STREAM, 0, id, &[0, 0, 0, 8])).0 {
            err = Some((i, e.reason));
            break;
        }
    }
    assert_eq!(err, Some((10, Reason::EnhanceYourCalm)));
}

#[test]
fn goaway_stops_new_streams_and_names_the_last() {
    let mut c = open(Config::default());
    feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            7,
            &block("GET", "/", &[]),
        ),
    )
    .0
    .unwrap();
    c.out.clear();
    c.goaway(Reason::NoError, "");
    let w = written(&mut c);
    assert_eq!(w[0].0, GOAWAY);
    assert_eq!((code(&w[0].3, 0), code(&w[0].3, 4)), (7, 0));
    assert!(c.going_away() && !c.failed());
    let (r, ev) = feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            9,
            &block("GET", "/", &[]),
        ),
    );
    assert!(r.is_ok() && ev.is_empty(), "{ev:?}");
    assert!(c.can_send(7), "open streams finish");
}

#[test]
fn pings_are_answered_and_large_header_blocks_are_split() {
    let mut c = open(Config::default());
    feed(&mut c, &fr(PING, 0, 0, b"12345678")).0.unwrap();
    assert_eq!(written(&mut c), [(PING, ACK, 0, b"12345678".to_vec())]);
    feed(
        &mut c,
        &fr(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &block("GET", "/", &[]),
        ),
    )
    .0
    .unwrap();
    assert!(c.send_headers(1, &vec![0; 20_000], true));
    let w = written(&mut c);
    assert_eq!(
        (w[0].0, w[0].1, w[0].3.len()),
        (HEADERS, END_STREAM, 16_384)
    );
    assert_eq!(
        (w[1].0, w[1].1, w[1].3.len()),
        (CONTINUATION, END_HEADERS, 3_616)
    );
}

/// Valid exchanges with random bytes flipped, cut into random reads: never
/// a panic, the output is whole frames, the stream limit holds (the fuzz
/// target `h2_core` does this at scale).
#[test]
fn mangled_input_never_panics_and_the_output_stays_framed() {
    let mut good = Vec::new();
    good.extend_from_slice(&fr(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 100]));
    for id in [1u32, 3, 5, 7] {
        good.extend_from_slice(&fr(
            HEADERS,
            END_HEADERS,
            id,
            &block("POST", "/x", &[("content-length", "3")]),
        ));
        good.extend_from_slice(&fr(DATA, END_STREAM, id, b"abc"));
        good.extend_from_slice(&fr(WINDOW_UPDATE, 0, id, &[0, 0, 1, 0]));
        good.extend_from_slice(&fr(RST_STREAM, 0, id, &[0, 0, 0, 8]));
    }
    good.extend_from_slice(&fr(PING, 0, 0, &[7; 8]));
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..3000 {
        let mut input = good.clone();
        for _ in 0..(next() % 6) {
            let at = (next() as usize) % input.len();
            input[at] = next() as u8;
        }
        let mut c = open(Config {
            max_concurrent_streams: 3,
            ..Config::default()
        });
        let mut buf = BytesMut::new();
        let mut ev = Vec::new();
        let mut rest = &input[..];
        while !rest.is_empty() {
            let n = 1 + (next() as usize) % rest.len();
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            let _ = c.recv(&mut buf, &mut ev);
            for e in ev.drain(..) {
                if let Event::Request { id, .. } = e {
                    if c.send_headers(id, &[0x88], false) {
                        c.send_data(id, &[1; 100], true);
                    }
                }
            }
            assert!(c.active() <= 3);
        }
        written(&mut c);
    }
}

#[test]
fn a_lowered_header_table_size_is_acknowledged_in_the_next_block() {
    let mut c = open(Config::default());
    feed(&mut c, &fr(SETTINGS, 0, 0, &[0, 1, 0, 0, 0, 0]))
        .0
        .unwrap();
    for id in [1, 3] {
        feed(
            &mut c,
            &fr(
                HEADERS,
                END_HEADERS | END_STREAM,
                id,
                &block("GET", "/", &[]),
            ),
        )
        .0
        .unwrap();
        c.send_headers(id, &[0x88], true);
    }
    let w = written(&mut c);
    let heads: Vec<_> = w
        .iter()
        .filter(|f| f.0 == HEADERS)
        .map(|f| f.3.clone())
        .collect();
    assert_eq!(heads, [vec![0x20, 0x88], vec![0x88]]);
}
