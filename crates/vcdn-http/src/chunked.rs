//! Incremental decoder for the chunked transfer coding (RFC 9112 §7.1),
//! with limits on the chunk-size line and the trailer section.

use bytes::{Bytes, BytesMut};

use crate::header::find_crlf;
use crate::ParseError;

const MAX_SIZE_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for a chunk-size line.
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Waiting for the CRLF that ends chunk data.
    DataEnd,
    /// After the last chunk, reading trailer fields (bytes so far).
    Trailers(usize),
    Done,
}

/// What one step of decoding produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Some body bytes.
    Data(Bytes),
    /// The buffer holds no complete next element: read more.
    NeedMore,
    /// The body is complete (last chunk and trailers consumed).
    Done,
}

#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder { state: State::Size }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decode from the front of `buf`, consuming what it uses.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ParseError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::Done),
                State::Size => {
                    let Some(i) = find_crlf(buf) else {
                        if content_len(buf) > MAX_SIZE_LINE {
                            return Err(ParseError::BadRequest("chunk-size line too long"));
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    if i > MAX_SIZE_LINE {
                        return Err(ParseError::BadRequest("chunk-size line too long"));
                    }
                    let line = &buf[..i];
                    let hex_end = line
                        .iter()
                        .position(|c| !c.is_ascii_hexdigit())
                        .unwrap_or(line.len());
                    if hex_end == 0 || hex_end > 15 {
                        return Err(ParseError::BadRequest("invalid chunk size"));
                    }
                    let rest = &line[hex_end..];
                    // Only chunk extensions (";...") may follow, possibly after BWS.
                    let rest_trim = rest.iter().position(|&c| c != b' ' && c != b'\t');
                    if let Some(p) = rest_trim {
                        if rest[p] != b';' || rest.iter().any(|&c| c < b' ' && c != b'\t') {
                            return Err(ParseError::BadRequest("invalid chunk extension"));
                        }
                    }
                    let size = line[..hex_end].iter().fold(0u64, |n, &c| {
                        n * 16 + u64::from((c as char).to_digit(16).unwrap_or(0))
                    });
                    let _ = buf.split_to(i + 2);
                    self.state = if size == 0 {
                        State::Trailers(0)
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = (buf.len() as u64).min(left) as usize;
                    let data = buf.split_to(n).freeze();
                    self.state = if left == n as u64 {
                        State::DataEnd
                    } else {
                        State::Data(left - n as u64)
                    };
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(ParseError::BadRequest("chunk data not followed by CRLF"));
                    }
                    let _ = buf.split_to(2);
                    self.state = State::Size;
                }
                State::Trailers(seen) => {
                    let Some(i) = find_crlf(buf) else {
                        let n = content_len(buf);
                        if n > 0 && seen + n > MAX_TRAILERS {
                            return Err(ParseError::HeadersTooLarge);
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    let _ = buf.split_to(i + 2);
                    if i == 0 {
                        self.state = State::Done;
                        return Ok(Decoded::Done);
                    }
                    if seen + i > MAX_TRAILERS {
                        return Err(ParseError::HeadersTooLarge);
                    }
                    self.state = State::Trailers(seen + i + 2);
                }
            }
        }
    }
}

/// Length of an unterminated line, not counting a final CR that may be the
/// start of its CRLF (so the verdict does not depend on read boundaries).
fn content_len(buf: &[u8]) -> usize {
    buf.len() - usize::from(buf.last() == Some(&b'\r'))
}

/// The chunk header for `len` bytes of data: `"{len:x}\r\n"`.
pub fn chunk_header(len: usize, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(out, "{len:x}\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], step: usize) -> Result<Vec<u8>, ParseError> {
        let mut d = ChunkedDecoder::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match d.decode(&mut buf)? {
                    Decoded::Data(b) => out.extend_from_slice(&b),
                    Decoded::NeedMore => break,
                    Decoded::Done => return Ok(out),
                }
            }
        }
        Err(ParseError::BadRequest("incomplete"))
    }

    #[test]
    fn decodes_in_any_split() {
        let msg = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
        for step in 1..msg.len() {
            assert_eq!(decode_all(msg, step).unwrap(), b"hello world");
        }
    }

    /// Found by fuzzing: limits at their exact size, fed byte by byte.
    #[test]
    fn limits_hold_at_any_split() {
        let mut size_line = b"1;".to_vec();
        size_line.resize(MAX_SIZE_LINE, b'x');
        size_line.extend_from_slice(b"\r\na\r\n0\r\n\r\n");
        assert_eq!(decode_all(&size_line, size_line.len()).unwrap(), b"a");
        assert_eq!(decode_all(&size_line, 1).unwrap(), b"a");
        let mut trailer = b"0\r\nX: ".to_vec();
        trailer.resize(3 + MAX_TRAILERS, b't');
        trailer.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            decode_all(&trailer, trailer.len()).is_ok(),
            decode_all(&trailer, 1).is_ok()
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(decode_all(b"zz\r\n", 10).is_err());
        assert!(decode_all(b"5\r\nhelloXX0\r\n\r\n", 100).is_err());
        assert!(decode_all(b"-1\r\n", 100).is_err());
        assert!(decode_all(b"ffffffffffffffffff\r\n", 100).is_err());
        assert!(decode_all(b"5 x\r\nhello\r\n0\r\n\r\n", 100).is_err());
    }
}
