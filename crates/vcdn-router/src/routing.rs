//! Where a request goes: the shared decision behind DNS answers and HTTP
//! redirects.
//!
//! 1. Locate the client: coverage zone (longest prefix), else the
//!    configured default region, else "anywhere".
//! 2. Take the service's healthy caches in that region; if none, those of
//!    the nearest region (great-circle distance between region coordinates,
//!    then configuration order) that has some; if none anywhere, the origin.
//! 3. For HTTP, rank that region's caches by rendezvous hashing of the
//!    content id (the same chunk goes to the same cache) and ask the chosen
//!    cache's admission filter: `Edge` → redirect to the cache, `Origin` →
//!    redirect straight to the origin, bypassing the edge.

use std::net::IpAddr;
use std::sync::Arc;

use vcdn_policy::admission::{Admission, AdmissionFilter};
use vcdn_policy::hashing;

use crate::state::{EdgeCache, Service, Snapshot};

/// An origin URL split into what redirects and DNS need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginUrl {
    /// `http://host[:port]` or `https://...`, no trailing slash.
    pub base: String,
    pub host: String,
    pub port: u16,
    /// When the host is an IP literal: what DNS answers when no cache is
    /// healthy.
    pub ip: Option<IpAddr>,
}

impl OriginUrl {
    pub fn parse(url: &str) -> Result<OriginUrl, String> {
        let (scheme, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => ("http", r),
            (_, Some(r)) => ("https", r),
            _ => return Err(format!("'{url}' must start with http:// or https://")),
        };
        let authority = rest.split('/').next().unwrap_or("");
        if rest.len() > authority.len() && rest[authority.len()..] != *"/" {
            return Err(format!(
                "'{url}' must have no path (requests keep their own path)"
            ));
        }
        if authority.is_empty() {
            return Err(format!("'{url}' has no host"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, p) = v6
                .split_once(']')
                .ok_or_else(|| format!("'{url}': unclosed '['"))?;
            (h.to_string(), p.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            None if scheme == "https" => 443,
            None => 80,
            Some(p) => p.parse().map_err(|_| format!("'{url}': bad port '{p}'"))?,
        };
        let ip = host.parse::<IpAddr>().ok();
        if ip.is_none() && crate::dns::wire::Name::parse(&host).is_err() {
            return Err(format!(
                "'{url}': '{host}' is neither an IP address nor a host name"
            ));
        }
        Ok(OriginUrl {
            base: format!("{scheme}://{authority}"),
            host,
            port,
            ip,
        })
    }
}

/// Where the client is, as far as routing is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// Region index in the snapshot, if known.
    pub region: Option<usize>,
    /// Prefix length the decision depended on (ECS scope).
    pub scope: u8,
}

/// The caches (or the origin) that serve a client.
pub enum Choice<'a> {
    /// Healthy caches of `region` (`None` = of every region).
    Caches {
        region: Option<usize>,
        caches: Vec<&'a Arc<EdgeCache>>,
    },
    /// No healthy cache anywhere.
    Origin,
}

impl Snapshot {
    /// Locates a client address: its coverage zone, else the region
    /// nearest to where the GeoIP database puts it, else the default region.
    pub fn locate(&self, ip: IpAddr) -> Located {
        if let Some((&r, len)) = self.coverage.lookup(ip) {
            return Located {
                region: Some(r),
                scope: len,
            };
        }
        if let Some((at, prefix)) = self.geoip.as_ref().and_then(|g| g.locate(ip)) {
            let nearest = self
                .regions
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.coords.map(|c| (crate::coverage::distance_km(at, c), i)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, i)) = nearest {
                return Located {
                    region: Some(i),
                    scope: prefix,
                };
            }
        }
        Located {
            region: self.default_region,
            scope: 0,
        }
    }

    /// The healthy caches that serve a client of `region` for `svc`, else
    /// the nearest region's; else caches that are only late (busy, not
    /// dead), nearest first; else the origin.
    pub fn choose<'a>(&self, svc: &'a Service, region: Option<usize>) -> Choice<'a> {
        let healthy = |r: usize| -> Vec<&'a Arc<EdgeCache>> {
            svc.regions
                .iter()
                .filter(|(ri, _)| *ri == r)
                .flat_map(|(_, cs)| cs.iter())
                .filter(|c| c.state.is_available())
                .collect()
        };
        // Busy but answering: when no region has a healthy cache, better
        // than the origin, which would take every user at once (a panic
        // mode, as load balancers ignore health when too few hosts pass).
        let late = |r: usize| -> Vec<&'a Arc<EdgeCache>> {
            svc.regions
                .iter()
                .filter(|(ri, _)| *ri == r)
                .flat_map(|(_, cs)| cs.iter())
                .filter(|c| c.state.is_late())
                .collect()
        };
        if let Some(r) = region {
            let here = healthy(r);
            if !here.is_empty() {
                return Choice::Caches {
                    region: Some(r),
                    caches: here,
                };
            }
            // Nearest other region with healthy caches.
            let mut others: Vec<(f64, usize, usize)> = svc
                .regions
                .iter()
                .enumerate()
                .filter(|(_, (ri, _))| *ri != r)
                .map(|(order, (ri, _))| {
                    let d = match (self.regions[r].coords, self.regions[*ri].coords) {
                        (Some(a), Some(b)) => crate::coverage::distance_km(a, b),
                        _ => f64::INFINITY,
                    };
                    (d, order, *ri)
                })
                .collect();
            others.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for (_, _, ri) in others.iter().copied() {
                let there = healthy(ri);
                if !there.is_empty() {
                    return Choice::Caches {
                        region: Some(ri),
                        caches: there,
                    };
                }
            }
            for ri in std::iter::once(r).chain(others.iter().map(|o| o.2)) {
                let busy = late(ri);
                if !busy.is_empty() {
                    return Choice::Caches {
                        region: Some(ri),
                        caches: busy,
                    };
                }
            }
            return Choice::Origin;
        }
        let all: Vec<&'a Arc<EdgeCache>> = svc
            .regions
            .iter()
            .flat_map(|(_, cs)| cs.iter())
            .filter(|c| c.state.is_available())
            .collect();
        let all = if all.is_empty() {
            svc.regions
                .iter()
                .flat_map(|(_, cs)| cs.iter())
                .filter(|c| c.state.is_late())
                .collect()
        } else {
            all
        };
        if all.is_empty() {
            Choice::Origin
        } else {
            Choice::Caches {
                region: None,
                caches: all,
            }
        }
    }
}

/// Why a request was sent to the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginReason {
    /// The admission filter has not seen this content recently.
    Filter,
    /// No healthy cache in any region.
    NoCache,
}

/// The outcome of HTTP routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Redirect to this cache (its index in the service's region list and
    /// the cache itself).
    Edge {
        cache: std::net::SocketAddr,
        region: Option<usize>,
        fallback: bool,
    },
    Origin(OriginReason),
}

/// Decides for one HTTP request of `svc` with content id `id` from a
/// client located at `loc`.
pub fn route(snap: &Snapshot, svc: &Service, loc: Located, id: u64) -> Route {
    match snap.choose(svc, loc.region) {
        Choice::Origin => Route::Origin(OriginReason::NoCache),
        Choice::Caches { region, caches } => {
            let keys: Vec<&str> = caches.iter().map(|c| c.key.as_str()).collect();
            let Some(i) = hashing::pick(&keys, id) else {
                return Route::Origin(OriginReason::NoCache);
            };
            let cache = caches[i];
            let admitted = match &cache.filter {
                None => Admission::Edge,
                Some(f) => f.lock().admit(id),
            };
            cache.state.count_admission(admitted);
            match admitted {
                Admission::Edge => Route::Edge {
                    cache: cache.state.endpoint.address,
                    region,
                    fallback: loc.region.is_some() && region != loc.region,
                },
                Admission::Origin => Route::Origin(OriginReason::Filter),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_urls() {
        let o = OriginUrl::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!(o.base, "http://127.0.0.1:9000");
        assert_eq!(o.ip, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(o.port, 9000);
        let o = OriginUrl::parse("http://origin.example/").unwrap();
        assert_eq!(
            (o.host.as_str(), o.port, o.ip),
            ("origin.example", 80, None)
        );
        let o = OriginUrl::parse("http://[::1]:81").unwrap();
        assert_eq!(o.ip, Some("::1".parse().unwrap()));
        let o = OriginUrl::parse("https://x.example").unwrap();
        assert_eq!((o.base.as_str(), o.port), ("https://x.example", 443));
        assert!(OriginUrl::parse("ftp://x.example").is_err());
        assert!(OriginUrl::parse("http://x.example/path").is_err());
        assert!(OriginUrl::parse("http://bad host").is_err());
        assert!(OriginUrl::parse("http://x:port").is_err());
    }
}
