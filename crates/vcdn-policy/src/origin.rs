//! Which addresses a customer's origin may have. An origin is a URL a
//! customer types; without a policy it could name the operator's control
//! API, a cloud metadata service or another customer's cache, and the vCDN
//! would fetch it for anonymous users (server-side request forgery). The
//! operator's policy is a list of allow and deny rules over addresses and
//! ports; the most specific rule that matches decides, and of equally
//! specific rules the last one added (so the control plane adds the default
//! `deny non-public` first, then the customer's and flavor's exceptions,
//! then its own addresses). `deny non-public` with `allow 127.0.0.1:9000`
//! (a demo origin) still refuses `127.0.0.1:8070` (the control API), and a
//! platform address or range denied last stays denied under a broader
//! exception such as `allow 127.0.0.0/8`.
//!
//! The same policy is applied where the order is taken (to the URL and the
//! addresses its name resolves to then) and by the cache at every connect
//! (to the address it is about to reach), since a name may resolve to
//! something else later.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use crate::net::{canonical, Cidr};

/// One rule's match: a network and, optionally, one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    pub net: Cidr,
    pub port: Option<u16>,
}

impl Rule {
    fn matches(&self, addr: SocketAddr) -> bool {
        self.net.contains(addr.ip()) && self.port.is_none_or(|p| p == addr.port())
    }

    /// Longer prefixes are more specific, and a port makes a rule more
    /// specific than the same network without one.
    fn specificity(&self) -> (u8, bool) {
        // An IPv4 /32 and an IPv6 /128 both name one host.
        let len = if self.net.addr.is_ipv4() {
            self.net.len + 96
        } else {
            self.net.len
        };
        (len, self.port.is_some())
    }

    /// Parses one rule or the keyword `non-public` (every address that is
    /// not on the public Internet; see [`NON_PUBLIC`]). Forms: `10.0.0.0/8`,
    /// `10.1.2.3`, `::1`, `127.0.0.1:9000`, `[::1]:9000`.
    pub fn parse_list(s: &str) -> Result<Vec<Rule>, String> {
        let s = s.trim();
        if s == "non-public" {
            return Ok(NON_PUBLIC
                .iter()
                .map(|(c, _)| Rule {
                    net: c.parse().expect("built-in networks are valid"),
                    port: None,
                })
                .collect());
        }
        s.parse().map(|r| vec![r])
    }
}

impl FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Rule, String> {
        let s = s.trim();
        if let Ok(sa) = s.parse::<SocketAddr>() {
            return Ok(Rule {
                net: Cidr::host(canonical(sa.ip())),
                port: Some(sa.port()),
            });
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Rule {
                net: Cidr::host(canonical(ip)),
                port: None,
            });
        }
        if s.contains('/') {
            return Ok(Rule {
                net: s.parse()?,
                port: None,
            });
        }
        Err(format!(
            "'{s}' is not an origin rule: expected a network (10.0.0.0/8), an address \
             (10.1.2.3), an address with a port (127.0.0.1:9000, [::1]:9000) or 'non-public'"
        ))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = self.net.len == if self.net.addr.is_ipv4() { 32 } else { 128 };
        match (self.port, host) {
            (Some(p), _) => write!(f, "{}", SocketAddr::new(self.net.addr, p)),
            (None, true) => write!(f, "{}", self.net.addr),
            (None, false) => write!(f, "{}", self.net),
        }
    }
}

/// Addresses that are not on the public Internet, with what each is.
pub const NON_PUBLIC: &[(&str, &str)] = &[
    ("0.0.0.0/8", "'this network'"),
    ("10.0.0.0/8", "a private network"),
    ("100.64.0.0/10", "carrier-grade NAT space"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local, where cloud metadata lives"),
    ("172.16.0.0/12", "a private network"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "a private network"),
    ("198.18.0.0/15", "benchmarking space"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and broadcast)"),
    ("::/128", "the unspecified address"),
    ("::1/128", "loopback"),
    ("64:ff9b::/96", "NAT64 (reaches IPv4 behind the translator)"),
    ("100::/64", "discard-only space"),
    ("fc00::/7", "a unique-local (private) network"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
];

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// The operator's origin policy. Empty, it allows everything (a cache an
/// operator runs by hand trusts the upstream it was given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginPolicy {
    rules: Vec<(Action, Rule)>,
}

/// Why an origin address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("origin address {addr} is refused by the operator's origin policy (it matches {rule}{what}); ask the operator for an exception if this origin is really yours")]
pub struct Refused {
    pub addr: SocketAddr,
    pub rule: Rule,
    what: String,
}

impl OriginPolicy {
    /// Adds `rules` with `action`.
    pub fn add(&mut self, action: Action, rules: impl IntoIterator<Item = Rule>) {
        self.rules.extend(rules.into_iter().map(|r| (action, r)));
    }

    /// Adds rules given as text (see [`Rule::parse_list`]).
    pub fn add_text(&mut self, action: Action, text: &str) -> Result<(), String> {
        let rules = Rule::parse_list(text)?;
        self.add(action, rules);
        Ok(())
    }

    /// The rules, in the order they were added.
    pub fn rules(&self) -> &[(Action, Rule)] {
        &self.rules
    }

    /// Whether `addr` may be reached as an origin.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Refused> {
        let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
        // `max_by_key` returns the last of equal maxima: the rule added last.
        let best = self
            .rules
            .iter()
            .filter(|(_, r)| r.matches(addr))
            .max_by_key(|(_, r)| r.specificity());
        match best {
            Some((Action::Deny, rule)) => Err(Refused {
                addr,
                rule: *rule,
                what: NON_PUBLIC
                    .iter()
                    .find(|(c, _)| rule.port.is_none() && c.parse::<Cidr>() == Ok(rule.net))
                    .map(|(_, w)| format!(": {w}"))
                    .unwrap_or_default(),
            }),
            _ => Ok(()),
        }
    }
}

/// The text form, rules in order: `deny non-public, allow 127.0.0.1:9000,
/// deny 127.0.0.1:8070` (also `;` or newlines between rules). This is how
/// the control plane hands a policy to the caches it starts.
impl FromStr for OriginPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<OriginPolicy, String> {
        let mut p = OriginPolicy::default();
        for item in s
            .split([',', ';', '\n'])
            .map(str::trim)
            .filter(|i| !i.is_empty())
        {
            let (action, rule) = match item.split_once(char::is_whitespace) {
                Some(("allow", r)) => (Action::Allow, r),
                Some(("deny", r)) => (Action::Deny, r),
                _ => {
                    return Err(format!(
                    "'{item}' is not an origin policy rule: expected 'allow RULE' or 'deny RULE'"
                ))
                }
            };
            p.add_text(action, rule)?;
        }
        Ok(p)
    }
}

/// Writes the rules back in order (`non-public` as the networks it means).
impl fmt::Display for OriginPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (a, r)) in self.rules.iter().enumerate() {
            let a = match a {
                Action::Allow => "allow",
                Action::Deny => "deny",
            };
            write!(f, "{}{a} {r}", if i == 0 { "" } else { ", " })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: &[(Action, &str)]) -> OriginPolicy {
        let mut p = OriginPolicy::default();
        for (a, t) in rules {
            p.add_text(*a, t).unwrap();
        }
        p
    }

    fn ok(p: &OriginPolicy, a: &str) -> bool {
        p.check(a.parse().unwrap()).is_ok()
    }

    #[test]
    fn empty_policy_allows_everything() {
        let p = OriginPolicy::default();
        assert!(ok(&p, "127.0.0.1:8070"));
        assert!(ok(&p, "[::1]:80"));
    }

    #[test]
    fn non_public_refuses_loopback_metadata_private_and_mapped() {
        let p = policy(&[(Action::Deny, "non-public")]);
        for a in [
            "127.0.0.1:8070",
            "169.254.169.254:80",
            "10.0.0.1:80",
            "192.168.1.1:443",
            "[::1]:80",
            "[::ffff:127.0.0.1]:80",
            "[fe80::1]:80",
            "[fd00::1]:80",
            "0.0.0.0:80",
            "[::]:80",
        ] {
            assert!(!ok(&p, a), "{a} allowed");
        }
        assert!(ok(&p, "93.184.216.34:80"));
        assert!(ok(&p, "[2606:2800:220:1::1]:443"));
        let e = p.check("169.254.169.254:80".parse().unwrap()).unwrap_err();
        assert!(e.to_string().contains("metadata"), "{e}");
    }

    #[test]
    fn most_specific_rule_wins_then_the_last_added() {
        let p = policy(&[
            (Action::Deny, "non-public"),
            (Action::Allow, "127.0.0.1:9000"),
            (Action::Deny, "127.0.0.1:8070"),
        ]);
        assert!(ok(&p, "127.0.0.1:9000"));
        assert!(!ok(&p, "127.0.0.1:8070"));
        assert!(!ok(&p, "127.0.0.1:9001"));
        // A broad exception does not open an exactly denied platform address.
        let p = policy(&[
            (Action::Deny, "non-public"),
            (Action::Allow, "127.0.0.0/8"),
            (Action::Allow, "127.10.0.0/16"),
            (Action::Deny, "127.0.0.1:8070"),
            (Action::Deny, "127.10.0.0/16"),
        ]);
        assert!(ok(&p, "127.0.0.1:9000"));
        assert!(!ok(&p, "127.0.0.1:8070"));
        assert!(!ok(&p, "127.10.0.5:8080"));
        let p = policy(&[(Action::Allow, "10.0.0.0/8"), (Action::Deny, "10.0.0.0/8")]);
        assert!(!ok(&p, "10.1.1.1:80"));
    }

    #[test]
    fn text_form_round_trips_in_order() {
        let p: OriginPolicy = "deny non-public; allow 127.0.0.1:9000, deny 127.0.0.1:8070"
            .parse()
            .unwrap();
        assert_eq!(p.rules().len(), NON_PUBLIC.len() + 2);
        let again: OriginPolicy = p.to_string().parse().unwrap();
        assert_eq!(again, p);
        assert!(ok(&again, "127.0.0.1:9000"));
        assert!(!ok(&again, "127.0.0.1:8070"));
        assert_eq!("".parse::<OriginPolicy>().unwrap(), OriginPolicy::default());
        assert!("permit 10.0.0.0/8".parse::<OriginPolicy>().is_err());
        assert!("deny".parse::<OriginPolicy>().is_err());
    }

    #[test]
    fn rule_forms() {
        for (t, shown) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3", "10.1.2.3"),
            ("127.0.0.1:9000", "127.0.0.1:9000"),
            ("[::1]:9000", "[::1]:9000"),
            ("::1", "::1"),
        ] {
            assert_eq!(t.parse::<Rule>().unwrap().to_string(), shown);
        }
        assert!("localhost".parse::<Rule>().is_err());
        assert!("10.0.0.1/8".parse::<Rule>().is_err());
        assert_eq!(
            Rule::parse_list("non-public").unwrap().len(),
            NON_PUBLIC.len()
        );
    }
}
