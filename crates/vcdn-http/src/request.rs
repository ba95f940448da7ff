//! Strict HTTP/1.1 request-head parser (RFC 9112), pure and fuzzable.
//!
//! It reads only what a CDN edge must accept and rejects, with the status a
//! client can act on, everything that could make two parsers disagree about
//! where a message ends (request smuggling): Content-Length together with
//! Transfer-Encoding, duplicate or malformed lengths, obs-fold, bare CR or LF.

use bytes::Bytes;

use crate::header::{find_crlf, is_tchar, is_token, trim_ows, Headers};
use crate::ParseError;

/// Limits applied while parsing a request head. The defaults are those of
/// common servers: 8 KiB request line, 32 KiB head, 100 fields.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_line: usize,
    pub max_head: usize,
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: 8 * 1024,
            max_head: 32 * 1024,
            max_headers: 100,
        }
    }
}

/// Request methods vcdn distinguishes; every other token is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Patch,
    Options,
    Trace,
    Connect,
    Other,
}

impl Method {
    fn from_bytes(b: &[u8]) -> Method {
        match b {
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

    /// Safe methods (RFC 9110 §9.2.1) never change the origin's state, so a
    /// cache may answer them; all others pass through and invalidate.
    pub fn is_safe(self) -> bool {
        matches!(
            self,
            Method::Get | Method::Head | Method::Options | Method::Trace
        )
    }

    /// Idempotent methods may be retried once on a failed upstream connection.
    pub fn is_idempotent(self) -> bool {
        self.is_safe() || matches!(self, Method::Put | Method::Delete)
    }
}

/// How the request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A parsed request head. `raw` holds the bytes; fields are slices of it.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: Method,
    pub method_raw: Bytes,
    pub target: Bytes,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    pub headers: Headers,
    pub body: BodyFraming,
    /// Whether the connection stays open after this exchange.
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// Where the target's path and query are (see [`OriginForm`]).
    origin_form: OriginForm,
}

/// Where the path and query of a request target are, worked out once by the
/// parser so that nobody has to slice them out of the target again (a slice
/// that is not part of the target, such as a static "/", cannot be taken
/// with `Bytes::slice_ref`: that was the panic of issue 15).
#[derive(Debug, Clone, PartialEq, Eq)]
enum OriginForm {
    /// `target[start..]`: an origin-form target (start 0), `*`, or an
    /// absolute-form target that has a path.
    InTarget {
        start: usize,
        authority: (usize, usize),
    },
    /// An absolute-form target with an empty path: "/" followed by its
    /// query, if any (RFC 9112 §3.2.2, RFC 3986 §6.2.3), made by the parser.
    Made {
        pq: Bytes,
        authority: (usize, usize),
    },
}

impl RequestHead {
    /// The path and query of the target (origin-form), also for an
    /// absolute-form target (`http://host/path`; `http://host?q` is `/?q`).
    pub fn path_and_query(&self) -> &[u8] {
        match &self.origin_form {
            OriginForm::InTarget { start, .. } => &self.target[*start..],
            OriginForm::Made { pq, .. } => pq,
        }
    }

    /// [`RequestHead::path_and_query`] as shared bytes, to keep (a cache
    /// key, the target sent upstream) without copying.
    pub fn origin_form(&self) -> Bytes {
        match &self.origin_form {
            OriginForm::InTarget { start: 0, .. } => self.target.clone(),
            OriginForm::InTarget { start, .. } => self.target.slice(*start..),
            OriginForm::Made { pq, .. } => pq.clone(),
        }
    }

    /// The authority the request is for: that of an absolute-form target,
    /// which wins over the Host field (RFC 9112 §3.2.2), else the Host
    /// field (empty when there is none, as in HTTP/1.0 without Host).
    pub fn authority(&self) -> &[u8] {
        let (OriginForm::InTarget { authority, .. } | OriginForm::Made { authority, .. }) =
            &self.origin_form;
        if authority.1 > authority.0 {
            return &self.target[authority.0..authority.1];
        }
        self.headers.get(b"host").map_or(&b""[..], |h| &h[..])
    }

    /// The path without the query.
    pub fn path(&self) -> &[u8] {
        let pq = self.path_and_query();
        match pq.iter().position(|&c| c == b'?') {
            Some(i) => &pq[..i],
            None => pq,
        }
    }
}

/// Split a request target into where its path starts and its authority.
///
/// A `#fragment` is rejected rather than stripped: it is not part of any
/// request-target form (RFC 9112 §3.2; RFC 9110 §7.1 says user agents
/// never send it), so a target carrying one comes from a broken or hostile
/// client. Stripping it would make two targets that differ on the wire
/// one cache key, and forwarding it would make the origin see a URI no
/// other server would; a 400 is the one answer every hop agrees on.
fn split_target(target: &[u8], method: Method) -> Result<OriginForm, ParseError> {
    if target.contains(&b'#') {
        return Err(ParseError::BadRequest("fragment (#) in request target"));
    }
    if target[0] == b'/' || (method == Method::Options && target == b"*") {
        return Ok(OriginForm::InTarget {
            start: 0,
            authority: (0, 0),
        });
    }
    let scheme = if target.starts_with(b"http://") {
        7
    } else if target.starts_with(b"https://") {
        8
    } else {
        return Err(ParseError::BadRequest("invalid request target"));
    };
    let rest = &target[scheme..];
    let end = rest
        .iter()
        .position(|&c| c == b'/' || c == b'?')
        .unwrap_or(rest.len());
    let auth = &rest[..end];
    // RFC 9110 §4.2.1: an http URI has a non-empty host; §4.2.4: userinfo
    // from an untrusted source is an error.
    if auth.contains(&b'@') {
        return Err(ParseError::BadRequest("userinfo in request target"));
    }
    if auth.is_empty() || auth[0] == b':' || !valid_host(auth) {
        return Err(ParseError::BadRequest(
            "invalid authority in request target",
        ));
    }
    let authority = (scheme, scheme + end);
    let start = scheme + end;
    match rest.get(end) {
        Some(b'/') => Ok(OriginForm::InTarget { start, authority }),
        Some(_) => {
            let mut pq = Vec::with_capacity(1 + target.len() - start);
            pq.push(b'/');
            pq.extend_from_slice(&target[start..]);
            Ok(OriginForm::Made {
                pq: Bytes::from(pq),
                authority,
            })
        }
        None => Ok(OriginForm::Made {
            pq: Bytes::from_static(b"/"),
            authority,
        }),
    }
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a reg-name,
/// an IPv4 address or a bracketed IP literal, then an optional decimal port
/// up to 65535. An empty value is allowed (a Host for a URI without one).
pub fn valid_host(v: &[u8]) -> bool {
    let (host, port) = if v.first() == Some(&b'[') {
        let Some(close) = v.iter().position(|&c| c == b']') else {
            return false;
        };
        let inner = &v[1..close];
        if inner.is_empty()
            || !inner
                .iter()
                .all(|&c| is_unreserved_or_sub_delim(c) || c == b':')
        {
            return false;
        }
        (&[][..], &v[close + 1..])
    } else {
        match v.iter().position(|&c| c == b':') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, &[][..]),
        }
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => {
            digits.len() <= 5
                && digits.iter().all(u8::is_ascii_digit)
                && digits
                    .iter()
                    .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'))
                    <= 65535
        }
        _ => false,
    };
    port_ok && valid_reg_name(host)
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`, which also
/// covers IPv4 addresses.
fn valid_reg_name(h: &[u8]) -> bool {
    let mut i = 0;
    while i < h.len() {
        match h[i] {
            b'%' => {
                if !(h.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && h.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
                {
                    return false;
                }
                i += 3;
            }
            c if is_unreserved_or_sub_delim(c) => i += 1,
            _ => return false,
        }
    }
    true
}

/// `unreserved / sub-delims` (RFC 3986 §2.2, §2.3) as a table: every
/// request's Host is checked, one lookup per byte.
const UNRESERVED_OR_SUB_DELIM: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        c += 1;
    }
    t
};

fn is_unreserved_or_sub_delim(c: u8) -> bool {
    UNRESERVED_OR_SUB_DELIM[c as usize]
}

/// Parse one request head from the start of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((head, n)))` with
/// the number of bytes consumed, or the error to answer with.
pub fn parse_request(
    buf: &Bytes,
    limits: &Limits,
) -> Result<Option<(RequestHead, usize)>, ParseError> {
    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before
    // the request-line; we ignore a few.
    let mut start = 0;
    while buf.len() >= start + 2 && &buf[start..start + 2] == b"\r\n" && start < 8 {
        start += 2;
    }
    let line_end = match find_crlf(&buf[start..]) {
        Some(i) => start + i,
        None => {
            let rest = &buf[start..];
            if rest.contains(&b'\n') {
                return Err(ParseError::BadRequest("bare LF in request line"));
            }
            // A trailing CR may be the start of the CRLF: not line content.
            if rest.len() - usize::from(rest.last() == Some(&b'\r')) > limits.max_request_line {
                return Err(ParseError::UriTooLong);
            }
            return Ok(None);
        }
    };
    if line_end - start > limits.max_request_line {
        return Err(ParseError::UriTooLong);
    }
    let line = &buf[start..line_end];
    let sp1 = line
        .iter()
        .position(|&c| c == b' ')
        .ok_or(ParseError::BadRequest("malformed request line"))?;
    let method_b = &line[..sp1];
    if !is_token(method_b) {
        return Err(ParseError::BadRequest("invalid method"));
    }
    let rest = &line[sp1 + 1..];
    let sp2 = rest
        .iter()
        .rposition(|&c| c == b' ')
        .ok_or(ParseError::BadRequest("malformed request line"))?;
    let target_b = &rest[..sp2];
    let version_b = &rest[sp2 + 1..];
    if target_b.is_empty() || target_b.iter().any(|&c| c <= b' ' || c == 0x7f) {
        return Err(ParseError::BadRequest("invalid request target"));
    }
    let minor_version = parse_version(version_b)?;
    let method = Method::from_bytes(method_b);
    if method == Method::Connect {
        return Err(ParseError::NotImplemented("CONNECT is not supported"));
    }
    let origin_form = split_target(target_b, method)?;

    let Some((headers, pos)) = parse_fields(buf, start, line_end + 2, limits)? else {
        return Ok(None);
    };

    let body = body_framing(&headers, minor_version)?;
    {
        let mut hosts = headers.get_all(b"host");
        match (hosts.next(), hosts.next()) {
            (Some(h), None) if !valid_host(h) => {
                return Err(ParseError::BadRequest("invalid Host header"))
            }
            (Some(_), None) => {}
            (None, _) if minor_version == 0 => {}
            (None, _) => return Err(ParseError::BadRequest("missing Host header")),
            _ => return Err(ParseError::BadRequest("duplicate Host header")),
        }
    }
    let close = headers.has_token(b"connection", b"close");
    let keep_alive = if minor_version == 1 {
        !close
    } else {
        !close && headers.has_token(b"connection", b"keep-alive")
    };
    let expect_continue = headers
        .get(b"expect")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"));
    let head = RequestHead {
        method,
        method_raw: buf.slice(start..start + sp1),
        target: buf.slice(start + sp1 + 1..start + sp1 + 1 + sp2),
        minor_version,
        headers,
        body,
        keep_alive,
        expect_continue,
        origin_form,
    };
    Ok(Some((head, pos)))
}

fn parse_version(v: &[u8]) -> Result<u8, ParseError> {
    match v {
        b"HTTP/1.1" => Ok(1),
        b"HTTP/1.0" => Ok(0),
        [b'H', b'T', b'T', b'P', b'/', a, b'.', b] if a.is_ascii_digit() && b.is_ascii_digit() => {
            Err(ParseError::VersionNotSupported)
        }
        [b'H', b'T', b'T', b'P', b'/', a] if a.is_ascii_digit() => {
            Err(ParseError::VersionNotSupported)
        }
        _ => Err(ParseError::BadRequest("malformed HTTP version")),
    }
}

/// Parse the header section that starts at `from`, up to and including
/// its final empty line, for a head that started at `start`: the fields and
/// the offset just past the head, or `None` if more bytes are needed.
pub(crate) fn parse_fields(
    buf: &Bytes,
    start: usize,
    from: usize,
    limits: &Limits,
) -> Result<Option<(Headers, usize)>, ParseError> {
    let mut headers = Headers::with_capacity(8);
    let mut pos = from;
    loop {
        if pos - start > limits.max_head {
            return Err(ParseError::HeadersTooLarge);
        }
        let Some(i) = find_crlf(&buf[pos..]) else {
            if buf[pos..].contains(&b'\n') {
                return Err(ParseError::BadRequest("bare LF in header section"));
            }
            if buf.len() - start > limits.max_head {
                return Err(ParseError::HeadersTooLarge);
            }
            return Ok(None);
        };
        if i == 0 {
            pos += 2;
            break;
        }
        if headers.len() >= limits.max_headers {
            return Err(ParseError::HeadersTooLarge);
        }
        let (name, value) = parse_field(buf, pos, pos + i)?;
        headers.push(name, value);
        pos += i + 2;
    }
    if pos - start > limits.max_head {
        return Err(ParseError::HeadersTooLarge);
    }
    Ok(Some((headers, pos)))
}

/// Parse `name: value` between `from` and `to` (the CRLF excluded).
pub(crate) fn parse_field(
    buf: &Bytes,
    from: usize,
    to: usize,
) -> Result<(Bytes, Bytes), ParseError> {
    let line = &buf[from..to];
    if line[0] == b' ' || line[0] == b'\t' {
        return Err(ParseError::BadRequest("obsolete line folding (obs-fold)"));
    }
    let colon = line
        .iter()
        .position(|&c| c == b':')
        .ok_or(ParseError::BadRequest("header line without colon"))?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&c| is_tchar(c)) {
        return Err(ParseError::BadRequest("invalid header name"));
    }
    let value = &line[colon + 1..];
    if value.iter().any(|&c| (c < b' ' && c != b'\t') || c == 0x7f) {
        return Err(ParseError::BadRequest("control character in header value"));
    }
    let (vs, ve) = trim_ows(value);
    let base = from + colon + 1;
    Ok((
        buf.slice(from..from + colon),
        buf.slice(base + vs..base + ve),
    ))
}

fn body_framing(headers: &Headers, minor: u8) -> Result<BodyFraming, ParseError> {
    let mut te = headers.get_all(b"transfer-encoding");
    let first_te = te.next();
    let mut cl = headers.get_all(b"content-length");
    let first_cl = cl.next();
    if first_cl.is_some() && cl.next().is_some() {
        return Err(ParseError::BadRequest("duplicate Content-Length"));
    }
    if let Some(v) = first_te {
        if first_cl.is_some() {
            return Err(ParseError::BadRequest(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        if minor == 0 {
            return Err(ParseError::BadRequest(
                "Transfer-Encoding in an HTTP/1.0 request",
            ));
        }
        if te.next().is_some() || !v.eq_ignore_ascii_case(b"chunked") {
            return Err(ParseError::NotImplemented(
                "only Transfer-Encoding: chunked is supported",
            ));
        }
        return Ok(BodyFraming::Chunked);
    }
    match first_cl {
        None => Ok(BodyFraming::None),
        Some(v) => match parse_length(v) {
            Some(0) => Ok(BodyFraming::None),
            Some(n) => Ok(BodyFraming::Length(n)),
            None => Err(ParseError::BadRequest("invalid Content-Length")),
        },
    }
}

/// A Content-Length value: 1*DIGIT, no sign, no list, at most 18 digits.
pub fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<(RequestHead, usize)>, ParseError> {
        parse_request(&Bytes::copy_from_slice(s.as_bytes()), &Limits::default())
    }

    fn status(s: &str) -> u16 {
        parse(s).unwrap_err().status()
    }

    #[test]
    fn simple_get() {
        let (h, n) = parse("GET /a?b=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\nrest")
            .unwrap()
            .unwrap();
        assert_eq!(h.method, Method::Get);
        assert_eq!(&h.target[..], b"/a?b=1");
        assert_eq!(h.path(), b"/a");
        assert_eq!(n, 45);
        assert!(h.keep_alive);
        assert_eq!(h.headers.get(b"accept").unwrap(), &b"*/*"[..]);
    }

    #[test]
    fn partial_needs_more() {
        assert!(parse("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
        assert!(parse("GET / HT").unwrap().is_none());
    }

    #[test]
    fn absolute_form() {
        let (h, _) = parse("GET http://example.com/x/y?q HTTP/1.1\r\nHost: e\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.path_and_query(), b"/x/y?q");
    }

    /// RFC 9112 §3.2.2 / RFC 3986 §6.2.3: an absolute-form target with an
    /// empty path means "/", also when a query follows.
    #[test]
    fn absolute_form_without_a_path_means_slash() {
        for (target, pq) in [
            ("http://x", "/"),
            ("http://x?q", "/?q"),
            ("https://x:8080?a=1&b", "/?a=1&b"),
            ("http://x:80/", "/"),
        ] {
            let (h, _) = parse(&format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n"))
                .unwrap()
                .unwrap();
            assert_eq!(h.path_and_query(), pq.as_bytes(), "{target}");
            assert_eq!(&h.origin_form()[..], pq.as_bytes(), "{target}");
            assert_eq!(h.path(), b"/", "{target}");
        }
    }

    #[test]
    fn the_authority_of_an_absolute_form_target_wins_over_host() {
        let (h, _) = parse("GET http://a.example:81/x HTTP/1.1\r\nHost: b\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.authority(), b"a.example:81");
        let (h, _) = parse("GET /x HTTP/1.1\r\nHost: b:82\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.authority(), b"b:82");
    }

    #[test]
    fn host_must_be_uri_host_and_port() {
        for good in [
            "x",
            "a.example",
            "a.example:8080",
            "127.0.0.1:1",
            "[::1]:80",
            "",
            "a%41b",
        ] {
            assert!(
                parse(&format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n")).is_ok(),
                "{good:?}"
            );
        }
        for bad in [
            "a b", "a/b", "a@b", "a:b", "a:99999", "[::1", "a\"b", "a%4", "[]", "a:80:80",
        ] {
            assert_eq!(
                status(&format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n")),
                400,
                "{bad:?}"
            );
        }
        // HTTP/1.0 needs no Host, but one that is sent must be valid.
        assert_eq!(status("GET / HTTP/1.0\r\nHost: a b\r\n\r\n"), 400);
    }

    #[test]
    fn absolute_form_authority_is_checked() {
        for bad in [
            "http:///x",
            "http://u@h/x",
            "http://a b/",
            "http://h:x/",
            "http://?q",
        ] {
            assert_eq!(
                status(&format!("GET {bad} HTTP/1.1\r\nHost: h\r\n\r\n")),
                400,
                "{bad:?}"
            );
        }
    }

    /// A fragment is never part of a request target (RFC 9110 §7.1).
    #[test]
    fn a_fragment_in_the_target_is_rejected() {
        for t in ["/a#b", "/#", "http://h/a?q#f", "http://h#f"] {
            assert_eq!(
                status(&format!("GET {t} HTTP/1.1\r\nHost: h\r\n\r\n")),
                400,
                "{t}"
            );
        }
    }

    #[test]
    fn http10_close_by_default() {
        let (h, _) = parse("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        let (h, _) = parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
    }

    #[test]
    fn rejects_ambiguous_framing() {
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\n"),
            400
        );
        assert_eq!(
            status("GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n"),
            400
        );
        assert_eq!(status("GET / HTTP/1.1\r\nHost : x\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\nHost: x\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: x\rY\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
            501
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            501
        );
    }

    #[test]
    fn versions_and_methods() {
        assert_eq!(status("GET / HTTP/2.0\r\nHost: x\r\n\r\n"), 505);
        assert_eq!(status("GET / HTTP/1.1x\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(status("GET / FOO\r\n\r\n"), 400);
        assert_eq!(status("G(T / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"), 501);
        assert_eq!(status("GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
        assert_eq!(status("GET x HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(9000));
        assert_eq!(status(&long), 414);
        let long = format!("GET /{}", "a".repeat(9000));
        assert_eq!(status(&long), 414);
        let big = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
            "a".repeat(40000)
        );
        assert_eq!(status(&big), 431);
        let many: String = (0..101).map(|i| format!("X{i}: y\r\n")).collect();
        assert_eq!(
            status(&format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n")),
            431
        );
    }

    /// Found by fuzzing: the verdict must not depend on where reads split.
    #[test]
    fn limit_checks_do_not_depend_on_read_boundaries() {
        let full = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(8192 - 15));
        assert!(parse(&full).unwrap().is_some());
        let line_end = full.find('\r').unwrap();
        assert!(parse(&full[..line_end + 1]).unwrap().is_none());
    }

    #[test]
    fn chunked_and_length() {
        let (h, _) = parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyFraming::Chunked);
        let (h, _) = parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyFraming::Length(12));
    }
}
