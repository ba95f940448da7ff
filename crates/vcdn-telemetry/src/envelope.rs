//! The binary frame that authenticates every discovery datagram, and the
//! freshness check that drops replays.
//!
//! ```text
//! 0      4   5     6          10                  42             46          110
//! "ANDY" | v | flags | mac key id | HMAC-SHA256 (32) | [auth key id | Ed25519 sig (64)] | JSON body
//! ```
//! The MAC covers every byte but itself (bytes 0..10 and 42..), under the
//! MAC key named by its id. With flag bit 0 set, an authority signature
//! over `"ANDY-AUTH" ‖ auth key id ‖ body` follows; a message type only an
//! authority may send ([`Body::needs_authority`]) is refused without one.
//! The checks run cheapest first: size, frame, MAC (constant time), then the
//! signature, then JSON, then limits, then freshness.

use std::num::NonZeroUsize;

use aws_lc_rs::hmac;
use lru::LruCache;

use crate::keys::Keyring;
use crate::message::{valid_node_id, Message, VERSION};

/// The largest datagram the protocol sends or reads.
pub const MAX_DATAGRAM: usize = 8192;
const MAGIC: &[u8; 4] = b"ANDY";
const FRAME_VERSION: u8 = 1;
const MAC_AT: usize = 10;
const MAC_LEN: usize = 32;
const SIG_LEN: usize = 64;
const SIGNED: u8 = 1;
const AUTH_CONTEXT: &[u8] = b"ANDY-AUTH";

/// Why a datagram was dropped. Each is counted on `/metrics`
/// (`vcdn_telemetry_rejected_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Too short, too long, wrong magic or version, bad JSON or limits.
    Malformed,
    /// A MAC key id this node does not hold.
    UnknownKey,
    /// The MAC does not verify.
    BadMac,
    /// An authority type without a valid authority signature.
    BadSignature,
    /// A timestamp outside the allowed clock skew.
    Stale,
    /// Seen before (same node, incarnation and sequence), or from an older
    /// incarnation than one already seen.
    Replay,
}

impl Reject {
    pub const ALL: [Reject; 6] = [
        Reject::Malformed,
        Reject::UnknownKey,
        Reject::BadMac,
        Reject::BadSignature,
        Reject::Stale,
        Reject::Replay,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::UnknownKey => "unknown_key",
            Reject::BadMac => "bad_mac",
            Reject::BadSignature => "bad_signature",
            Reject::Stale => "stale",
            Reject::Replay => "replay",
        }
    }
}

/// Frames `msg`: MAC with the current key, and an authority signature when
/// the type needs one (the keyring must hold the private key then).
pub fn seal(keys: &Keyring, msg: &Message) -> Vec<u8> {
    let body = serde_json::to_vec(msg).expect("messages serialise");
    seal_raw(keys, &body, msg.body.needs_authority())
}

/// Frames `body` as it is (for [`seal`], and for fuzzing what lies behind
/// the MAC). `signed` needs the authority's private key.
pub fn seal_raw(keys: &Keyring, body: &[u8], signed: bool) -> Vec<u8> {
    let (mac_id, mac_key) = keys.current_mac();
    let mut out = Vec::with_capacity(MAC_AT + MAC_LEN + 4 + SIG_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.push(FRAME_VERSION);
    out.push(if signed { SIGNED } else { 0 });
    out.extend_from_slice(&mac_id.to_be_bytes());
    out.extend_from_slice(&[0u8; MAC_LEN]);
    if signed {
        let (id, pair) = keys
            .signer()
            .expect("only a node holding the authority key sends authority messages");
        out.extend_from_slice(&id.to_be_bytes());
        let mut signed_part = Vec::with_capacity(AUTH_CONTEXT.len() + 4 + body.len());
        signed_part.extend_from_slice(AUTH_CONTEXT);
        signed_part.extend_from_slice(&id.to_be_bytes());
        signed_part.extend_from_slice(body);
        out.extend_from_slice(pair.sign(&signed_part).as_ref());
    }
    out.extend_from_slice(body);
    let tag = mac(mac_key, &out);
    out[MAC_AT..MAC_AT + MAC_LEN].copy_from_slice(tag.as_ref());
    out
}

fn mac(key: &hmac::Key, frame: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(&frame[..MAC_AT]);
    ctx.update(&frame[MAC_AT + MAC_LEN..]);
    ctx.sign()
}

/// Checks the frame and parses the message. Freshness is separate
/// ([`Freshness::check`]): it needs state.
pub fn open(keys: &Keyring, frame: &[u8]) -> Result<Message, Reject> {
    if frame.len() < MAC_AT + MAC_LEN + 2 || frame.len() > MAX_DATAGRAM {
        return Err(Reject::Malformed);
    }
    if &frame[..4] != MAGIC || frame[4] != FRAME_VERSION || frame[5] & !SIGNED != 0 {
        return Err(Reject::Malformed);
    }
    let mac_id = u32::from_be_bytes(frame[6..10].try_into().expect("4 bytes"));
    let key = keys.mac_key(mac_id).ok_or(Reject::UnknownKey)?;
    // `hmac::verify` compares in constant time.
    let mut data = Vec::with_capacity(frame.len() - MAC_LEN);
    data.extend_from_slice(&frame[..MAC_AT]);
    data.extend_from_slice(&frame[MAC_AT + MAC_LEN..]);
    hmac::verify(key, &data, &frame[MAC_AT..MAC_AT + MAC_LEN]).map_err(|_| Reject::BadMac)?;
    let mut rest = &frame[MAC_AT + MAC_LEN..];
    let mut authority_signed = false;
    if frame[5] & SIGNED != 0 {
        if rest.len() < 4 + SIG_LEN {
            return Err(Reject::Malformed);
        }
        let id_bytes = &rest[..4];
        let id = u32::from_be_bytes(id_bytes.try_into().expect("4 bytes"));
        let sig = &rest[4..4 + SIG_LEN];
        let body = &rest[4 + SIG_LEN..];
        let mut signed_part = Vec::with_capacity(AUTH_CONTEXT.len() + 4 + body.len());
        signed_part.extend_from_slice(AUTH_CONTEXT);
        signed_part.extend_from_slice(id_bytes);
        signed_part.extend_from_slice(body);
        match keys.verify_authority(id, &signed_part, sig) {
            Some(true) => authority_signed = true,
            Some(false) | None => return Err(Reject::BadSignature),
        }
        rest = body;
    }
    let msg: Message = serde_json::from_slice(rest).map_err(|_| Reject::Malformed)?;
    if msg.v != VERSION || !valid_node_id(&msg.node) || msg.body.validate().is_err() {
        return Err(Reject::Malformed);
    }
    if msg.body.needs_authority() && !authority_signed {
        return Err(Reject::BadSignature);
    }
    Ok(msg)
}

/// The clock skew allowed between sender and receiver.
pub const MAX_SKEW_MS: u64 = 30_000;
/// Out-of-order datagrams accepted behind the highest sequence seen.
const WINDOW: u64 = 64;

/// Drops stale and replayed messages: per node id the newest incarnation and
/// a 64-message window behind the highest sequence number (as IPsec's
/// anti-replay window). Only messages whose MAC verified reach it, so only
/// key holders make entries, and it holds at most `capacity` nodes (the
/// least recently heard is forgotten first; a replay of a forgotten node's
/// message is still stopped by the timestamp check once 30 s old).
pub struct Freshness {
    nodes: LruCache<String, Seen>,
}

struct Seen {
    inc: u64,
    top: u64,
    /// Bit i set: sequence `top - i` seen.
    window: u64,
}

impl Freshness {
    pub fn new(capacity: usize) -> Freshness {
        Freshness {
            nodes: LruCache::new(NonZeroUsize::new(capacity.max(1)).expect("≥ 1")),
        }
    }

    pub fn check(&mut self, now_ms: u64, msg: &Message) -> Result<(), Reject> {
        if msg.ts.abs_diff(now_ms) > MAX_SKEW_MS {
            return Err(Reject::Stale);
        }
        match self.nodes.get_mut(&msg.node) {
            None => {
                self.nodes.put(
                    msg.node.clone(),
                    Seen {
                        inc: msg.inc,
                        top: msg.seq,
                        window: 1,
                    },
                );
                Ok(())
            }
            Some(s) if msg.inc < s.inc => Err(Reject::Replay),
            Some(s) if msg.inc > s.inc => {
                *s = Seen {
                    inc: msg.inc,
                    top: msg.seq,
                    window: 1,
                };
                Ok(())
            }
            Some(s) => {
                if msg.seq > s.top {
                    let shift = msg.seq - s.top;
                    s.window = if shift >= WINDOW {
                        0
                    } else {
                        s.window << shift
                    };
                    s.window |= 1;
                    s.top = msg.seq;
                    Ok(())
                } else {
                    let behind = s.top - msg.seq;
                    if behind >= WINDOW || s.window & (1 << behind) != 0 {
                        Err(Reject::Replay)
                    } else {
                        s.window |= 1 << behind;
                        Ok(())
                    }
                }
            }
        }
    }

    /// Forgets a node (after its BYE), so its next incarnation starts clean.
    pub fn forget(&mut self, node: &str) {
        self.nodes.pop(node);
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyFile;
    use crate::message::{Authority, Body, Role};

    fn msg(body: Body) -> Message {
        Message {
            v: 1,
            node: "cache-1".into(),
            inc: 5,
            seq: 9,
            ts: 1_000_000,
            port: 4000,
            body,
        }
    }

    fn hello() -> Message {
        msg(Body::Hello {
            roles: vec![Role::Producer],
            publish: vec!["edge.stats".into()],
            subscribe: vec![],
        })
    }

    fn reconfig() -> Message {
        msg(Body::Reconfig {
            authority: Authority {
                epoch: 7,
                bootstrap: Some("127.0.0.1:9092".into()),
                cluster_id: None,
                controller: None,
                generation: 0,
            },
        })
    }

    #[test]
    fn sealed_messages_open_and_every_flipped_bit_is_refused() {
        let file = KeyFile::generate();
        let keys = file.keyring().unwrap();
        for m in [hello(), reconfig()] {
            let frame = seal(&keys, &m);
            assert_eq!(open(&keys, &frame).unwrap(), m);
            for i in 0..frame.len() {
                let mut f = frame.clone();
                f[i] ^= 0x10;
                assert!(open(&keys, &f).is_err(), "bit flip at {i} accepted");
            }
            assert_eq!(open(&keys, &frame[..frame.len() - 1]), Err(Reject::BadMac));
        }
    }

    #[test]
    fn a_member_can_mac_but_cannot_forge_an_authority_message() {
        let file = KeyFile::generate();
        let authority = file.keyring().unwrap();
        let member = file.member_only().keyring().unwrap();
        // A member verifies what the authority signed.
        assert!(open(&member, &seal(&authority, &reconfig())).is_ok());
        // A member's forgery: MAC right, no signature.
        let body = serde_json::to_vec(&reconfig()).unwrap();
        let mut forged = Vec::new();
        forged.extend_from_slice(b"ANDY\x01\x00");
        forged.extend_from_slice(&1u32.to_be_bytes());
        forged.extend_from_slice(&[0; 32]);
        forged.extend_from_slice(&body);
        let (_, k) = member.current_mac();
        let tag = mac(k, &forged);
        forged[10..42].copy_from_slice(tag.as_ref());
        assert_eq!(open(&member, &forged), Err(Reject::BadSignature));
        // The same with a made-up signature.
        let mut forged = b"ANDY\x01\x01".to_vec();
        forged.extend_from_slice(&1u32.to_be_bytes());
        forged.extend_from_slice(&[0; 32]);
        forged.extend_from_slice(&1u32.to_be_bytes());
        forged.extend_from_slice(&[7; 64]);
        forged.extend_from_slice(&body);
        let tag = mac(k, &forged);
        forged[10..42].copy_from_slice(tag.as_ref());
        assert_eq!(open(&member, &forged), Err(Reject::BadSignature));
    }

    #[test]
    fn another_deployments_keys_do_not_verify() {
        let a = KeyFile::generate().keyring().unwrap();
        let b = KeyFile::generate().keyring().unwrap();
        assert_eq!(open(&b, &seal(&a, &hello())), Err(Reject::BadMac));
    }

    #[test]
    fn both_keys_verify_during_rotation() {
        let old = KeyFile::generate();
        let mut new = KeyFile::generate();
        new.mac[0].id = 2;
        let mut both = old.clone();
        both.mac = vec![new.mac[0].clone(), old.mac[0].clone()];
        let both = both.keyring().unwrap();
        let from_old = seal(&old.keyring().unwrap(), &hello());
        assert!(open(&both, &from_old).is_ok());
        // A node that has only the new key refuses the old one's messages.
        let mut only_new = old.clone();
        only_new.mac = vec![new.mac[0].clone()];
        assert_eq!(
            open(&only_new.keyring().unwrap(), &from_old),
            Err(Reject::UnknownKey)
        );
    }

    #[test]
    fn garbage_and_oversize_datagrams_are_malformed() {
        let keys = KeyFile::generate().keyring().unwrap();
        assert_eq!(open(&keys, b""), Err(Reject::Malformed));
        assert_eq!(open(&keys, &[0u8; 100]), Err(Reject::Malformed));
        assert_eq!(
            open(&keys, &vec![b'A'; MAX_DATAGRAM + 1]),
            Err(Reject::Malformed)
        );
    }

    #[test]
    fn freshness_drops_replays_stale_and_old_incarnations() {
        let mut f = Freshness::new(2);
        let mut m = hello();
        let now = m.ts;
        assert_eq!(f.check(now, &m), Ok(()));
        assert_eq!(f.check(now, &m), Err(Reject::Replay));
        m.seq = 7; // out of order, within the window
        assert_eq!(f.check(now, &m), Ok(()));
        assert_eq!(f.check(now, &m), Err(Reject::Replay));
        m.seq = 200;
        assert_eq!(f.check(now, &m), Ok(()));
        m.seq = 100; // beyond the window
        assert_eq!(f.check(now, &m), Err(Reject::Replay));
        m.inc = 4; // an older boot
        m.seq = 1000;
        assert_eq!(f.check(now, &m), Err(Reject::Replay));
        m.inc = 6; // a newer boot starts over
        m.seq = 0;
        assert_eq!(f.check(now, &m), Ok(()));
        m.seq = 1;
        assert_eq!(f.check(now + MAX_SKEW_MS + 1, &m), Err(Reject::Stale));
        // Bounded: a third node pushes out the least recent.
        for n in ["a", "b", "c"] {
            let mut o = hello();
            o.node = n.into();
            f.check(now, &o).unwrap();
        }
        assert_eq!(f.len(), 2);
    }
}
