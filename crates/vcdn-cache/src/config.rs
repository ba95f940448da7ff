//! Cache configuration: a TOML file, overridden by flags and `VCDN_*`
//! environment variables in the binary, with defaults that work on one
//! machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Everything `vcdn cache` can be told.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Address clients connect to.
    pub listen: SocketAddr,
    /// Address clients connect to over TLS (HTTP/1.1 and HTTP/2 by ALPN).
    /// None: no TLS listener.
    pub tls_listen: Option<SocketAddr>,
    /// Certificates loaded at start: `NAME.crt` (PEM chain, server
    /// certificate first) and `NAME.key` (PEM key), optionally `NAME.ocsp`
    /// (a DER OCSP response to staple). NAME is the host name, or
    /// `_wildcard.example.com` for `*.example.com`. More are pushed live
    /// through the admin API.
    pub tls_cert_dir: Option<PathBuf>,
    /// Origin or parent cache: `http://host:port[/base-path]`, or
    /// `https://...` (TLS, verified against the system roots or
    /// `origin_ca_file`).
    pub upstream: String,
    /// PEM bundle of the CA certificates an `https://` upstream is
    /// verified against instead of the system roots.
    pub origin_ca_file: Option<PathBuf>,
    /// Name sent in SNI and verified in an `https://` upstream's
    /// certificate instead of the URL's host: for an origin addressed by
    /// IP, or to pin the name.
    pub origin_tls_name: Option<String>,
    /// Address of the control API, `/metrics` and `/healthz`.
    pub admin: Option<SocketAddr>,
    /// Bearer token the control API requires.
    pub admin_token: Option<String>,
    /// Serve the control API over HTTPS with this certificate chain and
    /// its key (PEM). Without them it is plain HTTP, refused off loopback.
    pub admin_tls_cert: Option<PathBuf>,
    pub admin_tls_key: Option<PathBuf>,
    /// Who this process is, as the control plane that started it knows it
    /// (shown in `/healthz` and `/stats`, so that an address answering
    /// is not taken for the right instance when it is another one).
    pub instance_id: Option<String>,
    /// Bytes of the memory tier.
    /// This bounds all memory for objects: the memory tier (shared-memory
    /// bodies included) and the bodies being fetched into it (at most a
    /// quarter). Larger objects go to the disk tier as they arrive, or pass
    /// through within `stream_window`.
    #[serde(deserialize_with = "size")]
    pub memory: u64,
    /// Directory of the disk tier (none: memory only). New or empty, or
    /// one a vcdn cache created (it holds a `VCDN-DISK-TIER` marker).
    pub disk: Option<PathBuf>,
    /// Bytes of the disk tier.
    #[serde(deserialize_with = "size")]
    pub disk_size: u64,
    /// Serving threads (0: one per available CPU).
    pub threads: usize,
    /// Name used in Via (a random suffix makes it unique per process, so a
    /// forwarding loop is detected without false alarms in a hierarchy).
    pub via: String,
    pub upstream_connect_timeout_ms: u64,
    pub upstream_read_timeout_ms: u64,
    pub upstream_max_idle: usize,
    /// A pooled upstream connection idle this long is closed rather than
    /// reused: under the origin's own keep-alive timeout (Apache: 5 s), so
    /// the cache does not send a request into a connection the origin is
    /// closing.
    pub upstream_idle_timeout_ms: u64,
    /// The operator's origin policy, applied to every address the cache
    /// connects to upstream: `deny non-public, allow 127.0.0.1:9000`
    /// (see `vcdn_policy::origin`). Empty: every address is allowed.
    pub origin_policy: String,
    /// A client has this long to send a request head once it started.
    pub header_timeout_ms: u64,
    /// An idle keep-alive connection is closed after this long.
    pub idle_timeout_ms: u64,
    /// A client that accepts no bytes for this long is dropped.
    pub send_timeout_ms: u64,
    pub max_request_line: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// Largest request body forwarded, bytes (bodies are streamed to the
    /// upstream, not held: this is a policy limit, not a memory one).
    #[serde(deserialize_with = "size")]
    pub max_request_body: u64,
    /// A request body that sends nothing for this long is answered 408.
    pub request_body_idle_timeout_ms: u64,
    /// A request body must average at least this many bytes per second
    /// (time spent waiting for the upstream to take it does not count),
    /// after `request_body_grace_ms`; else 408. 0: no minimum.
    pub request_body_min_rate: u64,
    pub request_body_grace_ms: u64,
    pub max_connections: usize,
    /// Largest lead of the fastest over the slowest client of one stream
    /// that is too large to cache, bytes.
    #[serde(deserialize_with = "size")]
    pub stream_window: u64,
    /// Revalidate when a client sends `Cache-Control: no-cache` (RFC);
    /// false shields the upstream from forced reloads.
    pub honor_client_no_cache: bool,
    /// Targeted cache-control fields obeyed ahead of Cache-Control.
    pub targeted_fields: Vec<String>,
    /// Heuristic freshness as a fraction of the time since Last-Modified.
    pub heuristic_fraction: f64,
    pub heuristic_max_s: u64,
    /// LRU admission filter size (content-aware data plane paper, §III-A):
    /// a GET for content not among the last N distinct paths requested is
    /// answered `302` to `admission_redirect` instead of being proxied, so
    /// unpopular content neither loads nor pollutes this cache. None: admit
    /// everything.
    pub admission_filter: Option<usize>,
    /// Where filtered requests are sent (default: the upstream).
    pub admission_redirect: Option<String>,
    /// The service's chunk /64s this cache answers on (the SRv6 data path:
    /// its agent delivers connections for any address in them, see
    /// `crate::chunks`). A request on a connection to a chunk address must
    /// name that chunk, else 421. Empty: no chunk addresses, and no check.
    pub chunk_prefixes: Vec<String>,
    /// How paths name chunks on `chunk_prefixes`: the service's segment
    /// template, as the router is given it. None: a path's chunk id is the
    /// hash of the path (`vcdn_content::content_id`).
    pub chunk_template: Option<ChunkTemplate>,
    /// A listener for chunk addresses besides `listen`, e.g. `[::]:80`,
    /// bound in `chunk_netns` when given: the edge's own network stack
    /// (its agent's namespace), while the admin API and the upstream stay
    /// in this process's. Needs `chunk_prefixes`.
    pub chunk_listen: Option<SocketAddr>,
    /// The network namespace `chunk_listen` is bound in: a name under
    /// `/run/netns` or a path (`/proc/PID/ns/net`).
    pub chunk_netns: Option<String>,
    /// Run the edge's SRv6 agent in this process (`crate::srv6`): the LRU
    /// filter in the kernel in front of the chunk listener.
    pub srv6: Option<CacheSrv6>,
    /// Serve the hit path from io_uring when the kernel allows it (see
    /// `ring.rs`); false keeps every connection on the epoll loop.
    pub io_uring: bool,
    /// Forward TRACE requests to the upstream. Off by default: TRACE echoes
    /// the request, cookies and credentials included, so it is answered
    /// 405 with an `Allow` field unless the service asks for it.
    pub allow_trace: bool,
    /// HTTP/2 (see `h2front.rs`): streams a client may have open at once
    /// on one connection; more are refused with `REFUSED_STREAM`.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2 receive window of one stream (request bodies), bytes.
    pub h2_stream_window: u32,
    /// HTTP/2 receive window of one connection, bytes: all the request
    /// body bytes a client can make this cache hold per connection.
    pub h2_connection_window: u32,
    /// HTTP/2 response bytes buffered per stream ahead of the socket.
    pub h2_max_send_buffer: usize,
    /// Streams a client opened and reset within one read, before they
    /// were answered; more is a rapid-reset attack (CVE-2023-44487)
    /// answered with GOAWAY `ENHANCE_YOUR_CALM`.
    pub h2_max_pending_accept_reset_streams: usize,
    /// Streams this cache had to reset for the client's protocol errors,
    /// per connection; more is answered with GOAWAY `ENHANCE_YOUR_CALM`.
    pub h2_max_local_error_reset_streams: usize,
    /// Streams the client reset after it opened them (while or after they
    /// were answered), per connection, beyond which (when they are also over half of the
    /// connection's streams) the connection is cut off with GOAWAY
    /// `ENHANCE_YOUR_CALM`: rapid reset paced so that each stream is
    /// accepted, and its upstream work started, before its reset arrives.
    pub h2_max_client_resets: u64,
    /// On shutdown (SIGTERM), how long open HTTP/2 streams may take to
    /// finish after GOAWAY, ms.
    pub drain_timeout_ms: u64,
    /// The deployment's telemetry key file (member-only, handed over by
    /// the control plane). None: no telemetry agent runs, as before.
    pub telemetry_keys: Option<PathBuf>,
    /// This cache's telemetry node id and record source (the instance id).
    pub telemetry_node: Option<String>,
    /// UDP port of telemetry discovery broadcasts.
    pub telemetry_discovery_port: u16,
    /// Where discovery broadcasts go (127.255.255.255 on one host).
    pub telemetry_broadcast: std::net::IpAddr,
    /// How often `edge.stats` is published, ms.
    pub telemetry_interval_ms: u64,
    /// Also a datasink producer: once a data sink answers, records go to
    /// Kafka too (acks=all), for billing (`vcdn up --kafka` sets it).
    pub telemetry_kafka: bool,
}

/// The edge's SRv6 agent (`srv6`): its routes go in `chunk_netns`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSrv6 {
    /// This edge's SID (the dispatcher's segment lists name it).
    pub sid: std::net::Ipv6Addr,
    /// Dispatchers' SIDs; their /64s may send here.
    pub dispatchers: Vec<std::net::Ipv6Addr>,
    /// The device the SID is reached by and clients are answered by.
    #[serde(default = "default_srv6_device")]
    pub device: String,
    /// The route to clients that gets the reply program.
    #[serde(default = "default_srv6_clients")]
    pub clients: String,
    /// auto (sized from α and N estimated online and this cache's C2),
    /// none (accept every connection: an origin gateway) or a size.
    #[serde(default = "default_srv6_filter")]
    pub filter: String,
    /// Routing table of the local delivery hairpin.
    #[serde(default = "default_srv6_table")]
    pub table: u32,
    /// Connections the agent remembers.
    #[serde(default = "default_srv6_conns")]
    pub conns: u32,
    /// How often an auto filter is re-sized, ms.
    #[serde(default = "default_srv6_sizing_ms")]
    pub sizing_interval_ms: u64,
}

impl CacheSrv6 {
    /// The defaults for `sid` trusting `dispatchers`.
    pub fn new(sid: std::net::Ipv6Addr, dispatchers: Vec<std::net::Ipv6Addr>) -> CacheSrv6 {
        CacheSrv6 {
            sid,
            dispatchers,
            device: default_srv6_device(),
            clients: default_srv6_clients(),
            filter: default_srv6_filter(),
            table: default_srv6_table(),
            conns: default_srv6_conns(),
            sizing_interval_ms: default_srv6_sizing_ms(),
        }
    }
}

fn default_srv6_device() -> String {
    "eth0".into()
}
fn default_srv6_clients() -> String {
    "::/0".into()
}
fn default_srv6_filter() -> String {
    "auto".into()
}
fn default_srv6_table() -> u32 {
    100
}
fn default_srv6_conns() -> u32 {
    65_536
}
fn default_srv6_sizing_ms() -> u64 {
    5_000
}

/// A service's DASH segment template (`chunk_template`), as the router's
/// `[services.template]` gives it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkTemplate {
    /// e.g. `/vod/$Video$/$RepresentationID$/seg-$Number$.m4s`
    pub path: String,
    /// Representation ids (or bandwidths) in quality order.
    #[serde(default)]
    pub representations: Vec<String>,
    /// Segment duration in seconds.
    #[serde(default = "two_seconds")]
    pub segment_duration_s: f64,
}

fn two_seconds() -> f64 {
    2.0
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            listen: "127.0.0.1:8080".parse().expect("static address"),
            tls_listen: None,
            tls_cert_dir: None,
            upstream: "http://127.0.0.1:9000".into(),
            origin_ca_file: None,
            origin_tls_name: None,
            admin: None,
            admin_token: None,
            admin_tls_cert: None,
            admin_tls_key: None,
            instance_id: None,
            memory: 256 << 20,
            disk: None,
            disk_size: 1 << 30,
            threads: 0,
            via: "vcdn".into(),
            upstream_connect_timeout_ms: 3_000,
            upstream_read_timeout_ms: 30_000,
            upstream_max_idle: 64,
            upstream_idle_timeout_ms: 4_000,
            origin_policy: String::new(),
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            max_request_line: 8 * 1024,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_request_body: 16 << 20,
            request_body_idle_timeout_ms: 10_000,
            request_body_min_rate: 1024,
            request_body_grace_ms: 10_000,
            max_connections: 100_000,
            stream_window: 8 << 20,
            honor_client_no_cache: true,
            targeted_fields: vec!["CDN-Cache-Control".into()],
            heuristic_fraction: 0.1,
            heuristic_max_s: 86_400,
            admission_filter: None,
            admission_redirect: None,
            chunk_prefixes: Vec::new(),
            chunk_template: None,
            chunk_listen: None,
            chunk_netns: None,
            srv6: None,
            io_uring: true,
            allow_trace: false,
            h2_max_concurrent_streams: 100,
            h2_stream_window: 256 << 10,
            h2_connection_window: 1 << 20,
            h2_max_send_buffer: 256 << 10,
            h2_max_pending_accept_reset_streams: 20,
            h2_max_local_error_reset_streams: 1024,
            h2_max_client_resets: 1000,
            drain_timeout_ms: 10_000,
            telemetry_keys: None,
            telemetry_node: None,
            telemetry_discovery_port: 12555,
            telemetry_broadcast: std::net::Ipv4Addr::new(127, 255, 255, 255).into(),
            telemetry_interval_ms: 100,
            telemetry_kafka: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("invalid configuration in {0}: {1}")]
    Parse(PathBuf, toml::de::Error),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl CacheConfig {
    pub fn from_file(path: &std::path::Path) -> Result<CacheConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.into(), e))?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse(path.into(), e))
    }

    /// Check what cannot be expressed in types.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if self.admin.is_some() && self.admin_token.as_deref().unwrap_or("").is_empty() {
            return bad("--admin needs --admin-token: the control API is always protected");
        }
        if let Some(t) = self.admin_token.as_deref().filter(|t| !t.is_empty()) {
            vcdn_http::auth::check_token_strength("--admin-token", t)
                .map_err(ConfigError::Invalid)?;
        }
        if self.tls_cert_dir.is_some() && self.tls_listen.is_none() {
            return bad(
                "--tls-cert-dir needs --tls-listen: certificates are only used by the TLS listener",
            );
        }
        if self.memory < 64 * 1024 {
            return bad("--memory must be at least 64 KiB");
        }
        if self.disk.is_some() && self.disk_size < 1 << 20 {
            return bad("--disk-size must be at least 1 MiB");
        }
        if !self.upstream.starts_with("http://") && !self.upstream.starts_with("https://") {
            return bad("--upstream must be an http:// or https:// URL");
        }
        if let Err(e) = self
            .origin_policy
            .parse::<vcdn_policy::origin::OriginPolicy>()
        {
            return Err(ConfigError::Invalid(format!(
                "--origin-policy {:?}: {e}",
                self.origin_policy
            )));
        }
        if self.h2_max_concurrent_streams == 0 {
            return bad("h2_max_concurrent_streams must be at least 1");
        }
        if !(65_535..=(1 << 31) - 1).contains(&self.h2_stream_window)
            || !(65_535..=(1 << 31) - 1).contains(&self.h2_connection_window)
        {
            return bad("h2_stream_window and h2_connection_window must be between 65535 and 2147483647 bytes (RFC 9113 §6.9.2)");
        }
        if self.h2_max_send_buffer < 16 << 10 || self.h2_max_send_buffer > u32::MAX as usize {
            return bad("h2_max_send_buffer must be between 16 KiB and 4 GiB");
        }
        if let Some(r) = &self.admission_redirect {
            if !r.starts_with("http://") && !r.starts_with("https://") {
                return bad("--admission-redirect must be an http:// or https:// URL");
            }
        }
        Ok(())
    }
}

/// Parse a byte size: a number with an optional K, M, G or T suffix
/// (binary multiples; "KiB", "MB" and friends accepted too).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 1048576, 64M, 2G)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("{s:?}: unknown size unit (use K, M, G or T)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        N(u64),
        S(String),
    }
    match Size::deserialize(d)? {
        Size::N(n) => Ok(n),
        Size::S(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("42").unwrap(), 42);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2 GiB").unwrap(), 2 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("5Q").is_err());
    }

    #[test]
    fn toml_file() {
        let c: CacheConfig = toml::from_str(
            "listen = \"127.0.0.1:1\"\nupstream = \"http://127.0.0.1:2\"\nmemory = \"1G\"\n",
        )
        .unwrap();
        assert_eq!(c.memory, 1 << 30);
        assert!(toml::from_str::<CacheConfig>("bogus = 1").is_err());
    }
}
