//! What a connection of the epoll loop (`crate::server`) is carried over:
//! the plain socket, or TLS records on it (rustls, in user space: this
//! kernel has no kTLS, `CONFIG_TLS` is not set, so the kernel cannot
//! encrypt for us and `sendfile(2)` cannot be used over TLS).
//!
//! The connection loop keeps its few I/O primitives (read into the request
//! buffer, write, write with more to come, send a file range, shut down)
//! and asks the [`Wire`] which way to do them: over TLS a read decrypts into
//! the request buffer, a write encrypts straight into the connection's
//! outgoing buffer and writes it with one `write`, a file range is read
//! with `pread(2)` in 256 KiB pieces and encrypted, and "more to come"
//! (`MSG_MORE` on the plain socket) just leaves the records buffered until
//! the body follows. Timeouts are those of the plain socket: reads wait
//! until the caller's deadline (header or idle timeout), writes at most the
//! send timeout.
//!
//! TLS runs on rustls's unbuffered API ([`Tls`]): rustls keeps the
//! protocol state and keys, this module the bytes. A connection holds a
//! receive buffer only while it has a partial record and an outgoing one
//! only while records wait for the socket; otherwise both are the serving
//! thread's spares, so an idle TLS connection holds no buffer (rustls's
//! buffered `ServerConnection` kept a 4 KiB receive buffer for good).

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::TcpStream as StdStream;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use vcdn_http::tls::rustls;
use vcdn_http::tls::rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use vcdn_http::tls::rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, WriteTraffic,
};
use vcdn_http::tls::rustls::{HandshakeKind, ServerConfig};

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
    /// As TLS records, after a completed handshake (see [`handshake`]).
    Tls(Box<Tls>),
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

/// Write every waiting TLS record, within the send timeout.
pub(crate) async fn push(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut Tls,
) -> io::Result<()> {
    while tls.wants_write() {
        let n = write_op(stream, cache, |s| tls.write_to(s)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// Encrypt `b`; write the records out when more than [`TLS_BUFFER`] wait
/// and, if `now`, at the end (else they wait for what follows, like
/// `MSG_MORE`). Records are encrypted straight into the outgoing buffer
/// and leave with one `write`.
pub(crate) async fn send(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut Tls,
    b: &[u8],
    now: bool,
) -> io::Result<()> {
    let mut at = 0;
    while at < b.len() {
        let piece = (b.len() - at).min(FILE_PIECE);
        if tls.out.len() + piece > TLS_BUFFER && tls.wants_write() {
            push(stream, cache, tls).await?;
        }
        tls.encrypt(&b[at..at + piece])?;
        at += piece;
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
    tls: &mut Tls,
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
    tls: &mut Tls,
    rbuf: &mut BytesMut,
    deadline: Instant,
) -> io::Result<usize> {
    if !tls.early.is_empty() {
        let early = std::mem::take(&mut tls.early);
        rbuf.extend_from_slice(&early);
        return Ok(early.len());
    }
    loop {
        // First what is already received.
        let (stop, n) = match tls.process(Some(rbuf)) {
            Ok(r) => r,
            Err(e) => {
                // rustls queued an alert saying why: a last try to send it.
                tls.queue_alert();
                tls.try_flush(stream);
                return Err(tls_err(e));
            }
        };
        if n > 0 {
            return Ok(n);
        }
        if tls.peer_closed || matches!(stop, Stop::Closed) {
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
        match guard.try_io(|s| tls.read_from(s.get_ref())) {
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
pub(crate) fn close_notify(stream: &AsyncFd<StdStream>, tls: &mut Tls) {
    tls.send_close_notify();
    tls.try_flush(stream);
}

/// Largest TLS record on the wire: 16 KiB of plaintext and what TLS 1.2 may
/// add (rustls's `MAX_WIRE_SIZE`).
const MAX_RECORD: usize = 16 * 1024 + 2048 + 5;
/// Bytes asked of the socket by one read: a whole record and some.
const READ_SIZE: usize = MAX_RECORD + 4096;
/// Most bytes held waiting for the rest of a record or of a handshake
/// message (rustls joins a handshake message of up to 64 KiB across
/// records, in this buffer).
const MAX_INCOMING: usize = 64 * 1024 + MAX_RECORD;
/// Record overhead allowed for when encrypting: header, content type, tag
/// (22 bytes in TLS 1.3, 29 in TLS 1.2), rounded up.
const RECORD_OVERHEAD: usize = 64;

thread_local! {
    /// The serving thread's spare receive buffer: a connection takes it to
    /// read and gives it back as soon as it holds no partial record, so
    /// waiting connections hold none.
    static SPARE_IN: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
    /// The serving thread's spare buffer of outgoing records, likewise
    /// held only while records wait for the socket.
    static SPARE_OUT: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Bytes `b[start..end]` of a buffer that exists only while it holds some
/// (`b` is empty otherwise, its memory given back to the thread's spare).
#[derive(Default)]
struct Buf {
    b: Vec<u8>,
    start: usize,
    end: usize,
}

impl Buf {
    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    fn data(&mut self) -> &mut [u8] {
        &mut self.b[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Room for `want` more bytes after the data (taking the thread's
    /// spare, moving the data to the front, growing up to `limit`); less if
    /// `limit` stops it.
    fn room(
        &mut self,
        want: usize,
        spare: &'static std::thread::LocalKey<Cell<Vec<u8>>>,
        limit: usize,
    ) -> &mut [u8] {
        if self.b.is_empty() {
            self.b = spare.with(Cell::take);
            self.start = 0;
            self.end = 0;
        }
        if self.b.len() - self.end < want && self.start > 0 {
            self.b.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.b.len() - self.end < want && self.b.len() < limit {
            // Zeroed once per allocation: the spare is reused as it is.
            let size = (self.end + want).min(limit);
            self.b.resize(size, 0);
        }
        &mut self.b[self.end..]
    }

    /// Once empty, give the memory back to the thread's spare (the larger
    /// of the two is kept, if not over `keep`: a buffer grown for a rare
    /// large message is freed).
    fn settle(&mut self, spare: &'static std::thread::LocalKey<Cell<Vec<u8>>>, keep: usize) {
        if self.is_empty() && !self.b.is_empty() {
            let b = std::mem::take(&mut self.b);
            self.start = 0;
            self.end = 0;
            if b.len() <= keep {
                spare.with(|s| {
                    let had = s.take();
                    s.set(if had.len() >= b.len() { had } else { b });
                });
            }
        }
    }
}

/// A TLS connection on rustls's unbuffered API: rustls keeps the protocol
/// state and the keys, vcdn the bytes. Received bytes are held only while
/// they are a partial record and records to send only while they wait for
/// the socket, so an idle connection holds no buffer at all (the buffered
/// `ServerConnection` kept a 4 KiB receive buffer for good).
pub(crate) struct Tls {
    conn: UnbufferedServerConnection,
    /// Received, not yet processed: a partial record (or handshake message).
    inc: Buf,
    /// Records waiting for the socket, in order.
    out: Buf,
    /// The client sent close_notify.
    peer_closed: bool,
    /// rustls failed (its alert is sent): nothing more is given to it.
    failed: bool,
    /// Request bytes decrypted while writing (the first request came with
    /// the client's Finished, and HTTP/2 speaks first): `fill` gives them
    /// before anything else. Empty, without memory, otherwise.
    early: Vec<u8>,
}

/// Where processing the received bytes stopped.
enum Stop {
    /// More bytes are needed (the handshake goes on).
    Read,
    /// The connection is established and everything received is processed.
    Ready,
    /// The client sent close_notify (or both sides did).
    Closed,
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Tls {
    pub(crate) fn new(config: Arc<ServerConfig>) -> Result<Box<Self>, rustls::Error> {
        Ok(Box::new(Tls {
            conn: UnbufferedServerConnection::new(config)?,
            inc: Buf::default(),
            out: Buf::default(),
            peer_closed: false,
            failed: false,
            early: Vec::new(),
        }))
    }

    /// The protocol chosen by ALPN.
    pub(crate) fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// Whether the handshake resumed a session.
    pub(crate) fn handshake_kind(&self) -> Option<HandshakeKind> {
        self.conn.handshake_kind()
    }

    /// Process what was received: handshake records are answered (the
    /// answers go to `out`), application data is appended to `rbuf` (if
    /// `None`, to `early`, for `fill`). Returns where it stopped and the
    /// bytes appended to `rbuf`.
    fn process(&mut self, mut rbuf: Option<&mut BytesMut>) -> Result<(Stop, usize), rustls::Error> {
        if self.failed {
            return Err(rustls::Error::General("the TLS connection failed".into()));
        }
        let mut got = 0;
        let stop = loop {
            let Tls {
                conn,
                inc,
                out,
                peer_closed,
                failed,
                early,
            } = &mut *self;
            let data: &mut [u8] = if inc.b.is_empty() {
                &mut []
            } else {
                inc.data()
            };
            let status = conn.process_tls_records(data);
            let mut discard = status.discard;
            let state = match status.state {
                Ok(s) => s,
                Err(e) => {
                    *failed = true;
                    return Err(e);
                }
            };
            let stop = match state {
                ConnectionState::EncodeTlsData(mut e) => {
                    let mut want = MAX_RECORD;
                    loop {
                        match e.encode(out.room(want, &SPARE_OUT, usize::MAX)) {
                            Ok(n) => {
                                out.end += n;
                                break;
                            }
                            Err(EncodeError::InsufficientSize(s)) => want = s.required_size,
                            Err(_) => break,
                        }
                    }
                    None
                }
                // The records are in `out`, in order: they leave with the
                // next push.
                ConnectionState::TransmitTlsData(t) => {
                    t.done();
                    None
                }
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(rec) = r.next_record() {
                        let rec = match rec {
                            Ok(r) => r,
                            Err(e) => {
                                *failed = true;
                                return Err(e);
                            }
                        };
                        discard += rec.discard;
                        match rbuf.as_deref_mut() {
                            Some(rbuf) => {
                                rbuf.extend_from_slice(rec.payload);
                                got += rec.payload.len();
                            }
                            None => early.extend_from_slice(rec.payload),
                        }
                    }
                    None
                }
                ConnectionState::PeerClosed => {
                    *peer_closed = true;
                    Some(Stop::Closed)
                }
                ConnectionState::Closed => Some(Stop::Closed),
                ConnectionState::BlockedHandshake => Some(Stop::Read),
                ConnectionState::WriteTraffic(_) => Some(Stop::Ready),
                _ => {
                    return Err(rustls::Error::General(
                        "unexpected TLS connection state (early data is not accepted)".into(),
                    ))
                }
            };
            inc.consume(discard);
            if let Some(s) = stop {
                break s;
            }
        };
        self.inc.settle(&SPARE_IN, READ_SIZE);
        Ok((stop, got))
    }

    /// Run `f` with rustls's permission to send application data, after
    /// queueing any handshake records rustls has to send first (a key
    /// update's answer, say), so records leave in order.
    fn with_write<R>(
        &mut self,
        mut f: impl FnMut(&mut WriteTraffic<'_, ServerConnectionData>, &mut Buf) -> R,
    ) -> io::Result<R> {
        match self.process(None).map_err(tls_err)? {
            (Stop::Ready, _) | (Stop::Closed, _) => {}
            (Stop::Read, _) => return Err(io::ErrorKind::NotConnected.into()),
        }
        let Tls { conn, inc, out, .. } = &mut *self;
        let data: &mut [u8] = if inc.b.is_empty() {
            &mut []
        } else {
            inc.data()
        };
        let status = conn.process_tls_records(data);
        let state = match status.state {
            Ok(s) => s,
            Err(e) => {
                self.failed = true;
                return Err(tls_err(e));
            }
        };
        match state {
            ConnectionState::WriteTraffic(mut w) => Ok(f(&mut w, out)),
            // Both sides closed, or request bytes not yet read (never left
            // unread by `fill`): no more records from us.
            _ => Err(io::ErrorKind::WriteZero.into()),
        }
    }

    /// Encrypt `data` into records waiting in `out`.
    fn encrypt(&mut self, data: &[u8]) -> io::Result<()> {
        let mut want = data.len() + (data.len() / (16 * 1024) + 1) * RECORD_OVERHEAD;
        loop {
            let r = self.with_write(|w, out| {
                let n = w.encrypt(data, out.room(want, &SPARE_OUT, usize::MAX))?;
                out.end += n;
                Ok::<_, EncryptError>(())
            })?;
            match r {
                Ok(()) => return Ok(()),
                Err(EncryptError::InsufficientSize(s)) if s.required_size > want => {
                    want = s.required_size
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }

    /// Queue close_notify (once the handshake is done; else nothing).
    pub(crate) fn send_close_notify(&mut self) {
        let _ = self.with_write(|w, out| {
            if let Ok(n) = w.queue_close_notify(out.room(RECORD_OVERHEAD, &SPARE_OUT, usize::MAX)) {
                out.end += n;
            }
        });
    }

    /// Write waiting records with one call; returns the bytes written and
    /// whether the write was short.
    fn write_to(&mut self, s: &StdStream) -> io::Result<(usize, bool)> {
        let want = self.out.len();
        let n = (&mut &*s).write(self.out.data())?;
        self.out.consume(n);
        self.out.settle(&SPARE_OUT, 2 * TLS_BUFFER);
        Ok((n, n < want))
    }

    /// Read once into the receive buffer; returns the bytes read and
    /// whether the read was short (the socket is drained).
    fn read_from(&mut self, s: &StdStream) -> io::Result<(usize, bool)> {
        // A partial record stays where it is and the read fills the rest of
        // the buffer (at least 4 KiB): the buffer grows past READ_SIZE only
        // for a handshake message joined across records.
        let want = READ_SIZE.saturating_sub(self.inc.len()).max(4096);
        let room = self.inc.room(want, &SPARE_IN, MAX_INCOMING);
        if room.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a TLS record or handshake message larger than 64 KiB",
            ));
        }
        let want = room.len();
        let r = (&mut &*s).read(room);
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                self.inc.settle(&SPARE_IN, READ_SIZE);
                return Err(e);
            }
        };
        self.inc.end += n;
        self.inc.settle(&SPARE_IN, READ_SIZE);
        Ok((n, n < want))
    }

    /// After a TLS error: rustls queued an alert saying why; move it to
    /// `out` (the caller tries once to send it). One call: rustls gives
    /// its queued records before it looks at received bytes again.
    fn queue_alert(&mut self) {
        let Tls { conn, inc, out, .. } = &mut *self;
        let data: &mut [u8] = if inc.b.is_empty() {
            &mut []
        } else {
            inc.data()
        };
        if let Ok(ConnectionState::EncodeTlsData(mut e)) = conn.process_tls_records(data).state {
            if let Ok(n) = e.encode(out.room(MAX_RECORD, &SPARE_OUT, usize::MAX)) {
                out.end += n;
            }
        }
    }

    /// Send what `out` holds without waiting (an alert, a close_notify).
    fn try_flush(&mut self, stream: &AsyncFd<StdStream>) {
        while !self.out.is_empty() {
            match stream.try_io(tokio::io::Interest::WRITABLE, |s| self.write_to(s)) {
                Ok((n, _)) if n > 0 => {}
                _ => break,
            }
        }
    }

    /// Whether records wait for the socket.
    pub(crate) fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }
}

/// The handshake: records read and answered until the connection is
/// established (the caller bounds it in time), then the server's last
/// records (TLS 1.3 session tickets) written. A failed handshake sends
/// rustls's alert when it can.
pub(crate) async fn handshake(
    stream: &AsyncFd<StdStream>,
    cache: &Cache,
    tls: &mut Tls,
) -> io::Result<()> {
    loop {
        let stop = match tls.process(None) {
            Ok((stop, _)) => stop,
            Err(e) => {
                tls.queue_alert();
                tls.try_flush(stream);
                return Err(tls_err(e));
            }
        };
        if tls.wants_write() {
            push(stream, cache, tls).await?;
        }
        match stop {
            Stop::Read => {}
            Stop::Ready if !tls.conn.is_handshaking() => return Ok(()),
            Stop::Ready => {}
            Stop::Closed => return Err(io::ErrorKind::UnexpectedEof.into()),
        }
        let mut guard = stream.readable().await?;
        match guard.try_io(|s| tls.read_from(s.get_ref())) {
            Ok(Ok((0, _))) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(Ok((_, short))) => {
                if short {
                    guard.clear_ready();
                }
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
}

/// Close without a reset: closing a socket with unread bytes makes the
/// kernel answer RST, and the client may lose the last answer (or
/// GOAWAY). So stop writing (close_notify over TLS, then FIN), then read
/// and drop what still comes until the client closes, `until` passes or
/// `max` bytes were dropped. Shared by both front ends.
pub(crate) async fn linger(
    stream: &AsyncFd<StdStream>,
    wire: &mut Wire,
    cache: &Cache,
    rbuf: &mut BytesMut,
    until: Instant,
    max: usize,
) {
    if let Wire::Tls(tls) = wire {
        tls.send_close_notify();
        if push(stream, cache, tls).await.is_err() {
            return;
        }
    }
    let _ = rustix::net::shutdown(stream.get_ref(), rustix::net::Shutdown::Write);
    let mut dropped = 0;
    while dropped < max {
        rbuf.clear();
        let n = match wire {
            Wire::Tls(tls) => fill(stream, cache, tls, rbuf, until).await,
            Wire::Plain => read_plain(stream, until).await,
        };
        match n {
            Ok(0) | Err(_) => break,
            Ok(n) => dropped += n,
        }
    }
    *rbuf = BytesMut::new();
}

/// Read and drop what the plain socket holds (for [`linger`]).
async fn read_plain(stream: &AsyncFd<StdStream>, until: Instant) -> io::Result<usize> {
    loop {
        let mut guard = match tokio::time::timeout_at(until.into(), stream.readable()).await {
            Ok(g) => g?,
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        };
        let mut buf = [0u8; 16 * 1024];
        match guard.try_io(|s| (&mut s.get_ref()).read(&mut buf)) {
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}
