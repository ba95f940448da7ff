//! A real browser for the portal's tests: Debian's headless Chromium
//! driven over WebDriver (`chromedriver`, with the `fantoccini` client),
//! axe-core (npm, fetched by `scripts/test.sh`) to check accessibility,
//! and screenshots a person can look at. The driver and every browser
//! process it started are killed on drop, also when a test fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use super::up::free_port;
use super::TempDir;

pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // Chromium's own processes (renderers, the GPU process) carry the
        // profile directory on their command line.
        let profile = self.profile.display().to_string();
        for (pid, args) in super::up::live_processes() {
            if args.iter().any(|a| a.contains(&profile)) {
                // SAFETY: signalling a process id.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

/// Where the tests write screenshots (kept after the run).
pub fn screenshot_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("portal-screenshots");
    std::fs::create_dir_all(&d).expect("screenshot directory");
    d
}

/// axe-core's script, as `scripts/test.sh` fetched it from npm.
fn axe_source() -> String {
    let path = std::env::var_os("VCDN_AXE_JS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
            cache.join("vcdn/axe-core-4.11.0/axe.min.js")
        });
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/test.sh fetches axe-core)", path.display()))
}

impl Browser {
    /// Headless Chromium at 1280 x 900. It accepts the API's self-signed
    /// certificate (loopback only).
    pub async fn start(name: &str) -> Browser {
        let profile = super::tempdir(&format!("chromium-{name}"));
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (apt install chromium-driver)");
        let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }))
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => panic!("no WebDriver session: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        Browser {
            client,
            driver,
            profile,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("the page loads");
    }

    /// The element, once it is there (10 s at most).
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
    }

    pub async fn fill(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap();
    }

    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.unwrap_or_default()
    }

    /// Waits until `css`'s text satisfies `ok`; its last text.
    pub async fn wait_text(&self, css: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let t = match self.client.find(Locator::Css(css)).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if ok(&t) || Instant::now() > deadline {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .expect("the script runs")
    }

    /// Runs an async script: its last argument is the callback.
    pub async fn js_async(&self, script: &str) -> Value {
        self.client
            .execute_async(script, vec![])
            .await
            .expect("the script runs")
    }

    /// Writes the page as `NAME.png` in [`screenshot_dir`].
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let p = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&p, png).unwrap();
        p
    }

    /// Scrolls `css` into view, then writes a screenshot (the viewport).
    pub async fn screenshot_at(&self, css: &str, name: &str) -> PathBuf {
        self.find(css).await;
        self.client
            .execute(
                "document.querySelector(arguments[0]).scrollIntoView({block: 'start'});",
                vec![serde_json::Value::String(css.to_string())],
            )
            .await
            .expect("the page scrolls");
        self.screenshot(name).await
    }

    /// axe-core's serious and critical violations on the page (WCAG 2.x
    /// A and AA rules): (rule, impact, where) each.
    pub async fn accessibility_violations(&self) -> Vec<String> {
        let src = axe_source();
        self.client
            .execute(&src, vec![])
            .await
            .expect("axe-core loads");
        let r = self
            .js_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})
                    .then(r => done({passes: r.passes.length, violations: r.violations.map(v => ({id: v.id,
                        impact: v.impact, nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 3)}))}))
                    .catch(e => done({passes: 0, violations: [{id: 'axe-error', impact: 'critical', nodes: [String(e)]}]}));",
            )
            .await;
        // An axe that checked nothing would report nothing.
        assert!(
            r["passes"].as_u64() > Some(5),
            "axe-core checked nothing: {r}"
        );
        r["violations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
            .map(|v| format!("{} ({}) at {}", v["id"], v["impact"], v["nodes"]))
            .collect()
    }

    /// The page's first contentful paint, ms after navigation started.
    pub async fn first_contentful_paint(&self) -> Option<f64> {
        self.js("const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null;")
            .await
            .as_f64()
    }
}
