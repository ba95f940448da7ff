//! The bottleneck link of one direction: a token bucket shared by every
//! connection of a shim, handing out quanta in turn.
//!
//! A connection that has read a chunk asks the link for its bytes and
//! waits for the grant; it asks again only after that, so a connection has
//! at most one request waiting. The link serves requests first come, first
//! served, which makes it a round robin between the connections that have
//! data: with equal quanta, each of n busy connections gets 1/n of the rate,
//! and none can starve another. One task per direction makes the grants,
//! reading the rate anew for each, so a live change applies from the next
//! quantum.

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::spec::{burst_bytes, transmission_time, Dir, PathSpec};

/// Token-bucket state as a generic cell rate algorithm: the instant at
/// which the bucket is (or was) empty. At time t it holds
/// `min(burst, (t − empty_at) × rate)` bytes, so one instant is the whole
/// state, and waking late (timers have a millisecond's grain) loses no
/// rate: the grant time is computed from absolute instants, not summed
/// sleeps.
#[derive(Debug, Default)]
pub struct Bucket {
    empty_at: Option<Instant>,
}

impl Bucket {
    /// Take `bytes` at `rate_bps`: the instant they may go (now, if the
    /// bucket holds them).
    pub fn reserve(&mut self, now: Instant, bytes: usize, rate_bps: u64) -> Instant {
        let full_since = now
            .checked_sub(transmission_time(burst_bytes(rate_bps), rate_bps))
            .unwrap_or(now);
        let start = self.empty_at.map_or(full_since, |e| e.max(full_since));
        let at = start + transmission_time(bytes as u64, rate_bps);
        self.empty_at = Some(at);
        at.max(now)
    }
}

/// A request for `bytes` of the link, granted through `done`.
struct Request {
    bytes: usize,
    done: oneshot::Sender<()>,
}

/// One direction's link, shared by every connection of a shim.
#[derive(Clone)]
pub struct Link {
    requests: mpsc::Sender<Request>,
}

impl Link {
    /// A link for direction `dir` whose rate is read from `spec`, and the
    /// task that grants its requests (to be spawned; it ends when every
    /// `Link` clone is gone). `waiting` bounds the requests waiting at once
    /// (one per connection).
    pub fn new(
        dir: Dir,
        spec: watch::Receiver<PathSpec>,
        waiting: usize,
    ) -> (Link, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(waiting.max(1));
        (Link { requests: tx }, grant(dir, spec, rx))
    }

    /// Wait until `bytes` may cross the link. False if the link is gone.
    pub async fn pass(&self, bytes: usize) -> bool {
        let (done, granted) = oneshot::channel();
        if self.requests.send(Request { bytes, done }).await.is_err() {
            return false;
        }
        granted.await.is_ok()
    }
}

/// The link's task: grant requests in arrival order, each when the bucket
/// holds its bytes at the rate of the moment.
async fn grant(dir: Dir, spec: watch::Receiver<PathSpec>, mut rx: mpsc::Receiver<Request>) {
    let mut bucket = Bucket::default();
    while let Some(r) = rx.recv().await {
        let rate = spec.borrow().rate_of(dir);
        match rate {
            Some(bps) => {
                let at = bucket.reserve(Instant::now(), r.bytes, bps);
                if at > Instant::now() {
                    tokio::time::sleep_until(at).await;
                }
            }
            // Uncapped now: no debt carries over to a later cap.
            None => bucket = Bucket::default(),
        }
        // The requester may have gone (its connection closed): fine.
        let _ = r.done.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_idle_bucket_passes_a_burst_then_paces_at_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::default();
        // 4 Mbit/s: 500 bytes a millisecond, a 5000-byte burst.
        assert_eq!(b.reserve(t0, 5000, 4_000_000), t0, "the burst goes at once");
        assert_eq!(b.reserve(t0, 5000, 4_000_000), t0 + ms(10));
        assert_eq!(b.reserve(t0, 5000, 4_000_000), t0 + ms(20));
        // A caller that wakes late (at 23 ms) is not charged the lateness:
        // the next grant is 10 ms after the previous one, not after waking.
        assert_eq!(b.reserve(t0 + ms(23), 5000, 4_000_000), t0 + ms(30));
    }

    #[test]
    fn idleness_buys_at_most_one_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::default();
        b.reserve(t0, 5000, 4_000_000);
        // After a second of silence, 5000 bytes pass at once, not 500 kB.
        let t1 = t0 + ms(1000);
        assert_eq!(b.reserve(t1, 5000, 4_000_000), t1);
        assert_eq!(b.reserve(t1, 5000, 4_000_000), t1 + ms(10));
    }

    #[test]
    fn a_long_run_averages_the_rate_exactly() {
        let t0 = Instant::now();
        let mut b = Bucket::default();
        let mut last = t0;
        for _ in 0..200 {
            // 1 MB in 5000-byte quanta at 4 Mbit/s: 2 s less the burst.
            last = b.reserve(last, 5000, 4_000_000);
        }
        assert_eq!(last - t0, ms(1990));
    }

    #[tokio::test]
    async fn the_link_serves_connections_in_turn() {
        let spec = PathSpec::default().with_rate_bps(4_000_000);
        let (_tx, rx) = watch::channel(spec);
        let (link, task) = Link::new(Dir::Down, rx, 8);
        tokio::spawn(task);
        let t0 = Instant::now();
        // Two connections, each passing 20 quanta of 5000 bytes one after
        // the other: both finish together at ~400 ms, not one at 200 ms.
        let run = |link: Link| async move {
            for _ in 0..20 {
                assert!(link.pass(5000).await);
            }
            Instant::now() - t0
        };
        let (a, b) = tokio::join!(run(link.clone()), run(link.clone()));
        assert!(a >= ms(380) && a <= ms(480), "{a:?}");
        assert!(b >= ms(380) && b <= ms(480), "{b:?}");
    }
}
