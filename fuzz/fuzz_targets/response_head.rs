//! Fuzz `vcdn_http::parse_response` and `ResponseHead::framing`.
//!
//! The whole input is the response bytes. Never panics; a successful parse
//! respects the limits, has a well-formed status line (matching `status` and
//! `minor_version`, no control character but HTAB in the reason phrase),
//! re-parses alone to the same head, and `framing` agrees with RFC 9112 §6.3
//! as the parser implements it. Prefixes are checked for the same incremental
//! consistency as in `request_head` (a complete head never depends on later
//! bytes, an error is never repaired by more bytes, a prefix shorter than a
//! complete head needs more bytes).
//!
//! Each input is parsed under the default `Limits`, a fixed tight set and a
//! tight set derived from the first byte.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use vcdn_http::response::ResponseFraming;
use vcdn_http::{parse_response, Limits, ParseError, ResponseHead};

type Parsed = Result<Option<(ResponseHead, usize)>, ParseError>;

const MAX_CR_SPLITS: usize = 32;

fn same_parse(a: &Parsed, b: &Parsed) -> bool {
    match (a, b) {
        (Ok(Some((ha, na))), Ok(Some((hb, nb)))) => {
            na == nb
                && ha.status == hb.status
                && ha.minor_version == hb.minor_version
                && ha.headers == hb.headers
        }
        (Ok(None), Ok(None)) => true,
        (Err(ea), Err(eb)) => ea == eb,
        _ => false,
    }
}

fn check_head(h: &ResponseHead, n: usize, input: &[u8], limits: &Limits) {
    assert!(n <= input.len(), "consumed {n} > input length {}", input.len());
    assert!(n >= 4 && &input[n - 4..n] == b"\r\n\r\n", "head does not end with CRLF CRLF: n={n}");
    assert!(n <= limits.max_head, "head of {n} bytes exceeds max_head {}", limits.max_head);
    assert!(h.headers.len() <= limits.max_headers, "{} fields > max_headers {}", h.headers.len(), limits.max_headers);
    assert!((100..=599).contains(&h.status), "status {}", h.status);
    assert!(h.minor_version <= 1, "minor version {}", h.minor_version);
    // The status line: `HTTP/1.x SP 3DIGIT [SP reason]`, matching the parsed
    // fields, and a reason phrase without control characters (HTAB allowed).
    let line_end = input.windows(2).position(|w| w == b"\r\n").expect("no CRLF in a parsed head");
    let line = &input[..line_end];
    assert!(line.len() >= 12 && line.starts_with(b"HTTP/1."), "malformed status line {line:?}");
    assert_eq!(line[7], b'0' + h.minor_version, "minor version does not match the status line");
    let digits = [h.status / 100, h.status / 10 % 10, h.status % 10].map(|d| b'0' + d as u8);
    assert_eq!(line[9..12], digits, "status does not match the status line");
    if let Some((&sp, reason)) = line[12..].split_first() {
        assert_eq!(sp, b' ', "no SP before the reason phrase");
        assert!(
            !reason.iter().any(|&c| (c < b' ' && c != b'\t') || c == 0x7f),
            "control character in reason phrase {reason:?}"
        );
    }
    for (name, value) in h.headers.iter() {
        assert!(!name.is_empty(), "empty header name");
        assert!(!name.iter().any(|&c| c == b':' || c <= b' ' || c >= 0x7f), "bad header name {name:?}");
        assert!(!value.iter().any(|&c| c == b'\r' || c == b'\n' || c == 0), "CR/LF/NUL in header value {value:?}");
    }

    assert_eq!(h.framing(true), Ok(ResponseFraming::Empty), "response to HEAD must have no body");
    let framing = h.framing(false);
    let te = h.headers.get_all(b"transfer-encoding").count();
    let cl = h.headers.get_all(b"content-length").count();
    if h.status < 200 || h.status == 204 || h.status == 304 {
        assert_eq!(framing, Ok(ResponseFraming::Empty), "status {} must have no body", h.status);
    } else {
        match framing {
            Ok(ResponseFraming::Empty) => panic!("status {} framed as Empty", h.status),
            Ok(ResponseFraming::Length(_)) => assert!(cl == 1 && te == 0, "Length with cl={cl} te={te}"),
            Ok(ResponseFraming::Chunked) => assert!(cl == 0 && te == 1, "Chunked with cl={cl} te={te}"),
            Ok(ResponseFraming::UntilClose) => assert!(cl == 0 && te == 0, "UntilClose with cl={cl} te={te}"),
            Err(_) => {}
        }
    }
    let _ = h.keep_alive();
    let _ = vcdn_http::reason(h.status);
}

fn check(data: &[u8], limits: &Limits) {
    let buf = Bytes::copy_from_slice(data);
    let full = parse_response(&buf, limits);

    let complete = match &full {
        Ok(Some((h, n))) => {
            let n = *n;
            check_head(h, n, data, limits);
            let alone = parse_response(&buf.slice(..n), limits);
            assert!(
                same_parse(&full, &alone),
                "re-parsing the first {n} bytes differs:\n full: {full:?}\n alone: {alone:?}"
            );
            Some(n)
        }
        _ => None,
    };

    let mut splits: Vec<usize> = Vec::with_capacity(MAX_CR_SPLITS + 3);
    if let Some(&b0) = data.first() {
        splits.push(b0 as usize * (data.len() + 1) / 256);
    }
    if let Some(n) = complete {
        splits.push(n - 1);
        splits.push(n);
    }
    splits.extend(
        data.iter()
            .enumerate()
            .filter(|&(_, &c)| c == b'\r')
            .map(|(i, _)| i + 1)
            .take(MAX_CR_SPLITS),
    );
    splits.sort_unstable();
    splits.dedup();

    for p in splits {
        if p >= data.len() {
            continue;
        }
        let prefix = parse_response(&buf.slice(..p), limits);
        match (&prefix, complete) {
            (_, Some(n)) if p >= n => assert!(
                same_parse(&prefix, &full),
                "prefix of {p} bytes holds the complete {n}-byte head but parses differently:\n \
                 prefix: {prefix:?}\n full: {full:?}"
            ),
            (_, Some(n)) => assert!(
                matches!(prefix, Ok(None)),
                "prefix of {p} bytes, shorter than the complete {n}-byte head, \
                 must need more bytes:\n prefix: {prefix:?}\n full: {full:?}"
            ),
            (Ok(Some(_)), None) => panic!(
                "prefix of {p} bytes parses but the whole input does not:\n \
                 prefix: {prefix:?}\n full: {full:?}"
            ),
            (Err(_), None) => assert!(
                full.is_err(),
                "prefix of {p} bytes is an error but the whole input is not:\n \
                 prefix: {prefix:?}\n full: {full:?}"
            ),
            (Ok(None), None) => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, &Limits::default());
    check(
        data,
        &Limits {
            max_request_line: 32,
            max_head: 96,
            max_headers: 4,
        },
    );
    let b = data.first().copied().unwrap_or(0) as usize;
    check(
        data,
        &Limits {
            max_request_line: 14 + (b & 0x3f),
            max_head: 20 + 2 * b,
            max_headers: b >> 5,
        },
    );
});
