//! The API document is the truth: schemathesis (PyPI), a property-based
//! fuzzer driven by `/v1/openapi.json`, calls every operation of a live
//! `vcdn up` with examples, boundary values and random data, as a customer
//! and as the operator, following the document's links from a created
//! service into its sub-resources, and checks every answer against the
//! document (status codes, schemas, headers, `Allow` on 405, bodies the
//! schemas allow accepted and those they forbid refused). It must find
//! nothing. `scripts/test.sh` installs it in a virtualenv outside the
//! work tree.

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;
use support::up::{Up, OP};

/// The schemathesis the test command installed.
fn schemathesis() -> PathBuf {
    if let Some(p) = std::env::var_os("VCDN_SCHEMATHESIS") {
        return p.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    cache.join("vcdn/schemathesis-4.32.5/bin/schemathesis")
}

/// One bounded run as `token`; panics with its report when it finds
/// anything.
fn fuzz(up: &Up, token: &str, service: &str, who: &str) {
    let config = up.dir.join(format!("schemathesis-{who}.toml"));
    // Business rules the schema cannot say (an unknown flavor, a name
    // taken, a region without capacity, a certificate that does not match
    // its key) are refused with 409 or 422: those are not mismatches.
    // Services' sub-resources are called on a real service.
    std::fs::write(
        &config,
        format!(
            r#"base-url = "{url}"
tls-verify = "{ca}"
continue-on-failure = true
seed = 1

[auth.openapi.bearer]
bearer = "${{VCDN_TOKEN}}"

[checks]
enabled = true

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "422"]

[phases]
stateful.max-steps = 10

[generation]
max-examples = 30

[[operations]]
include-path-regex = "^/v1/services/\\{{id\\}}"
parameters = {{ id = "{service}" }}
"#,
            url = up.api_client().url,
            ca = up.dir.join("api.crt").display(),
        ),
    )
    .unwrap();
    let out = Command::new(schemathesis())
        .arg("--config-file")
        .arg(&config)
        .args([
            "run",
            &format!("{}/v1/openapi.json", up.api_client().url),
            "--no-color",
        ])
        .env("VCDN_TOKEN", token)
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .output()
        .expect("schemathesis runs (scripts/test.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis as the {who} found mismatches:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Stateful"), "{text}");
    assert!(!text.contains("failures"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_mismatch_between_the_document_and_the_api() {
    // The fuzzer's probes without credentials are failed authentications
    // by design; the operator allows them for this run.
    let up = Up::start("api-document", &["--auth-failures-per-minute", "1000000"]);
    let spec = json!({"name": "fuzzed", "origin": format!("http://{}", up.origin),
        "hostname": "fuzzed.example", "flavor": "elastic",
        "regions": [{"region": "paris", "peak_users": 10}]});
    let (st, s) = up
        .call(&up.demo_key(), "POST", "/v1/services", Some(spec))
        .await;
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    fuzz(&up, &up.demo_key(), &id, "customer");
    // The operator's run may delete customers and change settings: last.
    fuzz(&up, OP, &id, "operator");
}
