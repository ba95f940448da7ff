//! Client location: coverage zones (CIDR → region, longest prefix wins)
//! and the nearest-region fallback by great-circle distance.

use std::collections::HashMap;
use std::net::IpAddr;

pub use vcdn_policy::net::Cidr;
use vcdn_policy::net::{canonical, mask};

/// Longest-prefix match of addresses to values: one hash table per prefix
/// length in use, probed from the longest down (a handful of lengths in a
/// real coverage file, so a few hash lookups per query).
#[derive(Debug, Clone, Default)]
pub struct PrefixMap<T> {
    v4: Vec<(u8, HashMap<u128, T>)>,
    v6: Vec<(u8, HashMap<u128, T>)>,
}

impl<T: Clone> PrefixMap<T> {
    pub fn insert(&mut self, c: Cidr, value: T) {
        let tables = if c.addr.is_ipv4() {
            &mut self.v4
        } else {
            &mut self.v6
        };
        let i = match tables.iter().position(|(l, _)| *l == c.len) {
            Some(i) => i,
            None => {
                tables.push((c.len, HashMap::new()));
                tables.sort_by_key(|t| std::cmp::Reverse(t.0));
                tables.iter().position(|(l, _)| *l == c.len).unwrap_or(0)
            }
        };
        tables[i].1.insert(mask(c.addr, c.len), value);
    }

    /// The value of the longest matching prefix, with that prefix's length
    /// (the scope of an EDNS Client Subnet answer).
    pub fn lookup(&self, ip: IpAddr) -> Option<(&T, u8)> {
        let ip = canonical(ip);
        let tables = if ip.is_ipv4() { &self.v4 } else { &self.v6 };
        tables
            .iter()
            .find_map(|(len, t)| t.get(&mask(ip, *len)).map(|v| (v, *len)))
    }
}

/// Great-circle distance in km between two (lat, lon) points in degrees.
pub fn distance_km(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (la1, lo1, la2, lo2) = (
        a.0.to_radians(),
        a.1.to_radians(),
        b.0.to_radians(),
        b.1.to_radians(),
    );
    let h = ((la2 - la1) / 2.0).sin().powi(2)
        + la1.cos() * la2.cos() * ((lo2 - lo1) / 2.0).sin().powi(2);
    2.0 * 6371.0 * h.sqrt().min(1.0).asin()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins() {
        let mut m = PrefixMap::default();
        m.insert("127.0.0.0/8".parse().unwrap(), "any");
        m.insert("127.1.0.0/16".parse().unwrap(), "paris");
        m.insert("127.1.2.0/24".parse().unwrap(), "lyon");
        m.insert("2001:db8::/32".parse().unwrap(), "v6");
        let at = |s: &str| m.lookup(s.parse().unwrap()).map(|(v, l)| (*v, l));
        assert_eq!(at("127.1.2.3"), Some(("lyon", 24)));
        assert_eq!(at("127.1.3.3"), Some(("paris", 16)));
        assert_eq!(at("127.9.9.9"), Some(("any", 8)));
        assert_eq!(at("10.0.0.1"), None);
        assert_eq!(at("2001:db8:1::1"), Some(("v6", 32)));
        assert_eq!(at("::ffff:127.1.2.3"), Some(("lyon", 24)));
    }

    #[test]
    fn distances() {
        let paris = (48.8566, 2.3522);
        let lyon = (45.764, 4.8357);
        let d = distance_km(paris, lyon);
        assert!((380.0..400.0).contains(&d), "{d}");
        assert_eq!(distance_km(paris, paris), 0.0);
    }
}
