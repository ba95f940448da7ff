//! The ANDy thesis's measurement (seed 004, §4.3): a generator of 85-byte
//! InfluxDB line-protocol messages stamped with their send time, at a
//! given rate or unthrottled, and a receiver that computes latency, loss,
//! duplicates and throughput.
//!
//! Unlike the thesis (two VMs synchronised by NTP, hence its negative mean
//! latencies), every node of vcdn's test bed is a network namespace of one
//! kernel, so sender and receiver read the same clock: no skew.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Size of every message, as in the thesis's generator.
pub const MESSAGE_BYTES: usize = 85;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Message `id` stamped now, exactly [`MESSAGE_BYTES`] long, newline-ended:
/// `latency,id=…,host=producer,pad=… value=1i,sentat=<µs>i`.
pub fn message(id: u64, sent_us: u64) -> Vec<u8> {
    let head = format!("latency,id={id},host=producer,pad=");
    let tail = format!(" value=1i,sentat={sent_us}i\n");
    let pad = MESSAGE_BYTES.saturating_sub(head.len() + tail.len()).max(1);
    let mut m = Vec::with_capacity(MESSAGE_BYTES);
    m.extend_from_slice(head.as_bytes());
    m.extend(std::iter::repeat_n(b'x', pad));
    m.extend_from_slice(tail.as_bytes());
    m
}

/// Reads `(id, sent_us)` back from a message.
pub fn parse(m: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(m).ok()?;
    let num = |key: &str| -> Option<u64> {
        let at = s.find(key)? + key.len();
        let rest = &s[at..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    Some((num("id=")?, num("sentat=")?))
}

/// Where the generator sends.
pub enum Sink {
    /// Straight to the consumer (the thesis's direct-UDP baseline).
    Udp(UdpSocket, SocketAddr),
    /// To the local agent's ingest port over TCP (as the thesis's app did).
    Tcp(TcpStream),
}

impl Sink {
    pub fn udp(to: SocketAddr) -> io::Result<Sink> {
        let s = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
        Ok(Sink::Udp(s, to))
    }

    pub fn tcp(to: SocketAddr) -> io::Result<Sink> {
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        Ok(Sink::Tcp(s))
    }
}

/// What the generator did.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub messages: u64,
    pub elapsed: Duration,
}

/// Sends `count` messages (or until `limit`), at `rate` bytes/s (`None`:
/// as fast as possible), paced in 1 ms slots. Ids start at 0.
pub fn generate(
    sink: &mut Sink,
    rate: Option<u64>,
    count: u64,
    limit: Duration,
) -> io::Result<Sent> {
    let t0 = Instant::now();
    let mut id = 0u64;
    let mut batch = Vec::with_capacity(64 * 1024);
    while id < count && t0.elapsed() < limit {
        let due = match rate {
            Some(r) => ((t0.elapsed().as_secs_f64() * r as f64) as u64 / MESSAGE_BYTES as u64 + 1)
                .min(count),
            None => (id + 256).min(count),
        };
        if due <= id {
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        batch.clear();
        while id < due {
            let m = message(id, now_us());
            match sink {
                Sink::Udp(s, to) => {
                    // A full socket buffer: wait, as a real sender's
                    // blocking send would.
                    while let Err(e) = s.send_to(&m, *to) {
                        match e.kind() {
                            io::ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_micros(100))
                            }
                            // An ICMP "port unreachable" for an earlier
                            // datagram (the receiver not yet bound): that
                            // one is lost, and counted as lost.
                            io::ErrorKind::ConnectionRefused => break,
                            _ => return Err(e),
                        }
                    }
                }
                Sink::Tcp(_) => batch.extend_from_slice(&m),
            }
            id += 1;
        }
        if let Sink::Tcp(s) = sink {
            s.write_all(&batch)?;
        }
    }
    Ok(Sent {
        messages: id,
        elapsed: t0.elapsed(),
    })
}

/// What the receiver saw.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Latency of every first arrival, µs.
    pub latencies_us: Vec<u64>,
    pub unique: u64,
    pub duplicates: u64,
    pub bytes: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
    pub malformed: u64,
}

/// Receives on `sock` until `idle` passes without a message, or `limit`.
/// `expect` bounds the ids tracked (larger ids are counted malformed).
pub fn receive(
    sock: &UdpSocket,
    expect: u64,
    idle: Duration,
    limit: Duration,
) -> io::Result<Received> {
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let mut seen = vec![0u64; (expect as usize).div_ceil(64)];
    let mut r = Received::default();
    let mut buf = vec![0u8; 65_536];
    let t0 = Instant::now();
    let mut last_any = Instant::now();
    while t0.elapsed() < limit {
        let n = match sock.recv_from(&mut buf) {
            Ok((n, _)) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if r.first.is_some() && last_any.elapsed() > idle {
                    break;
                }
                if r.first.is_none() && t0.elapsed() > idle * 10 {
                    break;
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        let at_us = now_us();
        last_any = now;
        // A datagram may carry several lines (TCP coalescing upstream).
        for line in buf[..n].split_inclusive(|b| *b == b'\n') {
            let Some((id, sent)) = parse(line) else {
                r.malformed += 1;
                continue;
            };
            if id >= expect {
                r.malformed += 1;
                continue;
            }
            r.bytes += line.len() as u64;
            r.first.get_or_insert(now);
            r.last = Some(now);
            let (w, b) = ((id / 64) as usize, id % 64);
            if seen[w] & (1 << b) != 0 {
                r.duplicates += 1;
            } else {
                seen[w] |= 1 << b;
                r.unique += 1;
                r.latencies_us.push(at_us.saturating_sub(sent));
            }
        }
    }
    Ok(r)
}

/// Descriptive statistics of one run, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub std_ms: f64,
    pub lost: u64,
    pub duplicates: u64,
    /// Bytes over the time between first and last arrival, in Mbit/s.
    pub throughput_mbit: f64,
}

impl Received {
    pub fn stats(&self, sent: u64) -> Stats {
        let mut l: Vec<f64> = self
            .latencies_us
            .iter()
            .map(|u| *u as f64 / 1000.0)
            .collect();
        l.sort_by(|a, b| a.total_cmp(b));
        let n = l.len().max(1) as f64;
        let mean = l.iter().sum::<f64>() / n;
        let var = l.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let q = |p: f64| {
            if l.is_empty() {
                0.0
            } else {
                l[((l.len() - 1) as f64 * p).round() as usize]
            }
        };
        let span = match (self.first, self.last) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        Stats {
            mean_ms: mean,
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            max_ms: l.last().copied().unwrap_or(0.0),
            std_ms: var.sqrt(),
            lost: sent.saturating_sub(self.unique),
            duplicates: self.duplicates,
            throughput_mbit: if span > 0.0 {
                self.bytes as f64 * 8.0 / span / 1e6
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_85_bytes_and_parse_back() {
        for id in [0, 7, 123_456, u32::MAX as u64] {
            let m = message(id, 1_795_776_113_004_123);
            assert_eq!(m.len(), MESSAGE_BYTES, "{}", String::from_utf8_lossy(&m));
            assert_eq!(parse(&m), Some((id, 1_795_776_113_004_123)));
        }
    }

    #[test]
    fn a_paced_run_over_loopback_udp_counts_loss_and_latency() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            receive(
                &rx,
                1000,
                Duration::from_millis(300),
                Duration::from_secs(10),
            )
            .unwrap()
        });
        let mut s = Sink::udp(to).unwrap();
        // 256 KiB/s for 1000 messages: ~0.33 s.
        let sent = generate(&mut s, Some(256 * 1024), 1000, Duration::from_secs(5)).unwrap();
        assert_eq!(sent.messages, 1000);
        assert!(
            sent.elapsed > Duration::from_millis(250) && sent.elapsed < Duration::from_secs(2),
            "{:?}",
            sent.elapsed
        );
        let r = h.join().unwrap();
        let st = r.stats(sent.messages);
        assert_eq!(st.lost, 0);
        assert_eq!(st.duplicates, 0);
        assert!(st.p50_ms < 50.0, "{st:?}");
    }
}
