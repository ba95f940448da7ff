//! Whether a customer may use an origin (server-side request forgery
//! defence at order time). Each service gets its own
//! [`OriginPolicy`]: the operator's base rules (`deny non-public` by
//! default), then the flavor's and the customer's `origin_allow`
//! exceptions, then the platform's own addresses denied last (the control
//! API, the router's addresses, every region's instance block), so an
//! exception never opens them. The order is refused unless every address
//! the origin's name resolves to passes; the caches get the same policy and
//! apply it again at every connect, since a name may resolve to something
//! else later.

use std::net::SocketAddr;
use std::time::Duration;

use vcdn_policy::net::{canonical, Cidr};
use vcdn_policy::origin::{Action, OriginPolicy, Rule};

use crate::settings::Settings;
use crate::types::Region;
use crate::validate::{OriginHost, OriginUrl};

/// How long an origin's name may take to resolve at order time.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// One of the platform's own addresses and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct PlatformAddress {
    pub rule: Rule,
    pub what: String,
}

/// The platform's addresses: the listeners `vcdn up` knows (an unspecified
/// listen address is denied on loopback) and every region's instance block
/// (instances and their admin APIs).
pub fn platform(listeners: &[(SocketAddr, String)], regions: &[Region]) -> Vec<PlatformAddress> {
    let mut out = Vec::new();
    for (addr, what) in listeners {
        let ip = canonical(addr.ip());
        let ips = if ip.is_unspecified() {
            vec![ip, std::net::IpAddr::from([127, 0, 0, 1])]
        } else {
            vec![ip]
        };
        for ip in ips {
            out.push(PlatformAddress {
                rule: Rule {
                    net: Cidr::host(ip),
                    port: Some(addr.port()),
                },
                what: what.clone(),
            });
        }
    }
    for r in regions {
        if let Ok(net) = r.instance_block.parse::<Cidr>() {
            out.push(PlatformAddress {
                rule: Rule { net, port: None },
                what: format!("region {}'s cache instances", r.name),
            });
        }
    }
    out
}

/// A service's policy, in the order the module doc gives.
pub fn service_policy(
    settings: &Settings,
    flavor_allow: &[String],
    customer_allow: &[String],
    platform: &[PlatformAddress],
) -> Result<OriginPolicy, String> {
    let mut p: OriginPolicy = settings
        .origin_policy
        .parse()
        .map_err(|e| format!("the operator's origin policy is invalid: {e}"))?;
    for r in flavor_allow.iter().chain(customer_allow) {
        p.add_text(Action::Allow, r)?;
    }
    p.add(Action::Deny, platform.iter().map(|a| a.rule));
    Ok(p)
}

/// Resolves the origin (names within [`RESOLVE_TIMEOUT`]) and checks every
/// address; the error says which address, which rule and whom to ask.
pub async fn check(
    url: &OriginUrl,
    policy: &OriginPolicy,
    platform: &[PlatformAddress],
) -> Result<(), String> {
    let (addrs, name) = match &url.host {
        OriginHost::Ip(ip) => (vec![SocketAddr::new(*ip, url.port)], None),
        OriginHost::Name(n) => {
            let found = tokio::time::timeout(
                RESOLVE_TIMEOUT,
                tokio::net::lookup_host((n.as_str(), url.port)),
            )
            .await
            .map_err(|_| {
                format!(
                    "the origin's name {n} did not resolve within {} s; check the name and its DNS",
                    RESOLVE_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| format!("the origin's name {n} does not resolve ({e}); check the name"))?;
            let addrs: Vec<SocketAddr> = found.collect();
            if addrs.is_empty() {
                return Err(format!(
                    "the origin's name {n} has no address; check the name"
                ));
            }
            (addrs, Some(n))
        }
    };
    for a in addrs {
        if let Err(refused) = policy.check(a) {
            let via = name
                .map(|n| format!("{n} resolves to {}: ", refused.addr))
                .unwrap_or_default();
            let mine = platform.iter().rev().find(|p| p.rule == refused.rule);
            return Err(match mine {
                Some(p) => format!(
                    "{via}origin address {} is refused by the operator's origin policy: it is the \
                     platform's own ({}, rule deny {}); use your own origin server",
                    refused.addr, p.what, p.rule
                ),
                None => format!("{via}{refused} (an origin_allow entry for your account)"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::origin_url;

    fn settings() -> Settings {
        crate::defaults::Defaults::embedded().settings
    }

    fn plat() -> Vec<PlatformAddress> {
        platform(
            &[
                ("127.0.0.1:8070".parse().unwrap(), "the control API".into()),
                (
                    "0.0.0.0:8054".parse().unwrap(),
                    "the router's admin API".into(),
                ),
            ],
            &crate::defaults::Defaults::embedded().regions,
        )
    }

    async fn verdict(url: &str, flavor: &[&str], customer: &[&str]) -> Result<(), String> {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = service_policy(&settings(), &own(flavor), &own(customer), &plat())?;
        check(&origin_url(url).unwrap(), &p, &plat()).await
    }

    #[tokio::test]
    async fn non_public_and_platform_addresses_are_refused_saying_why() {
        for (url, says) in [
            ("http://127.0.0.1:8070/", "platform's own (the control API"),
            ("http://169.254.169.254/", "metadata"),
            ("http://10.0.0.1/", "private"),
            ("http://[::1]:80/", "loopback"),
            (
                "http://localhost:9000/",
                "localhost resolves to 127.0.0.1:9000",
            ),
        ] {
            let e = verdict(url, &[], &[]).await.unwrap_err();
            assert!(e.contains(says) && e.contains("operator"), "{url}: {e}");
        }
        assert!(verdict("http://93.184.215.14/", &[], &[]).await.is_ok());
    }

    #[tokio::test]
    async fn exceptions_open_what_they_name_but_never_the_platform() {
        assert!(verdict("http://127.0.0.1:9000/", &[], &["127.0.0.1:9000"])
            .await
            .is_ok());
        assert!(verdict("http://127.0.0.1:9000/", &["127.0.0.0/8"], &[])
            .await
            .is_ok());
        assert!(verdict("http://127.0.0.1:9001/", &[], &["127.0.0.1:9000"])
            .await
            .is_err());
        for url in [
            "http://127.0.0.1:8070/",
            "http://127.10.0.3:8080/",
            "http://127.0.0.1:8054/",
        ] {
            let e = verdict(url, &["127.0.0.0/8"], &["127.0.0.0/8"])
                .await
                .unwrap_err();
            assert!(e.contains("platform's own"), "{url}: {e}");
        }
        assert!(service_policy(&settings(), &["nonsense".into()], &[], &[]).is_err());
    }
}
