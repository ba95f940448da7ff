//! Strict checks of an order, field by field, before anything is planned:
//! every number within a range that makes sense, names that are DNS names,
//! an origin URL the cache can use, a lease within the operator's limits.
//! Every problem is reported with its field and what to fix, all at once.
//! Pure code (no I/O): the origin's addresses are checked in
//! [`crate::origin`].

use std::net::{IpAddr, Ipv4Addr};

use crate::settings::{human_s, LeaseLimits};
use crate::types::{FieldError, ServiceSpec};

/// The lease when none is given.
pub const DEFAULT_LEASE_S: u64 = 24 * 3600;

/// A checked order: the spec with names normalised, and its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub spec: ServiceSpec,
    pub start: u64,
    pub end: u64,
    pub origin: OriginUrl,
}

/// A DNS label per RFC 1123: 1–63 letters, digits and hyphens, not
/// starting or ending with a hyphen. Case is the caller's business.
pub fn label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A service's hostname, lower-cased: a DNS name of at least two labels
/// (RFC 1123), at most 253 characters, not an IP address, no trailing dot
/// (one spelling per name, so uniqueness is a plain comparison).
pub fn hostname(s: &str) -> Result<String, String> {
    if s.ends_with('.') && s.len() > 1 {
        return Err(format!(
            "write it without the trailing dot: {}",
            s.trim_end_matches('.')
        ));
    }
    if s.parse::<IpAddr>().is_ok() {
        return Err("give a DNS name like video.example.com, not an IP address".into());
    }
    let lower = s.to_ascii_lowercase();
    let labels: Vec<&str> = lower.split('.').collect();
    if lower.len() > 253 || labels.len() < 2 || !labels.iter().all(|l| label(l)) {
        return Err(
            "give a DNS name like video.example.com: at least two labels of 1-63 letters, \
             digits and inner hyphens, 253 characters at most"
                .into(),
        );
    }
    // No top-level domain is all digits (that would read as an address).
    if labels
        .last()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(
            "the last label must not be all digits; give a DNS name like video.example.com".into(),
        );
    }
    Ok(lower)
}

/// Where an origin is: a name to resolve, or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginHost {
    Name(String),
    Ip(IpAddr),
}

/// An origin URL as the cache will use it: `http://host[:port][/base]`
/// or `https://...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginUrl {
    pub host: OriginHost,
    pub port: u16,
    /// The caches fetch over TLS (verified against the system roots, or
    /// the service's `origin_ca_pem`).
    pub https: bool,
}

/// Largest `origin_ca_pem`: a bundle of a few CA certificates.
pub const MAX_ORIGIN_CA_PEM: usize = 64 * 1024;

/// Parses an origin URL strictly: `http://` or `https://`, a host (a DNS
/// name, an IPv4 address or a bracketed IPv6 one), an optional port
/// 1–65535 (default 80 or 443), an optional base path; no user info,
/// query, fragment, spaces or control characters.
pub fn origin_url(s: &str) -> Result<OriginUrl, String> {
    const HOW: &str =
        "give an http:// or https:// URL with a host, an optional port and path, e.g. https://origin.example.com:8443";
    if s.len() > 2048 {
        return Err("the URL is longer than 2048 characters".into());
    }
    if let Some(c) = s.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "the URL contains {c:?}: no spaces or control characters (percent-encode them); {HOW}"
        ));
    }
    let (rest, https) = match (s.strip_prefix("http://"), s.strip_prefix("https://")) {
        (Some(r), _) => (r, false),
        (_, Some(r)) => (r, true),
        _ => {
            return Err(format!(
                "only http:// and https:// origins are supported; {HOW}"
            ))
        }
    };
    if s.contains('#') {
        return Err(format!("remove the #fragment; {HOW}"));
    }
    if s.contains('?') {
        return Err(format!(
            "remove the ?query: the base of an origin is a path; {HOW}"
        ));
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err(format!(
            "remove the user@ part: origins take no credentials; {HOW}"
        ));
    }
    if path.contains("//") || path.split('/').any(|seg| seg == ".." || seg == ".") {
        return Err(format!(
            "the path must not contain //, . or .. segments; {HOW}"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or(format!("unclosed [ in the host; {HOW}"))?;
        let ip: std::net::Ipv6Addr = ip
            .parse()
            .map_err(|_| format!("[{ip}] is not an IPv6 address; {HOW}"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(format!("junk after ]; {HOW}"))?),
        };
        (OriginHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let host = if let Ok(ip) = h.parse::<Ipv4Addr>() {
            OriginHost::Ip(IpAddr::V4(ip))
        } else {
            let lower = h.to_ascii_lowercase();
            if lower.is_empty()
                || lower.len() > 253
                || !lower.split('.').all(label)
                || lower
                    .split('.')
                    .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
            {
                return Err(format!("'{h}' is not a host name or address; {HOW}"));
            }
            OriginHost::Name(lower)
        };
        (host, port)
    };
    let port = match port {
        None if https => 443,
        None => 80,
        // Digits only: `+80` would parse as a number.
        Some(p) => Some(p)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p != 0)
            .ok_or(format!("port '{p}' must be 1-65535; {HOW}"))?,
    };
    Ok(OriginUrl { host, port, https })
}

/// Checks a service's `origin_ca_pem`: PEM certificates (the CAs its
/// `https://` origin's certificate is verified against), of bounded size.
pub fn origin_ca_pem(pem: &str, origin: Option<&OriginUrl>) -> Result<(), String> {
    if origin.is_some_and(|o| !o.https) {
        return Err(
            "an origin CA applies to an https:// origin only; remove it or use https://".into(),
        );
    }
    if pem.len() > MAX_ORIGIN_CA_PEM {
        return Err(format!(
            "give at most {MAX_ORIGIN_CA_PEM} bytes of PEM (the CA certificates only, not {} bytes)",
            pem.len()
        ));
    }
    vcdn_http::tls::parse_chain(pem.as_bytes())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Checks a finite number in `(0, max]`.
fn positive(errors: &mut Vec<FieldError>, field: String, v: Option<f64>, max: f64, unit: &str) {
    if let Some(x) = v {
        if !(x.is_finite() && x > 0.0 && x <= max) {
            errors.push(FieldError::new(
                field,
                format!("must be more than 0 and at most {max} {unit}, not {x}"),
            ));
        }
    }
}

fn count(errors: &mut Vec<FieldError>, field: String, v: Option<u64>, max: u64, unit: &str) {
    if let Some(x) = v {
        if !(1..=max).contains(&x) {
            errors.push(FieldError::new(
                field,
                format!("must be 1 to {max} {unit}, not {x}"),
            ));
        }
    }
}

/// Checks every field of an order at `now` against the lease limits;
/// returns it normalised (hostname in lower case) with its lease, or every
/// problem found.
pub fn order(
    mut spec: ServiceSpec,
    limits: &LeaseLimits,
    now: u64,
) -> Result<Checked, Vec<FieldError>> {
    let mut e = Vec::new();
    if !(label(&spec.name) && spec.name.bytes().all(|b| !b.is_ascii_uppercase())) {
        e.push(FieldError::new(
            "name",
            "use 1-63 lowercase letters, digits and inner hyphens, like my-video",
        ));
    }
    match hostname(&spec.hostname) {
        Ok(h) => spec.hostname = h,
        Err(d) => e.push(FieldError::new("hostname", d)),
    }
    let origin = match origin_url(&spec.origin) {
        Ok(o) => Some(o),
        Err(d) => {
            e.push(FieldError::new("origin", d));
            None
        }
    };
    if let Some(pem) = &spec.origin_ca_pem {
        if let Err(d) = origin_ca_pem(pem, origin.as_ref()) {
            e.push(FieldError::new("origin_ca_pem", d));
        }
    }
    // The proxy chains relay to the origin in plain HTTP.
    if spec.acceleration.is_some() && origin.as_ref().is_some_and(|o| o.https) {
        e.push(FieldError::new(
            "acceleration",
            "acceleration is not available for an https:// origin yet; remove it or use http://",
        ));
    }
    if spec.flavor.is_empty() || spec.flavor.len() > 63 {
        e.push(FieldError::new(
            "flavor",
            "name a flavor of the catalog (GET /v1/catalog)",
        ));
    }
    if spec.regions.is_empty() || spec.regions.len() > 64 {
        e.push(FieldError::new(
            "regions",
            "name 1 to 64 regions, e.g. [{\"region\": \"paris\", \"peak_users\": 500}]",
        ));
    }
    for (i, d) in spec.regions.iter().enumerate() {
        let f = |name: &str| format!("regions[{i}].{name}");
        if d.region.is_empty() || d.region.len() > 63 {
            e.push(FieldError::new(f("region"), "name a region of the catalog"));
        }
        count(&mut e, f("peak_users"), d.peak_users, 100_000_000, "users");
        count(&mut e, f("object_bytes"), d.object_bytes, 1 << 40, "bytes");
        positive(
            &mut e,
            f("requests_per_s"),
            d.requests_per_s,
            1e8,
            "requests/s",
        );
        positive(&mut e, f("bitrate_kbps"), d.bitrate_kbps, 1e6, "kbit/s");
        positive(&mut e, f("chunk_s"), d.chunk_s, 600.0, "s");
    }
    let q = &spec.quality;
    if let Some(m) = q.min_mos {
        if !(1.0..=5.0).contains(&m) {
            e.push(FieldError::new(
                "quality.min_mos",
                format!("must be 1 to 5, not {m}"),
            ));
        }
    }
    positive(
        &mut e,
        "quality.response_ms".into(),
        q.response_ms,
        600_000.0,
        "ms",
    );
    if let Some(p) = q.percentile {
        if !(1..=99).contains(&p) {
            e.push(FieldError::new(
                "quality.percentile",
                format!("must be 1 to 99, not {p}"),
            ));
        }
    }
    acceleration(&mut spec, &mut e);
    let (start, end) = lease(&spec, limits, now, &mut e);
    match (e.is_empty(), origin) {
        (true, Some(origin)) => Ok(Checked {
            spec,
            start,
            end,
            origin,
        }),
        _ => Err(e),
    }
}

/// At most this many accelerated path prefixes per service.
pub const MAX_ACCEL_PATHS: usize = 32;
/// Longest accelerated path prefix.
pub const MAX_ACCEL_PATH_LEN: usize = 256;
/// Most warm connections a proxy keeps per next hop.
pub const MAX_WARM: u32 = 64;

/// Checks the acceleration part of an order and fills in its default
/// hostname (`dyn.` + the service's hostname).
fn acceleration(spec: &mut ServiceSpec, e: &mut Vec<FieldError>) {
    let service_host = spec.hostname.clone();
    let Some(a) = spec.acceleration.as_mut() else {
        return;
    };
    if a.paths.is_empty() && !a.uncacheable {
        e.push(FieldError::new(
            "acceleration",
            "give path prefixes to accelerate (paths: [\"/api/\"]), uncacheable: true, or both",
        ));
    }
    if a.paths.len() > MAX_ACCEL_PATHS {
        e.push(FieldError::new(
            "acceleration.paths",
            format!(
                "give at most {MAX_ACCEL_PATHS} prefixes, not {}",
                a.paths.len()
            ),
        ));
    }
    for (i, p) in a.paths.iter().enumerate().take(MAX_ACCEL_PATHS) {
        let bad = if !p.starts_with('/') {
            Some("must start with /, like /api/".to_string())
        } else if p.len() > MAX_ACCEL_PATH_LEN {
            Some(format!("must be at most {MAX_ACCEL_PATH_LEN} characters"))
        } else if let Some(c) = p
            .chars()
            .find(|c| !c.is_ascii_graphic() || *c == '?' || *c == '#')
        {
            Some(format!(
                "contains {c:?}: a prefix is a path without spaces, control characters, ? or # (percent-encode them)"
            ))
        } else if a.paths[..i].contains(p) {
            Some("is listed twice".into())
        } else {
            None
        };
        if let Some(d) = bad {
            e.push(FieldError::new(format!("acceleration.paths[{i}]"), d));
        }
    }
    if let Some(w) = a.warm {
        if w > MAX_WARM {
            e.push(FieldError::new(
                "acceleration.warm",
                format!("must be 0 to {MAX_WARM} connections, not {w}"),
            ));
        }
    }
    let name = a
        .hostname
        .clone()
        .unwrap_or_else(|| format!("dyn.{service_host}"));
    match hostname(&name) {
        Ok(h) if h == service_host => e.push(FieldError::new(
            "acceleration.hostname",
            "must differ from the service's hostname (clients of accelerated paths resolve it to proxies, not caches)",
        )),
        Ok(h) => a.hostname = Some(h),
        // A default made from a valid but long hostname may be too long.
        Err(d) if a.hostname.is_none() => e.push(FieldError::new(
            "acceleration.hostname",
            format!("the default dyn.{service_host} is not usable ({d}); give one"),
        )),
        Err(d) => e.push(FieldError::new("acceleration.hostname", d)),
    }
}

/// The lease's start and end within the operator's limits.
fn lease(
    spec: &ServiceSpec,
    limits: &LeaseLimits,
    now: u64,
    e: &mut Vec<FieldError>,
) -> (u64, u64) {
    let l = &spec.lease;
    let latest = now.saturating_add(limits.max_start_ahead_s);
    // A start in the past means now.
    let start = l.start.unwrap_or(now).max(now);
    if start > latest {
        e.push(FieldError::new(
            "lease.start",
            format!(
                "a lease may start at most {} ahead (by {latest}); order closer to the date",
                human_s(limits.max_start_ahead_s)
            ),
        ));
    }
    let longest = format!(
        "a lease may last at most {}",
        human_s(limits.max_duration_s)
    );
    let end = match (l.end, l.duration_s) {
        (Some(_), Some(_)) => {
            e.push(FieldError::new("lease", "give end or duration_s, not both"));
            start
        }
        (Some(end), None) => {
            if end <= start {
                e.push(FieldError::new(
                    "lease.end",
                    format!("the lease ends ({end}) before it starts ({start})"),
                ));
            } else if end - start > limits.max_duration_s {
                e.push(FieldError::new(
                    "lease.end",
                    format!("{longest}; end it sooner"),
                ));
            }
            end
        }
        (None, Some(d)) => {
            if d == 0 || d > limits.max_duration_s {
                e.push(FieldError::new(
                    "lease.duration_s",
                    format!("{longest} ({} s), and at least 1 s", limits.max_duration_s),
                ));
            }
            start.saturating_add(d)
        }
        (None, None) => start.saturating_add(DEFAULT_LEASE_S.min(limits.max_duration_s)),
    };
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::*;

    const LIMITS: LeaseLimits = LeaseLimits {
        max_start_ahead_s: 90 * 86400,
        max_duration_s: 365 * 86400,
    };

    fn spec() -> ServiceSpec {
        ServiceSpec {
            name: "demo".into(),
            origin: "http://origin.example.com:8080/base".into(),
            hostname: "Video.Example.COM".into(),
            flavor: "elastic".into(),
            regions: vec![RegionDemand {
                region: "paris".into(),
                peak_users: Some(500),
                ..Default::default()
            }],
            quality: QualitySpec::default(),
            lease: LeaseSpec::default(),
            acceleration: None,
            origin_ca_pem: None,
            routing: Routing::Dns,
        }
    }

    fn fields(s: ServiceSpec) -> Vec<String> {
        order(s, &LIMITS, 1_000_000)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn acceleration_is_checked_field_by_field_and_gets_a_default_hostname() {
        let mut s = spec();
        s.acceleration = Some(AccelerationSpec {
            paths: vec!["/api/".into()],
            ..Default::default()
        });
        let c = order(s.clone(), &LIMITS, 1_000_000).unwrap();
        let a = c.spec.acceleration.unwrap();
        assert_eq!(a.hostname.as_deref(), Some("dyn.video.example.com"));
        s.acceleration = Some(AccelerationSpec::default());
        assert_eq!(fields(s.clone()), ["acceleration"]);
        s.acceleration = Some(AccelerationSpec {
            paths: vec!["api/".into(), "/a b".into(), "/ok".into(), "/ok".into()],
            uncacheable: true,
            hostname: Some("VIDEO.example.com".into()),
            warm: Some(1000),
        });
        assert_eq!(
            fields(s.clone()),
            [
                "acceleration.paths[0]",
                "acceleration.paths[1]",
                "acceleration.paths[3]",
                "acceleration.warm",
                "acceleration.hostname"
            ]
        );
        s.acceleration = Some(AccelerationSpec {
            paths: (0..40).map(|i| format!("/p{i}")).collect(),
            hostname: Some("127.0.0.1".into()),
            ..Default::default()
        });
        assert_eq!(fields(s), ["acceleration.paths", "acceleration.hostname"]);
        // An order without it (or stored before it) reads as none.
        let old: ServiceSpec = serde_json::from_str(
            r#"{"name":"a","origin":"http://o.example","hostname":"a.example","flavor":"f","regions":[]}"#,
        )
        .unwrap();
        assert_eq!(old.acceleration, None);
    }

    #[test]
    fn a_good_order_is_normalised_with_its_lease() {
        let c = order(spec(), &LIMITS, 1_000_000).unwrap();
        assert_eq!(c.spec.hostname, "video.example.com");
        assert_eq!((c.start, c.end), (1_000_000, 1_000_000 + DEFAULT_LEASE_S));
        assert_eq!(
            c.origin,
            OriginUrl {
                host: OriginHost::Name("origin.example.com".into()),
                port: 8080,
                https: false,
            }
        );
    }

    #[test]
    fn hostnames_are_dns_names_of_two_labels_or_more() {
        for good in ["a.b", "video.example.com", "x-1.example", "1x.example.org"] {
            assert!(hostname(good).is_ok(), "{good}");
        }
        assert_eq!(hostname("A.Example").unwrap(), "a.example");
        for bad in [
            "127.0.0.1",
            "::1",
            "localhost",
            "video.example.com.",
            "-a.example",
            "a-.example",
            "a..example",
            "a b.example",
            "a_b.example",
            "a.123",
            "",
            ".",
            &format!("{}.example", "a".repeat(64)),
            &format!("{}example", "a.".repeat(127)),
        ] {
            assert!(hostname(bad).is_err(), "{bad}");
        }
        assert!(hostname("video.example.com.")
            .unwrap_err()
            .contains("trailing dot"));
    }

    #[test]
    fn origin_urls_are_strict() {
        let ok = |s: &str| origin_url(s).unwrap();
        assert_eq!(ok("http://10.0.0.1").port, 80);
        assert_eq!(
            ok("http://10.0.0.1").host,
            OriginHost::Ip("10.0.0.1".parse().unwrap())
        );
        assert_eq!(ok("http://[::1]:9000/x").port, 9000);
        assert_eq!(
            ok("http://Origin.Example/a/b").host,
            OriginHost::Name("origin.example".into())
        );
        assert_eq!(
            ok("http://localhost:9000").host,
            OriginHost::Name("localhost".into())
        );
        assert_eq!(ok("https://10.0.0.1").port, 443);
        assert!(ok("https://origin.example:8443/b").https);
        assert!(!ok("http://origin.example").https);
        for bad in [
            "https://",
            "https://user@example.com",
            "ftp://example.com",
            "example.com",
            "http://",
            "http:///x",
            "http://exa mple.com",
            "http://example.com/a b",
            "http://example.com/\t",
            "http://example.com/#frag",
            "http://example.com/?q=1",
            "http://user:pw@example.com/",
            "http://example.com:0",
            "http://example.com:65536",
            "http://example.com:+80",
            "http://example.com:",
            "http://[::1",
            "http://[zz]:80",
            "http://1.2.3",
            "http://ex_ample.com",
            "http://example.com/../admin",
            "http://example.com//x",
            "http://example.com/é",
        ] {
            assert!(origin_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_origin_ca_is_pem_certificates_for_an_https_origin() {
        let ca = vcdn_http::tls::Ca::create("origin CA", 30).unwrap();
        let mut s = spec();
        s.origin = "https://origin.example.com".into();
        s.origin_ca_pem = Some(ca.cert_pem.clone());
        let c = order(s.clone(), &LIMITS, 1_000_000).unwrap();
        assert!(c.origin.https);
        assert_eq!(c.origin.port, 443);
        s.origin_ca_pem = Some("-----BEGIN CERTIFICATE-----\nnot base64\n".into());
        assert_eq!(fields(s.clone()), ["origin_ca_pem"]);
        s.origin_ca_pem = Some("hello".into());
        let e = order(s.clone(), &LIMITS, 1_000_000).unwrap_err();
        assert!(e[0].detail.contains("no certificate found"), "{e:?}");
        s.origin_ca_pem = Some(
            ca.cert_pem
                .repeat(MAX_ORIGIN_CA_PEM / ca.cert_pem.len() + 1),
        );
        assert_eq!(fields(s.clone()), ["origin_ca_pem"]);
        // For a plain origin it would do nothing: refused.
        s.origin = "http://origin.example.com".into();
        s.origin_ca_pem = Some(ca.cert_pem.clone());
        assert_eq!(fields(s.clone()), ["origin_ca_pem"]);
        // Proxy chains speak plain HTTP to the origin.
        s.origin = "https://origin.example.com".into();
        s.acceleration = Some(AccelerationSpec {
            uncacheable: true,
            ..Default::default()
        });
        assert_eq!(fields(s), ["acceleration"]);
    }

    #[test]
    fn bad_numbers_are_refused_with_their_field() {
        let mut s = spec();
        s.regions[0].bitrate_kbps = Some(-2000.0);
        s.regions[0].requests_per_s = Some(f64::NAN);
        s.regions[0].chunk_s = Some(f64::INFINITY);
        s.regions[0].peak_users = Some(0);
        s.quality.percentile = Some(100);
        s.quality.min_mos = Some(0.5);
        s.quality.response_ms = Some(-1.0);
        assert_eq!(
            fields(s),
            [
                "regions[0].peak_users",
                "regions[0].requests_per_s",
                "regions[0].bitrate_kbps",
                "regions[0].chunk_s",
                "quality.min_mos",
                "quality.response_ms",
                "quality.percentile"
            ]
        );
        let mut s = spec();
        s.regions.clear();
        s.name = "Demo".into();
        s.hostname = "10.0.0.1".into();
        s.origin = "http://x y".into();
        assert_eq!(fields(s), ["name", "hostname", "origin", "regions"]);
    }

    #[test]
    fn leases_stay_within_the_operator_limits() {
        let now = 1_000_000;
        let lease = |start, end, duration_s| {
            let mut s = spec();
            s.lease = LeaseSpec {
                start,
                end,
                duration_s,
            };
            order(s, &LIMITS, now)
                .map(|c| (c.start, c.end))
                .map_err(|e| e.into_iter().map(|e| e.field).collect::<Vec<_>>())
        };
        assert_eq!(
            lease(Some(1 << 62), None, Some(60)),
            Err(vec!["lease.start".into()])
        );
        assert_eq!(
            lease(None, None, Some(u64::MAX)),
            Err(vec!["lease.duration_s".into()])
        );
        assert_eq!(
            lease(None, Some(u64::MAX), None),
            Err(vec!["lease.end".into()])
        );
        assert_eq!(lease(None, Some(now), None), Err(vec!["lease.end".into()]));
        assert_eq!(
            lease(None, None, Some(0)),
            Err(vec!["lease.duration_s".into()])
        );
        assert_eq!(
            lease(None, Some(now + 10), Some(10)),
            Err(vec!["lease".into()])
        );
        assert_eq!(lease(Some(0), None, Some(60)), Ok((now, now + 60)));
        let ahead = now + 90 * 86400;
        assert_eq!(
            lease(Some(ahead), None, Some(365 * 86400)),
            Ok((ahead, ahead + 365 * 86400))
        );
        assert_eq!(
            lease(Some(ahead + 1), None, Some(60)),
            Err(vec!["lease.start".into()])
        );
    }
}
