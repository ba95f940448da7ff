//! Idle connections kept per next hop (and to the origin), so that an
//! exchange finds a connection whose handshake is done and whose congestion
//! window is already open (issue 17 point 2: what a warm reverse proxy has).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::conn::Conn;

/// Idle connections kept per key at most.
pub const MAX_IDLE_PER_KEY: usize = 64;

pub struct Pool {
    idle: Mutex<HashMap<String, Vec<(Conn, Instant)>>>,
    pub idle_timeout: Duration,
}

impl Pool {
    pub fn new(idle_timeout: Duration) -> Pool {
        Pool {
            idle: Mutex::new(HashMap::new()),
            idle_timeout,
        }
    }

    /// The most recently used idle connection to `key` that is still open
    /// and clean (closed or dirty ones met on the way are dropped).
    pub fn take(&self, key: &str) -> Option<Conn> {
        let mut m = self.idle.lock();
        let v = m.get_mut(key)?;
        while let Some((c, since)) = v.pop() {
            if since.elapsed() < self.idle_timeout && c.idle_ok() {
                return Some(c);
            }
        }
        None
    }

    /// Keeps `c` for later unless `key` already has enough.
    pub fn put(&self, key: &str, c: Conn) {
        if !c.idle_ok() {
            return;
        }
        let mut m = self.idle.lock();
        let v = m.entry(key.to_string()).or_default();
        if v.len() < MAX_IDLE_PER_KEY {
            v.push((c, Instant::now()));
        }
    }

    /// Idle connections to `key`, after dropping dead and expired ones
    /// beyond the first `keep` (the warm ones are kept past the timeout).
    pub fn prune(&self, key: &str, keep: usize) -> usize {
        let mut m = self.idle.lock();
        let Some(v) = m.get_mut(key) else { return 0 };
        v.retain(|(c, _)| c.idle_ok());
        let t = self.idle_timeout;
        let mut n = 0;
        // Newest last: keep the newest `keep` whatever their age.
        let len = v.len();
        v.retain(|(_, since)| {
            n += 1;
            len - n < keep || since.elapsed() < t
        });
        v.len()
    }

    pub fn forget(&self, key: &str) {
        self.idle.lock().remove(key);
    }

    pub fn total(&self) -> usize {
        self.idle.lock().values().map(Vec::len).sum()
    }

    pub fn keys(&self) -> Vec<String> {
        self.idle.lock().keys().cloned().collect()
    }
}
