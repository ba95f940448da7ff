//! What a connection of the epoll loop (`crate::server`) is carried over:
//! the plain socket, or TLS records on it (rustls, in user space: this
//! kernel has no kTLS, `CONFIG_TLS` is not set, so the kernel cannot
//! encrypt for us and `sendfile(2)` cannot be used over TLS).
//!
//! The connection loop keeps its few I/O primitives (read into the request
//! buffer, write, write with more to come, send a file range, shut down)
//! and asks the [`Wire`] which way to do them: over TLS a read decrypts into
//! the request buffer, a write encrypts into rustls's buffer of records and
//! writes the records with one vectored `write` (`writev(2)`), a file range
//! is read with `pread(2)` in 256 KiB pieces and encrypted, and "more to
//! come" (`MSG_MORE` on the plain socket) just leaves the records buffered
//! until the body follows. Timeouts are those of the plain socket: reads
//! wait until the caller's deadline (header or idle timeout), writes at
//! most the send timeout.

use std::io::{self, Read, Write};
use std::net::TcpStream as StdStream;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use vcdn_http::tls::rustls::ServerConnection;

use crate::proxy::Cache;

/// Pieces in which a file range is read and encrypted over TLS.
pub(crate) const FILE_PIECE: usize = 256 * 1024;
/// Encrypted records held before they must be written out: one file piece
/// and its record overhead.
pub(crate) const TLS_BUFFER: usize = FILE_PIECE + 16 * 1024;

/// How a connection's bytes travel.
pub(crate) enum Wire {
    /// Straight on the socket.
    Plain,
    /// As TLS records, after a completed handshake.
    Tls(Box<ServerConnection>),
}

/// The socket as rustls reads and writes it, remembering whether the last
/// call was short: a short read means the socket is drained and a short
/// write that its buffer is full, so readiness can be cleared without the
/// system call that would return `EAGAIN` (as on the plain path).
struct Probe<'a> {
    s: &'a StdStream,
    short: bool,
}

impl Read for Probe<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (&mut &*self.s).read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

impl Write for Probe<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = (&mut &*self.s).write(b)?;
        self.short = n < b.len();
        Ok(n)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let n = (&mut &*self.s).write_vectored(bufs)?;
        self.short = n < want;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Run one write-like operation when the socket is writable, within the
/// send timeout. `op` returns the bytes written and whether the write was
/// short (the socket buffer is full): then readiness is cleared without
/// another call.
pub(crate) async fn write_op(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    mut op: impl FnMut(&StdStream) -> io::Result<(usize, bool)>,
) -> io::Result<usize> {
    // Usually the socket is writable: try at once, without a timer.
    match stream.try_io(tokio::io::Interest::WRITABLE, |s| op(s)) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        r => return r.map(|(n, _)| n),
    }
    let wait = Duration::from_millis(cache.cfg.send_timeout_ms);
    loop {
        let mut guard = match tokio::time::timeout(wait, stream.writable()).await {
            Ok(g) => g?,
            Err(_) => {
                cache.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client did not read the response in time",
                ));
            }
        };
        match guard.try_io(|s| op(s.get_ref())) {
            Ok(Ok((n, short))) => {
                if short {
                    guard.clear_ready();
                }
                return Ok(n);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Write every TLS record rustls holds, within the send timeout.
pub(crate) async fn push(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut ServerConnection,
) -> io::Result<()> {
    while tls.wants_write() {
        let n = write_op(stream, cache, |s| {
            let mut p = Probe { s, short: false };
            let n = tls.write_tls(&mut p)?;
            Ok((n, p.short))
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// Encrypt `b`; write the records out when rustls's buffer is full and, if
/// `now`, at the end (else they wait for what follows, like `MSG_MORE`).
pub(crate) async fn send(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut ServerConnection,
    b: &[u8],
    now: bool,
) -> io::Result<()> {
    let mut at = 0;
    while at < b.len() {
        let n = tls.writer().write(&b[at..])?;
        at += n;
        if n == 0 {
            if !tls.wants_write() {
                // Nothing buffered and nothing taken: the connection is
                // closing (close_notify sent).
                return Err(io::ErrorKind::WriteZero.into());
            }
            push(stream, cache, tls).await?;
        }
    }
    if now {
        push(stream, cache, tls).await?;
    }
    Ok(())
}

/// Send `len` bytes of `file` from `offset` over TLS: read with `pread(2)`
/// in [`FILE_PIECE`]s, each encrypted and written before the next is read,
/// so a large body holds one piece whatever its size.
pub(crate) async fn send_file(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut ServerConnection,
    file: &std::fs::File,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    let mut buf = vec![0u8; (len as usize).min(FILE_PIECE)];
    let mut off = offset;
    let end = offset + len;
    while off < end {
        let want = ((end - off) as usize).min(buf.len());
        let n = file.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the body's file is shorter than its length",
            ));
        }
        send(stream, cache, tls, &buf[..n], true).await?;
        off += n as u64;
    }
    Ok(())
}

/// Read and decrypt until some request bytes are appended to `rbuf` (their
/// number is returned), the client closes (0), or `deadline` passes
/// (`TimedOut`). Records that carry no request bytes (a partial record, a
/// key update) do not end the wait, so a client cannot keep a connection
/// past its deadline by sending them.
pub(crate) async fn fill(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut ServerConnection,
    rbuf: &mut BytesMut,
    deadline: Instant,
) -> io::Result<usize> {
    loop {
        // First what is already received: the handshake may have read the
        // first request with the client's Finished.
        let state = match tls.process_new_packets() {
            Ok(s) => s,
            Err(e) => {
                // rustls queued an alert saying why: a last try to send it.
                let _ = stream.try_io(tokio::io::Interest::WRITABLE, |s| {
                    tls.write_tls(&mut Probe { s, short: false })
                });
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        };
        let n = state.plaintext_bytes_to_read();
        let closed = state.peer_has_closed();
        if n > 0 {
            let at = rbuf.len();
            rbuf.resize(at + n, 0);
            tls.reader().read_exact(&mut rbuf[at..])?;
            return Ok(n);
        }
        if closed {
            return Ok(0);
        }
        if tls.wants_write() {
            // A key update's answer, say.
            push(stream, cache, tls).await?;
        }
        let mut guard = match tokio::time::timeout_at(deadline.into(), stream.readable()).await {
            Ok(g) => g?,
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        };
        let res = guard.try_io(|s| {
            let mut p = Probe {
                s: s.get_ref(),
                short: false,
            };
            let n = tls.read_tls(&mut p)?;
            Ok((n, p.short))
        });
        match res {
            // The client closed without close_notify: the same end for us.
            Ok(Ok((0, _))) => return Ok(0),
            Ok(Ok((_, short))) => {
                if short {
                    guard.clear_ready();
                }
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {
                if rbuf.is_empty() && rbuf.capacity() > 0 {
                    // Idle connections hold no buffer.
                    *rbuf = BytesMut::new();
                }
            }
        }
    }
}

/// Say goodbye with `close_notify`, without waiting: the alert is small and
/// goes out now or never (a client that does not read gets no more time).
pub(crate) fn close_notify(stream: &AsyncFd<StdStream>, tls: &mut ServerConnection) {
    tls.send_close_notify();
    while tls.wants_write() {
        match stream.try_io(tokio::io::Interest::WRITABLE, |s| {
            tls.write_tls(&mut Probe { s, short: false })
        }) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}
