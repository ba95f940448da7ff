//! `vcdn player`: DASH sessions against a server, with QoE.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use vcdn_player::{Mode, PlayerOptions, Quality};

#[derive(Args)]
pub struct PlayerArgs {
    /// The MPD, http://host:port/path/manifest.mpd (with --chunks: the
    /// base URL, http://address:port; not needed with --chunk-prefix).
    #[arg(long, required_unless_present = "chunk_prefix", default_value = "")]
    url: String,
    /// More servers of the same content, http://host:port (repeat):
    /// sessions are spread evenly over --url and these.
    #[arg(long = "mirror")]
    mirrors: Vec<String>,
    /// Resolve the URL's host name at this DNS server (e.g. the vCDN
    /// router's), again whenever the answer's TTL runs out: sessions spread
    /// over the caches it names and follow them as they come and go.
    #[arg(long, conflicts_with = "mirrors")]
    dns: Option<std::net::SocketAddr>,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Seconds to play.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Seconds over which sessions start.
    #[arg(long, default_value_t = 1.0)]
    ramp: f64,
    /// adaptive (dash.js's rule: throughput, then BOLA on a long buffer),
    /// highest, lowest, or a representation index (0 = lowest).
    #[arg(long, default_value = "adaptive", value_parser = parse_quality)]
    quality: Quality,
    /// closed: as a viewer's player, the next segment when the previous one
    /// has arrived and the buffer has room (a slow server makes stalls);
    /// open: as a load generator, segment i at (i - 3) segment durations
    /// whatever happened before (the offered load does not fall when the
    /// server slows).
    #[arg(long, default_value = "closed", value_parser = parse_mode)]
    mode: Mode,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    /// Plain HTTP load on --url instead of DASH sessions.
    #[arg(long)]
    http: bool,
    /// HTTP load: keep-alive connections.
    #[arg(long, default_value_t = 10, requires = "http")]
    connections: usize,
    /// Send the mean MOS every 16 s to this URL (the control plane's
    /// /v1/services/NAME/qoe), with --qoe-token and --qoe-region.
    #[arg(long, requires_all = ["qoe_token", "qoe_region"])]
    qoe_to: Option<String>,
    #[arg(long, env = "VCDN_TOKEN", hide_env_values = true)]
    qoe_token: Option<String>,
    #[arg(long)]
    qoe_region: Option<String>,
    /// Trust an https --qoe-to by its certificate's fingerprint (what
    /// `vcdn up` prints) [default: the system's CAs].
    #[arg(long, env = "VCDN_API_FINGERPRINT")]
    qoe_fingerprint: Option<String>,
    /// Seconds a request may take before it counts as failed (a viewer's
    /// player gives up on a segment too; a deliberately slow origin needs more).
    #[arg(long, default_value_t = 10.0)]
    request_timeout: f64,
    /// Chunk catalogue load (the content-aware data-plane paper's query
    /// generator): --clients clients each fetch a Zipf(--zipf) chunk of a
    /// --catalogue on a new connection, again and again; from --url (a
    /// router or cache base, http://host:port) or, with --chunk-prefix,
    /// from each chunk's own IPv6 address.
    #[arg(long, conflicts_with = "http")]
    chunks: bool,
    /// The service's chunk /64 (SRv6 addressing: prefix | content id).
    #[arg(long, requires = "chunks")]
    chunk_prefix: Option<std::net::Ipv6Addr>,
    /// The port chunk addresses serve on.
    #[arg(long, default_value_t = 80, requires = "chunk_prefix")]
    chunk_port: u16,
    #[arg(long, default_value_t = 10_000, requires = "chunks")]
    catalogue: u64,
    #[arg(long, default_value_t = 0.9, requires = "chunks")]
    zipf: f64,
    /// Bytes of every chunk (/size/BYTES/cK at the demo origin).
    #[arg(long, default_value_t = 112_500, requires = "chunks")]
    object_bytes: u64,
    #[arg(long, default_value_t = 10, requires = "chunks")]
    clients: usize,
    /// Requests measured, after --warmup requests not measured.
    #[arg(long, default_value_t = 10_000, requires = "chunks")]
    requests: u64,
    #[arg(long, default_value_t = 0, requires = "chunks")]
    warmup: u64,
    #[arg(long, default_value_t = 1, requires = "chunks")]
    seed: u64,
    /// The Host of --chunks requests (the service's hostname, for a router).
    #[arg(long, default_value = "video", requires = "chunks")]
    host: String,
    /// HTTP load: total requests per second (open loop); without it each
    /// connection sends back to back (closed loop).
    #[arg(long, requires = "http")]
    rate: Option<f64>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "closed" => Ok(Mode::Closed),
        "open" => Ok(Mode::Open),
        _ => Err(format!("{s}: give closed or open")),
    }
}

fn parse_quality(s: &str) -> Result<Quality, String> {
    Ok(match s {
        "highest" => Quality::Highest,
        "lowest" => Quality::Lowest,
        "adaptive" => Quality::Adaptive,
        n => Quality::Index(
            n.parse()
                .map_err(|_| format!("{s}: give highest, lowest, adaptive or an index"))?,
        ),
    })
}

pub fn run(a: PlayerArgs) -> Result<(), String> {
    if a.sessions == 0
        || a.sessions > 1_000_000
        || a.duration.is_nan()
        || a.duration <= 0.0
        || a.duration > 86_400.0
        || a.ramp.is_nan()
        || a.ramp < 0.0
        || a.ramp > 86_400.0
    {
        return Err(
            "give 1 to 1,000,000 --sessions, a --duration up to a day and a --ramp of 0 to a day"
                .into(),
        );
    }
    if !(0.1..=3_600.0).contains(&a.request_timeout) {
        return Err("give a --request-timeout of 0.1 to 3,600 seconds".into());
    }
    let request_timeout = Duration::from_secs_f64(a.request_timeout);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    if a.chunks {
        if !(a.zipf.is_finite() && a.zipf > 0.0 && a.zipf <= 5.0)
            || a.object_bytes == 0
            || a.clients > 100_000
        {
            return Err(
                "give a --zipf in (0, 5], positive --object-bytes and at most 100,000 --clients"
                    .into(),
            );
        }
        let target = match a.chunk_prefix {
            Some(prefix) => vcdn_player::chunks::ChunkTarget::Srv6 {
                prefix,
                port: a.chunk_port,
            },
            None => {
                let base = a.url.trim_start_matches("http://").trim_end_matches('/');
                vcdn_player::chunks::ChunkTarget::Http {
                    base: base
                        .parse()
                        .map_err(|_| format!("--url {}: give http://ADDRESS:PORT", a.url))?,
                }
            }
        };
        let opts = vcdn_player::chunks::ChunkLoadOptions {
            target,
            catalogue: a.catalogue,
            alpha: a.zipf,
            object_bytes: a.object_bytes,
            clients: a.clients,
            requests: a.requests,
            warmup: a.warmup,
            max_duration: Duration::from_secs_f64(a.duration),
            seed: a.seed,
            timeout: request_timeout,
            progress: !a.quiet,
            host: a.host.clone(),
        };
        let report = rt
            .block_on(vcdn_player::chunks::run(opts))
            .map_err(|e| e.to_string())?;
        say(&serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
        return write_report(a.report.as_deref(), &report);
    }
    if a.http {
        if a.connections == 0
            || a.connections > 100_000
            || a.rate.is_some_and(|r| r.is_nan() || r <= 0.0)
        {
            return Err("give 1 to 100,000 --connections and a positive --rate".into());
        }
        let opts = vcdn_player::load::LoadOptions {
            url: a.url.clone(),
            connections: a.connections,
            rate: a.rate,
            duration: Duration::from_secs_f64(a.duration),
            timeout: request_timeout,
            progress: !a.quiet,
        };
        let report = rt
            .block_on(vcdn_player::load::load(opts))
            .map_err(|e| e.to_string())?;
        say(&vcdn_player::load::describe(&report));
        return write_report(a.report.as_deref(), &report);
    }
    let opts = PlayerOptions {
        url: a.url.clone(),
        sessions: a.sessions,
        duration: Duration::from_secs_f64(a.duration),
        ramp: Duration::from_secs_f64(a.ramp),
        quality: a.quality,
        mode: a.mode,
        progress: !a.quiet,
        mirrors: a.mirrors.clone(),
        dns: a.dns,
        qoe_report: match a.qoe_to.clone() {
            Some(url) => Some(vcdn_player::QoeReport {
                url,
                token: a.qoe_token.clone().unwrap_or_default(),
                region: a.qoe_region.clone().unwrap_or_default(),
                trust: crate::service_cmd::api_trust(a.qoe_fingerprint.as_deref(), None)?,
            }),
            None => None,
        },
        request_timeout,
        ..PlayerOptions::default()
    };
    let report = rt
        .block_on(vcdn_player::run(opts))
        .map_err(|e| e.to_string())?;
    say(&vcdn_player::describe(&report));
    write_report(a.report.as_deref(), &report)
}

/// Prints to stdout, ignoring a reader that went away (`vcdn player … | head`):
/// the report file must still be written.
fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn write_report<T: serde::Serialize>(
    path: Option<&std::path::Path>,
    report: &T,
) -> Result<(), String> {
    if let Some(p) = path {
        let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        std::fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        say(&format!("report written to {}", p.display()));
    }
    Ok(())
}
