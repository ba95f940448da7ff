//! HTTP/2 frames (RFC 9113 §4, §6): the 9-byte header, the types and flags
//! this server knows, error codes, and the writers of the frames it sends.

/// The connection preface a client opens with (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The frame size every endpoint must accept, and the largest this server
/// accepts (it never raises SETTINGS_MAX_FRAME_SIZE).
pub const DEFAULT_MAX_FRAME: usize = 16_384;
/// The window every stream and connection starts with.
pub const DEFAULT_WINDOW: u32 = 65_535;
/// The largest window (RFC 9113 §6.9.1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Reason {
    NoError = 0x0,
    ProtocolError = 0x1,
    InternalError = 0x2,
    FlowControlError = 0x3,
    SettingsTimeout = 0x4,
    StreamClosed = 0x5,
    FrameSizeError = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    CompressionError = 0x9,
    ConnectError = 0xa,
    EnhanceYourCalm = 0xb,
    InadequateSecurity = 0xc,
    Http11Required = 0xd,
}

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub ty: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    /// The header at the start of `b`, if 9 bytes are there. The reserved
    /// bit of the stream id is ignored (RFC 9113 §4.1).
    pub fn parse(b: &[u8]) -> Option<Head> {
        let h: &[u8; 9] = b.get(..9)?.try_into().ok()?;
        Some(Head {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize,
            ty: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// Append a frame header.
pub fn head(out: &mut Vec<u8>, len: usize, ty: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    let l = (len as u32).to_be_bytes();
    out.extend_from_slice(&[l[1], l[2], l[3], ty, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

pub fn rst_stream(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    head(out, 4, RST_STREAM, 0, stream);
    out.extend_from_slice(&(reason as u32).to_be_bytes());
}

pub fn window_update(out: &mut Vec<u8>, stream: u32, n: u32) {
    head(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&n.to_be_bytes());
}

pub fn goaway(out: &mut Vec<u8>, last: u32, reason: Reason, debug: &[u8]) {
    head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.extend_from_slice(&last.to_be_bytes());
    out.extend_from_slice(&(reason as u32).to_be_bytes());
    out.extend_from_slice(debug);
}

pub fn settings(out: &mut Vec<u8>, pairs: &[(u16, u32)]) {
    head(out, 6 * pairs.len(), SETTINGS, 0, 0);
    for (k, v) in pairs {
        out.extend_from_slice(&k.to_be_bytes());
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_the_reserved_bit_is_ignored() {
        let mut out = Vec::new();
        head(&mut out, 16_384, HEADERS, END_HEADERS | END_STREAM, 7);
        assert_eq!(
            Head::parse(&out),
            Some(Head {
                len: 16_384,
                ty: HEADERS,
                flags: END_HEADERS | END_STREAM,
                stream: 7
            })
        );
        out[5] |= 0x80;
        assert_eq!(Head::parse(&out).unwrap().stream, 7);
        assert_eq!(Head::parse(&out[..8]), None);
    }
}
