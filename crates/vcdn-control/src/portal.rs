//! The web portal's server side: its files, compiled into the binary and
//! served at `/` and `/portal/…` on the API's address, and browser
//! sessions.
//!
//! The portal is a page of plain JavaScript that calls the same `/v1` API
//! as every other client, so it can do nothing the API does not allow. A
//! person logs in with a customer API key or the operator token
//! (`POST /portal/login`); the browser then holds a session cookie
//! (`HttpOnly`, `SameSite=Strict`, `Secure` on HTTPS) instead of the key,
//! and the API takes the cookie as it takes a bearer token. Because a
//! cookie is sent by the browser on its own, every request that changes
//! something and authenticates with the cookie must also carry the
//! session's CSRF token in `X-CSRF-Token` (which a page of another origin
//! cannot read); a login must come from the portal's own origin. Every
//! portal response carries a Content-Security-Policy that allows the
//! portal's own scripts, styles and API only.
//!
//! Sessions live in memory (a restart logs everyone out), at most
//! [`MAX_SESSIONS`], each ending after [`IDLE`] without use or [`LIFETIME`]
//! after login.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use vcdn_http::serve::{Request, Response};

/// The cookie's name.
pub const COOKIE: &str = "vcdn_session";

/// The header that carries a session's CSRF token.
pub const CSRF_HEADER: &[u8] = b"x-csrf-token";

const MAX_SESSIONS: usize = 10_000;
const IDLE: Duration = Duration::from_secs(30 * 60);
const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Everything a portal page may load: its own files and API, nothing
/// inline, no frames, forms only to itself.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The portal's files: (path under `/portal/`, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../portal/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../portal/app.css"),
    ),
    (
        "uplot.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../portal/uplot.js"),
    ),
    (
        "uplot.css",
        "text/css; charset=utf-8",
        include_bytes!("../portal/uplot.css"),
    ),
    (
        "LICENSES.txt",
        "text/plain; charset=utf-8",
        include_bytes!("../portal/LICENSES.txt"),
    ),
];

const INDEX: &[u8] = include_bytes!("../portal/index.html");

/// Who a session is. A customer's session holds the hash of the key it
/// logged in with: once the key is rotated (or the customer deleted), the
/// session no longer authenticates.
#[derive(Debug, Clone, PartialEq)]
pub enum Who {
    Operator,
    Customer { id: String, key_sha256: String },
}

struct Session {
    who: Who,
    csrf: String,
    created: Instant,
    used: Instant,
}

/// The live sessions, by the SHA-256 of their cookie value.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

fn digest(v: &str) -> String {
    Sha256::digest(v.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Sessions {
    /// A new session for `who`: (cookie value, CSRF token). The oldest
    /// session makes room when there are too many.
    pub fn open(&self, who: Who) -> (String, String) {
        let cookie = crate::control::random_hex(32);
        let csrf = crate::control::random_hex(32);
        let now = Instant::now();
        let mut m = self.map.lock();
        m.retain(|_, s| alive(s, now));
        if m.len() >= MAX_SESSIONS {
            if let Some(oldest) = m.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone()) {
                m.remove(&oldest);
            }
        }
        m.insert(
            digest(&cookie),
            Session {
                who,
                csrf: csrf.clone(),
                created: now,
                used: now,
            },
        );
        (cookie, csrf)
    }

    /// The session of the request's cookie, if live: (who, CSRF token).
    pub fn of(&self, req: &Request) -> Option<(Who, String)> {
        let cookie = cookie(req)?;
        let now = Instant::now();
        let mut m = self.map.lock();
        let key = digest(cookie);
        let s = m.get_mut(&key)?;
        if !alive(s, now) {
            m.remove(&key);
            return None;
        }
        s.used = now;
        Some((s.who.clone(), s.csrf.clone()))
    }

    pub fn close(&self, req: &Request) {
        if let Some(c) = cookie(req) {
            self.map.lock().remove(&digest(c));
        }
    }
}

fn alive(s: &Session, now: Instant) -> bool {
    now.duration_since(s.used) < IDLE && now.duration_since(s.created) < LIFETIME
}

/// The value of the session cookie in the request's `Cookie` headers.
fn cookie(req: &Request) -> Option<&str> {
    req.head
        .headers
        .get_all(b"cookie")
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|v| !v.is_empty())
}

/// Whether a request that authenticates with the cookie may change
/// something: it carries the session's CSRF token.
pub fn csrf_ok(req: &Request, csrf: &str) -> bool {
    req.head
        .headers
        .get(CSRF_HEADER)
        .is_some_and(|v| vcdn_http::auth::token_eq(v, csrf.as_bytes()))
}

/// Whether a login comes from a page of the portal's own origin: its
/// `Origin` (sent by browsers on every POST) names the host it was sent
/// to, and `Sec-Fetch-Site`, when present, says same-origin. A request
/// without `Origin` is not from a browser page and is let through (it
/// holds the key anyway).
pub fn same_origin(req: &Request) -> bool {
    let h = |n: &[u8]| req.head.headers.get_str(n);
    if h(b"sec-fetch-site").is_some_and(|s| s != "same-origin" && s != "none") {
        return false;
    }
    match (h(b"origin"), h(b"host")) {
        (None, _) => true,
        (Some(o), Some(host)) => o
            .split_once("://")
            .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}

/// The `Set-Cookie` of a new session (and of a logout, with an empty
/// value and no lifetime).
pub fn set_cookie(value: &str, https: bool) -> String {
    let age = if value.is_empty() {
        0
    } else {
        LIFETIME.as_secs()
    };
    let secure = if https { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={age}{secure}")
}

/// Headers every portal answer carries.
pub fn secure(r: Response) -> Response {
    r.header("Content-Security-Policy", CSP)
        .header("X-Content-Type-Options", "nosniff")
        .header("Referrer-Policy", "no-referrer")
        .header("X-Frame-Options", "DENY")
}

/// A portal file: `/` is the page; `/portal/NAME` its scripts, styles and
/// licences. With `VCDN_PORTAL_DIR` set (developing the portal), files are
/// read from that directory on every request instead.
pub fn asset(path: &str) -> Option<Response> {
    let (name, ctype, embedded): (&str, &str, &[u8]) = if path == "/" || path == "/index.html" {
        ("index.html", "text/html; charset=utf-8", INDEX)
    } else {
        let name = path.strip_prefix("/portal/")?;
        let (n, t, b) = ASSETS.iter().find(|(n, _, _)| *n == name)?;
        (n, t, b)
    };
    let body = match std::env::var_os("VCDN_PORTAL_DIR") {
        Some(dir) => std::fs::read(std::path::Path::new(&dir).join(name)).ok()?,
        None => embedded.to_vec(),
    };
    // The page is small and names its files: always revalidated, so a new
    // vcdn's portal is used at once.
    Some(secure(Response::new(200, ctype, body)).header("Cache-Control", "no-cache"))
}
