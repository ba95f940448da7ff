//! 1xx interim responses (RFC 9110 §15.2), passed from the upstream to the
//! client that is waiting for the final response.
//!
//! A proxy must forward 1xx responses unless it asked for them itself
//! (§15.2), so the upstream client hands every interim head it reads to an
//! [`InterimSink`], and the connection loop writes what arrives to its
//! client before the final response. Rules:
//!
//! - `100 Continue` is not forwarded: the cache removes `Expect` from what
//!   it sends upstream and answers `Expect: 100-continue` itself, so an
//!   upstream 100 is one the cache did not ask for, and the client must not
//!   see a second one.
//! - `101 Switching Protocols` is never legitimate here (the cache does not
//!   forward `Upgrade`): the upstream client treats it as an invalid
//!   response (502).
//! - An HTTP/1.0 client gets none (§15.2: a server must not send a 1xx to
//!   an HTTP/1.0 client): the connection loop gives no sink for it.
//! - Interim responses are never stored: only the final response is.
//! - A fetch shared by several clients (coalesced) forwards them only to
//!   the client whose request started it. A 1xx answers one request; the
//!   clients that join later arrive at any moment (after the hints, or
//!   after the final head), so "to all" could not be kept anyway, and a
//!   joining client is answered like a hit, which has no interim response
//!   either.
//! - At most [`MAX_INTERIM`] per request, each within the upstream's head
//!   limits (64 KiB, 200 fields); more is a 502, so an upstream cannot keep
//!   a request waiting forever with an endless run of 1xx heads.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use vcdn_http::header::is_hop_by_hop;
use vcdn_http::ResponseHead;

/// Most interim responses accepted before the final one; more is a 502.
pub const MAX_INTERIM: usize = 10;

/// Where the upstream client puts the interim responses of one request.
#[derive(Debug, Clone)]
pub struct InterimSink {
    tx: mpsc::Sender<Bytes>,
    /// This cache's Via entry (RFC 9110 §7.6.3: a proxy adds Via to every
    /// message it forwards).
    via: Arc<str>,
}

/// A sink and the receiving end the connection loop writes from. The
/// channel holds [`MAX_INTERIM`] heads, so forwarding never waits.
pub fn channel(via: &str) -> (InterimSink, mpsc::Receiver<Bytes>) {
    let (tx, rx) = mpsc::channel(MAX_INTERIM);
    (
        InterimSink {
            tx,
            via: Arc::from(via),
        },
        rx,
    )
}

impl InterimSink {
    /// Forward one interim response head (not 100, see the module doc). A
    /// client that is gone is not an error.
    pub fn forward(&self, head: &ResponseHead) {
        if head.status == 100 || !(100..200).contains(&head.status) {
            return;
        }
        let _ = self.tx.try_send(encode(head, &self.via));
    }
}

/// The HTTP/1.1 bytes of an interim response: its status, its end-to-end
/// fields (hop-by-hop ones and those named by Connection dropped), Via
/// extended.
pub fn encode(head: &ResponseHead, via: &str) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {} {}\r\n",
            head.status,
            vcdn_http::reason(head.status)
        )
        .as_bytes(),
    );
    let mut upstream_via = None;
    for (n, v) in head.headers.iter() {
        if is_hop_by_hop(n)
            || head.headers.has_token(b"connection", n)
            || n.eq_ignore_ascii_case(b"content-length")
        {
            continue;
        }
        if n.eq_ignore_ascii_case(b"via") {
            upstream_via = Some(v.clone());
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Via: ");
    if let Some(v) = upstream_via {
        out.extend_from_slice(&v);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(via.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vcdn_http::{parse_response, Limits};

    fn head(raw: &str) -> ResponseHead {
        let b = Bytes::from(raw.to_string());
        parse_response(&b, &Limits::default()).unwrap().unwrap().0
    }

    #[test]
    fn early_hints_keep_their_links_and_lose_hop_by_hop_fields() {
        let h = head(
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nLink: </b.js>; rel=preload\r\n\
             Connection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nVia: 1.1 origin\r\n\r\n",
        );
        let out = encode(&h, "1.1 vcdn-test");
        assert_eq!(
            &out[..],
            b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nLink: </b.js>; rel=preload\r\n\
              Via: 1.1 origin, 1.1 vcdn-test\r\n\r\n"
        );
        // What is sent parses as a 1xx response.
        let again = head(std::str::from_utf8(&out).unwrap());
        assert_eq!(again.status, 103);
    }

    #[test]
    fn continue_is_not_forwarded_and_the_channel_never_blocks() {
        let (sink, mut rx) = channel("1.1 v");
        sink.forward(&head("HTTP/1.1 100 Continue\r\n\r\n"));
        assert!(rx.try_recv().is_err());
        for _ in 0..MAX_INTERIM + 5 {
            sink.forward(&head("HTTP/1.1 103 Early Hints\r\n\r\n"));
        }
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, MAX_INTERIM);
        drop(rx);
        sink.forward(&head("HTTP/1.1 102 Processing\r\n\r\n"));
    }
}
