//! DNS over TCP (RFC 7766): length-prefixed messages, several per
//! connection, under limits that keep idle connections from locking other
//! clients out (§6.2): at most `MAX_CONNECTIONS` in all and `PER_CLIENT` per
//! source address; when either is reached, the connection idle the longest
//! (of that client, or of anyone) is closed to make room, and a new one is
//! refused only when every connection is busy with a query. Idle
//! connections wait `IDLE` for their next query, `IDLE_UNDER_PRESSURE` once
//! half the slots are taken.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use super::answer::{answer, Transport};
use crate::state::Router;

const MAX_CONNECTIONS: usize = 1024;
const PER_CLIENT: usize = 16;
const IDLE: Duration = Duration::from_secs(10);
const IDLE_UNDER_PRESSURE: Duration = Duration::from_secs(1);
/// Time to read the rest of a query once its length arrived, and to write
/// an answer.
const IO: Duration = Duration::from_secs(5);

/// The connection table's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub per_client: usize,
    pub idle: Duration,
    pub idle_under_pressure: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: MAX_CONNECTIONS,
            per_client: PER_CLIENT,
            idle: IDLE,
            idle_under_pressure: IDLE_UNDER_PRESSURE,
        }
    }
}

/// One open connection as the table sees it.
struct Slot {
    peer: IpAddr,
    /// When it began waiting for its next query; `None` while it handles one.
    idle_since: Option<Instant>,
    close: Arc<Notify>,
}

/// Every open connection, by id, with counts per client.
#[derive(Default)]
struct Table {
    slots: HashMap<u64, Slot>,
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
}

/// Why a connection was let in or not.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// Admitted; it evicted `n` idle connections to get its slot.
    In { id: u64, evicted: usize },
    /// Every slot it could take is busy with a query.
    Refused,
}

impl Table {
    fn admit(&mut self, peer: IpAddr, limits: &Limits) -> (Admission, Option<Arc<Notify>>) {
        let mut evicted = 0;
        if self.per_peer.get(&peer).copied().unwrap_or(0) >= limits.per_client {
            if !self.evict_oldest_idle(Some(peer)) {
                return (Admission::Refused, None);
            }
            evicted += 1;
        }
        if self.slots.len() >= limits.max_connections {
            if !self.evict_oldest_idle(None) {
                return (Admission::Refused, None);
            }
            evicted += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        let close = Arc::new(Notify::new());
        self.slots.insert(
            id,
            Slot {
                peer,
                idle_since: Some(Instant::now()),
                close: close.clone(),
            },
        );
        *self.per_peer.entry(peer).or_default() += 1;
        (Admission::In { id, evicted }, Some(close))
    }

    /// Closes the connection idle the longest (of `peer`, if given).
    fn evict_oldest_idle(&mut self, peer: Option<IpAddr>) -> bool {
        let oldest = self
            .slots
            .iter()
            .filter(|(_, s)| peer.is_none_or(|p| s.peer == p))
            .filter_map(|(id, s)| s.idle_since.map(|t| (t, *id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        if let Some(s) = self.remove(id) {
            // Stored if the task is not waiting right now, so never lost.
            s.close.notify_one();
        }
        true
    }

    fn remove(&mut self, id: u64) -> Option<Slot> {
        let s = self.slots.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&s.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&s.peer);
            }
        }
        Some(s)
    }

    fn set_idle(&mut self, id: u64, idle: bool) {
        if let Some(s) = self.slots.get_mut(&id) {
            s.idle_since = idle.then(Instant::now);
        }
    }
}

/// The table shared by the accept loop and the connections.
struct Conns {
    table: Mutex<Table>,
    limits: Limits,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table is valid after any panic (each change is one step).
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Frees a connection's slot however its task ends (even by a panic).
struct SlotGuard {
    conns: Arc<Conns>,
    id: u64,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.conns.lock().remove(self.id);
    }
}

/// Serves DNS over TCP on `listener` forever.
pub async fn serve(router: Arc<Router>, listener: TcpListener, limits: Limits) {
    let conns = Arc::new(Conns {
        table: Mutex::new(Table::default()),
        limits,
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "DNS TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer = vcdn_policy::net::canonical(peer.ip());
        let (admission, close) = conns.lock().admit(peer, &conns.limits);
        let (id, close) = match (admission, close) {
            (Admission::In { id, evicted }, Some(close)) => {
                router
                    .metrics
                    .dns_tcp_evicted
                    .fetch_add(evicted as u64, Ordering::Relaxed);
                (id, close)
            }
            _ => {
                router
                    .metrics
                    .dns_tcp_refused
                    .fetch_add(1, Ordering::Relaxed);
                drop(stream); // every slot busy: close at once
                continue;
            }
        };
        let guard = SlotGuard {
            conns: conns.clone(),
            id,
        };
        let router = router.clone();
        tokio::spawn(async move {
            let _ = connection(&router, stream, peer, &guard, &close).await;
            drop(guard);
        });
    }
}

async fn connection(
    router: &Router,
    mut s: TcpStream,
    peer: IpAddr,
    slot: &SlotGuard,
    close: &Notify,
) -> io::Result<()> {
    let conns = &slot.conns;
    let mut buf = vec![0u8; 65535];
    let mut out = Vec::with_capacity(1024);
    loop {
        let idle = {
            let mut t = conns.lock();
            t.set_idle(slot.id, true);
            if t.slots.len() * 2 >= conns.limits.max_connections {
                conns.limits.idle_under_pressure
            } else {
                conns.limits.idle
            }
        };
        let mut len = [0u8; 2];
        tokio::select! {
            _ = close.notified() => return Ok(()),
            r = tokio::time::timeout(idle, s.read_exact(&mut len)) => match r {
                Ok(Ok(_)) => {}
                _ => return Ok(()),
            },
        }
        conns.lock().set_idle(slot.id, false);
        let n = u16::from_be_bytes(len) as usize;
        match tokio::time::timeout(IO, s.read_exact(&mut buf[..n])).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        router.metrics.dns_tcp.fetch_add(1, Ordering::Relaxed);
        let snap = router.snapshot();
        if !answer(
            &snap,
            &router.metrics,
            &buf[..n],
            peer,
            Transport::Tcp,
            &mut out,
        ) {
            return Ok(());
        }
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend_from_slice(&(out.len() as u16).to_be_bytes());
        framed.extend_from_slice(&out);
        tokio::time::timeout(IO, s.write_all(&framed))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_client: usize) -> Limits {
        Limits {
            max_connections: max,
            per_client,
            ..Limits::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn id(a: Admission) -> u64 {
        match a {
            Admission::In { id, .. } => id,
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn a_full_client_loses_its_oldest_idle_connection_first() {
        let l = limits(100, 2);
        let mut t = Table::default();
        let a = id(t.admit(ip("10.0.0.1"), &l).0);
        let b = id(t.admit(ip("10.0.0.1"), &l).0);
        t.admit(ip("10.0.0.2"), &l);
        t.set_idle(a, true); // a idle first... then b idle later
        std::thread::sleep(Duration::from_millis(2));
        t.set_idle(b, true);
        let (c, _) = t.admit(ip("10.0.0.1"), &l);
        assert!(matches!(c, Admission::In { evicted: 1, .. }));
        assert!(!t.slots.contains_key(&a), "the oldest idle one went");
        assert!(t.slots.contains_key(&b));
        assert_eq!(t.per_peer[&ip("10.0.0.1")], 2);
        assert_eq!(t.per_peer[&ip("10.0.0.2")], 1);
    }

    #[test]
    fn busy_connections_are_never_evicted() {
        let l = limits(2, 10);
        let mut t = Table::default();
        let a = id(t.admit(ip("10.0.0.1"), &l).0);
        let b = id(t.admit(ip("10.0.0.2"), &l).0);
        t.set_idle(a, false);
        t.set_idle(b, false);
        assert_eq!(t.admit(ip("10.0.0.3"), &l).0, Admission::Refused);
        t.set_idle(b, true);
        assert!(matches!(
            t.admit(ip("10.0.0.3"), &l).0,
            Admission::In { evicted: 1, .. }
        ));
        assert!(t.slots.contains_key(&a) && !t.slots.contains_key(&b));
    }

    #[test]
    fn removal_frees_the_counts() {
        let l = limits(4, 4);
        let mut t = Table::default();
        let a = id(t.admit(ip("10.0.0.1"), &l).0);
        assert!(t.remove(a).is_some());
        assert!(t.remove(a).is_none(), "removing twice is harmless");
        assert!(t.slots.is_empty() && t.per_peer.is_empty());
    }
}
