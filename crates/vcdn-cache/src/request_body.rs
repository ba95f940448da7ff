//! How long a client may take to send a request body. Bodies are streamed
//! to the upstream as they arrive, so a slow body holds a connection, an
//! upstream connection and a task, not memory; what must be bounded is the
//! time. Two rules, as in Apache's `mod_reqtimeout`: no pause longer than
//! the idle timeout, and on average at least `min_rate` bytes per second
//! after a grace period (each byte buys `1 / min_rate` seconds more). Time
//! spent waiting for the upstream to take the body is not the client's
//! and does not count.

use std::time::{Duration, Instant};

use crate::config::CacheConfig;

/// The clock of one request body.
#[derive(Debug, Clone)]
pub struct BodyClock {
    idle: Duration,
    grace: Duration,
    min_rate: u64,
    received: u64,
    /// Time spent waiting for the client's bytes so far.
    waited: Duration,
}

impl BodyClock {
    pub fn new(cfg: &CacheConfig) -> BodyClock {
        BodyClock {
            idle: Duration::from_millis(cfg.request_body_idle_timeout_ms),
            grace: Duration::from_millis(cfg.request_body_grace_ms),
            min_rate: cfg.request_body_min_rate,
            received: 0,
            waited: Duration::ZERO,
        }
    }

    /// How long the next wait for the client may last; `None` when the
    /// body is already too slow.
    pub fn allowance(&self) -> Option<Duration> {
        if self.min_rate == 0 {
            return Some(self.idle);
        }
        let earned = Duration::from_secs_f64(self.received as f64 / self.min_rate as f64);
        let budget = (self.grace + earned).checked_sub(self.waited)?;
        (!budget.is_zero()).then(|| budget.min(self.idle))
    }

    /// Account for one wait that started at `since` and brought `n` bytes.
    pub fn waited(&mut self, since: Instant, n: usize) {
        self.waited += since.elapsed();
        self.received += n as u64;
    }

    /// What a client too slow is told.
    pub fn explain(&self) -> String {
        format!(
            "the request body did not arrive in time: send it with pauses under {} ms and at least {} bytes/s on average",
            self.idle.as_millis(),
            self.min_rate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(idle_ms: u64, grace_ms: u64, rate: u64) -> BodyClock {
        BodyClock::new(&CacheConfig {
            request_body_idle_timeout_ms: idle_ms,
            request_body_grace_ms: grace_ms,
            request_body_min_rate: rate,
            ..CacheConfig::default()
        })
    }

    #[test]
    fn a_pause_is_bounded_by_the_idle_timeout() {
        let c = clock(2_000, 10_000, 1000);
        assert_eq!(c.allowance(), Some(Duration::from_secs(2)));
        let c = clock(2_000, 10_000, 0);
        assert_eq!(c.allowance(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_trickle_runs_out_of_time_after_the_grace_period() {
        let mut c = clock(2_000, 1_000, 1000);
        // One byte every 500 ms earns 1 ms each: after the grace second it
        // is over.
        c.waited += Duration::from_millis(500);
        c.received += 1;
        assert!(c.allowance().unwrap() <= Duration::from_millis(501));
        c.waited += Duration::from_millis(510);
        c.received += 1;
        assert_eq!(c.allowance(), None);
    }

    #[test]
    fn a_steady_body_keeps_its_allowance() {
        let mut c = clock(2_000, 1_000, 1000);
        for _ in 0..100 {
            c.waited += Duration::from_millis(100);
            c.received += 200; // 2000 B/s, twice the minimum
        }
        assert_eq!(c.allowance(), Some(Duration::from_secs(2)));
    }
}
