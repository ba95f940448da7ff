//! IP networks (CIDR blocks) as coverage zones and origin rules use them.

use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network, e.g. `127.1.0.0/16` or `2001:db8::/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    /// The network of one address (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Cidr {
        Cidr {
            addr,
            len: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    /// Whether `ip` is in this network. An IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`) is the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.len) == mask(self.addr, self.len)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| format!("'{s}' is not a CIDR (expected ADDRESS/LENGTH)"))?;
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("'{a}' in '{s}' is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = l
            .parse()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| format!("prefix length '{l}' in '{s}' must be 0-{max}"))?;
        if mask(addr, len) != bits(addr) {
            return Err(format!(
                "'{s}' has host bits set (did you mean {}?)",
                network(addr, len)
            ));
        }
        Ok(Cidr { addr, len })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// `ip`, with an IPv4-mapped IPv6 address turned into its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    }
}

/// The first `len` bits of `a` (the rest zero), as an integer.
pub fn mask(a: IpAddr, len: u8) -> u128 {
    let width = if a.is_ipv4() { 32 } else { 128 };
    if len == 0 {
        return 0;
    }
    let m = if width == 32 {
        (u32::MAX << (32 - len as u32)) as u128
    } else {
        u128::MAX << (128 - len as u32)
    };
    bits(a) & m
}

fn network(a: IpAddr, len: u8) -> String {
    let n = mask(a, len);
    match a {
        IpAddr::V4(_) => format!("{}/{}", std::net::Ipv4Addr::from(n as u32), len),
        IpAddr::V6(_) => format!("{}/{}", std::net::Ipv6Addr::from(n), len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parsing() {
        assert_eq!("127.1.0.0/16".parse::<Cidr>().unwrap().len, 16);
        assert!("2001:db8::/32".parse::<Cidr>().is_ok());
        let e = "127.1.2.0/16".parse::<Cidr>().unwrap_err();
        assert!(e.contains("127.1.0.0/16"), "{e}");
        assert!("127.1.0.0/33".parse::<Cidr>().is_err());
        assert!("127.1.0.0".parse::<Cidr>().is_err());
        assert!("x/8".parse::<Cidr>().is_err());
        assert!("0.0.0.0/0".parse::<Cidr>().is_ok());
    }

    #[test]
    fn containment() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::a01:203".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        assert!(!all.contains("2001:db8::1".parse().unwrap()));
    }
}
