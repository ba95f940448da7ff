//! Fuzz `vcdn_http::parse_request`.
//!
//! The whole input is the request bytes. Besides "never panics", every parse
//! is checked against invariants that any correct incremental parser keeps:
//!
//! * `Ok(Some((head, n)))` has `n <= input.len()`, respects the limits, and
//!   re-parsing the first `n` bytes alone gives the same head and `n`.
//! * Prefix consistency (bytes arriving in two reads): for a prefix `p` of
//!   the input, with `F = parse(input)` and `P = parse(p)`:
//!   - `P = Ok(Some((h, n)))`  =>  `F = Ok(Some((h, n)))` (a complete head
//!     never depends on bytes after it);
//!   - `P = Err(_)`            =>  `F = Err(_)` (more bytes never repair an
//!     error; the error kind may differ, e.g. "bare LF" vs "invalid method");
//!   - `F = Ok(Some((_, n)))` and `p.len() < n`  =>  `P = Ok(None)`;
//!   - `F = Ok(Some((_, n)))` and `p.len() >= n` =>  `P = F`.
//!   `P = Ok(None)` is always allowed, whatever `F` is.
//!
//! Prefix lengths checked: one derived from the first byte, `n - 1` and `n`
//! when the whole input parses, and every length that ends just after a CR
//! (a read boundary between CR and LF is where off-by-one bugs live).
//!
//! Each input is parsed under three `Limits`: the defaults, a fixed tight set
//! and a tight set derived from the first byte, so that the limit checks can
//! be reached with short inputs.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use vcdn_http::{parse_request, BodyFraming, Limits, Method, ParseError, RequestHead};

type Parsed = Result<Option<(RequestHead, usize)>, ParseError>;

/// At most this many CR-boundary prefixes per input and limit set.
const MAX_CR_SPLITS: usize = 32;

fn method_of(raw: &[u8]) -> Method {
    match raw {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        b"POST" => Method::Post,
        b"PUT" => Method::Put,
        b"DELETE" => Method::Delete,
        b"PATCH" => Method::Patch,
        b"OPTIONS" => Method::Options,
        b"TRACE" => Method::Trace,
        b"CONNECT" => Method::Connect,
        _ => Method::Other,
    }
}

fn same_head(a: &RequestHead, b: &RequestHead) -> bool {
    a.method == b.method
        && a.method_raw == b.method_raw
        && a.target == b.target
        && a.minor_version == b.minor_version
        && a.headers == b.headers
        && a.body == b.body
        && a.keep_alive == b.keep_alive
        && a.expect_continue == b.expect_continue
}

fn same_parse(a: &Parsed, b: &Parsed) -> bool {
    match (a, b) {
        (Ok(Some((ha, na))), Ok(Some((hb, nb)))) => na == nb && same_head(ha, hb),
        (Ok(None), Ok(None)) => true,
        (Err(ea), Err(eb)) => ea == eb,
        _ => false,
    }
}

/// Properties of one successful parse that follow from the parser's contract.
fn check_head(h: &RequestHead, n: usize, input: &[u8], limits: &Limits) {
    assert!(n <= input.len(), "consumed {n} > input length {}", input.len());
    assert!(n >= 4 && &input[n - 4..n] == b"\r\n\r\n", "head does not end with CRLF CRLF: n={n}");
    // Up to 4 leading empty lines (8 bytes) are skipped before the limit applies.
    assert!(n <= limits.max_head + 8, "head of {n} bytes exceeds max_head {}", limits.max_head);
    assert!(h.headers.len() <= limits.max_headers, "{} fields > max_headers {}", h.headers.len(), limits.max_headers);
    let line_len = h.method_raw.len() + 1 + h.target.len() + 1 + 8;
    assert!(line_len <= limits.max_request_line, "request line {line_len} > max {}", limits.max_request_line);
    assert_eq!(h.method, method_of(&h.method_raw), "method does not match method_raw");
    assert_ne!(h.method, Method::Connect, "CONNECT accepted");
    assert!(!h.target.is_empty(), "empty target");
    assert!(h.target.iter().all(|&c| c > b' ' && c != 0x7f), "bad byte in target");
    assert!(h.minor_version <= 1, "minor version {}", h.minor_version);
    for (name, value) in h.headers.iter() {
        assert!(!name.is_empty(), "empty header name");
        assert!(!name.iter().any(|&c| c == b':' || c <= b' ' || c >= 0x7f), "bad header name {name:?}");
        assert!(!value.iter().any(|&c| c == b'\r' || c == b'\n' || c == 0), "CR/LF/NUL in header value {value:?}");
        assert!(value.first().map_or(true, |&c| c != b' ' && c != b'\t'), "untrimmed header value {value:?}");
        assert!(value.last().map_or(true, |&c| c != b' ' && c != b'\t'), "untrimmed header value {value:?}");
    }
    let te = h.headers.get_all(b"transfer-encoding").count();
    let cl = h.headers.get_all(b"content-length").count();
    assert!(!(te > 0 && cl > 0), "both Transfer-Encoding and Content-Length accepted");
    assert!(cl <= 1, "duplicate Content-Length accepted");
    match h.body {
        BodyFraming::Chunked => {
            assert_eq!(h.minor_version, 1, "chunked in HTTP/1.0");
            assert_eq!(te, 1, "Chunked without exactly one Transfer-Encoding");
        }
        BodyFraming::Length(len) => {
            assert!(len > 0, "Length(0) instead of None");
            assert_eq!(cl, 1, "Length without Content-Length");
        }
        BodyFraming::None => assert_eq!(te, 0, "Transfer-Encoding ignored"),
    }
    if h.minor_version == 1 {
        assert_eq!(h.headers.get_all(b"host").count(), 1, "HTTP/1.1 without exactly one Host");
    }
    // Accessors must not panic.
    let _ = h.path();
    let _ = h.path_and_query();
    let _ = h.method.is_safe();
    let _ = h.method.is_idempotent();
}

fn check(data: &[u8], limits: &Limits) {
    let buf = Bytes::copy_from_slice(data);
    let full = parse_request(&buf, limits);

    let complete = match &full {
        Ok(Some((h, n))) => {
            let n = *n;
            check_head(h, n, data, limits);
            // The head is self-contained: its own bytes parse to the same head.
            let alone = parse_request(&buf.slice(..n), limits);
            assert!(
                same_parse(&full, &alone),
                "re-parsing the first {n} bytes differs:\n full: {full:?}\n alone: {alone:?}"
            );
            Some(n)
        }
        _ => None,
    };

    // Prefix lengths to try.
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
        let prefix = parse_request(&buf.slice(..p), limits);
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
