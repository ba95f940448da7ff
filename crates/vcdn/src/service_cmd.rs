//! `vcdn service …` and `vcdn customer …`: the REST API from the shell,
//! with readable tables and the API's own error messages.

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use vcdn_http::client::{ClientError, Endpoint};
use vcdn_http::tls::Trust;

#[derive(Args)]
pub struct ApiArgs {
    /// The control plane's API.
    #[arg(
        long,
        global = true,
        default_value = "https://127.0.0.1:8070",
        env = "VCDN_API"
    )]
    api: String,
    /// Trust the API's certificate by its SHA-256 fingerprint (what `vcdn
    /// up` prints; DATA_DIR/api.fingerprint).
    #[arg(long, global = true, env = "VCDN_API_FINGERPRINT")]
    api_fingerprint: Option<String>,
    /// Trust the API's certificate if a CA of this PEM file issued it
    /// [default: the system's CAs].
    #[arg(long, global = true, env = "VCDN_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// A customer API key (or the operator token).
    #[arg(long, global = true, env = "VCDN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    cmd: ServiceCmd,
}

#[derive(Subcommand)]
enum ServiceCmd {
    /// Order a vCDN.
    Create {
        name: String,
        /// http://host:port of your origin.
        #[arg(long)]
        origin: String,
        /// The hostname your users resolve.
        #[arg(long)]
        hostname: String,
        #[arg(long, default_value = "elastic")]
        flavor: String,
        /// REGION=PEAK_USERS (repeat), e.g. paris=500.
        #[arg(long = "region", required = true, value_parser = parse_region)]
        regions: Vec<(String, u64)>,
        /// Video bitrate in kb/s of every region's viewers.
        #[arg(long)]
        bitrate_kbps: Option<f64>,
        /// Minimum mean MOS (1-5).
        #[arg(long, conflicts_with = "response_ms")]
        min_mos: Option<f64>,
        /// Response-time target in ms (with --percentile).
        #[arg(long)]
        response_ms: Option<f64>,
        #[arg(long, requires = "response_ms")]
        percentile: Option<u8>,
        /// Lease length: 90s, 30m, 2h, 1d.
        #[arg(long, value_parser = parse_duration)]
        lease: Option<u64>,
        /// Accelerate this path prefix through proxy chains (repeat), e.g. /api/.
        #[arg(long = "accelerate", value_name = "PREFIX")]
        accelerate: Vec<String>,
        /// Also accelerate what the caches fetch from the origin (misses,
        /// passes, no-store answers).
        #[arg(long)]
        accelerate_uncacheable: bool,
        /// The name clients of accelerated paths resolve [default: dyn.HOSTNAME].
        #[arg(long, value_name = "NAME")]
        accel_hostname: Option<String>,
        /// How users reach the caches: dns (DNS and HTTP routing) or srv6
        /// (also every chunk at its own IPv6 address, dispatched in the
        /// kernel; the platform must offer it) [default: dns].
        #[arg(long, value_parser = ["dns", "srv6"])]
        routing: Option<String>,
    },
    /// Your services.
    List,
    /// A service: state, entry point, instances, cost.
    Show { service: String },
    /// Delete a service (its caches stop).
    Delete { service: String },
    /// What the platform did: deployed, healed, scaled, expired.
    Events { service: String },
    /// Usage and cost so far.
    Usage { service: String },
    /// History per region: requests/s, hit ratio, instances and MOS over
    /// time (GET /v1/services/{id}/timeseries).
    History {
        service: String,
        /// How far back: 90s, 30m, 2h, 1d.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        since: u64,
        /// Seconds per row: 10, 300 or 3600 [default: the finest that
        /// fits].
        #[arg(long)]
        step: Option<u64>,
    },
    /// Purge content from every cache of the service.
    Purge {
        service: String,
        #[arg(long, conflicts_with_all = ["prefix", "all"], required_unless_present_any = ["prefix", "all"])]
        url: Option<String>,
        #[arg(long, conflicts_with = "all")]
        prefix: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Fetch a URL into every cache of the service.
    Prefetch { service: String, url: String },
    /// Flavors and regions on offer.
    Catalog,
}

#[derive(Args)]
pub struct CustomerArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    cmd: CustomerCmd,
}

#[derive(Subcommand)]
enum CustomerCmd {
    /// Make a customer and print its API key (operator token needed).
    Create { name: String },
    /// All customers.
    List,
}

fn parse_region(s: &str) -> Result<(String, u64), String> {
    let (r, n) = s
        .split_once('=')
        .ok_or("give REGION=PEAK_USERS, e.g. paris=500")?;
    Ok((
        r.to_string(),
        n.parse()
            .map_err(|_| format!("{n} is not a number of users"))?,
    ))
}

fn parse_duration(s: &str) -> Result<u64, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s}: give a duration like 90s, 30m, 2h or 1d"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s}: unit must be s, m, h or d")),
    };
    Ok(n * mult)
}

/// Whom the CLI trusts as the API: the pinned fingerprint, else the CAs
/// of a file, else the system's.
pub fn api_trust(
    fingerprint: Option<&str>,
    ca_file: Option<&std::path::Path>,
) -> Result<Trust, String> {
    if let Some(f) = fingerprint.filter(|f| !f.trim().is_empty()) {
        return vcdn_http::tls::parse_fingerprint(f)
            .map(Trust::Fingerprint)
            .ok_or_else(|| {
                format!("VCDN_API_FINGERPRINT {f:?} is not a SHA-256 fingerprint (sha256: and 64 hex digits, as vcdn up prints it)")
            });
    }
    if let Some(p) = ca_file {
        let pem = std::fs::read(p).map_err(|e| format!("VCDN_CA_FILE {}: {e}", p.display()))?;
        let cas = vcdn_http::tls::parse_chain(&pem)
            .map_err(|e| format!("VCDN_CA_FILE {}: {e}", p.display()))?;
        return Ok(Trust::Bundle(cas));
    }
    Ok(Trust::System)
}

/// What a failed call to the API means for the person at the shell.
pub fn explain(api: &str, e: &ClientError) -> String {
    match e {
        ClientError::FingerprintMismatch { seen, .. } => format!(
            "the API at {api} presented a certificate with fingerprint {seen}, not the one in VCDN_API_FINGERPRINT (or --api-fingerprint): refusing to send the token. If this is your vcdn up (its data directory's api.fingerprint holds it), trust it with\n  export VCDN_API_FINGERPRINT={seen}"
        ),
        ClientError::Tls(..) => format!(
            "{e}\n(vcdn up prints VCDN_API_FINGERPRINT to trust its self-signed certificate; with an operator certificate set VCDN_CA_FILE; an API served with --plain-http needs VCDN_API=http://…)"
        ),
        ClientError::Invalid(..) if api.starts_with("http://") => format!(
            "{e} (the API serves HTTPS unless started with --plain-http: try VCDN_API=https://…)"
        ),
        e => format!("{e} (is `vcdn up` running?)"),
    }
}

struct Client {
    api: String,
    endpoint: Endpoint,
    rt: tokio::runtime::Runtime,
    auth: String,
    json: bool,
}

impl Client {
    fn new(a: &ApiArgs) -> Result<Client, String> {
        let url = a
            .api
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        let trust = api_trust(a.api_fingerprint.as_deref(), a.ca_file.as_deref())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let endpoint = rt
            .block_on(Endpoint::new(&url, &trust))
            .map_err(|e| format!("{e} (set --api or VCDN_API, e.g. https://127.0.0.1:8070)"))?;
        let token = a
            .token
            .clone()
            .ok_or("no API key: set VCDN_TOKEN or --token (vcdn up prints one)")?;
        Ok(Client {
            api: url,
            endpoint,
            rt,
            auth: format!("Bearer {token}"),
            json: a.json,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let r = self
            .rt
            .block_on(self.endpoint.request(
                method,
                path,
                &[
                    ("Authorization", &self.auth),
                    ("Content-Type", "application/json"),
                ],
                body.as_bytes(),
                Duration::from_secs(60),
            ))
            .map_err(|e| explain(&self.api, &e))?;
        let v: Value = if r.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&r.body).unwrap_or_else(|_| json!(r.text()))
        };
        if r.status() >= 400 {
            let detail = v["detail"].as_str().unwrap_or("");
            let title = v["title"].as_str().unwrap_or("");
            return Err(format!("{} {title}: {detail}", r.status()));
        }
        Ok(v)
    }
}

/// Unix seconds as an HTTP date (UTC).
fn when(v: &Value) -> String {
    v.as_u64().map_or("-".into(), vcdn_http::date::format)
}

/// Unix milliseconds as the UTC time of day with milliseconds.
fn clock_ms(v: &Value) -> String {
    v.as_u64().map_or("-".into(), |ms| {
        let t = (ms / 1000) % 86_400;
        format!(
            "{:02}:{:02}:{:02}.{:03}",
            t / 3600,
            t / 60 % 60,
            t % 60,
            ms % 1000
        )
    })
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.clone()));
    }
    out
}

fn instances(v: &Value) -> Vec<Value> {
    v["graph"]["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| {
            r["instances"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |mut i| {
                    i["region"] = r["region"].clone();
                    i
                })
        })
        .collect()
}

fn show(v: &Value) -> String {
    let e = &v["entry_point"];
    let mut out = format!(
        "service   {} ({})\nstate     {}{}\nflavor    {}\norigin    {}\nhostname  {}\nDNS       {}\nURL       {}\nlease     {} .. {}\n",
        s(&v["name"]),
        s(&v["id"]),
        s(&v["state"]),
        v["error"].as_str().map(|e| format!(" ({e})")).unwrap_or_default(),
        s(&v["flavor"]),
        s(&v["origin"]),
        s(&v["hostname"]),
        s(&e["dns_server"]),
        s(&e["url"]),
        when(&v["lease"]["start"]),
        when(&v["lease"]["end"]),
    );
    if let Some(p) = e["srv6"]["chunk_prefix"].as_str() {
        let g = &v["graph"]["srv6"]["gateway"];
        out.push_str(&format!(
            "chunks    {p} port {} (a path's address: {})\ngateway   {} on {} ({}, pid {})\n",
            s(&e["srv6"]["port"]),
            s(&e["srv6"]["address_of_a_path"]),
            s(&g["id"]),
            s(&g["host"]),
            s(&g["state"]),
            s(&g["pid"]),
        ));
    }
    let c = &v["cost"];
    out.push_str(&format!(
        "cost      {} {} ({}: base {}, extra {}); {} vCPU-h, {} requests, {} bytes\n\n",
        s(&c["total"]),
        s(&c["currency"]),
        s(&c["scheme"]),
        s(&c["base"]),
        s(&c["extra"]),
        s(&c["vcpu_hours"]),
        s(&c["requests"]),
        s(&c["bytes"])
    ));
    let rows: Vec<Vec<String>> = instances(v)
        .iter()
        .map(|i| {
            vec![
                s(&i["region"]),
                s(&i["id"]),
                s(&i["host"]),
                s(&i["address"]),
                s(&i["state"]),
                s(&i["pid"]),
                s(&i["cpu_limit"]),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "REGION",
            "INSTANCE",
            "HOST",
            "ADDRESS",
            "STATE",
            "PID",
            "CPU LIMIT",
        ],
        &rows,
    ));
    out.push_str(&show_acceleration(&v["acceleration"]));
    out
}

/// The acceleration part of `vcdn service show`: entry point, what is
/// accelerated, the proxies and their usage (nothing without it).
fn show_acceleration(a: &Value) -> String {
    if a.is_null() {
        return String::new();
    }
    let e = &a["entry_point"];
    let paths: Vec<String> = a["paths"].as_array().into_iter().flatten().map(s).collect();
    let u = &a["usage"];
    let mut out = format!(
        "\n\nacceleration\nhostname  {}\nURL       {}\npaths     {}{}\negress    {}\nusage     {} requests, {} bytes, {} vCPU-s, {} CPU-s\n\n",
        s(&a["hostname"]),
        s(&e["url"]),
        if paths.is_empty() { "-".into() } else { paths.join(" ") },
        if a["uncacheable"] == true { " + everything uncacheable (caches fetch through their ingress)" } else { "" },
        s(&a["egress"]),
        u["requests"].as_u64().unwrap_or(0),
        u["bytes"].as_u64().unwrap_or(0),
        u["vcpu_seconds"].as_f64().map_or("0".into(), |x| format!("{x:.0}")),
        u["cpu_seconds"].as_f64().map_or("0".into(), |x| format!("{x:.1}")),
    );
    let rows: Vec<Vec<String>> = a["proxies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let roles: Vec<String> = p["roles"].as_array().into_iter().flatten().map(s).collect();
            vec![
                s(&p["location"]),
                roles.join("+"),
                s(&p["id"]),
                s(&p["host"]),
                s(&p["address"]),
                s(&p["state"]),
                s(&p["pid"]),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "LOCATION", "ROLE", "PROXY", "HOST", "ADDRESS", "STATE", "PID",
        ],
        &rows,
    ));
    out
}

pub fn run_service(a: ServiceArgs) -> Result<(), String> {
    let c = Client::new(&a.api)?;
    let out = match a.cmd {
        ServiceCmd::Create {
            name,
            origin,
            hostname,
            flavor,
            regions,
            bitrate_kbps,
            min_mos,
            response_ms,
            percentile,
            lease,
            accelerate,
            accelerate_uncacheable,
            accel_hostname,
            routing,
        } => {
            let mut body = json!({
                "name": name, "origin": origin, "hostname": hostname, "flavor": flavor,
                "regions": regions.iter().map(|(r, n)| {
                    let mut d = json!({"region": r, "peak_users": n});
                    if let Some(b) = bitrate_kbps { d["bitrate_kbps"] = json!(b); }
                    d
                }).collect::<Vec<_>>(),
                "quality": {"min_mos": min_mos, "response_ms": response_ms, "percentile": percentile},
                "lease": {"duration_s": lease},
            });
            if !accelerate.is_empty() || accelerate_uncacheable || accel_hostname.is_some() {
                body["acceleration"] = json!({
                    "paths": accelerate,
                    "uncacheable": accelerate_uncacheable,
                    "hostname": accel_hostname,
                });
            }
            if let Some(r) = routing {
                body["routing"] = json!(r);
            }
            let v = c.call("POST", "/v1/services", Some(&body))?;
            if c.json {
                v.to_string()
            } else {
                show(&v)
            }
        }
        ServiceCmd::List => {
            let v = c.call("GET", "/v1/services", None)?;
            if c.json {
                v.to_string()
            } else {
                let rows: Vec<Vec<String>> = v["services"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        let regions: Vec<String> = x["graph"]["regions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|r| {
                                format!(
                                    "{}:{}",
                                    s(&r["region"]),
                                    r["instances"].as_array().map_or(0, |i| i.len())
                                )
                            })
                            .collect();
                        vec![
                            s(&x["id"]),
                            s(&x["name"]),
                            s(&x["state"]),
                            s(&x["flavor"]),
                            s(&x["hostname"]),
                            regions.join(" "),
                            s(&x["cost"]["total"]),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "ID",
                        "NAME",
                        "STATE",
                        "FLAVOR",
                        "HOSTNAME",
                        "INSTANCES",
                        "COST",
                    ],
                    &rows,
                )
            }
        }
        ServiceCmd::Show { service } => {
            let v = c.call("GET", &format!("/v1/services/{service}"), None)?;
            if c.json {
                v.to_string()
            } else {
                show(&v)
            }
        }
        ServiceCmd::Delete { service } => {
            let v = c.call("DELETE", &format!("/v1/services/{service}"), None)?;
            if c.json {
                v.to_string()
            } else {
                format!("service {} {}", s(&v["id"]), s(&v["state"]))
            }
        }
        ServiceCmd::Events { service } => {
            let v = c.call("GET", &format!("/v1/services/{service}/events"), None)?;
            if c.json {
                v.to_string()
            } else {
                let rows: Vec<Vec<String>> = v["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        vec![
                            s(&e["seq"]),
                            clock_ms(&e["at_ms"]),
                            s(&e["kind"]),
                            s(&e["detail"]),
                        ]
                    })
                    .collect();
                table(&["SEQ", "TIME (UTC)", "KIND", "DETAIL"], &rows)
            }
        }
        ServiceCmd::Usage { service } => {
            let v = c.call("GET", &format!("/v1/services/{service}/usage"), None)?;
            if c.json {
                v.to_string()
            } else {
                table(
                    &[
                        "SCHEME", "VCPU-H", "REQUESTS", "BYTES", "BASE", "EXTRA", "TOTAL",
                    ],
                    &[vec![
                        s(&v["scheme"]),
                        s(&v["vcpu_hours"]),
                        s(&v["requests"]),
                        s(&v["bytes"]),
                        s(&v["base"]),
                        s(&v["extra"]),
                        format!("{} {}", s(&v["total"]), s(&v["currency"])),
                    ]],
                )
            }
        }
        ServiceCmd::History {
            service,
            since,
            step,
        } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let step = step.map_or(String::new(), |s| format!("&step={s}"));
            let from = now.saturating_sub(since);
            let v = c.call(
                "GET",
                &format!("/v1/services/{service}/timeseries?from={from}{step}"),
                None,
            )?;
            if c.json {
                v.to_string()
            } else {
                let step = v["step_s"].as_f64().unwrap_or(10.0);
                let mut rows = Vec::new();
                for r in v["regions"].as_array().into_iter().flatten() {
                    let col = |name: &str, i: usize| r[name].get(i).cloned().unwrap_or(Value::Null);
                    for (i, t) in r["t"].as_array().into_iter().flatten().enumerate() {
                        let rate = col("requests", i)
                            .as_f64()
                            .map_or("-".into(), |n| format!("{:.1}", n / step));
                        let pct = col("hit_ratio", i)
                            .as_f64()
                            .map_or("-".into(), |h| format!("{:.0} %", h * 100.0));
                        rows.push(vec![
                            clock_ms(&Value::from(t.as_u64().unwrap_or(0) * 1000)),
                            s(&r["region"]),
                            rate,
                            pct,
                            s(&col("instances", i)),
                            s(&col("mos_estimated", i)),
                            s(&col("mos_reported", i)),
                        ]);
                    }
                }
                table(
                    &[
                        "TIME (UTC)",
                        "REGION",
                        "REQ/S",
                        "HITS",
                        "INSTANCES",
                        "MOS EST",
                        "MOS REPORTED",
                    ],
                    &rows,
                )
            }
        }
        ServiceCmd::Purge {
            service,
            url,
            prefix,
            all,
        } => {
            let body = match (url, prefix) {
                (Some(u), _) => json!({"url": u}),
                (_, Some(p)) => json!({"prefix": p}),
                _ => json!({"all": all}),
            };
            fan_out(&c, &format!("/v1/services/{service}/purge"), &body)?
        }
        ServiceCmd::Prefetch { service, url } => fan_out(
            &c,
            &format!("/v1/services/{service}/prefetch"),
            &json!({"url": url}),
        )?,
        ServiceCmd::Catalog => {
            let v = c.call("GET", "/v1/catalog", None)?;
            if c.json {
                v.to_string()
            } else {
                let rows: Vec<Vec<String>> = v["flavors"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| {
                        let t = &f["template"];
                        let p = &f["pricing"];
                        vec![
                            s(&f["name"]),
                            s(&f["kind"]),
                            format!("{}-{}", s(&t["min_instances"]), s(&t["max_instances"])),
                            s(&t["vcpus_per_instance"]),
                            format!("{} {}/vCPU-h", s(&p["per_vcpu_hour"]), s(&p["currency"])),
                            s(&f["description"]),
                        ]
                    })
                    .collect();
                let regions: Vec<String> = v["regions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| s(&r["name"]))
                    .collect();
                format!(
                    "{}\n\nregions: {}",
                    table(
                        &[
                            "FLAVOR",
                            "KIND",
                            "INSTANCES",
                            "VCPU",
                            "PRICE",
                            "DESCRIPTION"
                        ],
                        &rows
                    ),
                    regions.join(", ")
                )
            }
        }
    };
    println!("{out}");
    Ok(())
}

fn fan_out(c: &Client, path: &str, body: &Value) -> Result<String, String> {
    let v = c.call("POST", path, Some(body))?;
    if c.json {
        return Ok(v.to_string());
    }
    let rows: Vec<Vec<String>> = v["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            vec![
                s(&i["region"]),
                s(&i["instance"]),
                i["status"]
                    .as_u64()
                    .map_or_else(|| s(&i["error"]), |x| x.to_string()),
                s(&i["result"]),
            ]
        })
        .collect();
    Ok(table(&["REGION", "INSTANCE", "STATUS", "RESULT"], &rows))
}

pub fn run_customer(a: CustomerArgs) -> Result<(), String> {
    let c = Client::new(&a.api)?;
    let out = match a.cmd {
        CustomerCmd::Create { name } => {
            let v = c.call("POST", "/v1/customers", Some(&json!({"name": name})))?;
            if c.json {
                v.to_string()
            } else {
                format!(
                    "customer {} ({})\nAPI key  {}   (shown only now)",
                    s(&v["name"]),
                    s(&v["id"]),
                    s(&v["api_key"])
                )
            }
        }
        CustomerCmd::List => {
            let v = c.call("GET", "/v1/customers", None)?;
            if c.json {
                v.to_string()
            } else {
                let rows: Vec<Vec<String>> = v["customers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| vec![s(&x["id"]), s(&x["name"]), when(&x["created_at"])])
                    .collect();
                table(&["ID", "NAME", "CREATED"], &rows)
            }
        }
    };
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_prints_the_acceleration_entry_point_proxies_and_usage() {
        let v = json!({
            "name": "shop", "id": "s-1", "state": "active", "graph": {"regions": []},
            "acceleration": {
                "hostname": "dyn.shop.example", "paths": ["/api/"], "uncacheable": true,
                "entry_point": {"url": "http://dyn.shop.example:8080/"},
                "egress": "marseille",
                "proxies": [
                    {"id": "i-p1", "location": "paris", "roles": ["ingress"], "host": "paris-1",
                     "address": "127.10.0.2:8080", "state": "running", "pid": 42},
                    {"id": "i-p2", "location": "marseille", "roles": ["egress"], "host": "marseille-1",
                     "address": "127.12.0.1:8080", "state": "running", "pid": 43}
                ],
                "usage": {"requests": 7, "bytes": 1000, "vcpu_seconds": 12.0, "cpu_seconds": 0.3}
            }
        });
        let out = show(&v);
        assert!(
            out.contains("URL       http://dyn.shop.example:8080/"),
            "{out}"
        );
        assert!(
            out.contains("paths     /api/ + everything uncacheable"),
            "{out}"
        );
        assert!(out.contains("egress    marseille"), "{out}");
        assert!(
            out.contains("usage     7 requests, 1000 bytes, 12 vCPU-s, 0.3 CPU-s"),
            "{out}"
        );
        assert!(out.contains("paris      ingress  i-p1"), "{out}");
        assert!(out.contains("marseille  egress   i-p2"), "{out}");
        // Without acceleration, nothing more than before.
        assert!(!show(&json!({"graph": {"regions": []}})).contains("acceleration"));
    }

    #[test]
    fn create_takes_the_acceleration_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(subcommand)]
            cmd: ServiceCmd,
        }
        let t = T::try_parse_from([
            "t",
            "create",
            "shop",
            "--origin",
            "http://o.example",
            "--hostname",
            "shop.example",
            "--region",
            "paris=10",
            "--accelerate",
            "/api/",
            "--accelerate",
            "/cart/",
            "--accelerate-uncacheable",
            "--accel-hostname",
            "fast.shop.example",
        ])
        .unwrap();
        let ServiceCmd::Create {
            accelerate,
            accelerate_uncacheable,
            accel_hostname,
            ..
        } = t.cmd
        else {
            panic!("not create")
        };
        assert_eq!(accelerate, ["/api/", "/cart/"]);
        assert!(accelerate_uncacheable);
        assert_eq!(accel_hostname.as_deref(), Some("fast.shop.example"));
    }
}
