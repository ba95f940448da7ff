//! vcdn's own telemetry records: what caches, the router and the API
//! publish on the topics of `docs/telemetry-protocol.md` (`edge.stats`,
//! `edge.events`, `router.decisions`, `qoe.reports`).
//!
//! A record is a JSON object with the publisher's identity, boot incarnation
//! and sequence number, framed with a MAC under the deployment's MAC key
//! (the same keys as discovery), so a datagram injected on the network
//! cannot make the supervisor scale or bill. Counters are cumulative: a
//! lost record costs nothing but freshness, a duplicated or reordered one
//! is recognised by `(inc, seq)` ([`Latest`]), so no delta is ever counted
//! twice.

use std::collections::HashMap;

use aws_lc_rs::hmac;
use serde::{Deserialize, Serialize};

use crate::envelope::Reject;
use crate::keys::Keyring;

pub const TOPIC_EDGE_STATS: &str = "edge.stats";
pub const TOPIC_EDGE_EVENTS: &str = "edge.events";
pub const TOPIC_ROUTER_DECISIONS: &str = "router.decisions";
pub const TOPIC_QOE_REPORTS: &str = "qoe.reports";

const MAGIC: &[u8; 4] = b"ANDR";
const HEAD: usize = 4 + 4 + 32;
/// The largest record (one UDP datagram, one Kafka message).
pub const MAX_RECORD: usize = 60_000;

/// One record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The publisher: an instance id, `router`, `control`.
    pub source: String,
    /// The service it belongs to, when it belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The publisher's boot incarnation (larger at every start).
    pub inc: u64,
    /// Per-incarnation sequence number.
    pub seq: u64,
    /// Milliseconds since the Unix epoch at publication.
    pub ts: u64,
    /// The payload: for `edge.stats` the cache's `/stats` document.
    pub data: serde_json::Value,
}

/// Frames a record: `"ANDR" ‖ key id ‖ HMAC-SHA256(key, key id ‖ json) ‖ json`.
pub fn seal(keys: &Keyring, r: &Record) -> Vec<u8> {
    let json = serde_json::to_vec(r).expect("records serialise");
    let (id, key) = keys.current_mac();
    let mut out = Vec::with_capacity(HEAD + json.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(&id.to_be_bytes());
    ctx.update(&json);
    out.extend_from_slice(ctx.sign().as_ref());
    out.extend_from_slice(&json);
    out
}

/// Checks a record's frame and parses it.
pub fn open(keys: &Keyring, frame: &[u8]) -> Result<Record, Reject> {
    if frame.len() < HEAD + 2 || frame.len() > MAX_RECORD || &frame[..4] != MAGIC {
        return Err(Reject::Malformed);
    }
    let id = u32::from_be_bytes(frame[4..8].try_into().expect("4 bytes"));
    let key = keys.mac_key(id).ok_or(Reject::UnknownKey)?;
    let mut data = Vec::with_capacity(4 + frame.len() - HEAD);
    data.extend_from_slice(&frame[4..8]);
    data.extend_from_slice(&frame[HEAD..]);
    hmac::verify(key, &data, &frame[8..HEAD]).map_err(|_| Reject::BadMac)?;
    let r: Record = serde_json::from_slice(&frame[HEAD..]).map_err(|_| Reject::Malformed)?;
    if !crate::message::valid_node_id(&r.source) {
        return Err(Reject::Malformed);
    }
    Ok(r)
}

/// The newest record per source: one that is not newer than the held one
/// (same or older incarnation, not a higher sequence) is a duplicate or
/// arrived late, and is refused. At most `capacity` sources are held; the
/// caller removes sources that are gone ([`Latest::retain`]).
pub struct Latest {
    held: HashMap<String, Record>,
    capacity: usize,
}

impl Latest {
    pub fn new(capacity: usize) -> Latest {
        Latest {
            held: HashMap::new(),
            capacity,
        }
    }

    /// Keeps `r` if it is newer than what is held; says whether it did.
    pub fn offer(&mut self, r: Record) -> bool {
        match self.held.get(&r.source) {
            Some(h) if (r.inc, r.seq) <= (h.inc, h.seq) => false,
            None if self.held.len() >= self.capacity => false,
            _ => {
                self.held.insert(r.source.clone(), r);
                true
            }
        }
    }

    pub fn get(&self, source: &str) -> Option<&Record> {
        self.held.get(source)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.held.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyFile;

    fn rec(inc: u64, seq: u64) -> Record {
        Record {
            source: "i-1".into(),
            service: Some("s-1".into()),
            inc,
            seq,
            ts: 1,
            data: serde_json::json!({"requests": {"HIT": seq}}),
        }
    }

    #[test]
    fn records_round_trip_and_tampering_is_refused() {
        let keys = KeyFile::generate().keyring().unwrap();
        let f = seal(&keys, &rec(1, 2));
        assert_eq!(open(&keys, &f).unwrap(), rec(1, 2));
        let mut t = f.clone();
        let n = t.len() - 2;
        t[n] ^= 1;
        assert_eq!(open(&keys, &t), Err(Reject::BadMac));
        let other = KeyFile::generate().keyring().unwrap();
        assert_eq!(open(&other, &f), Err(Reject::BadMac));
        assert_eq!(open(&keys, b"ANDRxx"), Err(Reject::Malformed));
    }

    #[test]
    fn only_newer_records_are_kept() {
        let mut l = Latest::new(1);
        assert!(l.offer(rec(1, 5)));
        assert!(!l.offer(rec(1, 5)), "a duplicate");
        assert!(!l.offer(rec(1, 4)), "a late one");
        assert!(l.offer(rec(1, 6)));
        assert!(l.offer(rec(2, 0)), "a restarted publisher starts over");
        assert!(!l.offer(rec(1, 99)), "the old boot's records are done");
        let mut other = rec(1, 1);
        other.source = "i-2".into();
        assert!(!l.offer(other), "bounded");
    }
}
