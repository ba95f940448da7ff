//! `vcdn cache ctl`: the control API from the command line.

use std::time::Duration;

use vcdn_http::client::Endpoint;

/// One control command.
#[derive(Debug, Clone)]
pub enum Command {
    Health,
    Stats,
    Objects { prefix: Option<String> },
    Object { id: String },
    PurgeUrl(String),
    PurgePrefix(String),
    PurgeAll,
    Prefetch(String),
    Metrics,
}

/// Run a command against an admin API (plain or HTTPS, see
/// [`Endpoint`]); returns the response body, or a message for the user.
pub async fn run(admin: &Endpoint, token: &str, cmd: Command) -> Result<String, String> {
    let auth = format!("Bearer {token}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let (method, path, body) = match &cmd {
        Command::Health => ("GET", "/healthz".to_string(), String::new()),
        Command::Metrics => ("GET", "/metrics".to_string(), String::new()),
        Command::Stats => ("GET", "/stats".to_string(), String::new()),
        Command::Objects { prefix } => (
            "GET",
            match prefix {
                Some(p) => format!("/objects?prefix={}", encode(p)),
                None => "/objects".to_string(),
            },
            String::new(),
        ),
        Command::Object { id } => ("GET", format!("/objects/{id}"), String::new()),
        Command::PurgeUrl(u) => (
            "POST",
            "/purge".into(),
            serde_json::json!({ "url": u }).to_string(),
        ),
        Command::PurgePrefix(p) => (
            "POST",
            "/purge".into(),
            serde_json::json!({ "prefix": p }).to_string(),
        ),
        Command::PurgeAll => (
            "POST",
            "/purge".into(),
            serde_json::json!({ "all": true }).to_string(),
        ),
        Command::Prefetch(u) => (
            "POST",
            "/prefetch".into(),
            serde_json::json!({ "url": u }).to_string(),
        ),
    };
    let resp = admin
        .request(
            method,
            &path,
            &headers,
            body.as_bytes(),
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| match e {
            vcdn_http::client::ClientError::FingerprintMismatch { addr, seen } => format!(
                "the admin API at {addr} presented a certificate with fingerprint {seen}, not the one given (--fingerprint): refusing to send the token"
            ),
            e if admin.is_https() => format!(
                "{e}\n(the admin API is HTTPS: trust its CA with --ca-file or VCDN_CA_FILE (vcdn up's is DATA_DIR/ca.crt), or its certificate with --fingerprint)"
            ),
            e => format!(
                "{e}\n(a cache started with --admin-tls-cert needs https://ADDR or --ca-file/--fingerprint)"
            ),
        })?;
    if resp.status() >= 400 {
        let detail = serde_json::from_slice::<serde_json::Value>(&resp.body)
            .ok()
            .and_then(|v| v["detail"].as_str().map(String::from))
            .unwrap_or_else(|| resp.text());
        return Err(format!(
            "{} {}: {detail}",
            resp.status(),
            vcdn_http::reason(resp.status())
        ));
    }
    // Pretty-print JSON for people; pass other text through.
    Ok(
        match serde_json::from_slice::<serde_json::Value>(&resp.body) {
            Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_else(|_| resp.text()),
            Err(_) => resp.text(),
        },
    )
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
