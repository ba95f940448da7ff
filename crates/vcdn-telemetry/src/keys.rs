//! The keys of the discovery protocol.
//!
//! Two kinds, because a shared secret cannot tell a sink from a cache that
//! holds the same secret:
//! - **MAC keys** (HMAC-SHA256, 32 bytes), held by every node: every
//!   datagram carries a MAC under one of them. Up to two are valid at once
//!   so keys rotate without a flag day: the first one signs, both verify.
//! - **Authority keys** (Ed25519): only the control plane and the nodes it
//!   makes data sinks or trackers hold the private key; every node holds the
//!   public keys (again up to two) and accepts CONFIG, RECONFIG,
//!   CLUSTER_RESIZE, TCONFIG, TRECONFIG and NEW_DESTINATION only when signed
//!   by one. A cache that is broken into can therefore send HELLOs and
//!   PUBLISHes, but it cannot re-point other nodes.
//!
//! The control plane hands each instance a key file (JSON, mode 0600) when it
//! starts it, as it does the admin token.

use std::fmt;
use std::path::Path;

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};

/// At most this many keys of a kind are valid at once (the current one and
/// the one being rotated out).
pub const MAX_KEYS: usize = 2;

/// Errors of loading or building a keyring; the texts are for an operator.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the telemetry key file {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("the telemetry key file {path} is not valid: {err}")]
    Parse { path: String, err: String },
    #[error("the telemetry keyring is not valid: {0}")]
    Invalid(String),
}

/// A key of a kind, by id.
#[derive(Clone, Serialize, Deserialize)]
pub struct KeyEntry {
    pub id: u32,
    /// Hex: 32 bytes (a MAC key or an Ed25519 public key).
    pub key: String,
}

/// The private authority key (PKCS#8 v2, hex), only on authorities.
#[derive(Clone, Serialize, Deserialize)]
pub struct PrivateEntry {
    pub id: u32,
    pub pkcs8: String,
}

/// The key file as stored and handed over.
#[derive(Clone, Serialize, Deserialize)]
pub struct KeyFile {
    /// MAC keys, the current one first.
    pub mac: Vec<KeyEntry>,
    /// Authority public keys, the current one first.
    pub authority_public: Vec<KeyEntry>,
    /// The authority's signing key: present only for nodes that may be a
    /// data sink or a tracker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority_private: Option<PrivateEntry>,
}

/// The keys a node uses, parsed.
pub struct Keyring {
    mac: Vec<(u32, hmac::Key)>,
    authority_public: Vec<(u32, [u8; 32])>,
    signer: Option<(u32, Ed25519KeyPair)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("mac_ids", &self.mac.iter().map(|k| k.0).collect::<Vec<_>>())
            .field(
                "authority_ids",
                &self
                    .authority_public
                    .iter()
                    .map(|k| k.0)
                    .collect::<Vec<_>>(),
            )
            .field("can_sign", &self.signer.is_some())
            .finish()
    }
}

impl KeyFile {
    /// A new key file with fresh keys (id 1 of each), including the private
    /// authority key: what the control plane makes once and keeps.
    pub fn generate() -> KeyFile {
        let rng = SystemRandom::new();
        let mut mac = [0u8; 32];
        rng.fill(&mut mac)
            .expect("the system's random source works");
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("Ed25519 key generation works");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("a generated key parses");
        KeyFile {
            mac: vec![KeyEntry {
                id: 1,
                key: hex(&mac),
            }],
            authority_public: vec![KeyEntry {
                id: 1,
                key: hex(pair.public_key().as_ref()),
            }],
            authority_private: Some(PrivateEntry {
                id: 1,
                pkcs8: hex(pkcs8.as_ref()),
            }),
        }
    }

    /// The same keys without the private authority key: what a cache, the
    /// router or an agent that is not an authority gets.
    pub fn member_only(&self) -> KeyFile {
        KeyFile {
            authority_private: None,
            ..self.clone()
        }
    }

    pub fn load(path: &Path) -> Result<KeyFile, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|err| KeyError::Read {
            path: path.display().to_string(),
            err,
        })?;
        serde_json::from_str(&text).map_err(|e| KeyError::Parse {
            path: path.display().to_string(),
            err: e.to_string(),
        })
    }

    /// Writes the file with mode 0600 (it holds secrets), atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(
            serde_json::to_string_pretty(self)
                .expect("serialises")
                .as_bytes(),
        )?;
        f.sync_all()?;
        std::fs::rename(tmp, path)
    }

    pub fn keyring(&self) -> Result<Keyring, KeyError> {
        Keyring::new(self)
    }
}

impl Keyring {
    pub fn new(file: &KeyFile) -> Result<Keyring, KeyError> {
        let bad = |s: String| KeyError::Invalid(s);
        if file.mac.is_empty() || file.mac.len() > MAX_KEYS {
            return Err(bad(format!(
                "it needs 1 or {MAX_KEYS} MAC keys, has {}",
                file.mac.len()
            )));
        }
        if file.authority_public.is_empty() || file.authority_public.len() > MAX_KEYS {
            return Err(bad(format!(
                "it needs 1 or {MAX_KEYS} authority public keys, has {}",
                file.authority_public.len()
            )));
        }
        let mut mac = Vec::new();
        for k in &file.mac {
            let bytes = unhex(&k.key)
                .filter(|b| b.len() == 32)
                .ok_or_else(|| bad(format!("MAC key {} is not 64 hex digits", k.id)))?;
            mac.push((k.id, hmac::Key::new(hmac::HMAC_SHA256, &bytes)));
        }
        let mut authority_public = Vec::new();
        for k in &file.authority_public {
            let bytes = unhex(&k.key).filter(|b| b.len() == 32).ok_or_else(|| {
                bad(format!(
                    "authority public key {} is not 64 hex digits",
                    k.id
                ))
            })?;
            let mut a = [0u8; 32];
            a.copy_from_slice(&bytes);
            authority_public.push((k.id, a));
        }
        let signer = match &file.authority_private {
            None => None,
            Some(p) => {
                let der = unhex(&p.pkcs8)
                    .ok_or_else(|| bad(format!("authority private key {} is not hex", p.id)))?;
                let pair = Ed25519KeyPair::from_pkcs8(&der).map_err(|_| {
                    bad(format!(
                        "authority private key {} is not an Ed25519 PKCS#8 key",
                        p.id
                    ))
                })?;
                let public = file.authority_public.iter().find(|k| k.id == p.id);
                if public.map(|k| unhex(&k.key)) != Some(Some(pair.public_key().as_ref().to_vec()))
                {
                    return Err(bad(format!(
                        "authority private key {} does not match the public key of that id",
                        p.id
                    )));
                }
                Some((p.id, pair))
            }
        };
        Ok(Keyring {
            mac,
            authority_public,
            signer,
        })
    }

    /// The MAC key datagrams are sent with.
    pub(crate) fn current_mac(&self) -> (u32, &hmac::Key) {
        (self.mac[0].0, &self.mac[0].1)
    }

    pub(crate) fn mac_key(&self, id: u32) -> Option<&hmac::Key> {
        self.mac.iter().find(|k| k.0 == id).map(|k| &k.1)
    }

    pub(crate) fn signer(&self) -> Option<(u32, &Ed25519KeyPair)> {
        self.signer.as_ref().map(|(id, k)| (*id, k))
    }

    /// Whether this node may act as a data sink or tracker.
    pub fn can_sign(&self) -> bool {
        self.signer.is_some()
    }

    /// Verifies an authority signature over `msg` with public key `id`:
    /// `None` when the id is unknown.
    pub(crate) fn verify_authority(&self, id: u32, msg: &[u8], sig: &[u8]) -> Option<bool> {
        let (_, key) = self.authority_public.iter().find(|k| k.0 == id)?;
        Some(
            UnparsedPublicKey::new(&ED25519, key)
                .verify(msg, sig)
                .is_ok(),
        )
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_round_trip_and_member_copy_cannot_sign() {
        let file = KeyFile::generate();
        let ring = file.keyring().unwrap();
        assert!(ring.can_sign());
        let text = serde_json::to_string(&file.member_only()).unwrap();
        assert!(!text.contains("pkcs8"));
        let member: KeyFile = serde_json::from_str(&text).unwrap();
        assert!(!member.keyring().unwrap().can_sign());
    }

    #[test]
    fn a_private_key_that_does_not_match_its_public_key_is_refused() {
        let mut a = KeyFile::generate();
        let b = KeyFile::generate();
        a.authority_private = b.authority_private.clone();
        let err = a.keyring().unwrap_err().to_string();
        assert!(err.contains("does not match"), "{err}");
    }

    #[test]
    fn wrong_lengths_and_counts_are_refused_with_a_reason() {
        let mut f = KeyFile::generate();
        f.mac[0].key = "abcd".into();
        assert!(f
            .keyring()
            .unwrap_err()
            .to_string()
            .contains("64 hex digits"));
        let mut f = KeyFile::generate();
        f.mac = vec![f.mac[0].clone(); 3];
        assert!(f.keyring().unwrap_err().to_string().contains("MAC keys"));
    }
}
