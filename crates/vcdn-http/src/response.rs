//! Strict HTTP/1.1 response-head parser, for what upstreams send back.

use bytes::Bytes;

use crate::header::{find_crlf, Headers};
use crate::request::{parse_fields, parse_length, Limits};
use crate::ParseError;

/// A parsed status line and header section.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub status: u16,
    pub minor_version: u8,
    pub headers: Headers,
}

/// How a response body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body: HEAD, 1xx, 204 and 304.
    Empty,
    Length(u64),
    Chunked,
    /// Delimited by the server closing the connection.
    UntilClose,
}

impl ResponseHead {
    /// The framing of this response's body, given the request method.
    pub fn framing(&self, request_was_head: bool) -> Result<ResponseFraming, ParseError> {
        if request_was_head || self.status < 200 || self.status == 204 || self.status == 304 {
            return Ok(ResponseFraming::Empty);
        }
        let mut cl = self.headers.get_all(b"content-length");
        let first_cl = cl.next();
        if first_cl.is_some() && cl.next().is_some() {
            return Err(ParseError::BadRequest(
                "duplicate Content-Length in response",
            ));
        }
        if let Some(te) = self.headers.get(b"transfer-encoding") {
            if first_cl.is_some() {
                return Err(ParseError::BadRequest(
                    "response has both Content-Length and Transfer-Encoding",
                ));
            }
            if self.headers.get_all(b"transfer-encoding").count() == 1
                && te.eq_ignore_ascii_case(b"chunked")
            {
                return Ok(ResponseFraming::Chunked);
            }
            return Err(ParseError::NotImplemented(
                "response transfer coding other than chunked",
            ));
        }
        match first_cl {
            Some(v) => parse_length(v)
                .map(ResponseFraming::Length)
                .ok_or(ParseError::BadRequest("invalid Content-Length in response")),
            None => Ok(ResponseFraming::UntilClose),
        }
    }

    /// Whether the upstream keeps the connection open after this response.
    pub fn keep_alive(&self) -> bool {
        let close = self.headers.has_token(b"connection", b"close");
        if self.minor_version == 1 {
            !close
        } else {
            !close && self.headers.has_token(b"connection", b"keep-alive")
        }
    }
}

/// Parse a response head at the start of `buf`: `Ok(None)` needs more bytes.
pub fn parse_response(
    buf: &Bytes,
    limits: &Limits,
) -> Result<Option<(ResponseHead, usize)>, ParseError> {
    let Some(line_end) = find_crlf(buf) else {
        if buf.len() > limits.max_head {
            return Err(ParseError::HeadersTooLarge);
        }
        return Ok(None);
    };
    let line = &buf[..line_end];
    // HTTP/1.x SP 3DIGIT SP reason
    if line.len() < 12 || &line[..7] != b"HTTP/1." || line[8] != b' ' {
        return Err(ParseError::BadRequest("malformed status line"));
    }
    let minor_version = match line[7] {
        b'0' => 0,
        b'1' => 1,
        _ => return Err(ParseError::VersionNotSupported),
    };
    let code = &line[9..12];
    if !code.iter().all(u8::is_ascii_digit) || line.get(12).is_some_and(|&c| c != b' ') {
        return Err(ParseError::BadRequest("malformed status code"));
    }
    if line[12..]
        .iter()
        .any(|&c| (c < b' ' && c != b'\t') || c == 0x7f)
    {
        return Err(ParseError::BadRequest("control character in reason phrase"));
    }
    let status = code.iter().fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    if !(100..=599).contains(&status) {
        return Err(ParseError::BadRequest("status code out of range"));
    }
    let Some((headers, pos)) = parse_fields(buf, 0, line_end + 2, limits)? else {
        return Ok(None);
    };
    Ok(Some((
        ResponseHead {
            status,
            minor_version,
            headers,
        },
        pos,
    )))
}

/// The standard reason phrase of a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        508 => "Loop Detected",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<(ResponseHead, usize)>, ParseError> {
        parse_response(&Bytes::copy_from_slice(s.as_bytes()), &Limits::default())
    }

    #[test]
    fn ok_response() {
        let (h, n) = parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(n, 38);
        assert_eq!(h.framing(false).unwrap(), ResponseFraming::Length(5));
        assert_eq!(h.framing(true).unwrap(), ResponseFraming::Empty);
        assert!(h.keep_alive());
    }

    #[test]
    fn framing_rules() {
        let (h, _) = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing(false).unwrap(), ResponseFraming::Chunked);
        let (h, _) = parse("HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.framing(false).unwrap(), ResponseFraming::UntilClose);
        assert!(!h.keep_alive());
        let (h, _) = parse("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing(false).unwrap(), ResponseFraming::Empty);
        let (h, _) =
            parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap()
                .unwrap();
        assert!(h.framing(false).is_err());
        let (h, _) = parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.framing(false).is_err());
    }

    #[test]
    fn malformed() {
        assert!(parse("HTTP/1.1 2000 OK\r\n\r\n").is_err());
        assert!(parse("HTTX/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse("HTTP/1.1 200 OK\r\n folded\r\n\r\n").is_err());
        assert!(parse("HTTP/1.1 200 OK\r\nX: y\r\n").unwrap().is_none());
        assert!(parse("HTTP/1.1 204\r\n\r\n").unwrap().is_some());
        assert!(parse("HTTP/1.1 200 O\rK\r\n\r\n").is_err());
    }

    /// Found by fuzzing: a head one or two bytes over the limit was
    /// accepted when it arrived whole and refused when it arrived in parts.
    #[test]
    fn head_limit_is_exact() {
        let limits = Limits::default();
        for extra in [0usize, 1, 2] {
            let pad = limits.max_head - 21 + extra;
            let s = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(pad - 4));
            let whole = parse_response(&Bytes::from(s.clone()), &limits);
            let cut = parse_response(&Bytes::from(s[..s.len() - 1].to_string()), &limits);
            assert_eq!(whole.is_err(), s.len() > limits.max_head, "len {}", s.len());
            assert!(cut.is_err() == whole.is_err() || matches!(cut, Ok(None)));
        }
    }
}
