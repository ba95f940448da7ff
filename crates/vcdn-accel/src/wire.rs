//! The hop protocol between proxies (spec: `docs/accel-protocol.md`): the
//! chain header a proxy sends to the next one, the response preamble and
//! the error frame that come back. Pure code without sockets, so that every
//! bound is unit-tested; the proxy reads the fixed-size parts with exact
//! reads and hands the bytes here.

use sha2::{Digest, Sha256};

/// First bytes of every hop connection's request. No HTTP method is
/// followed by the byte 0x01, so one look tells a peer from a client.
pub const MAGIC: &[u8; 7] = b"VCDNHOP";
/// The one version this proxy speaks.
pub const VERSION: u8 = 1;
/// Bytes before the fields: magic, version, fields length.
pub const PREFIX_LEN: usize = 10;
/// Largest fields block.
pub const MAX_FIELDS: usize = 1024;
/// Most names a chain may carry (the receiver included).
pub const MAX_HOPS: usize = 8;
/// Longest location or service name.
pub const MAX_NAME: usize = 63;
/// Largest HTTP request head carried.
pub const MAX_HEAD: usize = 64 * 1024;
/// Bytes of the truncated HMAC-SHA256 tag.
pub const TAG_LEN: usize = 16;
/// Largest warm-up transfer a peer will send.
pub const MAX_WARMUP: u64 = 4 << 20;
/// Largest error message carried back.
pub const MAX_ERROR: usize = 512;
/// Largest frame payload (a larger piece is sent as several frames).
pub const MAX_FRAME: u32 = 16 << 20;

/// What a hop connection's request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carry one HTTP exchange along the chain.
    Exchange = 1,
    /// Send back `body` bytes of padding, to open a fresh connection's
    /// congestion window before a client needs it.
    Warmup = 2,
}

/// How a body that follows a head is delimited on a hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `[u32 len][len bytes]` frames, a zero length ends.
    Frames,
}

/// A decoded and authenticated chain header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopHeader {
    pub kind: Kind,
    pub service: String,
    /// The rest of the chain: the receiver first, the egress last.
    pub chain: Vec<String>,
    pub body: Framing,
    /// Length of the HTTP request head that follows the fields.
    pub head_len: u32,
}

/// Why a hop header was refused; the text is sent back in the error frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HopError {
    #[error("not a vcdn hop header (bad magic)")]
    BadMagic,
    #[error("unsupported hop protocol version {0} (this proxy speaks {VERSION})")]
    Version(u8),
    #[error("hop header fields too large ({0} bytes, at most {MAX_FIELDS})")]
    TooLarge(usize),
    #[error("malformed hop header: {0}")]
    Malformed(&'static str),
    #[error("hop header authentication failed (wrong or missing hop key)")]
    BadTag,
}

/// Whether `name` is a valid location or service name: 1–63 of
/// `[A-Za-z0-9._-]`. No `:` or `/`, so a name can never be an address.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// HMAC-SHA256 (RFC 2104) of `parts` concatenated, under `key`.
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

fn tag(key: &[u8], prefix_and_fields: &[u8], head: &[u8]) -> [u8; TAG_LEN] {
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&hmac(key, &[prefix_and_fields, head])[..TAG_LEN]);
    t
}

/// Constant-time equality of two tags.
fn tag_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl HopHeader {
    /// The whole request preamble: prefix, fields, `head`, tag under `key`.
    /// Names must be valid (the proxy only builds headers from its own
    /// table and peer set, which are validated when loaded).
    pub fn encode(&self, head: &[u8], key: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(128);
        f.push(self.kind as u8);
        f.push(self.service.len() as u8);
        f.extend_from_slice(self.service.as_bytes());
        f.push(self.chain.len() as u8);
        for n in &self.chain {
            f.push(n.len() as u8);
            f.extend_from_slice(n.as_bytes());
        }
        let (code, len) = match self.body {
            Framing::None => (0u8, 0u64),
            Framing::Length(n) => (1, n),
            Framing::Frames => (2, 0),
        };
        f.push(code);
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&(head.len() as u32).to_be_bytes());
        let mut out = Vec::with_capacity(PREFIX_LEN + f.len() + head.len() + TAG_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&(f.len() as u16).to_be_bytes());
        out.extend_from_slice(&f);
        let t = tag(key, &out, head);
        out.extend_from_slice(head);
        out.extend_from_slice(&t);
        out
    }
}

/// Checks the 10-byte prefix; returns the length of the fields block.
pub fn parse_prefix(p: &[u8; PREFIX_LEN]) -> Result<usize, HopError> {
    if &p[..7] != MAGIC {
        return Err(HopError::BadMagic);
    }
    if p[7] != VERSION {
        return Err(HopError::Version(p[7]));
    }
    let len = u16::from_be_bytes([p[8], p[9]]) as usize;
    if len > MAX_FIELDS {
        return Err(HopError::TooLarge(len));
    }
    Ok(len)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HopError> {
        if self.0.len() < n {
            return Err(HopError::Malformed("fields end early"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, HopError> {
        Ok(self.take(1)?[0])
    }
    fn name(&mut self) -> Result<String, HopError> {
        let n = self.u8()? as usize;
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) if valid_name(s) => Ok(s.to_string()),
            _ => Err(HopError::Malformed(
                "invalid name (1-63 of A-Z a-z 0-9 . _ -)",
            )),
        }
    }
}

/// Parses the fields block (structure and bounds only: the tag is checked
/// by [`verify`] once the head has been read).
pub fn parse_fields(f: &[u8]) -> Result<HopHeader, HopError> {
    let mut r = Reader(f);
    let kind = match r.u8()? {
        1 => Kind::Exchange,
        2 => Kind::Warmup,
        _ => return Err(HopError::Malformed("unknown kind")),
    };
    let service = r.name()?;
    let hops = r.u8()? as usize;
    if hops == 0 || hops > MAX_HOPS {
        return Err(HopError::Malformed("chain must have 1 to 8 names"));
    }
    let chain = (0..hops).map(|_| r.name()).collect::<Result<Vec<_>, _>>()?;
    let code = r.u8()?;
    let len = u64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
    let head_len = u32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes"));
    if !r.0.is_empty() {
        return Err(HopError::Malformed("trailing bytes after fields"));
    }
    let body = match (code, len) {
        (0, 0) => Framing::None,
        (1, n) => Framing::Length(n),
        (2, 0) => Framing::Frames,
        _ => return Err(HopError::Malformed("unknown body framing")),
    };
    if head_len as usize > MAX_HEAD {
        return Err(HopError::Malformed("request head longer than 64 KiB"));
    }
    match kind {
        Kind::Exchange if head_len == 0 => {
            return Err(HopError::Malformed("exchange without a request head"))
        }
        Kind::Warmup if head_len != 0 || !matches!(body, Framing::Length(n) if n <= MAX_WARMUP) => {
            return Err(HopError::Malformed("bad warm-up request"))
        }
        _ => {}
    }
    Ok(HopHeader {
        kind,
        service,
        chain,
        body,
        head_len,
    })
}

/// Checks the tag over prefix, fields and head under `key`.
pub fn verify(
    key: &[u8],
    prefix_and_fields: &[u8],
    head: &[u8],
    got: &[u8],
) -> Result<(), HopError> {
    if key.is_empty() || !tag_eq(&tag(key, prefix_and_fields, head), got) {
        return Err(HopError::BadTag);
    }
    Ok(())
}

/// Error codes of an error frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The header was refused (malformed, bad tag, wrong service, unknown
    /// next hop); retrying the same chain will not help.
    Refused = 1,
    /// The named hop could not be reached or failed before answering.
    HopFailed = 2,
    /// The origin could not be reached or answered garbage.
    Origin = 3,
    /// The proxy is shutting down.
    Unavailable = 4,
}

/// A response preamble as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preamble {
    /// A response head of `head_len` bytes follows, then the body.
    Response {
        head_len: u32,
        body: Framing,
        /// The body ends when the origin closed its connection: the client
        /// connection must close after it.
        close: bool,
    },
    Error {
        code: ErrorCode,
        /// The hop that failed (for `HopFailed`), else empty.
        hop: String,
        message: String,
    },
}

/// Fixed part of a response preamble: `'R'` framing u32 head_len u64 len.
pub const RESPONSE_LEN: usize = 14;

/// Encodes a response preamble.
pub fn encode_response(head_len: u32, body: Framing, close: bool) -> [u8; RESPONSE_LEN] {
    let mut out = [0u8; RESPONSE_LEN];
    out[0] = b'R';
    let (code, len) = match (body, close) {
        (Framing::None, _) => (0, 0),
        (Framing::Length(n), _) => (0, n),
        (Framing::Frames, false) => (1, 0),
        (Framing::Frames, true) => (2, 0),
    };
    out[1] = code;
    out[2..6].copy_from_slice(&head_len.to_be_bytes());
    out[6..14].copy_from_slice(&len.to_be_bytes());
    out
}

/// Encodes an error frame (message and hop name cut to their bounds).
pub fn encode_error(code: ErrorCode, hop: &str, message: &str) -> Vec<u8> {
    let hop = if valid_name(hop) { hop } else { "" };
    let mut m = message.as_bytes();
    if m.len() > MAX_ERROR {
        m = &m[..MAX_ERROR];
        while std::str::from_utf8(m).is_err() {
            m = &m[..m.len() - 1];
        }
    }
    let mut out = Vec::with_capacity(5 + hop.len() + m.len());
    out.push(b'E');
    out.push(code as u8);
    out.push(hop.len() as u8);
    out.extend_from_slice(hop.as_bytes());
    out.extend_from_slice(&(m.len() as u16).to_be_bytes());
    out.extend_from_slice(m);
    out
}

/// Parses the fixed part of a response preamble (its first byte tells
/// which): `Ok(Some)` for a response, `Ok(None)` when it is an error frame
/// (read its rest with [`parse_error_rest`]).
pub fn parse_response(b: &[u8; RESPONSE_LEN]) -> Result<Option<Preamble>, HopError> {
    match b[0] {
        b'R' => {
            let head_len = u32::from_be_bytes(b[2..6].try_into().expect("4"));
            let len = u64::from_be_bytes(b[6..14].try_into().expect("8"));
            if head_len as usize > MAX_HEAD {
                return Err(HopError::Malformed("response head longer than 64 KiB"));
            }
            let (body, close) = match (b[1], len) {
                (0, 0) => (Framing::None, false),
                (0, n) => (Framing::Length(n), false),
                (1, 0) => (Framing::Frames, false),
                (2, 0) => (Framing::Frames, true),
                _ => return Err(HopError::Malformed("unknown response framing")),
            };
            Ok(Some(Preamble::Response {
                head_len,
                body,
                close,
            }))
        }
        b'E' => Ok(None),
        _ => Err(HopError::Malformed("unknown preamble")),
    }
}

/// The error frame's first three bytes are `'E' code hop_len`; the proxy
/// reads them (from the start of the fixed response buffer it read), then
/// `hop_len + 2` bytes, then the message: this parses the pieces.
pub fn parse_error(code: u8, hop: &[u8], message: &[u8]) -> Preamble {
    let code = match code {
        1 => ErrorCode::Refused,
        2 => ErrorCode::HopFailed,
        4 => ErrorCode::Unavailable,
        _ => ErrorCode::Origin,
    };
    let hop = String::from_utf8_lossy(hop).into_owned();
    Preamble::Error {
        code,
        hop: if valid_name(&hop) { hop } else { String::new() },
        message: String::from_utf8_lossy(message).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> HopHeader {
        HopHeader {
            kind: Kind::Exchange,
            service: "shop".into(),
            chain: vec!["paris".into(), "nyc".into()],
            body: Framing::Length(42),
            head_len: 0,
        }
    }

    /// Decodes a whole encoded preamble the way the proxy does.
    fn decode(b: &[u8], key: &[u8]) -> Result<(HopHeader, Vec<u8>), HopError> {
        let p: [u8; PREFIX_LEN] = b[..PREFIX_LEN].try_into().unwrap();
        let n = parse_prefix(&p)?;
        let h = parse_fields(&b[PREFIX_LEN..PREFIX_LEN + n])?;
        let head_end = PREFIX_LEN + n + h.head_len as usize;
        let head = &b[PREFIX_LEN + n..head_end];
        verify(
            key,
            &b[..PREFIX_LEN + n],
            head,
            &b[head_end..head_end + TAG_LEN],
        )?;
        Ok((h, head.to_vec()))
    }

    #[test]
    fn round_trip() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let b = header().encode(head, b"k");
        let (h, got) = decode(&b, b"k").unwrap();
        assert_eq!(h.chain, header().chain);
        assert_eq!(h.body, Framing::Length(42));
        assert_eq!(h.head_len as usize, head.len());
        assert_eq!(got, head);
    }

    #[test]
    fn tag_binds_key_fields_and_head() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let b = header().encode(head, b"k");
        assert_eq!(decode(&b, b"other"), Err(HopError::BadTag));
        assert_eq!(decode(&b, b""), Err(HopError::BadTag));
        let mut c = b.clone();
        let i = c.len() - TAG_LEN - 3;
        c[i] ^= 1; // the head
        assert_eq!(decode(&c, b"k"), Err(HopError::BadTag));
    }

    #[test]
    fn refuses_bad_prefix_and_fields() {
        let mut p = *b"VCDNHOP\x01\x00\x10";
        assert_eq!(parse_prefix(&p), Ok(16));
        p[7] = 2;
        assert_eq!(parse_prefix(&p), Err(HopError::Version(2)));
        assert_eq!(
            parse_prefix(b"VCDNHOP\x01\xff\xff"),
            Err(HopError::TooLarge(65535))
        );
        assert_eq!(parse_prefix(b"GET / HTTP"), Err(HopError::BadMagic));
        for bad in [
            &b""[..],
            b"\x09",
            b"\x01\x04shop\x00",
            b"\x01\x04shop\x09",
            b"\x01\x04shop\x01\x0e127.0.0.1:9000\x00",
        ] {
            assert!(
                matches!(parse_fields(bad), Err(HopError::Malformed(_))),
                "{bad:?}"
            );
        }
        // Every truncation of a valid header is refused, never a panic.
        let b = header().encode(b"GET / HTTP/1.1\r\n\r\n", b"k");
        let n = parse_prefix(&b[..10].try_into().unwrap()).unwrap();
        for cut in 0..n {
            assert!(parse_fields(&b[10..10 + cut]).is_err());
        }
    }

    #[test]
    fn names_are_never_addresses() {
        assert!(valid_name("paris-1.eu"));
        for n in ["", "10.0.0.1:80", "a/b", "[::1]", &"x".repeat(64)] {
            assert!(!valid_name(n), "{n}");
        }
    }

    #[test]
    fn response_and_error_frames() {
        let r = encode_response(100, Framing::Length(5), false);
        assert_eq!(
            parse_response(&r),
            Ok(Some(Preamble::Response {
                head_len: 100,
                body: Framing::Length(5),
                close: false
            }))
        );
        let r = encode_response(10, Framing::Frames, true);
        assert!(matches!(
            parse_response(&r),
            Ok(Some(Preamble::Response { close: true, .. }))
        ));
        let e = encode_error(ErrorCode::HopFailed, "nyc", &"é".repeat(400));
        assert_eq!(e[0], b'E');
        let hop_len = e[2] as usize;
        let m = &e[5 + hop_len..];
        assert!(m.len() <= MAX_ERROR && std::str::from_utf8(m).is_ok());
        match parse_error(e[1], &e[3..3 + hop_len], m) {
            Preamble::Error { code, hop, .. } => {
                assert_eq!(code, ErrorCode::HopFailed);
                assert_eq!(hop, "nyc");
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        let got = hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
