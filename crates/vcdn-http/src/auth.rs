//! Bearer authentication for the control endpoints (the control plane's
//! API, the cache's and the router's admin APIs), in one place so that
//! they all read the header the same way, refuse weak tokens the same way
//! and slow down guessing the same way.
//!
//! - The scheme is matched case-insensitively (RFC 9110 §11.1), so
//!   `bearer TOKEN` works like `Bearer TOKEN`; tokens compare in constant
//!   time.
//! - A token an operator gives must have at least [`MIN_TOKEN_LEN`]
//!   characters ([`check_token_strength`]); generated ones are longer.
//! - [`Guard`] counts failures per source (an IPv4 address, an IPv6 /64).
//!   After [`ThrottleConfig::max_failures`] failures in a window, the source
//!   gets `429` with `Retry-After` until the window ends, **whatever token it
//!   sends**: checking the token first would tell a guesser which guess was
//!   right while it is throttled. A legitimate client behind the same address
//!   waits at most one window. Other sources are not affected. The table of
//!   sources is bounded; each failure is logged with its source, at most
//!   [`LOG_LINES_PER_S`] lines a second (the rest are counted and reported).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::serve::{Request, Response};

/// The shortest token an operator may configure: 32 characters (e.g. 16
/// random bytes in hex), far beyond guessing at any request rate.
pub const MIN_TOKEN_LEN: usize = 32;

/// Failure log lines written per second at most, over all sources.
pub const LOG_LINES_PER_S: u32 = 10;

/// The token of `Authorization: Bearer <token>`, the scheme in any case
/// (RFC 9110 §11.1: schemes are case-insensitive), spaces around the token
/// ignored. `None` without the header, with another scheme or no token.
pub fn bearer_token(req: &Request) -> Option<&[u8]> {
    let v = req.head.headers.get(b"authorization")?;
    let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ')?;
    let end = rest.iter().rposition(|&b| b != b' ')? + 1;
    Some(&rest[start..end])
}

/// Whether two tokens are equal, in time that depends only on their
/// lengths (the token is a secret). An empty `want` never matches.
pub fn token_eq(got: &[u8], want: &[u8]) -> bool {
    got.len() == want.len()
        && !want.is_empty()
        && got.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Refuses a configured token that is too short to resist guessing, with a
/// message saying which setting and how to make a good one.
pub fn check_token_strength(setting: &str, token: &str) -> Result<(), String> {
    let n = token.chars().count();
    if n < MIN_TOKEN_LEN || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{setting} is too weak: a token needs at least {MIN_TOKEN_LEN} characters without \
             spaces (this one has {n}); make one with `openssl rand -hex 16`, or leave it out \
             to have one generated"
        ));
    }
    Ok(())
}

/// How failures are throttled.
#[derive(Debug, Clone, Copy)]
pub struct ThrottleConfig {
    /// Failures a source may have in one window before it is throttled.
    pub max_failures: u32,
    /// The window, counted from a source's first failure.
    pub window: Duration,
    /// Sources remembered at most (the memory bound).
    pub max_sources: usize,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            max_failures: 10,
            window: Duration::from_secs(60),
            max_sources: 4096,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    since: Instant,
    failures: u32,
}

#[derive(Default)]
struct LogBudget {
    second: Option<Instant>,
    lines: u32,
    suppressed: u64,
}

/// The failure throttle of one API (see the module doc).
pub struct Guard {
    realm: &'static str,
    cfg: ThrottleConfig,
    sources: Mutex<HashMap<IpAddr, Entry>>,
    log: Mutex<LogBudget>,
    failures: AtomicU64,
    throttled: AtomicU64,
}

/// A source's key: IPv4 (also when mapped into IPv6) by address, IPv6 by
/// its /64, since one host usually holds a whole /64.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Guard {
    /// A guard for the API named `realm` (also the `WWW-Authenticate` realm).
    pub fn new(realm: &'static str, cfg: ThrottleConfig) -> Guard {
        Guard {
            realm,
            cfg,
            sources: Mutex::new(HashMap::new()),
            log: Mutex::new(LogBudget::default()),
            failures: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        }
    }

    /// Authentication failures so far.
    pub fn failures_total(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Requests refused with 429 so far.
    pub fn throttled_total(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// The 429 answer when `ip` has used up its failures, else `None`.
    pub fn throttled(&self, ip: IpAddr) -> Option<Response> {
        let wait = self.throttled_for(ip, Instant::now())?;
        self.throttled.fetch_add(1, Ordering::Relaxed);
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Some(
            Response::problem(
                429,
                &format!(
                    "too many failed authentications from {}; try again in {secs} s with a valid token",
                    source_key(ip)
                ),
            )
            .header("Retry-After", secs.max(1).to_string()),
        )
    }

    fn throttled_for(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let e = sources.get(&source_key(ip))?;
        let left = (e.since + self.cfg.window).checked_duration_since(now)?;
        (e.failures >= self.cfg.max_failures && !left.is_zero()).then_some(left)
    }

    /// Records a failed authentication from `ip` (logged, rate-limited) and
    /// returns the 401 answer with `detail`.
    pub fn failed(&self, ip: IpAddr, detail: &str) -> Response {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let (n, now_throttled) = self.record(ip, Instant::now());
        if self.may_log(Instant::now()) {
            if now_throttled {
                tracing::warn!(realm = self.realm, source = %ip, failures = n,
                    "authentication failed; throttling this source for the rest of the window");
            } else {
                tracing::warn!(realm = self.realm, source = %ip, failures = n, "authentication failed");
            }
        }
        Response::problem(401, detail).header(
            "WWW-Authenticate",
            format!("Bearer realm=\"{}\"", self.realm),
        )
    }

    /// Counts a failure; returns the source's count in its window and
    /// whether this one reached the limit.
    fn record(&self, ip: IpAddr, now: Instant) -> (u32, bool) {
        let key = source_key(ip);
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if !sources.contains_key(&key) && sources.len() >= self.cfg.max_sources {
            let window = self.cfg.window;
            sources.retain(|_, e| now.saturating_duration_since(e.since) < window);
            if sources.len() >= self.cfg.max_sources {
                // Still full: forget the source whose window is oldest.
                if let Some(oldest) = sources.iter().min_by_key(|(_, e)| e.since).map(|(k, _)| *k) {
                    sources.remove(&oldest);
                }
            }
        }
        let e = sources.entry(key).or_insert(Entry {
            since: now,
            failures: 0,
        });
        if now.saturating_duration_since(e.since) >= self.cfg.window {
            *e = Entry {
                since: now,
                failures: 0,
            };
        }
        e.failures = e.failures.saturating_add(1);
        (e.failures, e.failures == self.cfg.max_failures)
    }

    fn may_log(&self, now: Instant) -> bool {
        let mut b = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if b.second
            .is_none_or(|s| now.saturating_duration_since(s) >= Duration::from_secs(1))
        {
            if b.suppressed > 0 {
                tracing::warn!(
                    realm = self.realm,
                    lines = b.suppressed,
                    "authentication-failure log lines suppressed (rate limit)"
                );
            }
            *b = LogBudget {
                second: Some(now),
                lines: 0,
                suppressed: 0,
            };
        }
        if b.lines < LOG_LINES_PER_S {
            b.lines += 1;
            true
        } else {
            b.suppressed += 1;
            false
        }
    }

    /// The whole check for an API with one token: a throttled source gets
    /// 429, a missing or wrong token 401 (and counts as a failure).
    #[allow(clippy::result_large_err)]
    pub fn authorize(&self, req: &Request, want: &str) -> Result<(), Response> {
        let ip = req.peer.ip();
        if let Some(r) = self.throttled(ip) {
            return Err(r);
        }
        if bearer_token(req).is_some_and(|t| token_eq(t, want.as_bytes())) {
            return Ok(());
        }
        Err(self.failed(
            ip,
            "missing or wrong bearer token: send Authorization: Bearer <admin token>",
        ))
    }

    /// Sources currently remembered (for tests of the memory bound).
    pub fn sources(&self) -> usize {
        self.sources.lock().map(|s| s.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{parse_request, Limits};
    use bytes::Bytes;

    fn req(auth: Option<&str>, peer: &str) -> Request {
        let mut raw = String::from("GET /x HTTP/1.1\r\nHost: a\r\n");
        if let Some(a) = auth {
            raw.push_str(&format!("Authorization: {a}\r\n"));
        }
        raw.push_str("\r\n");
        let bytes = Bytes::from(raw);
        let (head, _) = parse_request(&bytes, &Limits::default()).unwrap().unwrap();
        Request {
            head,
            body: Bytes::new(),
            peer: peer.parse().unwrap(),
        }
    }

    const T: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn the_scheme_is_case_insensitive_and_the_token_exact() {
        for a in [
            "Bearer 0123456789abcdef0123456789abcdef",
            "bearer 0123456789abcdef0123456789abcdef",
            "BEARER  0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(
                bearer_token(&req(Some(a), "127.0.0.1:1")),
                Some(T.as_bytes()),
                "{a}"
            );
        }
        for a in ["Basic abc", "Bearer", "Bearer ", "Bearerx abc", "bear abc"] {
            assert_eq!(bearer_token(&req(Some(a), "127.0.0.1:1")), None, "{a}");
        }
        assert_eq!(bearer_token(&req(None, "127.0.0.1:1")), None);
        assert!(token_eq(T.as_bytes(), T.as_bytes()));
        assert!(!token_eq(b"0123456789abcdef0123456789abcdeF", T.as_bytes()));
        assert!(!token_eq(b"", b""));
        assert!(!token_eq(b"abc", T.as_bytes()));
    }

    #[test]
    fn short_or_spaced_tokens_are_refused_with_a_way_out() {
        let e = check_token_strength("--operator-token", "x").unwrap_err();
        assert!(e.contains("--operator-token") && e.contains("32"), "{e}");
        assert!(check_token_strength("t", &"a".repeat(31)).is_err());
        assert!(check_token_strength("t", &format!("{} ", "a".repeat(32))).is_err());
        assert!(check_token_strength("t", T).is_ok());
    }

    #[test]
    fn a_source_is_throttled_after_its_failures_and_others_are_not() {
        let g = Guard::new(
            "test",
            ThrottleConfig {
                max_failures: 3,
                window: Duration::from_secs(60),
                max_sources: 100,
            },
        );
        let bad = req(Some("bearer wrong"), "127.0.0.5:1000");
        for _ in 0..3 {
            assert_eq!(g.authorize(&bad, T).unwrap_err().status, 401);
        }
        let r = g.authorize(&bad, T).unwrap_err();
        assert_eq!(r.status, 429);
        let retry = r
            .headers
            .iter()
            .find(|(n, _)| n == "Retry-After")
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        // A good token from the throttled source waits too (see the module doc).
        let good_there = req(Some(&format!("Bearer {T}")), "127.0.0.5:1001");
        assert_eq!(g.authorize(&good_there, T).unwrap_err().status, 429);
        // Another source is unaffected.
        let good = req(Some(&format!("Bearer {T}")), "127.0.0.6:1000");
        assert!(g.authorize(&good, T).is_ok());
        let other_bad = req(Some("Bearer nope"), "127.0.0.6:1000");
        assert_eq!(g.authorize(&other_bad, T).unwrap_err().status, 401);
        assert_eq!(g.failures_total(), 4);
    }

    #[test]
    fn the_window_ends_and_the_table_stays_bounded() {
        let g = Guard::new(
            "test",
            ThrottleConfig {
                max_failures: 2,
                window: Duration::from_secs(10),
                max_sources: 8,
            },
        );
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let t0 = Instant::now();
        g.record(ip, t0);
        g.record(ip, t0);
        assert!(g.throttled_for(ip, t0 + Duration::from_secs(5)).is_some());
        assert!(g.throttled_for(ip, t0 + Duration::from_secs(10)).is_none());
        // After the window a new one starts from zero.
        assert_eq!(g.record(ip, t0 + Duration::from_secs(11)), (1, false));
        for i in 0..1000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i));
            g.record(ip, t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(g.sources() <= 8, "{}", g.sources());
        // IPv6 sources count per /64.
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        g.record(a, t0 + Duration::from_secs(2));
        g.record(b, t0 + Duration::from_secs(2));
        assert!(g.throttled_for(a, t0 + Duration::from_secs(3)).is_some());
    }
}
