//! Which server a session's requests go to.
//!
//! The servers are either a fixed list (the URL's host and `--mirror`s) or
//! the addresses a DNS server gives for the URL's name (`--dns`), asked
//! again whenever the answer's TTL runs out, as viewers' resolvers do. So a
//! vCDN's router steers players: a cache that joins gets viewers, and one
//! that is drained (taken out of DNS) loses them before it stops.
//!
//! Each session prefers the server that rendezvous hashing ranks first for
//! the session's id (`vcdn_policy::hashing`): sessions spread evenly, and
//! when a server joins or leaves only the sessions it wins or held move
//! (1/n of them), not all. A server that failed a session's request is
//! avoided by that session for [`AVOID`], which sends it to its next choice;
//! the servers of the previous answer come after the current ones.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket as StdUdp};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

use crate::PlayerError;

/// How long a session keeps away from a server that failed it.
pub const AVOID: Duration = Duration::from_secs(10);
/// Bounds on how long an answer is kept (the TTL is clamped to these).
const MIN_TTL: Duration = Duration::from_secs(1);
const MAX_TTL: Duration = Duration::from_secs(300);
/// Wait for one DNS answer; asked twice before giving up.
const DNS_TIMEOUT: Duration = Duration::from_secs(2);

/// The current servers, shared by every session of a run.
pub struct Servers {
    current: RwLock<Arc<List>>,
}

struct List {
    addrs: Vec<SocketAddr>,
    /// `addrs` as text: the names rendezvous hashing scores.
    names: Vec<String>,
    /// The servers of the answer before, tried after these: a session
    /// whose new servers fail goes back to one it knows, as a resolver
    /// serving stale would let it.
    before: Vec<SocketAddr>,
}

impl List {
    fn new(mut addrs: Vec<SocketAddr>, before: Vec<SocketAddr>) -> Arc<List> {
        addrs.sort();
        addrs.dedup();
        let names = addrs.iter().map(|a| a.to_string()).collect();
        let before = before.into_iter().filter(|a| !addrs.contains(a)).collect();
        Arc::new(List {
            addrs,
            names,
            before,
        })
    }
}

/// A session's memory of servers that failed it.
#[derive(Default)]
pub struct Avoided(std::sync::Mutex<HashMap<SocketAddr, Instant>>);

impl Avoided {
    pub fn add(&self, addr: SocketAddr) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(addr, Instant::now() + AVOID);
        }
    }

    fn contains(&self, addr: &SocketAddr) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(addr).copied())
            .is_some_and(|until| until > Instant::now())
    }
}

impl Servers {
    /// A list that never changes.
    pub fn fixed(addrs: Vec<SocketAddr>) -> Arc<Servers> {
        Arc::new(Servers {
            current: RwLock::new(List::new(addrs, Vec::new())),
        })
    }

    /// The A records of `name` from the DNS server `dns`, with `port`,
    /// kept fresh by a task that lives as long as the returned value.
    pub async fn from_dns(
        dns: SocketAddr,
        name: &str,
        port: u16,
    ) -> Result<Arc<Servers>, PlayerError> {
        let (addrs, ttl) = resolve(dns, name, port)
            .await
            .map_err(|e| PlayerError::Url(format!("resolving {name} at {dns}: {e}")))?;
        let servers = Arc::new(Servers {
            current: RwLock::new(List::new(addrs, Vec::new())),
        });
        let weak: Weak<Servers> = Arc::downgrade(&servers);
        let name = name.to_string();
        tokio::spawn(async move {
            let mut wait = ttl;
            loop {
                tokio::time::sleep(wait).await;
                let Some(s) = weak.upgrade() else { return };
                match resolve(dns, &name, port).await {
                    Ok((addrs, ttl)) => {
                        if let Ok(mut c) = s.current.write() {
                            if c.addrs != addrs {
                                tracing::info!(%name, servers = ?addrs, "servers changed");
                                let before = c.addrs.clone();
                                *c = List::new(addrs, before);
                            }
                        }
                        wait = ttl;
                    }
                    Err(e) => {
                        // Keep the last answer, as a resolver serving stale.
                        tracing::warn!(%name, %dns, error = %e, "cannot refresh servers");
                        wait = MIN_TTL;
                    }
                }
            }
        });
        Ok(servers)
    }

    /// The servers in `session`'s order of preference, those it avoids
    /// last.
    pub fn ranked(&self, session: usize, avoided: &Avoided) -> Vec<SocketAddr> {
        let list = match self.current.read() {
            Ok(l) => l.clone(),
            Err(_) => return Vec::new(),
        };
        let mut order: Vec<SocketAddr> = vcdn_policy::hashing::ranking(&list.names, session as u64)
            .into_iter()
            .map(|i| list.addrs[i])
            .chain(list.before.iter().copied())
            .collect();
        order.sort_by_key(|a| avoided.contains(a));
        order
    }
}

/// One DNS lookup of `name`'s A records: the addresses with `port`, and
/// how long they may be kept.
async fn resolve(
    dns: SocketAddr,
    name: &str,
    port: u16,
) -> Result<(Vec<SocketAddr>, Duration), String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = (nanos ^ std::process::id()) as u16;
    let query = query(id, name)?;
    let local: SocketAddr = if dns.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let std = StdUdp::bind(local).map_err(|e| e.to_string())?;
    std.set_nonblocking(true).map_err(|e| e.to_string())?;
    let sock = UdpSocket::from_std(std).map_err(|e| e.to_string())?;
    sock.connect(dns).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1232];
    for _ in 0..2 {
        sock.send(&query).await.map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + DNS_TIMEOUT;
        while let Ok(got) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
            let n = got.map_err(|e| e.to_string())?;
            match answer(&buf[..n], id) {
                Ok(None) => continue, // not our answer
                Ok(Some((v4, ttl))) if !v4.is_empty() => {
                    let addrs = v4.into_iter().map(|ip| (ip, port).into()).collect();
                    return Ok((addrs, ttl.clamp(MIN_TTL, MAX_TTL)));
                }
                Ok(Some(_)) => return Err(format!("{name} has no A record")),
                Err(e) => return Err(e),
            }
        }
    }
    Err(format!("no answer within {:?}, asked twice", DNS_TIMEOUT))
}

/// A query for `name` IN A.
fn query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("{name}: not a domain name"));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    if q.len() > 12 + 255 {
        return Err(format!("{name}: longer than 255 bytes"));
    }
    q.extend_from_slice(&[0, 1, 0, 1]); // A, IN
    Ok(q)
}

/// The A records and smallest TTL of an answer to query `id`; `None` when
/// the message is not that answer.
fn answer(m: &[u8], id: u16) -> Result<Option<(Vec<Ipv4Addr>, Duration)>, String> {
    let bad = || "malformed DNS answer".to_string();
    let u16_at = |i: usize| -> Result<u16, String> {
        m.get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(bad)
    };
    if m.len() < 12 || u16_at(0)? != id || m[2] & 0x80 == 0 {
        return Ok(None);
    }
    if m[2] & 0x02 != 0 {
        return Err("the DNS answer is truncated".into());
    }
    match m[3] & 0x0f {
        0 => {}
        2 => return Err("the DNS server failed (SERVFAIL)".into()),
        3 => return Err("no such name (NXDOMAIN)".into()),
        5 => return Err("the DNS server refused: it does not serve this name (REFUSED)".into()),
        rcode => return Err(format!("the DNS server answered rcode {rcode}")),
    }
    let (qd, an) = (u16_at(4)?, u16_at(6)?);
    // Skips a name (labels, ending in a zero or a compression pointer).
    let skip_name = |mut i: usize| -> Result<usize, String> {
        loop {
            let len = *m.get(i).ok_or_else(bad)?;
            match len {
                0 => return Ok(i + 1),
                l if l & 0xc0 == 0xc0 => return Ok(i + 2),
                l if l < 64 => i += 1 + l as usize,
                _ => return Err(bad()),
            }
        }
    };
    let mut i = 12;
    for _ in 0..qd {
        i = skip_name(i)? + 4;
    }
    let (mut ips, mut ttl) = (Vec::new(), u32::MAX);
    for _ in 0..an {
        i = skip_name(i)?;
        let (kind, class) = (u16_at(i)?, u16_at(i + 2)?);
        let t = m
            .get(i + 4..i + 8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(bad)?;
        let len = u16_at(i + 8)? as usize;
        let data = m.get(i + 10..i + 10 + len).ok_or_else(bad)?;
        if kind == 1 && class == 1 && len == 4 {
            ips.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
            ttl = ttl.min(t);
        }
        i += 10 + len;
    }
    Ok(Some((ips, Duration::from_secs(ttl.min(86_400) as u64))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(id: u16, rcode: u8, records: &[([u8; 4], u32)]) -> Vec<u8> {
        let mut m = query(id, "live.demo.example").unwrap();
        m[2] |= 0x80;
        m[3] = rcode;
        m[7] = records.len() as u8;
        for (ip, ttl) in records {
            m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
            m.extend_from_slice(&ttl.to_be_bytes());
            m.extend_from_slice(&[0, 4]);
            m.extend_from_slice(ip);
        }
        m
    }

    #[test]
    fn answers_give_addresses_and_the_smallest_ttl() {
        let m = reply(7, 0, &[([127, 10, 0, 1], 20), ([127, 10, 0, 2], 15)]);
        let (ips, ttl) = answer(&m, 7).unwrap().unwrap();
        assert_eq!(
            ips,
            [Ipv4Addr::new(127, 10, 0, 1), Ipv4Addr::new(127, 10, 0, 2)]
        );
        assert_eq!(ttl, Duration::from_secs(15));
        assert!(answer(&m, 8).unwrap().is_none(), "another query's answer");
        assert!(answer(&reply(7, 3, &[]), 7)
            .unwrap_err()
            .contains("NXDOMAIN"));
        for cut in 0..m.len() {
            let _ = answer(&m[..cut], 7); // never panics
        }
        assert!(query(1, "a..b").is_err());
    }

    #[test]
    fn sessions_spread_and_only_the_winners_move_to_a_new_server() {
        let addrs = |n: u8| -> Vec<SocketAddr> {
            (1..=n)
                .map(|i| SocketAddr::from(([127, 10, 0, i], 80)))
                .collect()
        };
        let none = Avoided::default();
        let s = Servers::fixed(addrs(3));
        let before: Vec<SocketAddr> = (0..3000).map(|i| s.ranked(i, &none)[0]).collect();
        for a in addrs(3) {
            let n = before.iter().filter(|&&b| b == a).count();
            assert!((800..1200).contains(&n), "{a} has {n} of 3000 sessions");
        }
        *s.current.write().unwrap() = List::new(addrs(4), addrs(3));
        let after: Vec<SocketAddr> = (0..3000).map(|i| s.ranked(i, &none)[0]).collect();
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        let new = SocketAddr::from(([127, 10, 0, 4], 80));
        assert!(after.iter().zip(&before).all(|(a, b)| a == b || *a == new));
        assert!((550..950).contains(&moved), "{moved} of 3000 moved");
        let avoid = Avoided::default();
        avoid.add(after[0]);
        assert_ne!(s.ranked(0, &avoid)[0], after[0]);
        assert_eq!(s.ranked(0, &avoid).len(), 4);
        // A new answer that fails: the session goes back to the old ones.
        let origin = SocketAddr::from(([127, 0, 0, 1], 80));
        *s.current.write().unwrap() = List::new(vec![origin], addrs(4));
        let r = s.ranked(7, &none);
        assert_eq!(r[0], origin);
        assert_eq!(r.len(), 5);
        avoid.add(origin);
        assert_ne!(s.ranked(7, &avoid)[0], origin);
    }
}
