//! The server side of one HTTP/2 connection, sans I/O: bytes in
//! ([`Connection::recv`]), events and frames to write out. The caller owns
//! the socket and the streams' answers; this type owns the protocol: the
//! preface, SETTINGS, stream states and ids, flow control both ways, header
//! blocks (joined across CONTINUATION, bounded) decoded into HTTP/1.1
//! request heads, and the errors of RFC 9113 §5.4 with their codes.
//!
//! Abuse limits: streams over `max_concurrent_streams` are refused
//! (REFUSED_STREAM); streams opened and reset by the client within one read
//! (rapid reset, CVE-2023-44487), client resets that are most of the
//! streams, and stream errors of our own past their bounds end the
//! connection with GOAWAY ENHANCE_YOUR_CALM; a header block is bounded in
//! bytes and in CONTINUATION frames (the 2024 CONTINUATION flood), and the
//! decoded list by `max_header_list` (over it: [`Event::TooLarge`], the
//! caller answers 431).

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use super::frame::{self, Head, Reason};
use super::request::{trailer_ok, Builder, Request};
use crate::hpack::{Decoder, DEFAULT_TABLE_SIZE};

/// The limits of a connection.
#[derive(Debug, Clone)]
pub struct Config {
    pub max_concurrent_streams: u32,
    /// The receive window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).
    pub stream_window: u32,
    /// The receive window of the connection.
    pub connection_window: u32,
    /// The largest decoded header list (SETTINGS_MAX_HEADER_LIST_SIZE).
    pub max_header_list: usize,
    /// Streams opened and reset by the client within one read.
    pub max_pending_accept_resets: usize,
    /// Streams this side reset for the client's errors.
    pub max_local_error_resets: usize,
    /// Client resets, once they are also most of the streams opened.
    pub max_client_resets: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_concurrent_streams: 100,
            stream_window: 256 << 10,
            connection_window: 1 << 20,
            max_header_list: 32 << 10,
            max_pending_accept_resets: 20,
            max_local_error_resets: 1024,
            max_client_resets: 1000,
        }
    }
}

/// What happened on the connection, for the caller to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A stream opened with this request; `end_stream`: no body follows.
    Request {
        id: u32,
        request: Request,
        end_stream: bool,
    },
    /// A stream opened with a header list over `max_header_list`: answer
    /// 431. Its body, if any, still comes as [`Event::Data`].
    TooLarge { id: u32, end_stream: bool },
    /// Request body bytes (padding removed; give them back with
    /// [`Connection::release`] once consumed), and whether the body ends.
    Data { id: u32, data: Bytes, end: bool },
    /// The stream is gone (reset by the client, or by this side for its
    /// error): stop answering it.
    Reset { id: u32, by_client: bool },
}

/// A connection error: GOAWAY with `reason` is already in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error {
    pub reason: Reason,
    pub why: &'static str,
}

#[derive(Debug)]
struct Stream {
    /// The client may still send on it.
    recv_open: bool,
    /// We may still send on it.
    send_open: bool,
    send_window: i64,
    recv_window: i64,
    /// Bytes consumed but not yet given back in a WINDOW_UPDATE.
    unacked: u32,
    content_length: Option<u64>,
    received: u64,
    /// The `recv` call that opened it (rapid reset within one read).
    batch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Preface,
    /// The preface was read; the first frame must be SETTINGS.
    Settings,
    Open,
    /// GOAWAY with an error was sent: nothing more is read.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    /// A new stream's request.
    Open,
    /// The trailers of an open stream.
    Trailers,
    /// Decoded only to keep the HPACK table in step; the stream is
    /// refused or reset with this reason (None: ignored after GOAWAY).
    Discard(Option<Reason>),
}

/// A header block being gathered across CONTINUATION frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    kind: BlockKind,
    frames: u32,
}

/// CONTINUATION frames one header block may take.
const MAX_BLOCK_FRAMES: u32 = 64;

pub struct Connection {
    cfg: Config,
    phase: Phase,
    decoder: Decoder,
    streams: HashMap<u32, Stream>,
    /// The highest stream id the client opened (or that was refused).
    last_id: u32,
    /// GOAWAY sent: streams above this id are ignored.
    goaway: Option<u32>,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    recv_window: i64,
    unacked: u32,
    block: Option<Block>,
    block_bytes: Vec<u8>,
    /// Frames to write.
    pub out: Vec<u8>,
    batch: u64,
    batch_resets: usize,
    client_resets: u64,
    opened: u64,
    local_resets: usize,
    peer_goaway: bool,
    /// The client's SETTINGS_HEADER_TABLE_SIZE.
    peer_table_size: u32,
    /// The client lowered it: the next header block starts with a size
    /// update (to 0: this side never indexes), RFC 7541 §4.2.
    table_update: bool,
}

impl Connection {
    /// A connection whose first output (in [`Connection::out`]) is the
    /// server's SETTINGS and the connection window's first update.
    pub fn new(cfg: Config) -> Connection {
        let mut out = Vec::with_capacity(64);
        frame::settings(
            &mut out,
            &[
                (
                    frame::SETTINGS_MAX_CONCURRENT_STREAMS,
                    cfg.max_concurrent_streams,
                ),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, cfg.stream_window),
                (
                    frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                    cfg.max_header_list.min(u32::MAX as usize) as u32,
                ),
            ],
        );
        let extra = cfg.connection_window.saturating_sub(frame::DEFAULT_WINDOW);
        if extra > 0 {
            frame::window_update(&mut out, 0, extra);
        }
        Connection {
            recv_window: frame::DEFAULT_WINDOW as i64 + extra as i64,
            cfg,
            phase: Phase::Preface,
            decoder: Decoder::new(DEFAULT_TABLE_SIZE),
            streams: HashMap::new(),
            last_id: 0,
            goaway: None,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            peer_initial_window: frame::DEFAULT_WINDOW as i64,
            send_window: frame::DEFAULT_WINDOW as i64,
            unacked: 0,
            block: None,
            block_bytes: Vec::new(),
            out,
            batch: 0,
            batch_resets: 0,
            client_resets: 0,
            opened: 0,
            local_resets: 0,
            peer_goaway: false,
            peer_table_size: DEFAULT_TABLE_SIZE as u32,
            table_update: false,
        }
    }

    /// Streams open (counted against the concurrency limit).
    pub fn active(&self) -> usize {
        self.streams.len()
    }

    /// Streams the client opened so far.
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// The highest stream id the client opened.
    pub fn last_stream(&self) -> u32 {
        self.last_id
    }

    /// The preface has not been read yet.
    pub fn awaiting_preface(&self) -> bool {
        self.phase == Phase::Preface
    }

    /// The client sent GOAWAY, or this side did: no new streams come, the
    /// connection ends when the open ones are done.
    pub fn going_away(&self) -> bool {
        self.peer_goaway || self.goaway.is_some()
    }

    /// A connection error was sent: close once the output is written.
    pub fn failed(&self) -> bool {
        self.phase == Phase::Failed
    }

    /// Free memory held for reading when nothing is pending (idle).
    pub fn shrink(&mut self) {
        if self.block.is_none() {
            self.block_bytes = Vec::new();
        }
        if self.streams.is_empty() {
            self.streams = HashMap::new();
        }
    }

    /// Read what `buf` holds: complete frames are taken out of it (a
    /// partial one stays for the next call); events go to `events`.
    pub fn recv(&mut self, buf: &mut BytesMut, events: &mut Vec<Event>) -> Result<(), Error> {
        match self.phase {
            Phase::Failed => {
                buf.clear();
                return Ok(());
            }
            Phase::Preface => {
                let n = buf.len().min(frame::PREFACE.len());
                if buf[..n] != frame::PREFACE[..n] {
                    return Err(self.fail(Reason::ProtocolError, "not the HTTP/2 preface"));
                }
                if n < frame::PREFACE.len() {
                    return Ok(());
                }
                let _ = buf.split_to(n);
                self.phase = Phase::Settings;
            }
            _ => {}
        }
        self.batch += 1;
        self.batch_resets = 0;
        // The complete frames, taken out at once.
        let mut end = 0;
        while let Some(h) = Head::parse(&buf[end..]) {
            if h.len > frame::DEFAULT_MAX_FRAME {
                return Err(self.fail(Reason::FrameSizeError, "a frame over the maximum size"));
            }
            if buf.len() - end < 9 + h.len {
                break;
            }
            end += 9 + h.len;
        }
        if end == 0 {
            return Ok(());
        }
        let chunk = buf.split_to(end).freeze();
        let mut at = 0;
        while at < chunk.len() {
            let h = Head::parse(&chunk[at..]).expect("a whole frame");
            let payload = chunk.slice(at + 9..at + 9 + h.len);
            at += 9 + h.len;
            if let Err((reason, why)) = self.frame(h, payload, events) {
                return Err(self.fail(reason, why));
            }
        }
        Ok(())
    }

    /// Send GOAWAY with `reason` and stop reading.
    fn fail(&mut self, reason: Reason, why: &'static str) -> Error {
        frame::goaway(&mut self.out, self.last_id, reason, why.as_bytes());
        self.phase = Phase::Failed;
        self.goaway = Some(self.last_id);
        self.block = None;
        self.block_bytes = Vec::new();
        Error { reason, why }
    }

    /// Say GOAWAY (`NoError` on drain or idle, or `EnhanceYourCalm`): no
    /// stream above the last one opened is taken.
    pub fn goaway(&mut self, reason: Reason, why: &str) {
        if self.phase == Phase::Failed {
            return;
        }
        frame::goaway(&mut self.out, self.last_id, reason, why.as_bytes());
        self.goaway = Some(self.last_id);
        if reason != Reason::NoError {
            self.phase = Phase::Failed;
        }
    }

    /// Reset a stream from this side (a timeout, a failed answer).
    pub fn reset(&mut self, id: u32, reason: Reason) {
        if self.streams.remove(&id).is_some() {
            frame::rst_stream(&mut self.out, id, reason);
        }
    }

    /// Reset a stream for the client's error, counted against the bound.
    fn stream_error(
        &mut self,
        id: u32,
        reason: Reason,
        events: &mut Vec<Event>,
    ) -> Result<(), (Reason, &'static str)> {
        frame::rst_stream(&mut self.out, id, reason);
        if self.streams.remove(&id).is_some() {
            events.push(Event::Reset {
                id,
                by_client: false,
            });
        }
        self.local_resets += 1;
        if self.local_resets > self.cfg.max_local_error_resets {
            return Err((Reason::EnhanceYourCalm, "too many streams reset for errors"));
        }
        Ok(())
    }

    fn frame(
        &mut self,
        h: Head,
        p: Bytes,
        events: &mut Vec<Event>,
    ) -> Result<(), (Reason, &'static str)> {
        use frame::*;
        if self.phase == Phase::Settings {
            if h.ty != SETTINGS || h.has(ACK) {
                return Err((Reason::ProtocolError, "the first frame is not SETTINGS"));
            }
            self.phase = Phase::Open;
        }
        if let Some(b) = &self.block {
            if h.ty != CONTINUATION || h.stream != b.stream {
                return Err((
                    Reason::ProtocolError,
                    "a header block interrupted by another frame",
                ));
            }
        }
        match h.ty {
            DATA => self.data(h, p, events),
            HEADERS => self.headers(h, p, events),
            PRIORITY => {
                if h.stream == 0 {
                    return Err((Reason::ProtocolError, "PRIORITY on stream 0"));
                }
                if h.len != 5 {
                    return self.stream_error(h.stream, Reason::FrameSizeError, events);
                }
                let dep = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                if dep == h.stream {
                    return self.stream_error(h.stream, Reason::ProtocolError, events);
                }
                Ok(())
            }
            RST_STREAM => {
                if h.stream == 0 {
                    return Err((Reason::ProtocolError, "RST_STREAM on stream 0"));
                }
                if h.len != 4 {
                    return Err((Reason::FrameSizeError, "RST_STREAM not 4 bytes"));
                }
                if self.idle(h.stream) {
                    return Err((Reason::ProtocolError, "RST_STREAM on an idle stream"));
                }
                if let Some(s) = self.streams.remove(&h.stream) {
                    self.client_resets += 1;
                    events.push(Event::Reset {
                        id: h.stream,
                        by_client: true,
                    });
                    if s.batch == self.batch {
                        self.batch_resets += 1;
                        if self.batch_resets > self.cfg.max_pending_accept_resets {
                            return Err((
                                Reason::EnhanceYourCalm,
                                "too many streams reset as soon as opened",
                            ));
                        }
                    }
                } else if h.stream > self.goaway.unwrap_or(u32::MAX) {
                    // Ignored after GOAWAY.
                } else {
                    // A reset of a stream already answered counts too: an
                    // attacker resetting hits still costs their answers.
                    self.client_resets += 1;
                }
                if self.client_resets > self.cfg.max_client_resets
                    && self.client_resets * 2 > self.opened
                {
                    return Err((Reason::EnhanceYourCalm, "too many streams reset"));
                }
                Ok(())
            }
            SETTINGS => self.settings(h, &p),
            PUSH_PROMISE => Err((Reason::ProtocolError, "PUSH_PROMISE from a client")),
            PING => {
                if h.stream != 0 {
                    return Err((Reason::ProtocolError, "PING on a stream"));
                }
                if h.len != 8 {
                    return Err((Reason::FrameSizeError, "PING not 8 bytes"));
                }
                if !h.has(ACK) {
                    head(&mut self.out, 8, PING, ACK, 0);
                    self.out.extend_from_slice(&p);
                }
                Ok(())
            }
            GOAWAY => {
                if h.stream != 0 {
                    return Err((Reason::ProtocolError, "GOAWAY on a stream"));
                }
                if h.len < 8 {
                    return Err((Reason::FrameSizeError, "GOAWAY under 8 bytes"));
                }
                self.peer_goaway = true;
                Ok(())
            }
            WINDOW_UPDATE => {
                if h.len != 4 {
                    return Err((Reason::FrameSizeError, "WINDOW_UPDATE not 4 bytes"));
                }
                let n = (u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff) as i64;
                if h.stream == 0 {
                    if n == 0 {
                        return Err((Reason::ProtocolError, "WINDOW_UPDATE of 0"));
                    }
                    self.send_window += n;
                    if self.send_window > MAX_WINDOW {
                        return Err((Reason::FlowControlError, "connection window over 2^31-1"));
                    }
                    return Ok(());
                }
                if self.idle(h.stream) {
                    return Err((Reason::ProtocolError, "WINDOW_UPDATE on an idle stream"));
                }
                let Some(s) = self.streams.get_mut(&h.stream) else {
                    return Ok(());
                };
                if n == 0 {
                    return self.stream_error(h.stream, Reason::ProtocolError, events);
                }
                s.send_window += n;
                if s.send_window > MAX_WINDOW {
                    return self.stream_error(h.stream, Reason::FlowControlError, events);
                }
                Ok(())
            }
            CONTINUATION => self.continuation(h, p, events),
            _ => Ok(()),
        }
    }

    /// A stream id the client has not opened yet.
    fn idle(&self, id: u32) -> bool {
        id > self.last_id
    }

    fn settings(&mut self, h: Head, p: &[u8]) -> Result<(), (Reason, &'static str)> {
        use frame::*;
        if h.stream != 0 {
            return Err((Reason::ProtocolError, "SETTINGS on a stream"));
        }
        if h.has(ACK) {
            if h.len != 0 {
                return Err((Reason::FrameSizeError, "SETTINGS ACK with a payload"));
            }
            return Ok(());
        }
        if !h.len.is_multiple_of(6) {
            return Err((Reason::FrameSizeError, "SETTINGS not a multiple of 6 bytes"));
        }
        for s in p.chunks_exact(6) {
            let k = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match k {
                SETTINGS_ENABLE_PUSH if v > 1 => {
                    return Err((Reason::ProtocolError, "SETTINGS_ENABLE_PUSH not 0 or 1"))
                }
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    if v as i64 > MAX_WINDOW {
                        return Err((
                            Reason::FlowControlError,
                            "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1",
                        ));
                    }
                    let delta = v as i64 - self.peer_initial_window;
                    self.peer_initial_window = v as i64;
                    for s in self.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > MAX_WINDOW {
                            return Err((Reason::FlowControlError, "a stream window over 2^31-1"));
                        }
                    }
                }
                SETTINGS_HEADER_TABLE_SIZE => {
                    if v < self.peer_table_size {
                        self.table_update = true;
                    }
                    self.peer_table_size = v;
                }
                SETTINGS_MAX_FRAME_SIZE => {
                    if !(16_384..=(1 << 24) - 1).contains(&v) {
                        return Err((
                            Reason::ProtocolError,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        ));
                    }
                    // Larger frames buy nothing here; keep to 16 KiB.
                    self.peer_max_frame = (v as usize).min(DEFAULT_MAX_FRAME);
                }
                _ => {}
            }
        }
        head(&mut self.out, 0, SETTINGS, ACK, 0);
        Ok(())
    }

    /// Strip padding: the payload without it, or a PROTOCOL_ERROR.
    fn unpad(h: &Head, p: Bytes) -> Result<Bytes, (Reason, &'static str)> {
        if !h.has(frame::PADDED) {
            return Ok(p);
        }
        let Some(&pad) = p.first() else {
            return Err((
                Reason::FrameSizeError,
                "a padded frame without its pad length",
            ));
        };
        if pad as usize >= p.len() {
            return Err((Reason::ProtocolError, "padding as long as the frame"));
        }
        Ok(p.slice(1..p.len() - pad as usize))
    }

    fn data(
        &mut self,
        h: Head,
        p: Bytes,
        events: &mut Vec<Event>,
    ) -> Result<(), (Reason, &'static str)> {
        if h.stream == 0 {
            return Err((Reason::ProtocolError, "DATA on stream 0"));
        }
        if self.idle(h.stream) {
            return Err((Reason::ProtocolError, "DATA on an idle stream"));
        }
        let len = h.len as i64;
        if len > self.recv_window {
            return Err((Reason::FlowControlError, "DATA over the connection window"));
        }
        self.recv_window -= len;
        let data = Self::unpad(&h, p)?;
        let padding = h.len - data.len();
        let open = self.streams.get(&h.stream).is_some_and(|s| s.recv_open);
        if !open {
            // Closed, half-closed or reset: the bytes still count for the
            // connection; give them back at once.
            self.give_back(h.len);
            // RST_STREAM STREAM_CLOSED (RFC 9113 §5.1), not counted as the
            // client's error: it may not have seen our reset yet.
            frame::rst_stream(&mut self.out, h.stream, Reason::StreamClosed);
            if self.streams.remove(&h.stream).is_some() {
                events.push(Event::Reset {
                    id: h.stream,
                    by_client: false,
                });
            }
            return Ok(());
        }
        let s = self.streams.get_mut(&h.stream).expect("open");
        if len > s.recv_window {
            self.give_back(h.len);
            return self.stream_error(h.stream, Reason::FlowControlError, events);
        }
        s.recv_window -= len;
        s.received += data.len() as u64;
        let end = h.has(frame::END_STREAM);
        let over = s.content_length.is_some_and(|n| s.received > n)
            || (end && s.content_length.is_some_and(|n| s.received != n));
        if over {
            self.give_back(h.len);
            return self.stream_error(h.stream, Reason::ProtocolError, events);
        }
        if end {
            s.recv_open = false;
        }
        if padding > 0 {
            self.release(h.stream, padding);
        }
        if end {
            self.close_if_done(h.stream);
        }
        if !data.is_empty() || end {
            events.push(Event::Data {
                id: h.stream,
                data,
                end,
            });
        }
        Ok(())
    }

    /// Give bytes back to the connection window only.
    fn give_back(&mut self, n: usize) {
        self.unacked += n as u32;
        if self.unacked >= self.cfg.connection_window / 2 {
            frame::window_update(&mut self.out, 0, self.unacked);
            self.recv_window += self.unacked as i64;
            self.unacked = 0;
        }
    }

    /// Request body bytes of stream `id` were consumed: the client may
    /// send as many more (WINDOW_UPDATE once half a window is owed).
    pub fn release(&mut self, id: u32, n: usize) {
        if n == 0 {
            return;
        }
        self.give_back(n);
        let half = self.cfg.stream_window / 2;
        if let Some(s) = self.streams.get_mut(&id) {
            if !s.recv_open {
                return;
            }
            s.unacked += n as u32;
            if s.unacked >= half {
                frame::window_update(&mut self.out, id, s.unacked);
                s.recv_window += s.unacked as i64;
                s.unacked = 0;
            }
        }
    }

    fn close_if_done(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| !s.recv_open && !s.send_open)
        {
            self.streams.remove(&id);
        }
    }

    fn headers(
        &mut self,
        h: Head,
        p: Bytes,
        events: &mut Vec<Event>,
    ) -> Result<(), (Reason, &'static str)> {
        if h.stream == 0 {
            return Err((Reason::ProtocolError, "HEADERS on stream 0"));
        }
        let mut frag = Self::unpad(&h, p)?;
        let mut kind = BlockKind::Open;
        if h.has(frame::PRIORITY_FLAG) {
            if frag.len() < 5 {
                return Err((Reason::FrameSizeError, "HEADERS too short for its priority"));
            }
            let dep = u32::from_be_bytes([frag[0], frag[1], frag[2], frag[3]]) & 0x7fff_ffff;
            frag = frag.slice(5..);
            if dep == h.stream {
                kind = BlockKind::Discard(Some(Reason::ProtocolError));
            }
        }
        if h.stream.is_multiple_of(2) {
            return Err((Reason::ProtocolError, "a client stream with an even id"));
        }
        let end_stream = h.has(frame::END_STREAM);
        if h.stream <= self.last_id {
            match self.streams.get(&h.stream) {
                Some(s) if s.recv_open => {
                    if !end_stream {
                        return Err((Reason::ProtocolError, "trailers without END_STREAM"));
                    }
                    if kind == BlockKind::Open {
                        kind = BlockKind::Trailers;
                    }
                }
                Some(_) => kind = BlockKind::Discard(Some(Reason::StreamClosed)),
                None => return Err((Reason::StreamClosed, "HEADERS on a closed stream")),
            }
        } else {
            self.last_id = h.stream;
            if self.goaway.is_some() {
                kind = BlockKind::Discard(None);
            } else if kind == BlockKind::Open {
                self.opened += 1;
                if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
                    kind = BlockKind::Discard(Some(Reason::RefusedStream));
                }
            }
        }
        let b = Block {
            stream: h.stream,
            end_stream,
            kind,
            frames: 0,
        };
        if h.has(frame::END_HEADERS) {
            // The usual case: decoded from the frame, no copy.
            return self.end_block(b, &frag, events);
        }
        self.block = Some(b);
        self.block_bytes.clear();
        self.block_bytes.extend_from_slice(&frag);
        Ok(())
    }

    /// The most bytes one header block may take, over all its frames.
    fn max_block(&self) -> usize {
        self.cfg.max_header_list * 2 + frame::DEFAULT_MAX_FRAME
    }

    fn continuation(
        &mut self,
        h: Head,
        p: Bytes,
        events: &mut Vec<Event>,
    ) -> Result<(), (Reason, &'static str)> {
        let max = self.max_block();
        let Some(b) = &mut self.block else {
            return Err((Reason::ProtocolError, "CONTINUATION without a header block"));
        };
        b.frames += 1;
        if b.frames > MAX_BLOCK_FRAMES || self.block_bytes.len() + p.len() > max {
            return Err((
                Reason::EnhanceYourCalm,
                "a header block too large or in too many CONTINUATION frames",
            ));
        }
        self.block_bytes.extend_from_slice(&p);
        if h.has(frame::END_HEADERS) {
            let b = self.block.take().expect("a block");
            let block = std::mem::take(&mut self.block_bytes);
            let r = self.end_block(b, &block, events);
            self.block_bytes = block;
            self.block_bytes.clear();
            return r;
        }
        Ok(())
    }

    /// A whole header block: decode it (always, to keep the HPACK table in
    /// step) and act on it.
    fn end_block(
        &mut self,
        b: Block,
        block: &[u8],
        events: &mut Vec<Event>,
    ) -> Result<(), (Reason, &'static str)> {
        let max = self.cfg.max_header_list;
        let id = b.stream;
        let decoded = match b.kind {
            BlockKind::Open => {
                let mut builder = Builder::default();
                let r = self.decoder.decode(block, max, |n, v| builder.field(n, v));
                r.map(|fits| fits.then(|| builder.finish()))
            }
            BlockKind::Trailers => {
                let mut ok = true;
                let r = self.decoder.decode(block, max, |n, _| ok &= trailer_ok(n));
                r.map(|_| Some(if ok { Err("") } else { Err("bad trailer") }))
            }
            BlockKind::Discard(_) => self.decoder.decode(block, max, |_, _| {}).map(|_| None),
        };
        let decoded = match decoded {
            Ok(d) => d,
            Err(_) => {
                return Err((
                    Reason::CompressionError,
                    "a header block HPACK cannot decode",
                ))
            }
        };
        match b.kind {
            BlockKind::Discard(None) => Ok(()),
            BlockKind::Discard(Some(reason)) => {
                if reason == Reason::RefusedStream {
                    frame::rst_stream(&mut self.out, id, reason);
                    Ok(())
                } else {
                    self.stream_error(id, reason, events)
                }
            }
            BlockKind::Trailers => {
                if decoded != Some(Err("")) {
                    return self.stream_error(id, Reason::ProtocolError, events);
                }
                let s = self.streams.get_mut(&id).expect("open stream");
                if s.content_length.is_some_and(|n| n != s.received) {
                    return self.stream_error(id, Reason::ProtocolError, events);
                }
                s.recv_open = false;
                self.close_if_done(id);
                events.push(Event::Data {
                    id,
                    data: Bytes::new(),
                    end: true,
                });
                Ok(())
            }
            BlockKind::Open => {
                let stream = Stream {
                    recv_open: !b.end_stream,
                    send_open: true,
                    send_window: self.peer_initial_window,
                    recv_window: self.cfg.stream_window as i64,
                    unacked: 0,
                    content_length: None,
                    received: 0,
                    batch: self.batch,
                };
                match decoded {
                    None => {
                        self.streams.insert(id, stream);
                        events.push(Event::TooLarge {
                            id,
                            end_stream: b.end_stream,
                        });
                        Ok(())
                    }
                    Some(Ok(request)) => {
                        if b.end_stream && request.content_length.is_some_and(|n| n > 0) {
                            self.streams.insert(id, stream);
                            return self.stream_error(id, Reason::ProtocolError, events);
                        }
                        let content_length = request.content_length;
                        self.streams.insert(
                            id,
                            Stream {
                                content_length,
                                ..stream
                            },
                        );
                        events.push(Event::Request {
                            id,
                            request,
                            end_stream: b.end_stream,
                        });
                        Ok(())
                    }
                    Some(Err(_)) => {
                        self.streams.insert(id, stream);
                        self.stream_error(id, Reason::ProtocolError, events)
                    }
                }
            }
        }
    }

    /// Whether stream `id` can still be answered.
    pub fn can_send(&self, id: u32) -> bool {
        self.streams.get(&id).is_some_and(|s| s.send_open)
    }

    /// Whether the client may still send on stream `id`.
    pub fn receiving(&self, id: u32) -> bool {
        self.streams.get(&id).is_some_and(|s| s.recv_open)
    }

    /// Send a header block (HEADERS, then CONTINUATION frames if it is
    /// larger than a frame). Returns false if the stream is gone.
    pub fn send_headers(&mut self, id: u32, block: &[u8], end_stream: bool) -> bool {
        if !self.can_send(id) {
            return false;
        }
        if self.table_update {
            self.table_update = false;
            let mut b = Vec::with_capacity(block.len() + 1);
            b.push(0x20);
            b.extend_from_slice(block);
            return self.send_headers(id, &b, end_stream);
        }
        let max = self.peer_max_frame;
        let mut parts = block.chunks(max).peekable();
        let first = parts.next().unwrap_or(&[]);
        let last = parts.peek().is_none();
        let flags = if end_stream { frame::END_STREAM } else { 0 }
            | if last { frame::END_HEADERS } else { 0 };
        frame::head(&mut self.out, first.len(), frame::HEADERS, flags, id);
        self.out.extend_from_slice(first);
        while let Some(p) = parts.next() {
            let flags = if parts.peek().is_none() {
                frame::END_HEADERS
            } else {
                0
            };
            frame::head(&mut self.out, p.len(), frame::CONTINUATION, flags, id);
            self.out.extend_from_slice(p);
        }
        if end_stream {
            self.end_send(id);
        }
        true
    }

    fn end_send(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.send_open = false;
        }
        self.close_if_done(id);
    }

    /// How many body bytes stream `id` may send now.
    pub fn capacity(&self, id: u32) -> usize {
        match self.streams.get(&id) {
            Some(s) if s.send_open => s.send_window.min(self.send_window).max(0) as usize,
            _ => 0,
        }
    }

    /// Send as much of `data` as the windows allow, as DATA frames; the
    /// last with END_STREAM if `end` and all of it went. Returns the bytes
    /// sent (0 for a stream that is gone).
    pub fn send_data(&mut self, id: u32, data: &[u8], end: bool) -> usize {
        if !self.can_send(id) {
            return 0;
        }
        let n = data.len().min(self.capacity(id));
        let all = n == data.len();
        if n == 0 && !(all && end) {
            return 0;
        }
        let mut at = 0;
        loop {
            let k = (n - at).min(self.peer_max_frame);
            let last = at + k == n;
            let flags = if last && all && end {
                frame::END_STREAM
            } else {
                0
            };
            frame::head(&mut self.out, k, frame::DATA, flags, id);
            self.out.extend_from_slice(&data[at..at + k]);
            at += k;
            if last {
                break;
            }
        }
        self.send_window -= n as i64;
        if let Some(s) = self.streams.get_mut(&id) {
            s.send_window -= n as i64;
        }
        if all && end {
            self.end_send(id);
        }
        n
    }
}

#[cfg(test)]
mod tests;
