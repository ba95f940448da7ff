//! A real player as the yardstick: headless Chromium (Debian's `chromium`
//! and `chromedriver`) opens a page, normally the origin's `/watch` page
//! with dash.js, and reads back what a viewer saw from
//! `window.vcdnStats`.
//!
//! chromedriver speaks W3C WebDriver as JSON over HTTP on loopback, so a
//! small blocking HTTP/1.1 client drives it (`POST /session`, `/url`,
//! `/execute/sync`, `DELETE /session`). chromedriver runs in a process
//! group of its own; [`Browser`]'s `Drop` ends the session, kills that
//! group (chromedriver and the Chromium tree it started) and removes the
//! throwaway profile, also when a test panics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Where Debian puts chromedriver and Chromium.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// What the viewer saw, as the watch page counts it at the `<video>`
/// element (times in ms from just before `player.initialize`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BrowserStats {
    /// The MPD played.
    #[serde(default)]
    pub url: String,
    /// Until the first `playing` event; `None` while not started.
    pub startup_ms: Option<f64>,
    /// `waiting` after the first `playing`.
    pub stalls: u32,
    /// Stall time, the one in progress included.
    pub stall_ms: f64,
    pub stalled: bool,
    pub ended: bool,
    /// The video representation being played.
    pub bitrate_kbps: f64,
    /// Video quality switches rendered.
    pub switches: u32,
    pub errors: Vec<String>,
    /// The last (at most 500) segment fetches.
    pub segments: Vec<SegmentFetch>,
    pub position_s: f64,
    #[serde(default)]
    pub buffer_s: f64,
}

/// One segment fetch as dash.js reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegmentFetch {
    /// `video` or `audio`.
    #[serde(rename = "type")]
    pub media_type: Option<String>,
    /// An initialization segment.
    #[serde(default)]
    pub init: bool,
    pub url: Option<String>,
    pub index: Option<f64>,
    pub quality_kbps: Option<f64>,
    pub start_ms: Option<f64>,
    pub first_byte_ms: Option<f64>,
    pub end_ms: Option<f64>,
    #[serde(default)]
    pub failed: bool,
}

impl BrowserStats {
    /// Media (not initialization) segments of `media_type` fetched.
    pub fn media_segments(&self, media_type: &str) -> usize {
        self.segments
            .iter()
            .filter(|s| !s.init && !s.failed && s.media_type.as_deref() == Some(media_type))
            .count()
    }

    /// The highest video bitrate fetched, kbit/s.
    pub fn top_video_kbps(&self) -> f64 {
        self.segments
            .iter()
            .filter(|s| s.media_type.as_deref() == Some("video"))
            .filter_map(|s| s.quality_kbps)
            .fold(0.0, f64::max)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("{0} is missing: install Debian's chromium and chromium-driver (apt-get install --no-install-recommends chromium chromium-driver)")]
    Missing(&'static str),
    #[error("cannot start chromedriver: {0}")]
    Start(std::io::Error),
    #[error("chromedriver did not become ready within {0:?}")]
    NotReady(Duration),
    #[error("chromedriver: {0}")]
    Http(String),
    #[error("WebDriver {what}: {message}")]
    WebDriver { what: String, message: String },
    #[error("the page reported no window.vcdnStats within {0:?} (is it the /watch page?)")]
    NoStats(Duration),
    #[error("window.vcdnStats is not what was expected: {0}")]
    Stats(String),
}

/// A headless Chromium driven through chromedriver.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: Option<String>,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver and opens a Chromium session.
    pub fn start() -> Result<Browser, BrowserError> {
        for (p, what) in [(CHROMEDRIVER, "chromedriver"), (CHROMIUM, "chromium")] {
            if !std::path::Path::new(p).exists() {
                return Err(BrowserError::Missing(what));
            }
        }
        // An ephemeral port: not every chromedriver takes --port=0.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(BrowserError::Start)?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let profile =
            std::env::temp_dir().join(format!("vcdn-chromium-{}-{port}", std::process::id()));
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so Chromium's whole tree is killed with it.
            .process_group(0)
            .spawn()
            .map_err(BrowserError::Start)?;
        let mut b = Browser {
            driver,
            addr,
            session: None,
            profile,
        };
        let wait = Duration::from_secs(15);
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(v) = b.call("GET", "/status", None) {
                if v["value"]["ready"].as_bool() == Some(true) {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(BrowserError::NotReady(wait));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--mute-audio",
                "--autoplay-policy=no-user-gesture-required",
                "--disable-dev-shm-usage",
                format!("--user-data-dir={}", b.profile.display()),
            ],
        }}}});
        let v = b.call("POST", "/session", Some(&caps))?;
        let id = v["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| BrowserError::WebDriver {
                what: "new session".into(),
                message: v.to_string(),
            })?;
        b.session = Some(id.to_string());
        Ok(b)
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session.as_deref().unwrap_or(""))
    }

    /// Opens `url` (returns when the page has loaded).
    pub fn open(&self, url: &str) -> Result<(), BrowserError> {
        self.call(
            "POST",
            &self.session_path("/url"),
            Some(&json!({ "url": url })),
        )?;
        Ok(())
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub fn run(&self, script: &str) -> Result<Value, BrowserError> {
        let v = self.call(
            "POST",
            &self.session_path("/execute/sync"),
            Some(&json!({"script": script, "args": []})),
        )?;
        Ok(v["value"].clone())
    }

    /// The page's `window.vcdnStats`, `None` before the page defines it.
    pub fn stats(&self) -> Result<Option<BrowserStats>, BrowserError> {
        let v = self.run("return window.vcdnStats || null;")?;
        if v.is_null() {
            return Ok(None);
        }
        serde_json::from_value(v)
            .map(Some)
            .map_err(|e| BrowserError::Stats(e.to_string()))
    }

    /// CPU seconds chromedriver and Chromium have used so far (all
    /// processes of the group, from /proc).
    pub fn cpu_s(&self) -> f64 {
        let pgid = self.driver.id().to_string();
        let tick = 100.0; // USER_HZ on Linux
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return 0.0;
        };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|stat| {
                // Fields after "(comm)": state ppid pgrp ... utime(12) stime(13).
                let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                (f.get(2)? == &pgid).then_some(())?;
                Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
            })
            .sum::<f64>()
            / tick
    }

    /// One WebDriver call; the answer's JSON, or its error.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, BrowserError> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let (status, text) = http(self.addr, method, path, &body, Duration::from_secs(60))
            .map_err(|e| BrowserError::Http(format!("{method} {path}: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            BrowserError::Http(format!("{method} {path}: not JSON ({e}): {text:.200}"))
        })?;
        if status != 200 {
            return Err(BrowserError::WebDriver {
                what: format!("{method} {path}"),
                message: v["value"]["message"]
                    .as_str()
                    .unwrap_or(&text)
                    .chars()
                    .take(500)
                    .collect(),
            });
        }
        Ok(v)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(id) = self.session.take() {
            let _ = http(
                self.addr,
                "DELETE",
                &format!("/session/{id}"),
                "",
                Duration::from_secs(10),
            );
        }
        // The whole group: chromedriver and any Chromium process left.
        let pgid = self.driver.id() as i32;
        // SAFETY: kill(2) with a negative pid signals our own process group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Plays `url` (a watch page) in headless Chromium for `duration` after it
/// loaded (less if the title ends) and returns what the viewer saw.
pub fn play_in_browser(url: &str, duration: Duration) -> Result<BrowserStats, BrowserError> {
    let b = Browser::start()?;
    b.open(url)?;
    watch(&b, duration)
}

/// Polls a page's stats until `duration` has passed or playback ended.
pub fn watch(b: &Browser, duration: Duration) -> Result<BrowserStats, BrowserError> {
    let deadline = Instant::now() + duration;
    let mut last = None;
    loop {
        if let Some(s) = b.stats()? {
            let ended = s.ended;
            last = Some(s);
            if ended {
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250).min(deadline - Instant::now()));
    }
    last.ok_or(BrowserError::NoStats(duration))
}

/// A blocking HTTP/1.1 request to chromedriver on loopback: status and
/// body (chromedriver answers with Content-Length and may keep the
/// connection open, so the body is read by its length).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    const MAX: usize = 64 << 20;
    let e = |e: std::io::Error| e.to_string();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(e)?;
    s.set_read_timeout(Some(timeout)).map_err(e)?;
    s.set_write_timeout(Some(timeout)).map_err(e)?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(e)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let mut want: Option<(usize, usize)> = None; // (head end, content length)
    loop {
        if let Some((h, n)) = want {
            if raw.len() >= h + n {
                raw.truncate(h + n);
                break;
            }
        }
        let got = s.read(&mut buf).map_err(e)?;
        if got == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..got]);
        if raw.len() > MAX {
            return Err("answer too large".into());
        }
        if want.is_none() {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..i]).to_ascii_lowercase();
                if head.contains("transfer-encoding: chunked") {
                    return Err("chunked answers are not supported".into());
                }
                let n = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok());
                if let Some(n) = n {
                    want = Some((i + 4, n));
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no complete answer ({} bytes)", raw.len()))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:.80}"))?;
    Ok((status, rest.to_string()))
}
