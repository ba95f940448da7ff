//! A request's decoded header fields turned straight into the HTTP/1.1
//! request head the strict parser (`crate::parse_request`) reads, so every
//! rule and limit of the HTTP/1.1 front end applies to HTTP/2 unchanged.
//! What HTTP/2 itself forbids (RFC 9113 §8.2, §8.3) makes the request
//! malformed: the caller resets the stream with PROTOCOL_ERROR.

use crate::header::is_token;

/// Fields that describe one HTTP/1.1 connection and are malformed in
/// HTTP/2 (RFC 9113 §8.2.2); `te` is allowed only as `trailers`.
pub const CONNECTION_SPECIFIC: [&[u8]; 5] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"upgrade",
];

/// A request of a stream, as an HTTP/1.1 head still open at its end: the
/// caller adds the framing of the body (see [`Request::finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Request line, `host`, the fields, one joined `cookie`; each line
    /// ends with CRLF, the blank line is not there yet.
    pub head: Vec<u8>,
    /// The client's `content-length`, if it sent one.
    pub content_length: Option<u64>,
    /// A HEAD request.
    pub head_only: bool,
}

/// How the body of a request reaches the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// It has all arrived: this many bytes (0: none).
    Whole(usize),
    /// It is still arriving: the client's length if given, else chunked.
    Streamed,
}

impl Request {
    /// The complete HTTP/1.1 head for a body framed as `body`.
    pub fn finish(mut self, body: Body) -> Vec<u8> {
        match body {
            Body::Whole(0) => {}
            Body::Whole(n) => {
                self.head.extend_from_slice(b"content-length: ");
                self.head
                    .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                self.head.extend_from_slice(b"\r\n");
            }
            Body::Streamed => match self.content_length {
                Some(n) => {
                    self.head.extend_from_slice(b"content-length: ");
                    self.head
                        .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                    self.head.extend_from_slice(b"\r\n");
                }
                None => self
                    .head
                    .extend_from_slice(b"transfer-encoding: chunked\r\n"),
            },
        }
        self.head.extend_from_slice(b"\r\n");
        self.head
    }
}

/// Builds a [`Request`] from fields as the HPACK decoder gives them.
/// Pseudo-headers come first (RFC 9113 §8.3); at the first regular field
/// the request line is written, and the fields go straight after it.
#[derive(Default)]
pub struct Builder {
    method: Option<Vec<u8>>,
    scheme: bool,
    path: Option<Vec<u8>>,
    authority: Option<Vec<u8>>,
    /// The head being written, once the pseudo-headers are all there.
    head: Vec<u8>,
    cookies: Vec<u8>,
    content_length: Option<u64>,
    regular_seen: bool,
    malformed: Option<&'static str>,
}

impl Builder {
    fn bad(&mut self, why: &'static str) {
        if self.malformed.is_none() {
            self.malformed = Some(why);
        }
    }

    /// Take one decoded field.
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        if self.malformed.is_some() {
            return;
        }
        if value.iter().any(|&c| c == b'\r' || c == b'\n' || c == 0) {
            return self.bad("a field value holds CR, LF or NUL");
        }
        if let Some(p) = name.strip_prefix(b":") {
            if self.regular_seen {
                return self.bad("a pseudo-header after a regular field");
            }
            let slot = match p {
                b"method" => &mut self.method,
                b"path" => &mut self.path,
                b"authority" => &mut self.authority,
                b"scheme" => {
                    if self.scheme {
                        return self.bad("a repeated pseudo-header");
                    }
                    self.scheme = true;
                    return;
                }
                _ => return self.bad("an unknown pseudo-header"),
            };
            if slot.is_some() {
                return self.bad("a repeated pseudo-header");
            }
            *slot = Some(value.to_vec());
            return;
        }
        if !self.regular_seen {
            self.regular_seen = true;
            if let Err(why) = self.request_line() {
                return self.bad(why);
            }
        }
        if !is_token(name) || name.iter().any(|c| c.is_ascii_uppercase()) {
            return self.bad("a field name that is not a lowercase token");
        }
        if CONNECTION_SPECIFIC.contains(&name) {
            return self.bad("a connection-specific field");
        }
        match name {
            b"te" => {
                if value != b"trailers" {
                    self.bad("te other than trailers");
                }
            }
            b"host" => match &self.authority {
                // RFC 9113 §8.3.1: Host, if also sent, must name the same.
                Some(a) if a != value => self.bad("a host field that differs from :authority"),
                Some(_) => {}
                None => self.line(b"host", value),
            },
            b"cookie" => {
                // RFC 9113 §8.2.3: crumbs are joined into one field.
                if !self.cookies.is_empty() {
                    self.cookies.extend_from_slice(b"; ");
                }
                self.cookies.extend_from_slice(value);
            }
            b"content-length" => {
                let n = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok());
                match (n, self.content_length) {
                    (None, _) => self.bad("a content-length that is not a number"),
                    (Some(n), Some(m)) if n != m => self.bad("two different content-lengths"),
                    (Some(n), _) => self.content_length = Some(n),
                }
            }
            _ => self.line(name, value),
        }
    }

    fn line(&mut self, name: &[u8], value: &[u8]) {
        self.head.extend_from_slice(name);
        self.head.extend_from_slice(b": ");
        self.head.extend_from_slice(value);
        self.head.extend_from_slice(b"\r\n");
    }

    /// Check the pseudo-headers and write the request line and `host`.
    fn request_line(&mut self) -> Result<(), &'static str> {
        let Some(method) = &self.method else {
            return Err("no :method");
        };
        let connect = method == b"CONNECT";
        let target = if connect {
            if self.scheme || self.path.is_some() {
                return Err(":scheme or :path in a CONNECT");
            }
            match &self.authority {
                Some(a) => a,
                None => return Err("no :authority in a CONNECT"),
            }
        } else {
            match &self.path {
                Some(p) if !p.is_empty() && self.scheme => p,
                Some(_) if self.scheme => return Err("an empty :path"),
                _ => return Err("no :scheme or :path"),
            }
        };
        if !is_token(method) {
            return Err("a :method that is not a token");
        }
        if target.iter().any(|&c| c <= b' ' || c == 0x7f) {
            return Err("a :path with spaces or control characters");
        }
        let h = &mut self.head;
        h.reserve(method.len() + target.len() + 256);
        h.extend_from_slice(method);
        h.push(b' ');
        h.extend_from_slice(target);
        h.extend_from_slice(b" HTTP/1.1\r\n");
        if let Some(a) = &self.authority {
            h.extend_from_slice(b"host: ");
            h.extend_from_slice(a);
            h.extend_from_slice(b"\r\n");
        }
        Ok(())
    }

    /// The request, or why it is malformed.
    pub fn finish(mut self) -> Result<Request, &'static str> {
        if !self.regular_seen {
            self.regular_seen = true;
            self.request_line()?;
        }
        if let Some(why) = self.malformed {
            return Err(why);
        }
        if !self.cookies.is_empty() {
            self.head.extend_from_slice(b"cookie: ");
            self.head.extend_from_slice(&self.cookies);
            self.head.extend_from_slice(b"\r\n");
        }
        Ok(Request {
            head: self.head,
            content_length: self.content_length,
            head_only: self.method.as_deref() == Some(b"HEAD"),
        })
    }
}

/// Check a trailer field: pseudo-headers are malformed there; the fields
/// themselves are dropped (the cache does not forward request trailers).
pub fn trailer_ok(name: &[u8]) -> bool {
    !name.starts_with(b":")
        && is_token(name)
        && !name.iter().any(|c| c.is_ascii_uppercase())
        && !CONNECTION_SPECIFIC.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(fields: &[(&str, &str)]) -> Result<Request, &'static str> {
        let mut b = Builder::default();
        for (n, v) in fields {
            b.field(n.as_bytes(), v.as_bytes());
        }
        b.finish()
    }

    const GET: [(&str, &str); 4] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "example.com"),
        (":path", "/a?b=1"),
    ];

    #[test]
    fn a_request_becomes_the_http1_head_the_other_front_end_parses() {
        let mut f = GET.to_vec();
        f.extend([
            ("accept", "*/*"),
            ("cookie", "a=1"),
            ("cookie", "b=2"),
            ("te", "trailers"),
            ("host", "example.com"),
            ("content-length", "5"),
        ]);
        let r = build(&f).unwrap();
        assert_eq!(r.content_length, Some(5));
        assert_eq!(
            String::from_utf8(r.clone().finish(Body::Whole(0))).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nhost: example.com\r\naccept: */*\r\ncookie: a=1; b=2\r\n\r\n"
        );
        assert!(String::from_utf8(r.clone().finish(Body::Whole(3)))
            .unwrap()
            .ends_with("cookie: a=1; b=2\r\ncontent-length: 3\r\n\r\n"));
        assert!(String::from_utf8(r.finish(Body::Streamed))
            .unwrap()
            .ends_with("content-length: 5\r\n\r\n"));
        let r = build(&GET).unwrap();
        assert!(String::from_utf8(r.finish(Body::Streamed))
            .unwrap()
            .ends_with("transfer-encoding: chunked\r\n\r\n"));
    }

    #[test]
    fn what_http2_forbids_is_malformed() {
        for (n, v) in [
            ("connection", "close"),
            ("keep-alive", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("te", "gzip"),
            ("host", "other.example"),
            ("X-Upper", "1"),
            ("x-crlf", "a\r\nb: c"),
            ("x-nul", "a\0"),
            (":path", "/again"),
            (":status", "200"),
            ("content-length", "x"),
            ("bad name", "1"),
        ] {
            let mut f = GET.to_vec();
            f.push((n, v));
            assert!(build(&f).is_err(), "{n}");
        }
        // Pseudo-headers after a field; missing or empty ones.
        assert!(build(&[("accept", "*/*"), (":method", "GET")]).is_err());
        assert!(build(&GET[..3]).is_err());
        assert!(build(&[(":method", "GET"), (":scheme", "http"), (":path", "")]).is_err());
        assert!(build(&[(":method", "GET"), (":scheme", "http"), (":path", "/ x")]).is_err());
    }
}
