//! A watch page, so a person (or a test's headless browser) plays a
//! title through whatever is in front of the origin: `GET /watch?mpd=URL`
//! (default: the 2 s test title of [`crate::video`]) is a static page with
//! a `<video>` element, dash.js and `watch.js`, which plays the MPD with
//! dash.js's default settings and records what the viewer sees in
//! `window.vcdnStats` (start-up delay, stalls, bitrate, switches, segment
//! timings).
//!
//! The page never echoes the query: `watch.js` reads `mpd` from
//! `location.search` and hands it to dash.js as a URL only, and the page
//! runs no inline script, so a `script-src 'self'` policy holds.

use vcdn_http::serve::Response;

/// dash.js 5.2.1 (BSD-3-Clause), see `assets/dashjs/README.md`.
pub const DASHJS: &[u8] = include_bytes!("../assets/dashjs/dash.all.min.js");
pub const DASHJS_LICENSE: &[u8] = include_bytes!("../assets/dashjs/LICENSE.md");
pub const DASHJS_VERSION: &str = "5.2.1";
const PAGE: &str = include_str!("../assets/watch.html");
const SCRIPT: &str = include_str!("../assets/watch.js");

/// Scripts only from the origin of the page; media from MSE blobs; the MPD
/// and segments from anywhere (an absolute `mpd` may name another host).
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
media-src 'self' blob:; connect-src *; worker-src 'self' blob:; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The page or one of its scripts, for a GET or HEAD of `path`.
pub fn route(path: &str) -> Option<Response> {
    let (ct, body, max_age): (&str, &'static [u8], u32) = match path {
        "/watch" => ("text/html; charset=utf-8", PAGE.as_bytes(), 300),
        "/player/watch.js" => ("text/javascript; charset=utf-8", SCRIPT.as_bytes(), 300),
        "/player/dash.all.min.js" => ("text/javascript; charset=utf-8", DASHJS, 86_400),
        "/player/LICENSE-dashjs.md" => ("text/markdown; charset=utf-8", DASHJS_LICENSE, 86_400),
        _ => return None,
    };
    let mut r = Response::new(200, ct, body)
        .header("Cache-Control", format!("public, max-age={max_age}"))
        .header("X-Content-Type-Options", "nosniff");
    if path == "/watch" {
        r = r
            .header("Content-Security-Policy", POLICY)
            .header("Referrer-Policy", "no-referrer");
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_script_and_loads_both_scripts() {
        assert!(PAGE.contains(r#"<script src="player/dash.all.min.js" defer></script>"#));
        assert!(PAGE.contains(r#"<script src="player/watch.js" defer></script>"#));
        assert_eq!(PAGE.matches("<script").count(), 2);
        assert!(
            !PAGE
                .split_whitespace()
                .any(|w| w.starts_with("on") && w.contains('=')),
            "no inline event handlers"
        );
        assert!(DASHJS.starts_with(b"/*! For license information"));
        assert!(
            route("/watch?mpd=x").is_none(),
            "the query is not part of the path"
        );
        assert!(route("/player/../watch").is_none());
    }
}
