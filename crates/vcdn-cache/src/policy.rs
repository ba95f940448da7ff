//! HTTP caching rules for a shared cache: what may be stored, for how long
//! it is fresh, when it may be served stale, and how old it is (RFC 9111,
//! stale-while-revalidate and stale-if-error of RFC 5861, and the targeted
//! `CDN-Cache-Control` field of RFC 9213). Pure functions of header fields
//! and times, so every rule is unit-tested without a network.

use bytes::Bytes;
use vcdn_http::{date, Headers};

/// Cache-Control directives a shared cache acts on. Unknown ones are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
    /// Request only: answer from the cache or 504.
    pub only_if_cached: bool,
    /// Request only: accepts a response stale by up to this much.
    pub max_stale: Option<u64>,
    /// Request only: wants a response fresh for at least this much longer.
    pub min_fresh: Option<u64>,
}

/// Parse every value of a Cache-Control-like field. Directive names are
/// case-insensitive; quoted arguments may contain commas.
pub fn parse_directives<'a>(values: impl Iterator<Item = &'a Bytes>) -> Directives {
    let mut d = Directives::default();
    for v in values {
        for item in split_quoted(v) {
            let (name, arg) = match item.iter().position(|&c| c == b'=') {
                Some(i) => (&item[..i], Some(unquote(&item[i + 1..]))),
                None => (item, None),
            };
            let name = trim(name);
            let secs = || arg.and_then(parse_delta);
            let lower = name.to_ascii_lowercase();
            match &lower[..] {
                b"max-age" => d.max_age = d.max_age.or(Some(secs().unwrap_or(0))),
                b"s-maxage" => d.s_maxage = d.s_maxage.or(Some(secs().unwrap_or(0))),
                b"no-store" => d.no_store = true,
                // A qualified no-cache="field" is treated as unqualified:
                // stricter, and always correct.
                b"no-cache" => d.no_cache = true,
                b"private" => d.private = true,
                b"public" => d.public = true,
                b"must-revalidate" => d.must_revalidate = true,
                b"proxy-revalidate" => d.proxy_revalidate = true,
                b"stale-while-revalidate" => d.stale_while_revalidate = secs(),
                b"stale-if-error" => d.stale_if_error = secs(),
                b"only-if-cached" => d.only_if_cached = true,
                b"max-stale" => d.max_stale = Some(secs().unwrap_or(u64::MAX)),
                b"min-fresh" => d.min_fresh = secs(),
                _ => {}
            }
        }
    }
    d
}

fn split_quoted(v: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &c) in v.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && c == b'\\' {
            escaped = true;
        } else if c == b'"' {
            quoted = !quoted;
        } else if c == b',' && !quoted {
            out.push(trim(&v[start..i]));
            start = i + 1;
        }
    }
    out.push(trim(&v[start..]));
    out.retain(|s| !s.is_empty());
    out
}

fn trim(v: &[u8]) -> &[u8] {
    let (s, e) = vcdn_http::header::trim_ows(v);
    &v[s..e]
}

fn unquote(v: &[u8]) -> &[u8] {
    let v = trim(v);
    if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// delta-seconds; values beyond 2^31 are capped there (RFC 9111 §1.2.2).
fn parse_delta(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .try_fold(0u64, |n, &d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
            .unwrap_or(u64::MAX)
            .min(1 << 31),
    )
}

/// Operator settings that the RFC leaves to the cache.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// Targeted fields obeyed ahead of Cache-Control, in order (RFC 9213).
    pub targeted_fields: Vec<Bytes>,
    /// Heuristic freshness: this fraction of the time since Last-Modified.
    pub heuristic_fraction: f64,
    /// Upper bound of a heuristic freshness lifetime, seconds.
    pub heuristic_max: u64,
    /// Obey a client's `no-cache`/`max-age` by revalidating (RFC
    /// behaviour); a CDN may turn this off to shield the origin from reloads.
    pub honor_client_no_cache: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            targeted_fields: vec![Bytes::from_static(b"cdn-cache-control")],
            heuristic_fraction: 0.1,
            heuristic_max: 86_400,
            honor_client_no_cache: true,
        }
    }
}

/// What a shared cache may do with one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Freshness {
    /// Whether it may be stored at all.
    pub storable: bool,
    /// Freshness lifetime in seconds.
    pub lifetime: u64,
    /// Seconds past expiry during which it may be served while a background
    /// revalidation runs.
    pub stale_while_revalidate: u64,
    /// Seconds past expiry during which it may be served when the upstream
    /// fails.
    pub stale_if_error: u64,
    /// Never serve it stale without successful validation.
    pub must_revalidate: bool,
    /// Validate on every use (response `no-cache`).
    pub no_cache: bool,
}

/// Status codes cacheable by default, i.e. heuristically (RFC 9110 §15.1).
fn heuristically_cacheable(status: u16) -> bool {
    matches!(
        status,
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The directives that govern a response: the first targeted field present
/// (e.g. CDN-Cache-Control), otherwise Cache-Control.
pub fn response_directives(headers: &Headers, cfg: &PolicyConfig) -> Directives {
    for field in &cfg.targeted_fields {
        if headers.contains(field) {
            return parse_directives(headers.get_all(field));
        }
    }
    parse_directives(headers.get_all(b"cache-control"))
}

/// Decide storability and freshness of a response to a GET (RFC 9111 §3
/// and §4.2.1) as seen by a shared cache.
pub fn freshness(
    request: &Headers,
    status: u16,
    response: &Headers,
    cfg: &PolicyConfig,
) -> Freshness {
    let rq = parse_directives(request.get_all(b"cache-control"));
    let cc = response_directives(response, cfg);
    let explicit = cc.s_maxage.or(cc.max_age).or_else(|| {
        response.get(b"expires").map(|e| {
            // An invalid Expires means "already expired".
            match (
                date::parse(e),
                response.get(b"date").and_then(|d| date::parse(d)),
            ) {
                (Some(exp), Some(d)) => exp.saturating_sub(d),
                (Some(exp), None) => exp.saturating_sub(date::unix_now()),
                _ => 0,
            }
        })
    });
    let authorized = request.contains(b"authorization");
    let mut storable = !rq.no_store
        && !cc.no_store
        && !cc.private
        && (explicit.is_some() || cc.public || heuristically_cacheable(status))
        && (!authorized || cc.public || cc.must_revalidate || cc.s_maxage.is_some())
        && status != 206
        && status != 304
        && (200..600).contains(&status)
        && crate::key::vary_names(response).is_some();
    // A response that sets a cookie belongs to one user unless it is
    // explicitly marked shareable.
    if response.contains(b"set-cookie") && !cc.public && cc.s_maxage.is_none() {
        storable = false;
    }
    let lifetime = explicit.unwrap_or_else(|| {
        match (
            response.get(b"last-modified").and_then(|v| date::parse(v)),
            response.get(b"date").and_then(|v| date::parse(v)),
        ) {
            (Some(lm), Some(d)) if heuristically_cacheable(status) || cc.public => {
                ((d.saturating_sub(lm)) as f64 * cfg.heuristic_fraction) as u64
            }
            _ => 0,
        }
        .min(cfg.heuristic_max)
    });
    let must_revalidate = cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some();
    Freshness {
        storable,
        lifetime,
        stale_while_revalidate: if must_revalidate {
            0
        } else {
            cc.stale_while_revalidate.unwrap_or(0)
        },
        stale_if_error: if must_revalidate {
            0
        } else {
            cc.stale_if_error.unwrap_or(0)
        },
        must_revalidate,
        no_cache: cc.no_cache,
    }
}

/// The age of a stored response when it arrived (RFC 9111 §4.2.3), from its
/// Date and Age fields and the request and response times.
pub fn initial_age(response: &Headers, request_time: u64, response_time: u64) -> u64 {
    let date_value = response
        .get(b"date")
        .and_then(|v| date::parse(v))
        .unwrap_or(response_time);
    let age_value = response
        .get(b"age")
        .and_then(|v| parse_delta(v))
        .unwrap_or(0);
    let apparent = response_time.saturating_sub(date_value);
    let corrected = age_value + response_time.saturating_sub(request_time);
    apparent.max(corrected)
}

/// What a request allows the cache to do with a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usable {
    /// Fresh enough: serve it.
    Fresh,
    /// Stale, but may be served now while a background revalidation runs.
    StaleWhileRevalidate,
    /// Must be validated with the upstream first (stale, no-cache, or the
    /// request asked for it); `stale_if_error` says whether it can still be
    /// served if the upstream fails.
    Revalidate { stale_if_error: bool },
}

/// Decide how a stored response of `age` seconds may be used for a request.
pub fn usable(f: &Freshness, age: u64, request: &Headers, cfg: &PolicyConfig) -> Usable {
    let rq = parse_directives(request.get_all(b"cache-control"));
    let pragma_no_cache =
        !request.contains(b"cache-control") && request.has_token(b"pragma", b"no-cache");
    let stale_by = age.saturating_sub(f.lifetime);
    let sie = !f.must_revalidate && age < f.lifetime.saturating_add(f.stale_if_error);
    let revalidate = Usable::Revalidate {
        stale_if_error: sie,
    };
    if f.no_cache {
        return revalidate;
    }
    if cfg.honor_client_no_cache {
        if rq.no_cache || pragma_no_cache {
            return revalidate;
        }
        if rq.max_age.is_some_and(|m| age > m) {
            return revalidate;
        }
        if rq
            .min_fresh
            .is_some_and(|m| age.saturating_add(m) > f.lifetime)
        {
            return revalidate;
        }
    }
    if age < f.lifetime {
        return Usable::Fresh;
    }
    if f.must_revalidate {
        return revalidate;
    }
    if rq.max_stale.is_some_and(|m| stale_by <= m) {
        return Usable::Fresh;
    }
    if stale_by < f.stale_while_revalidate {
        return Usable::StaleWhileRevalidate;
    }
    revalidate
}

/// Does `If-None-Match` match this entity tag (weak comparison)?
pub fn etag_matches(if_none_match: &[u8], etag: &[u8]) -> bool {
    let strip = |t: &[u8]| -> Vec<u8> { t.strip_prefix(b"W/").unwrap_or(t).to_vec() };
    let etag = strip(trim(etag));
    split_quoted(if_none_match)
        .into_iter()
        .any(|t| t == b"*" || strip(t) == etag)
}

/// Evaluate a conditional GET/HEAD against a stored response's validators
/// (RFC 9110 §13.2.2): true when the answer is 304 Not Modified.
pub fn not_modified(request: &Headers, stored: &Headers) -> bool {
    if let Some(inm) = request.get(b"if-none-match") {
        return stored.get(b"etag").is_some_and(|e| etag_matches(inm, e));
    }
    if let Some(ims) = request
        .get(b"if-modified-since")
        .and_then(|v| date::parse(v))
    {
        if let Some(lm) = stored.get(b"last-modified").and_then(|v| date::parse(v)) {
            return lm <= ims;
        }
    }
    false
}

/// A single byte range resolved against a representation length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Serve the whole representation (no Range, several ranges, bad syntax
    /// or an If-Range that does not match).
    Full,
    /// Serve bytes `start..=end`.
    Partial { start: u64, end: u64 },
    /// 416 Range Not Satisfiable.
    Unsatisfiable,
}

/// Resolve a request's Range (RFC 9110 §14) for a stored response of `len`.
pub fn resolve_range(request: &Headers, stored: &Headers, len: u64) -> RangeAnswer {
    let Some(range) = request.get(b"range") else {
        return RangeAnswer::Full;
    };
    if let Some(if_range) = request.get(b"if-range") {
        let ok = if if_range.starts_with(b"\"") {
            // Strong comparison only.
            stored.get(b"etag").is_some_and(|e| e == if_range)
        } else {
            match (date::parse(if_range), stored.get(b"last-modified")) {
                (Some(d), Some(lm)) => date::parse(lm) == Some(d),
                _ => false,
            }
        };
        if !ok {
            return RangeAnswer::Full;
        }
    }
    let Some(spec) = range.strip_prefix(b"bytes=") else {
        return RangeAnswer::Full;
    };
    let spec = trim(spec);
    if spec.contains(&b',') {
        return RangeAnswer::Full;
    }
    let Some(dash) = spec.iter().position(|&c| c == b'-') else {
        return RangeAnswer::Full;
    };
    let (a, b) = (trim(&spec[..dash]), trim(&spec[dash + 1..]));
    let num = |v: &[u8]| vcdn_http::request::parse_length(v);
    match (a.is_empty(), b.is_empty()) {
        (true, true) => RangeAnswer::Full,
        (true, false) => match num(b) {
            None => RangeAnswer::Full,
            Some(0) => RangeAnswer::Unsatisfiable,
            Some(_) if len == 0 => RangeAnswer::Unsatisfiable,
            Some(n) => RangeAnswer::Partial {
                start: len.saturating_sub(n),
                end: len - 1,
            },
        },
        (false, _) => {
            let Some(start) = num(a) else {
                return RangeAnswer::Full;
            };
            let end = if b.is_empty() {
                u64::MAX
            } else {
                match num(b) {
                    Some(e) if e >= start => e,
                    _ => return RangeAnswer::Full,
                }
            };
            if start >= len {
                RangeAnswer::Unsatisfiable
            } else {
                RangeAnswer::Partial {
                    start,
                    end: end.min(len - 1),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(fields: &[(&'static str, &str)]) -> Headers {
        let mut h = Headers::new();
        for (n, v) in fields {
            h.push(Bytes::from_static(n.as_bytes()), Bytes::from(v.to_string()));
        }
        h
    }

    fn fresh(resp: &[(&'static str, &str)]) -> Freshness {
        freshness(&Headers::new(), 200, &h(resp), &PolicyConfig::default())
    }

    #[test]
    fn directive_parsing() {
        let d = parse_directives(
            h(&[(
                "cache-control",
                "Max-Age=60, no-cache=\"a, b\", s-maxage=\"30\", private",
            )])
            .get_all(b"cache-control"),
        );
        assert_eq!(d.max_age, Some(60));
        assert_eq!(d.s_maxage, Some(30));
        assert!(d.no_cache && d.private);
        assert_eq!(parse_delta(b"99999999999999999999999"), Some(1 << 31));
    }

    #[test]
    fn lifetime_precedence() {
        assert_eq!(
            fresh(&[("cache-control", "max-age=10, s-maxage=20")]).lifetime,
            20
        );
        assert_eq!(fresh(&[("cache-control", "max-age=10")]).lifetime, 10);
        let f = fresh(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
        ]);
        assert_eq!(f.lifetime, 60);
        assert_eq!(fresh(&[("expires", "0")]).lifetime, 0);
        // Heuristic: 10% of the time since Last-Modified.
        let f = fresh(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("last-modified", "Sun, 06 Nov 1994 06:49:37 GMT"),
        ]);
        assert_eq!(f.lifetime, 720);
        assert!(f.storable);
    }

    #[test]
    fn cdn_cache_control_wins() {
        let f = fresh(&[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=600"),
        ]);
        assert!(f.storable);
        assert_eq!(f.lifetime, 600);
        let f = fresh(&[
            ("cache-control", "max-age=600"),
            ("cdn-cache-control", "no-store"),
        ]);
        assert!(!f.storable);
    }

    #[test]
    fn not_storable() {
        assert!(!fresh(&[("cache-control", "no-store, max-age=60")]).storable);
        assert!(!fresh(&[("cache-control", "private, max-age=60")]).storable);
        assert!(!fresh(&[("cache-control", "max-age=60"), ("vary", "*")]).storable);
        assert!(!fresh(&[("cache-control", "max-age=60"), ("set-cookie", "a=b")]).storable);
        assert!(
            fresh(&[
                ("cache-control", "public, max-age=60"),
                ("set-cookie", "a=b")
            ])
            .storable
        );
        let auth = h(&[("authorization", "Bearer x")]);
        let cfg = PolicyConfig::default();
        assert!(!freshness(&auth, 200, &h(&[("cache-control", "max-age=60")]), &cfg).storable);
        assert!(freshness(&auth, 200, &h(&[("cache-control", "s-maxage=60")]), &cfg).storable);
        let nostore_req = h(&[("cache-control", "no-store")]);
        assert!(
            !freshness(
                &nostore_req,
                200,
                &h(&[("cache-control", "max-age=60")]),
                &cfg
            )
            .storable
        );
        // Not heuristically cacheable without explicit freshness.
        assert!(!freshness(&Headers::new(), 302, &Headers::new(), &cfg).storable);
        assert!(
            freshness(
                &Headers::new(),
                302,
                &h(&[("cache-control", "max-age=5")]),
                &cfg
            )
            .storable
        );
    }

    #[test]
    fn usability() {
        let cfg = PolicyConfig::default();
        let none = Headers::new();
        let f = fresh(&[(
            "cache-control",
            "max-age=10, stale-while-revalidate=5, stale-if-error=100",
        )]);
        assert_eq!(usable(&f, 3, &none, &cfg), Usable::Fresh);
        assert_eq!(usable(&f, 12, &none, &cfg), Usable::StaleWhileRevalidate);
        assert_eq!(
            usable(&f, 20, &none, &cfg),
            Usable::Revalidate {
                stale_if_error: true
            }
        );
        assert_eq!(
            usable(&f, 200, &none, &cfg),
            Usable::Revalidate {
                stale_if_error: false
            }
        );
        let mr = fresh(&[(
            "cache-control",
            "max-age=10, must-revalidate, stale-if-error=100",
        )]);
        assert_eq!(
            usable(&mr, 12, &none, &cfg),
            Usable::Revalidate {
                stale_if_error: false
            }
        );
        let nc = fresh(&[("cache-control", "no-cache, max-age=100")]);
        assert!(matches!(
            usable(&nc, 1, &none, &cfg),
            Usable::Revalidate { .. }
        ));
        let req_nc = h(&[("cache-control", "no-cache")]);
        assert!(matches!(
            usable(&f, 1, &req_nc, &cfg),
            Usable::Revalidate { .. }
        ));
        let pragma = h(&[("pragma", "no-cache")]);
        assert!(matches!(
            usable(&f, 1, &pragma, &cfg),
            Usable::Revalidate { .. }
        ));
        let max_stale = h(&[("cache-control", "max-stale=100")]);
        assert_eq!(usable(&f, 50, &max_stale, &cfg), Usable::Fresh);
        let lenient = PolicyConfig {
            honor_client_no_cache: false,
            ..PolicyConfig::default()
        };
        assert_eq!(usable(&f, 1, &req_nc, &lenient), Usable::Fresh);
    }

    #[test]
    fn ages() {
        let r = h(&[("date", "Sun, 06 Nov 1994 08:49:37 GMT"), ("age", "30")]);
        let t = 784111777;
        assert_eq!(initial_age(&r, t, t + 2), 32);
        assert_eq!(initial_age(&r, t + 100, t + 100), 100);
    }

    #[test]
    fn conditionals() {
        let stored = h(&[
            ("etag", "\"abc\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        assert!(not_modified(
            &h(&[("if-none-match", "\"x\", W/\"abc\"")]),
            &stored
        ));
        assert!(not_modified(&h(&[("if-none-match", "*")]), &stored));
        assert!(!not_modified(&h(&[("if-none-match", "\"x\"")]), &stored));
        assert!(not_modified(
            &h(&[("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            &stored
        ));
        assert!(!not_modified(
            &h(&[("if-modified-since", "Sun, 06 Nov 1994 08:49:36 GMT")]),
            &stored
        ));
        // If-None-Match takes precedence over If-Modified-Since.
        assert!(!not_modified(
            &h(&[
                ("if-none-match", "\"x\""),
                ("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")
            ]),
            &stored
        ));
    }

    #[test]
    fn ranges() {
        let s = h(&[("etag", "\"e\"")]);
        let r = |v: &str| resolve_range(&h(&[("range", v)]), &s, 100);
        assert_eq!(r("bytes=0-9"), RangeAnswer::Partial { start: 0, end: 9 });
        assert_eq!(r("bytes=90-"), RangeAnswer::Partial { start: 90, end: 99 });
        assert_eq!(r("bytes=-10"), RangeAnswer::Partial { start: 90, end: 99 });
        assert_eq!(r("bytes=-1000"), RangeAnswer::Partial { start: 0, end: 99 });
        assert_eq!(
            r("bytes=50-5000"),
            RangeAnswer::Partial { start: 50, end: 99 }
        );
        assert_eq!(r("bytes=100-"), RangeAnswer::Unsatisfiable);
        assert_eq!(r("bytes=-0"), RangeAnswer::Unsatisfiable);
        assert_eq!(r("bytes=0-1,5-6"), RangeAnswer::Full);
        assert_eq!(r("bytes=5-1"), RangeAnswer::Full);
        assert_eq!(r("items=0-1"), RangeAnswer::Full);
        let ir = |v: &str| resolve_range(&h(&[("range", "bytes=0-0"), ("if-range", v)]), &s, 100);
        assert_eq!(ir("\"e\""), RangeAnswer::Partial { start: 0, end: 0 });
        assert_eq!(ir("\"other\""), RangeAnswer::Full);
    }
}
