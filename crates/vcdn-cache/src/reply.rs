//! A response as the connection loop writes it: the serialised head and
//! a body that is in memory, in a shared-memory file, or streamed from an
//! upstream fetch; and the small writers that build heads.

use std::sync::Arc;

use bytes::Bytes;
use vcdn_http::{date, reason};

use crate::fetch::FetchReader;
use crate::object::ObjectStats;

/// The body of a reply.
pub enum ReplyBody {
    Empty,
    Full(Bytes),
    /// A stored body in a shared-memory file: `bytes` is `len` bytes of
    /// `file` from `offset`, sent with sendfile when large.
    Shared {
        bytes: Bytes,
        file: Arc<std::fs::File>,
        offset: u64,
    },
    /// Bytes cloned from an upstream fetch as they arrive: skip `skip`
    /// bytes, then send at most `take` (ranges), chunk-encoded or not.
    Stream {
        reader: FetchReader,
        skip: u64,
        take: Option<u64>,
        chunked: bool,
    },
}

/// A response ready to be written: the serialised head and the body.
pub struct Reply {
    pub status: u16,
    pub head: Vec<u8>,
    pub body: ReplyBody,
    /// The connection must close after this reply (close-delimited body, or
    /// an error after which the request stream cannot be trusted).
    pub close: bool,
    /// Count the body bytes sent against this object's statistics.
    pub stats: Option<Arc<ObjectStats>>,
}

pub(crate) fn status_line(code: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(512);
    v.extend_from_slice(format!("HTTP/1.1 {code} {}\r\n", reason(code)).as_bytes());
    v
}

pub(crate) fn push_field(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "{name}: {value}\r\n");
}

pub(crate) fn push_str_field(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `name: n\r\n` without the formatting machinery (hot path).
pub(crate) fn push_num(out: &mut Vec<u8>, name: &str, n: u64) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// End the head: Connection: close when needed, then the empty line.
pub(crate) fn finish_head(out: &mut Vec<u8>, close: bool) {
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A complete error reply with a plain-text body.
pub fn error_reply(code: u16, message: &str, close: bool, head_only: bool) -> Reply {
    let body = Bytes::from(format!("{code} {}: {message}\n", reason(code)));
    let mut head = status_line(code);
    head.extend_from_slice(b"Date: ");
    date::write_now(&mut head);
    head.extend_from_slice(
        b"\r\nContent-Type: text/plain; charset=utf-8\r\nCache-Control: no-store\r\n",
    );
    push_field(&mut head, "Content-Length", body.len());
    finish_head(&mut head, close);
    Reply {
        status: code,
        head,
        body: if head_only {
            ReplyBody::Empty
        } else {
            ReplyBody::Full(body)
        },
        close,
        stats: None,
    }
}
