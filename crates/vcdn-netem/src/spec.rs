//! The emulated path: one-way delays, bandwidth caps and queue sizes, and
//! the limits that keep the relay itself bounded.

use std::time::Duration;

/// Which way bytes travel. "Up" is client → target (requests), "down" is
/// target → client (responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Client → target.
    Up,
    /// Target → client.
    Down,
}

/// The path between client and target. Changed live with
/// [`crate::Shim::set`]: delays and rates apply to the next byte released
/// or admitted; `queue_bytes` only to connections accepted afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PathSpec {
    /// One-way delay client → target.
    pub delay_up: Duration,
    /// One-way delay target → client.
    pub delay_down: Duration,
    /// Bandwidth cap client → target, bits per second, shared by all
    /// connections (`None`: uncapped).
    pub rate_up_bps: Option<u64>,
    /// Bandwidth cap target → client, bits per second, shared by all
    /// connections (`None`: uncapped).
    pub rate_down_bps: Option<u64>,
    /// Bytes held per connection and direction (read, not yet written).
    /// `None`: [`PathSpec::queue_limit`] computes it from rate and delay.
    pub queue_bytes: Option<usize>,
}

/// The smallest queue a connection direction gets, and the default
/// queue's floor.
pub const MIN_QUEUE: usize = 256 << 10;
/// The largest default queue (an explicit `queue_bytes` may be larger).
pub const MAX_DEFAULT_QUEUE: usize = 64 << 20;
/// The rate an uncapped direction is sized for when its queue is computed.
const UNCAPPED_SIZING_BPS: u64 = 100_000_000;
/// Largest read (and, uncapped, largest chunk in the delay line).
pub const MAX_CHUNK: usize = 64 << 10;
/// One Ethernet-sized segment: the smallest rate quantum.
const MSS: usize = 1500;
/// The bucket holds this much time's worth of the rate.
const BURST_TIME: Duration = Duration::from_millis(10);

impl PathSpec {
    /// The same delay both ways, no cap.
    pub fn delay(one_way: Duration) -> PathSpec {
        PathSpec {
            delay_up: one_way,
            delay_down: one_way,
            ..PathSpec::default()
        }
    }

    /// The same cap both ways, bits per second.
    pub fn with_rate_bps(self, bps: u64) -> PathSpec {
        PathSpec {
            rate_up_bps: Some(bps),
            rate_down_bps: Some(bps),
            ..self
        }
    }

    /// The one-way delay of `d`.
    pub fn delay_of(&self, d: Dir) -> Duration {
        match d {
            Dir::Up => self.delay_up,
            Dir::Down => self.delay_down,
        }
    }

    /// The cap of `d`, bits per second (`None`, or 0, uncapped).
    pub fn rate_of(&self, d: Dir) -> Option<u64> {
        match d {
            Dir::Up => self.rate_up_bps,
            Dir::Down => self.rate_down_bps,
        }
        .filter(|&r| r > 0)
    }

    /// Bytes a connection may hold in direction `d`. The delay line holds
    /// what was read in the last `delay`, so a connection reaches rate R
    /// only if the queue is at least R × delay (with no cap, a connection
    /// gets at most queue / delay). The default is twice that
    /// bandwidth-delay product (uncapped: sized for 100 Mbit/s), at least
    /// 256 KiB and at most 64 MiB; an explicit size is taken as given, but
    /// never below one largest read.
    pub fn queue_limit(&self, d: Dir) -> usize {
        if let Some(q) = self.queue_bytes {
            return q.max(MSS);
        }
        let bps = self.rate_of(d).unwrap_or(UNCAPPED_SIZING_BPS) as f64;
        let bdp = bps / 8.0 * self.delay_of(d).as_secs_f64();
        ((2.0 * bdp) as usize).clamp(MIN_QUEUE, MAX_DEFAULT_QUEUE)
    }
}

/// The largest read in direction `d`, which is also the quantum the
/// shared bucket hands out in turn: 10 ms of the rate, between one MSS and
/// 64 KiB (uncapped: 64 KiB).
pub fn chunk_bytes(rate_bps: Option<u64>) -> usize {
    match rate_bps {
        None => MAX_CHUNK,
        Some(r) => (bytes_in(r, BURST_TIME) as usize).clamp(MSS, MAX_CHUNK),
    }
}

/// The bucket's depth: 10 ms of the rate, at least two MSS, so a path
/// that was idle sends a short burst, as a real link's queue drains one.
pub fn burst_bytes(rate_bps: u64) -> u64 {
    bytes_in(rate_bps, BURST_TIME).max(2 * MSS as u64)
}

/// Bytes sent in `t` at `bps`.
fn bytes_in(bps: u64, t: Duration) -> u64 {
    (bps as u128 * t.as_nanos() / 8 / 1_000_000_000) as u64
}

/// The time `bytes` take at `bps`.
pub fn transmission_time(bytes: u64, bps: u64) -> Duration {
    let ns = bytes as u128 * 8 * 1_000_000_000 / bps.max(1) as u128;
    Duration::from_nanos(ns.min(u64::MAX as u128) as u64)
}

/// Limits on the relay itself (not part of the path; fixed at start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections relayed at once; more are reset on accept.
    pub max_connections: usize,
    /// Bytes queued in all connections together; when reached, every
    /// connection stops reading until writes drain it.
    pub memory_bytes: usize,
    /// The longest a connect to the target may take.
    pub connect_timeout: Duration,
    /// A connection on which nothing was read or written for this long is
    /// closed (also one whose peer stopped reading).
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            memory_bytes: 256 << 20,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_queue_is_twice_the_bandwidth_delay_product_within_bounds() {
        let ms = Duration::from_millis;
        // 40 Mbit/s × 100 ms = 500 kB; twice that.
        let s = PathSpec::delay(ms(100)).with_rate_bps(40_000_000);
        assert_eq!(s.queue_limit(Dir::Down), 1_000_000);
        // Small products get the floor, huge ones the ceiling.
        let s = PathSpec::delay(ms(10)).with_rate_bps(1_000_000);
        assert_eq!(s.queue_limit(Dir::Up), MIN_QUEUE);
        let s = PathSpec::delay(ms(1000)).with_rate_bps(10_000_000_000);
        assert_eq!(s.queue_limit(Dir::Up), MAX_DEFAULT_QUEUE);
        // Uncapped: sized for 100 Mbit/s.
        assert_eq!(PathSpec::delay(ms(100)).queue_limit(Dir::Down), 2_500_000);
        // Explicit sizes win, but never below one segment.
        let s = PathSpec {
            queue_bytes: Some(10),
            ..PathSpec::default()
        };
        assert_eq!(s.queue_limit(Dir::Down), 1500);
    }

    #[test]
    fn quanta_and_bursts_are_ten_milliseconds_of_the_rate() {
        assert_eq!(chunk_bytes(Some(4_000_000)), 5000);
        assert_eq!(chunk_bytes(Some(100_000)), 1500);
        assert_eq!(chunk_bytes(Some(1_000_000_000)), MAX_CHUNK);
        assert_eq!(chunk_bytes(None), MAX_CHUNK);
        assert_eq!(burst_bytes(4_000_000), 5000);
        assert_eq!(burst_bytes(100_000), 3000);
        assert_eq!(
            transmission_time(500_000, 4_000_000),
            Duration::from_secs(1)
        );
        assert_eq!(
            PathSpec::default().with_rate_bps(0).rate_of(Dir::Up),
            None,
            "a zero rate is no cap, not a dead path"
        );
    }
}
