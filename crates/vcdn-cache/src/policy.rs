//! HTTP caching rules for a shared cache: what may be stored, for how long
//! it is fresh, when it may be served stale, and how old it is (RFC 9111,
//! stale-while-revalidate and stale-if-error of RFC 5861, and the targeted
//! `CDN-Cache-Control` field of RFC 9213). Pure functions of header fields
//! and times, so every rule is unit-tested without a network.

use bytes::Bytes;
use vcdn_http::{date, Headers};

/// Cache-Control directives a shared cache acts on. Unknown ones are ignored
/// (RFC 9111 §5.2.3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub no_store: bool,
    /// Also set by the qualified form `no-cache="field"`, which this cache
    /// treats as unqualified (RFC 9111 §5.2.2.4 notes this is common; it is
    /// stricter than the qualified meaning, so always correct).
    pub no_cache: bool,
    /// Also set by `private="field"` (RFC 9111 §5.2.2.7): the response is
    /// then not stored at all, which the qualified form allows.
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    /// RFC 9111 §5.2.2.3: lets a cache that understands the status code
    /// ignore `no-store`, and forbids storing one it does not understand.
    pub must_understand: bool,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
    /// Request only: answer from the cache or 504.
    pub only_if_cached: bool,
    /// Request only: accepts a response stale by up to this much.
    pub max_stale: Option<u64>,
    /// Request only: wants a response fresh for at least this much longer.
    pub min_fresh: Option<u64>,
}

/// delta-seconds larger than any a cache needs are this (RFC 9111 §1.2.2).
pub const DELTA_MAX: u64 = 1 << 31;

/// Parse every value of a Cache-Control field (RFC 9111 §5.2). Directive
/// names are case-insensitive; arguments are accepted as token or
/// quoted-string (`max-age="60"`: senders SHOULD NOT, recipients accept);
/// quoted arguments may contain commas. When a directive appears more than
/// once (RFC 9111 §4.2.1): the freshness lifetimes `max-age` and `s-maxage`
/// with different values make the response stale (lifetime 0), and an
/// invalid one (`max-age=abc`, `max-age=-1`, `max-age=1.5`) does too;
/// otherwise the most restrictive value is kept (the shortest
/// stale-while-revalidate, stale-if-error and max-stale, the longest
/// min-fresh). A directive with a malformed argument that has no
/// conservative reading (`max-stale=abc`, `min-fresh=x`,
/// `stale-while-revalidate=x`) is ignored.
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
                b"max-age" => lifetime(&mut d.max_age, secs()),
                b"s-maxage" => lifetime(&mut d.s_maxage, secs()),
                b"no-store" => d.no_store = true,
                b"no-cache" => d.no_cache = true,
                b"private" => d.private = true,
                b"public" => d.public = true,
                b"must-revalidate" => d.must_revalidate = true,
                b"proxy-revalidate" => d.proxy_revalidate = true,
                b"must-understand" => d.must_understand = true,
                b"stale-while-revalidate" => shortest(&mut d.stale_while_revalidate, secs()),
                b"stale-if-error" => shortest(&mut d.stale_if_error, secs()),
                b"only-if-cached" => d.only_if_cached = true,
                // Without an argument: any staleness (§5.2.1.2).
                b"max-stale" => match arg {
                    None => shortest(&mut d.max_stale, Some(u64::MAX)),
                    Some(_) => shortest(&mut d.max_stale, secs()),
                },
                b"min-fresh" => {
                    if let Some(s) = secs() {
                        d.min_fresh = Some(d.min_fresh.map_or(s, |m| m.max(s)));
                    }
                }
                _ => {}
            }
        }
    }
    d
}

/// A freshness lifetime seen once more: invalid, or different from the
/// one seen before, means stale (RFC 9111 §4.2.1).
fn lifetime(slot: &mut Option<u64>, value: Option<u64>) {
    *slot = match (*slot, value) {
        (None, Some(v)) => Some(v),
        (Some(old), Some(v)) if old == v => Some(v),
        _ => Some(0),
    };
}

/// Keep the smallest valid value; an invalid one is ignored.
fn shortest(slot: &mut Option<u64>, value: Option<u64>) {
    if let Some(v) = value {
        *slot = Some(slot.map_or(v, |old| old.min(v)));
    }
}

/// The Age field (RFC 9111 §5.1): a non-negative integer of seconds. A
/// list-based value (`Age: 10, 20`, or several field lines) is read as
/// its first member; a value that is then invalid (`-1`, `1.5`, `abc`,
/// empty) is ignored (None); a very large one is 2^31 (§1.2.2).
pub fn parse_age<'a>(mut values: impl Iterator<Item = &'a Bytes>) -> Option<u64> {
    let first = values.next()?;
    let member = first.split(|&c| c == b',').next().unwrap_or_default();
    parse_delta(trim(member))
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

/// delta-seconds (1*DIGIT); values beyond 2^31 are capped there (RFC 9111
/// §1.2.2).
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
            .min(DELTA_MAX),
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

/// The directives that govern a response, and whether they came from a
/// targeted field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Governing {
    pub directives: Directives,
    /// From a targeted field (RFC 9213): Cache-Control and Expires are
    /// then ignored.
    pub targeted: bool,
}

/// The directives that govern a response (RFC 9213 §2.2): those of the
/// first targeted field (e.g. CDN-Cache-Control), in the operator's order,
/// with a valid, non-empty value; otherwise Cache-Control.
pub fn response_directives(headers: &Headers, cfg: &PolicyConfig) -> Governing {
    for field in &cfg.targeted_fields {
        if let Some(directives) = targeted_directives(headers.get_all(field)) {
            return Governing {
                directives,
                targeted: true,
            };
        }
    }
    Governing {
        directives: parse_directives(headers.get_all(b"cache-control")),
        targeted: false,
    }
}

/// Read a targeted field (RFC 9213 §2.1): its field lines are one
/// Structured Fields Dictionary (RFC 8941), each member a cache directive
/// with the Cache-Control meaning and the type that meaning implies:
/// delta-seconds directives are non-negative Integers, the others Booleans
/// (`no-store=?0` is false), and `no-cache`/`private` may also carry field
/// names (a String, Token or Inner List: the qualified form, treated as
/// unqualified as in Cache-Control). A member of the wrong type
/// (`max-age="60"`, `max-age=1.5`, `max-age=-1`, `no-store=1`) is invalid
/// and ignored ("SHOULD NOT consume values that violate these inferred
/// constraints"); parameters are ignored; unknown directives are valid and
/// ignored (RFC 9213 §3.1's `CDN-Cache-Control: none`).
///
/// None, and the field is ignored as if absent (§2.1), when it does not
/// parse as a Dictionary, is empty, or has no valid member: a field whose
/// only directive is of the wrong type is not a "valid, non-empty value"
/// (§2.2), so Cache-Control governs.
pub fn targeted_directives<'a>(values: impl Iterator<Item = &'a Bytes>) -> Option<Directives> {
    use vcdn_http::sf::{self, BareItem, Member};
    let dict = sf::parse_dictionary_lines(values.map(|v| &v[..])).ok()?;
    let mut d = Directives::default();
    let mut valid = 0;
    for (key, member) in dict.iter() {
        let bare = member.bare();
        let flag = |slot: &mut bool| match bare {
            Some(BareItem::Boolean(b)) => {
                *slot = *b;
                true
            }
            _ => false,
        };
        let qualified = |slot: &mut bool| match (bare, member) {
            (Some(BareItem::Boolean(b)), _) => {
                *slot = *b;
                true
            }
            (Some(BareItem::String(_) | BareItem::Token(_)), _) | (None, Member::InnerList(..)) => {
                *slot = true;
                true
            }
            _ => false,
        };
        let secs = |slot: &mut Option<u64>| match bare {
            Some(BareItem::Integer(i)) if *i >= 0 => {
                *slot = Some((*i as u64).min(DELTA_MAX));
                true
            }
            _ => false,
        };
        let ok = match key {
            "max-age" => secs(&mut d.max_age),
            "s-maxage" => secs(&mut d.s_maxage),
            "stale-while-revalidate" => secs(&mut d.stale_while_revalidate),
            "stale-if-error" => secs(&mut d.stale_if_error),
            "no-store" => flag(&mut d.no_store),
            "public" => flag(&mut d.public),
            "must-revalidate" => flag(&mut d.must_revalidate),
            "proxy-revalidate" => flag(&mut d.proxy_revalidate),
            "must-understand" => flag(&mut d.must_understand),
            "no-cache" => qualified(&mut d.no_cache),
            "private" => qualified(&mut d.private),
            // Unknown here (request directives included): valid, ignored.
            _ => true,
        };
        if ok {
            valid += 1;
        }
    }
    (valid > 0).then_some(d)
}

/// Status codes whose caching rules this cache implements, for
/// `must-understand` (RFC 9111 §5.2.2.3).
fn understood(status: u16) -> bool {
    heuristically_cacheable(status) || matches!(status, 302 | 303 | 307)
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
    let governing = response_directives(response, cfg);
    let cc = governing.directives;
    // Expires counts only without max-age and s-maxage (RFC 9111 §5.3) and
    // without a targeted field (RFC 9213 §2.2).
    let expires = || {
        if governing.targeted {
            return None;
        }
        let mut lines = response.get_all(b"expires");
        let e = lines.next()?;
        // Several different values: stale (RFC 9111 §4.2.1).
        if lines.any(|other| other != e) {
            return Some(0);
        }
        // An invalid Expires means "already expired" (§5.3).
        Some(
            match (
                date::parse(e),
                response.get(b"date").and_then(|d| date::parse(d)),
            ) {
                (Some(exp), Some(d)) => exp.saturating_sub(d),
                (Some(exp), None) => exp.saturating_sub(date::unix_now()),
                _ => 0,
            },
        )
    };
    let explicit = cc.s_maxage.or(cc.max_age).or_else(expires);
    let authorized = request.contains(b"authorization");
    // must-understand: no-store is ignored for a status code this cache
    // understands, and a response with one it does not is not stored
    // (RFC 9111 §3, §5.2.2.3).
    let no_store = if cc.must_understand {
        !understood(status)
    } else {
        cc.no_store
    };
    let mut storable = !rq.no_store
        && !no_store
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
    let age_value = parse_age(response.get_all(b"age")).unwrap_or(0);
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

    fn lifetime_of(cc: &[&str]) -> (bool, u64) {
        let mut resp = Headers::new();
        for v in cc {
            resp.push(
                Bytes::from_static(b"cache-control"),
                Bytes::from(v.to_string()),
            );
        }
        let f = freshness(&Headers::new(), 200, &resp, &PolicyConfig::default());
        (f.storable, f.lifetime)
    }

    /// RFC 9111 §5.2: names case-insensitive, token or quoted-string
    /// arguments, unknown directives ignored (§5.2.3).
    #[test]
    fn rfc9111_5_2_directive_syntax() {
        assert_eq!(lifetime_of(&["MAX-AGE=60"]), (true, 60));
        assert_eq!(lifetime_of(&["max-age=\"60\""]), (true, 60));
        assert_eq!(
            lifetime_of(&["foo=\"a, max-age=1\", max-age=10, bar"]),
            (true, 10)
        );
        assert_eq!(lifetime_of(&["x-unknown=1, s-maxage=\"7\""]), (true, 7));
    }

    /// RFC 9111 §4.2.1: invalid freshness information is stale, and a
    /// directive repeated with different values makes the response stale.
    #[test]
    fn rfc9111_4_2_1_invalid_or_conflicting_lifetimes_are_stale() {
        for bad in [
            "max-age=abc",
            "max-age=-1",
            "max-age=1.5",
            "max-age=",
            "max-age=60 60",
        ] {
            assert_eq!(lifetime_of(&[bad]), (true, 0), "{bad}");
        }
        assert_eq!(lifetime_of(&["max-age=60, max-age=30"]), (true, 0));
        assert_eq!(lifetime_of(&["max-age=60", "max-age=30"]), (true, 0));
        assert_eq!(lifetime_of(&["max-age=60", "Max-Age=60"]), (true, 60));
        assert_eq!(lifetime_of(&["max-age=abc, max-age=60"]), (true, 0));
        assert_eq!(
            lifetime_of(&["s-maxage=10, s-maxage=20, max-age=99"]),
            (true, 0)
        );
        // §1.2.2: too large a delta-seconds is 2^31.
        assert_eq!(
            lifetime_of(&["max-age=99999999999999999999"]),
            (true, DELTA_MAX)
        );
        // Several different Expires lines: stale too.
        let two = fresh(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 09:50:37 GMT"),
        ]);
        assert_eq!(two.lifetime, 0);
        let same = fresh(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
        ]);
        assert_eq!(same.lifetime, 60);
        // Most restrictive of repeated stale-* directives.
        let f = fresh(&[(
            "cache-control",
            "max-age=1, stale-while-revalidate=50, stale-while-revalidate=5, stale-if-error=x",
        )]);
        assert_eq!((f.stale_while_revalidate, f.stale_if_error), (5, 0));
    }

    /// RFC 9111 §5.2.2.4 and §5.2.2.7: the qualified forms are handled as
    /// the unqualified ones (revalidate on every use; not stored).
    #[test]
    fn rfc9111_5_2_2_qualified_no_cache_and_private() {
        let nc = fresh(&[("cache-control", "no-cache=\"set-cookie\", max-age=60")]);
        assert!(nc.storable && nc.no_cache);
        let cfg = PolicyConfig::default();
        assert!(matches!(
            usable(&nc, 1, &Headers::new(), &cfg),
            Usable::Revalidate { .. }
        ));
        assert!(!fresh(&[("cache-control", "private=\"set-cookie, x\", max-age=60")]).storable);
        assert!(!fresh(&[("cache-control", "private=set-cookie, max-age=60")]).storable);
    }

    /// RFC 9111 §5.2.2.3 and §3: must-understand overrides no-store for a
    /// status code the cache understands, and forbids storing others.
    #[test]
    fn rfc9111_5_2_2_3_must_understand() {
        let cfg = PolicyConfig::default();
        let r = h(&[("cache-control", "must-understand, no-store, max-age=60")]);
        assert!(freshness(&Headers::new(), 200, &r, &cfg).storable);
        assert!(!freshness(&Headers::new(), 299, &r, &cfg).storable);
        let r = h(&[("cache-control", "must-understand, max-age=60")]);
        assert!(!freshness(&Headers::new(), 418, &r, &cfg).storable);
    }

    /// RFC 9111 §5.2.1.2, §5.2.1.3: a malformed max-stale or min-fresh is
    /// ignored (max-stale=abc is not "any staleness").
    #[test]
    fn rfc9111_5_2_1_malformed_request_directives_are_ignored() {
        let cfg = PolicyConfig::default();
        let f = fresh(&[("cache-control", "max-age=10")]);
        let req = |v: &str| h(&[("cache-control", v)]);
        assert_eq!(usable(&f, 50, &req("max-stale"), &cfg), Usable::Fresh);
        assert_eq!(usable(&f, 50, &req("max-stale=100"), &cfg), Usable::Fresh);
        assert!(matches!(
            usable(&f, 50, &req("max-stale=abc"), &cfg),
            Usable::Revalidate { .. }
        ));
        assert!(matches!(
            usable(&f, 50, &req("max-stale=100, max-stale=5"), &cfg),
            Usable::Revalidate { .. }
        ));
        assert_eq!(usable(&f, 5, &req("min-fresh=x"), &cfg), Usable::Fresh);
        assert!(matches!(
            usable(&f, 5, &req("min-fresh=8"), &cfg),
            Usable::Revalidate { .. }
        ));
    }

    /// RFC 9111 §5.1: Age is delta-seconds; a list is read as its first
    /// member, an invalid value is ignored, a huge one is 2^31.
    #[test]
    fn rfc9111_5_1_age() {
        let age = |vals: &[&str]| {
            let hs: Vec<Bytes> = vals.iter().map(|v| Bytes::from(v.to_string())).collect();
            parse_age(hs.iter())
        };
        assert_eq!(age(&["30"]), Some(30));
        assert_eq!(age(&["10, 20"]), Some(10));
        assert_eq!(age(&["10", "20"]), Some(10));
        assert_eq!(age(&[" 7 "]), Some(7));
        for bad in ["-1", "1.5", "abc", "", "1e3", "+5", "10 20"] {
            assert_eq!(age(&[bad]), None, "{bad:?}");
        }
        assert_eq!(age(&["99999999999999999999999"]), Some(DELTA_MAX));
        assert_eq!(age(&[]), None);
        let t = 784111777;
        let at = |a: &str| {
            initial_age(
                &h(&[("date", "Sun, 06 Nov 1994 08:49:37 GMT"), ("age", a)]),
                t,
                t + 2,
            )
        };
        assert_eq!(at("30, 999"), 32);
        assert_eq!(at("-1"), 2);
        assert_eq!(at("1.5"), 2);
        assert_eq!(at("99999999999999999999999"), DELTA_MAX + 2);
    }

    fn cdn(cdn_cc: &[&str], cc: &str) -> Freshness {
        let mut resp = h(&[("cache-control", cc)]);
        for v in cdn_cc {
            resp.push(
                Bytes::from_static(b"cdn-cache-control"),
                Bytes::from(v.to_string()),
            );
        }
        freshness(&Headers::new(), 200, &resp, &PolicyConfig::default())
    }

    /// RFC 9213 §2.1: a Structured Fields Dictionary; members of the wrong
    /// type are ignored; a field that does not parse, is empty or has no
    /// valid member is ignored and Cache-Control governs (§2.2).
    #[test]
    fn rfc9213_targeted_field_types() {
        // Wrong types: the field has no valid member, Cache-Control governs.
        for bad in [
            "max-age=\"60\"",
            "max-age=1.5",
            "max-age=-1",
            "max-age=:AA==:",
            "max-age=(60)",
        ] {
            let f = cdn(&[bad], "max-age=5");
            assert_eq!((f.storable, f.lifetime), (true, 5), "{bad}");
        }
        // Booleans: ?0 is false.
        let f = cdn(&["no-store=?0, max-age=30"], "no-store");
        assert_eq!((f.storable, f.lifetime), (true, 30));
        assert!(!cdn(&["no-store=?1, max-age=30"], "max-age=5").storable);
        assert!(!cdn(&["no-store, max-age=30"], "max-age=5").storable);
        // A wrong-typed no-store is ignored, the valid max-age used.
        let f = cdn(&["no-store=1, max-age=30"], "max-age=5");
        assert_eq!((f.storable, f.lifetime), (true, 30));
        // Parameters are ignored.
        assert_eq!(cdn(&["max-age=30;foo=bar"], "max-age=5").lifetime, 30);
        // Not a Dictionary: ignored as a whole.
        for bad in [
            "max-age=30,",
            "Max-Age=30",
            "max-age=30 s-maxage=2",
            "max-age = 30",
            "max-age=1234567890123456",
        ] {
            assert_eq!(cdn(&[bad], "max-age=5").lifetime, 5, "{bad}");
        }
        // Empty: ignored.
        assert_eq!(cdn(&[""], "max-age=5").lifetime, 5);
        // Several lines are one Dictionary; a later duplicate wins (RFC 8941).
        assert_eq!(
            cdn(&["max-age=10", "s-maxage=40"], "max-age=5").lifetime,
            40
        );
        assert_eq!(cdn(&["max-age=10, max-age=20"], "max-age=5").lifetime, 20);
        // Unknown directives are valid: Cache-Control is ignored (RFC 9213
        // §3.1's "CDN-Cache-Control: none").
        let f = cdn(&["none"], "no-store");
        assert!(f.storable);
        assert_eq!(f.lifetime, 0);
        // Qualified private and no-cache.
        assert!(!cdn(&["private=\"set-cookie\", max-age=30"], "max-age=5").storable);
        assert!(cdn(&["no-cache=(\"a\" \"b\"), max-age=30"], "max-age=5").no_cache);
        // Large values saturate at 2^31.
        assert_eq!(
            cdn(&["max-age=999999999999999"], "max-age=5").lifetime,
            DELTA_MAX
        );
    }

    /// RFC 9213 §2.2: with a targeted field in use, Expires is ignored too.
    #[test]
    fn rfc9213_targeted_field_ignores_expires() {
        let f = fresh(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 09:49:37 GMT"),
            ("cdn-cache-control", "public"),
        ]);
        assert!(f.storable);
        assert_eq!(f.lifetime, 0);
        // Without a valid targeted field, Expires counts.
        let f = fresh(&[
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("expires", "Sun, 06 Nov 1994 09:49:37 GMT"),
            ("cdn-cache-control", "max-age=\"9\""),
        ]);
        assert_eq!(f.lifetime, 3600);
    }

    /// RFC 9213 §2.2: the first targeted field in the operator's list with a
    /// valid value is used.
    #[test]
    fn rfc9213_target_list_order() {
        let cfg = PolicyConfig {
            targeted_fields: vec![
                Bytes::from_static(b"vcdn-cache-control"),
                Bytes::from_static(b"cdn-cache-control"),
            ],
            ..PolicyConfig::default()
        };
        let f = |fields: &[(&'static str, &str)]| {
            freshness(&Headers::new(), 200, &h(fields), &cfg).lifetime
        };
        let both = [
            ("cache-control", "max-age=5"),
            ("cdn-cache-control", "max-age=20"),
            ("vcdn-cache-control", "max-age=10"),
        ];
        assert_eq!(f(&both), 10);
        let invalid_first = [
            ("cache-control", "max-age=5"),
            ("cdn-cache-control", "max-age=20"),
            ("vcdn-cache-control", "max-age=10,"),
        ];
        assert_eq!(f(&invalid_first), 20);
    }
}
