//! A connection with a small read buffer for the parts parsed in user space
//! (heads, hop headers, chunk-size lines, frame lengths), and the body
//! copiers built on [`crate::splice::relay_exact`]: whatever was read ahead
//! into the buffer is written first, the rest is spliced.

use std::io;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::net::TcpStream;

use crate::splice::{relay_exact, Pipe};
use crate::wire::MAX_FRAME;

/// Longest chunk-size line or trailer section accepted.
const MAX_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

pub struct Conn {
    pub stream: TcpStream,
    pub buf: BytesMut,
}

fn timed_out(what: &str, t: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what}: nothing for {t:?}"),
    )
}

fn eof(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("{what}: connection closed"),
    )
}

/// Writes all of `b` to `to`, failing when it accepts nothing for `stall`.
pub async fn write_all(to: &TcpStream, mut b: &[u8], stall: Duration) -> io::Result<()> {
    while !b.is_empty() {
        match to.try_write(b) {
            Ok(n) => b = &b[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tokio::time::timeout(stall, to.writable())
                    .await
                    .map_err(|_| timed_out("write", stall))??;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where a copied body goes: as it is, or wrapped in hop frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    Raw,
    Frames,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: BytesMut::with_capacity(8192),
        }
    }

    /// Reads more into the buffer: `Ok(0)` at end of stream.
    pub async fn fill(&mut self, t: Duration) -> io::Result<usize> {
        loop {
            if self.buf.capacity() - self.buf.len() < 1024 {
                self.buf.reserve(8192);
            }
            match self.stream.try_read_buf(&mut self.buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tokio::time::timeout(t, self.stream.readable())
                        .await
                        .map_err(|_| timed_out("read", t))??;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes exactly `n` bytes (n is bounded by the caller).
    pub async fn take(&mut self, n: usize, t: Duration) -> io::Result<BytesMut> {
        while self.buf.len() < n {
            if self.fill(t).await? == 0 {
                return Err(eof("read"));
            }
        }
        Ok(self.buf.split_to(n))
    }

    /// Takes one CRLF-terminated line (with its CRLF), at most `MAX_LINE`.
    async fn line(&mut self, t: Duration) -> io::Result<BytesMut> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                return Ok(self.buf.split_to(i + 2));
            }
            if self.buf.len() > MAX_LINE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "chunk line too long",
                ));
            }
            if self.fill(t).await? == 0 {
                return Err(eof("chunked body"));
            }
        }
    }

    /// Moves exactly `n` body bytes to `to`: the buffered ones first.
    pub async fn relay(
        &mut self,
        to: &TcpStream,
        n: u64,
        pipe: &mut Pipe,
        t: Duration,
    ) -> io::Result<()> {
        let ahead = (self.buf.len() as u64).min(n) as usize;
        if ahead > 0 {
            write_all(to, &self.buf[..ahead], t).await?;
            self.buf.advance(ahead);
        }
        if n > ahead as u64 {
            match pipe.sockmap.clone() {
                Some(map) => {
                    map.relay_exact(&self.stream, to, n - ahead as u64, t)
                        .await?
                }
                None => relay_exact(&self.stream, to, n - ahead as u64, pipe, t).await?,
            }
        }
        Ok(())
    }

    /// As [`Conn::relay`], always through the pipe: frames are too short
    /// for joining and leaving the sockmap to pay.
    async fn relay_spliced(
        &mut self,
        to: &TcpStream,
        n: u64,
        pipe: &mut Pipe,
        t: Duration,
    ) -> io::Result<()> {
        let map = pipe.sockmap.take();
        let r = self.relay(to, n, pipe, t).await;
        pipe.sockmap = map;
        r
    }

    /// Moves `n` bytes as one or more frames (or raw).
    async fn piece(
        &mut self,
        to: &TcpStream,
        mut n: u64,
        out: Out,
        pipe: &mut Pipe,
        t: Duration,
    ) -> io::Result<()> {
        while n > 0 {
            let k = n.min(u64::from(MAX_FRAME));
            if out == Out::Frames {
                write_all(to, &(k as u32).to_be_bytes(), t).await?;
            }
            self.relay_spliced(to, k, pipe, t).await?;
            n -= k;
        }
        Ok(())
    }

    /// Copies a chunked body (its raw coding, size lines, data, trailers)
    /// to `to`; data of each chunk is spliced. Returns the bytes copied.
    pub async fn copy_chunked(
        &mut self,
        to: &TcpStream,
        out: Out,
        pipe: &mut Pipe,
        t: Duration,
    ) -> io::Result<u64> {
        let mut total = 0;
        loop {
            let line = self.line(t).await?;
            let size = chunk_size(&line)?;
            let mut raw = line;
            if size == 0 {
                // Trailer fields up to the empty line.
                let mut trailers = 0;
                loop {
                    let l = self.line(t).await?;
                    trailers += l.len();
                    if trailers > MAX_TRAILERS {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "trailers too large",
                        ));
                    }
                    let end = l.len() == 2;
                    raw.extend_from_slice(&l);
                    if end {
                        break;
                    }
                }
            }
            self.write_piece(to, &raw, out, t).await?;
            total += raw.len() as u64;
            if size == 0 {
                break;
            }
            // Data and its CRLF (checked after the splice would cost a
            // copy; the receiver's parser sees a broken coding anyway).
            self.piece(to, size + 2, out, pipe, t).await?;
            total += size + 2;
        }
        if out == Out::Frames {
            write_all(to, &0u32.to_be_bytes(), t).await?;
        }
        Ok(total)
    }

    /// Copies until the peer closes (a close-delimited body). Bytes are
    /// read in user space here: the length of each piece is only known
    /// once read. Returns the bytes copied.
    pub async fn copy_until_close(
        &mut self,
        to: &TcpStream,
        out: Out,
        t: Duration,
    ) -> io::Result<u64> {
        let mut total = 0;
        loop {
            if self.buf.is_empty() && self.fill(t).await? == 0 {
                break;
            }
            let b = self.buf.split();
            self.write_piece(to, &b, out, t).await?;
            total += b.len() as u64;
        }
        if out == Out::Frames {
            write_all(to, &0u32.to_be_bytes(), t).await?;
        }
        Ok(total)
    }

    /// Copies a framed body: to `Out::Raw` unwraps it, to `Out::Frames`
    /// passes the frames on. Returns the payload bytes.
    pub async fn copy_frames(
        &mut self,
        to: &TcpStream,
        out: Out,
        pipe: &mut Pipe,
        t: Duration,
    ) -> io::Result<u64> {
        let mut total = 0;
        loop {
            let len = self.take(4, t).await?;
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            if len > MAX_FRAME {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "frame too large",
                ));
            }
            if len == 0 {
                if out == Out::Frames {
                    write_all(to, &0u32.to_be_bytes(), t).await?;
                }
                return Ok(total);
            }
            self.piece(to, u64::from(len), out, pipe, t).await?;
            total += u64::from(len);
        }
    }

    async fn write_piece(&self, to: &TcpStream, b: &[u8], out: Out, t: Duration) -> io::Result<()> {
        if b.is_empty() {
            return Ok(());
        }
        if out == Out::Frames {
            let mut v = Vec::with_capacity(4 + b.len());
            v.extend_from_slice(&(b.len() as u32).to_be_bytes());
            v.extend_from_slice(b);
            return write_all(to, &v, t).await;
        }
        write_all(to, b, t).await
    }

    /// Whether a pooled connection is still usable: open, and nothing
    /// unexpected waiting to be read (a non-blocking peek).
    pub fn idle_ok(&self) -> bool {
        use std::os::fd::AsRawFd;
        if !self.buf.is_empty() {
            return false;
        }
        let mut b = [0u8; 1];
        // SAFETY: recv into a local buffer on a descriptor we own.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
    }
}

/// The size of a chunk-size line (`1a;ext=1\r\n`).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad chunk size");
    let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(bad());
    }
    let rest = &line[digits..];
    if !(rest == b"\r\n"
        || rest
            .first()
            .is_some_and(|&c| c == b';' || c == b' ' || c == b'\t'))
    {
        return Err(bad());
    }
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).map_err(|_| bad())?, 16)
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::chunk_size;

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size(b"1a\r\n").unwrap(), 26);
        assert_eq!(chunk_size(b"0;x=y\r\n").unwrap(), 0);
        assert!(chunk_size(b"\r\n").is_err());
        assert!(chunk_size(b"-1\r\n").is_err());
        assert!(chunk_size(b"1g\r\n").is_err());
        assert!(chunk_size(b"ffffffffffffffff\r\n").is_err());
    }
}
