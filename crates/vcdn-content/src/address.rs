//! Content addresses: a producer's IPv6 /64 prefix followed by a 64-bit chunk id.
//!
//! In the content-aware data plane (§II-A of the paper) every chunk gets a globally routable
//! IPv6 address: the first 64 bits are the content producer's prefix and act as a *locator*
//! (the network routes on them as usual), the last 64 bits are the [`ChunkId`] and act as the
//! *content identifier* that dispatchers and admission filters read without terminating HTTP.
//! A [`ContentPrefix`] is therefore always exactly a /64: anything shorter would leave locator
//! bits inside the id, anything longer would cut into it.

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use thiserror::Error;

use crate::name::{ChunkId, ChunkName};

/// Why a text is not a content prefix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PrefixError {
    /// The address part is not an IPv6 address.
    #[error(
        "{input:?} is not an IPv6 prefix: expected a /64 such as 2001:db8:1:2::/64 (or 2001:db8:1:2::, which implies /64)"
    )]
    NotAnAddress {
        /// The text given.
        input: String,
    },
    /// The part after `/` is not a number.
    #[error("prefix length {length:?} is not a number: expected /64")]
    BadLength {
        /// The text after `/`.
        length: String,
    },
    /// A prefix length other than 64.
    #[error(
        "a content prefix must be a /64 (the chunk id fills the last 64 bits of the address), not /{length}"
    )]
    WrongLength {
        /// The length given.
        length: u32,
    },
    /// Some of the last 64 bits are set.
    #[error(
        "{address} has bits set in its last 64 bits, which belong to the chunk id: expected a /64 with a zero interface id, such as {network}/64"
    )]
    HostBitsSet {
        /// The address given.
        address: Ipv6Addr,
        /// The same address with the last 64 bits cleared.
        network: Ipv6Addr,
    },
}

/// A content producer's IPv6 /64 prefix, the locator half of a content address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentPrefix(u64);

impl ContentPrefix {
    /// The only prefix length: 64.
    pub const LEN: u32 = 64;

    /// The prefix whose network address is `network`; its last 64 bits must be zero.
    pub fn new(network: Ipv6Addr) -> Result<Self, PrefixError> {
        let bits = u128::from(network);
        if bits as u64 != 0 {
            return Err(PrefixError::HostBitsSet {
                address: network,
                network: Ipv6Addr::from(bits & !u128::from(u64::MAX)),
            });
        }
        Ok(ContentPrefix((bits >> 64) as u64))
    }

    /// The prefix from its 64 bits (the first four groups of the address).
    pub fn from_bits(bits: u64) -> Self {
        ContentPrefix(bits)
    }

    /// The prefix of any address (its first 64 bits).
    pub fn of(addr: Ipv6Addr) -> Self {
        ContentPrefix((u128::from(addr) >> 64) as u64)
    }

    /// The 64 prefix bits.
    pub fn bits(&self) -> u64 {
        self.0
    }

    /// The network address (the prefix followed by 64 zero bits).
    pub fn network(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.0) << 64)
    }

    /// The content address of chunk `id` under this prefix.
    pub fn address(&self, id: ChunkId) -> Ipv6Addr {
        Ipv6Addr::from((u128::from(self.0) << 64) | u128::from(id.0))
    }

    /// Whether `addr` lies in this /64.
    pub fn contains(&self, addr: Ipv6Addr) -> bool {
        Self::of(addr) == *self
    }

    /// The chunk id of `addr` if it lies in this /64.
    pub fn chunk_id(&self, addr: Ipv6Addr) -> Option<ChunkId> {
        self.contains(addr).then(|| chunk_id(addr))
    }
}

/// `2001:db8:1:2::/64`.
impl fmt::Display for ContentPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), Self::LEN)
    }
}

/// Parses `2001:db8:1:2::/64`, or `2001:db8:1:2::` (which implies /64). Any other length, or
/// bits set in the last 64, is an error saying what is expected.
impl FromStr for ContentPrefix {
    type Err = PrefixError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let (addr, length) = match t.split_once('/') {
            Some((addr, length)) => (addr, Some(length)),
            None => (t, None),
        };
        let network: Ipv6Addr = addr.parse().map_err(|_| PrefixError::NotAnAddress {
            input: s.to_string(),
        })?;
        if let Some(length) = length {
            if length.is_empty() || !length.bytes().all(|b| b.is_ascii_digit()) {
                return Err(PrefixError::BadLength {
                    length: length.to_string(),
                });
            }
            match length.parse::<u32>() {
                Ok(64) => {}
                Ok(length) => return Err(PrefixError::WrongLength { length }),
                Err(_) => {
                    return Err(PrefixError::BadLength {
                        length: length.to_string(),
                    })
                }
            }
        }
        Self::new(network)
    }
}

/// The chunk id of a content address: its last 64 bits.
pub fn chunk_id(addr: Ipv6Addr) -> ChunkId {
    ChunkId(u128::from(addr) as u64)
}

/// A content address split into its producer prefix and the chunk it names.
pub fn decode(addr: Ipv6Addr) -> (ContentPrefix, ChunkName) {
    (ContentPrefix::of(addr), ChunkName::from_id(chunk_id(addr)))
}

/// The content address of `name` under `prefix` (`prefix.address(name.id())`).
pub fn encode(prefix: &ContentPrefix, name: &ChunkName) -> Ipv6Addr {
    prefix.address(name.id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::ChunkDuration;

    fn prefix(s: &str) -> ContentPrefix {
        s.parse().unwrap()
    }

    #[test]
    fn parses_a_64_with_or_without_length() {
        let a = prefix("2001:db8:1:2::/64");
        let b = prefix("2001:db8:1:2::");
        assert_eq!(a, b);
        assert_eq!(a.bits(), 0x2001_0db8_0001_0002);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(
            prefix(" 2001:db8:1:2::/064 ").to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(prefix("::/64").bits(), 0);
        assert_eq!(prefix(&a.to_string()), a);
    }

    #[test]
    fn rejects_other_lengths_and_host_bits_saying_what_is_expected() {
        for len in ["48", "56", "63", "65", "128", "0"] {
            let e = format!("2001:db8::/{len}")
                .parse::<ContentPrefix>()
                .unwrap_err();
            assert!(matches!(e, PrefixError::WrongLength { .. }), "{len}: {e}");
            assert!(e.to_string().contains("must be a /64"), "{e}");
        }
        let e = "2001:db8:1:2::1/64".parse::<ContentPrefix>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "2001:db8:1:2::1 has bits set in its last 64 bits, which belong to the chunk id: \
             expected a /64 with a zero interface id, such as 2001:db8:1:2::/64"
        );
        assert!(matches!(
            "2001:db8:1:2:8000::".parse::<ContentPrefix>(),
            Err(PrefixError::HostBitsSet { .. })
        ));
        for bad_len in ["", "x", "+64", "-64", "6 4", "99999999999"] {
            let e = format!("2001:db8::/{bad_len}")
                .parse::<ContentPrefix>()
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    PrefixError::BadLength { .. } | PrefixError::NotAnAddress { .. }
                ),
                "{bad_len:?}: {e}"
            );
        }
        for bad in [
            "",
            "/64",
            "2001:db8::/64/64",
            "10.0.0.0/64",
            "2001:db8::%eth0",
            "host",
        ] {
            assert!(bad.parse::<ContentPrefix>().is_err(), "{bad:?}");
        }
        let e = "10.1.2.3".parse::<ContentPrefix>().unwrap_err();
        assert!(e.to_string().contains("expected a /64"), "{e}");
    }

    #[test]
    fn id_to_address_to_id_round_trips() {
        let p = prefix("2001:db8:1:2::/64");
        for id in [0, 1, 0x0000_02a0_0007_0cc8, u64::MAX, 1 << 63] {
            let addr = p.address(ChunkId(id));
            assert!(p.contains(addr));
            assert_eq!(p.chunk_id(addr), Some(ChunkId(id)));
            assert_eq!(chunk_id(addr), ChunkId(id));
            let (q, name) = decode(addr);
            assert_eq!(q, p);
            assert_eq!(name.id(), ChunkId(id));
        }
        let other = prefix("2001:db8:1:3::/64");
        assert_eq!(other.chunk_id(p.address(ChunkId(5))), None);
    }

    #[test]
    fn names_encode_into_the_last_64_bits() {
        let p = prefix("2001:db8:1:2::");
        let name = ChunkName::new(42, 7, 3, ChunkDuration::from_units(200).unwrap()).unwrap();
        let addr = encode(&p, &name);
        assert_eq!(
            addr,
            "2001:db8:1:2:0:2a0:7:cc8".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(decode(addr), (p, name));
        // The largest video and quality, nothing else: the fields' places in the address.
        let top = ChunkName::new(
            ChunkName::MAX_VIDEO.into(),
            0,
            ChunkName::MAX_QUALITY.into(),
            ChunkDuration::ZERO,
        )
        .unwrap();
        let addr = encode(&p, &top);
        assert_eq!(
            addr,
            "2001:db8:1:2:ffff:fff0:0:fc00".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(decode(addr), (p, top));
        let max = ChunkName::from_id(ChunkId(u64::MAX));
        assert_eq!(
            encode(&p, &max),
            "2001:db8:1:2:ffff:ffff:ffff:ffff"
                .parse::<Ipv6Addr>()
                .unwrap()
        );
    }
}
