//! `vcdn netem`: flags → `vcdn_netem::Shim`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::Args;
use vcdn_cache::config::parse_size;
use vcdn_netem::{Limits, PathSpec, Shim, ShimStats};

#[derive(Args)]
pub struct NetemArgs {
    /// Address clients connect to.
    #[arg(long, default_value = "127.0.0.1:9100", env = "VCDN_NETEM_LISTEN")]
    listen: SocketAddr,
    /// Where every connection is relayed: host:port (or http://host:port).
    #[arg(long, env = "VCDN_NETEM_TARGET")]
    target: String,
    /// One-way delay each way, ms (a round trip costs twice this; a new
    /// connection one round trip more).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// One-way delay client → target, ms [default: --delay-ms].
    #[arg(long)]
    up_delay_ms: Option<u64>,
    /// One-way delay target → client, ms [default: --delay-ms].
    #[arg(long)]
    down_delay_ms: Option<u64>,
    /// Bandwidth cap each way, kbit/s, shared by all connections
    /// [default: uncapped].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    rate_kbit: Option<u64>,
    /// Cap client → target, kbit/s [default: --rate-kbit].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    up_rate_kbit: Option<u64>,
    /// Cap target → client (responses), kbit/s [default: --rate-kbit].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    down_rate_kbit: Option<u64>,
    /// Bytes queued per connection and direction, e.g. 1M; must be at
    /// least rate × delay for the rate to be reachable [default: twice
    /// that, at least 256K].
    #[arg(long, value_parser = parse_size)]
    queue: Option<u64>,
    /// Connections relayed at once; more are reset.
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
}

pub fn run(a: NetemArgs) -> Result<(), String> {
    let host = a.target.trim_start_matches("http://").trim_end_matches('/');
    let target = host
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve --target {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("--target {host} has no address"))?;
    let ms = Duration::from_millis;
    let kbit = |k: Option<u64>| k.or(a.rate_kbit).map(|k| k.saturating_mul(1000));
    let spec = PathSpec {
        delay_up: ms(a.up_delay_ms.unwrap_or(a.delay_ms)),
        delay_down: ms(a.down_delay_ms.unwrap_or(a.delay_ms)),
        rate_up_bps: kbit(a.up_rate_kbit),
        rate_down_bps: kbit(a.down_rate_kbit),
        queue_bytes: a.queue.map(|q| q.min(usize::MAX as u64) as usize),
    };
    let limits = Limits {
        max_connections: a.max_connections,
        ..Limits::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    rt.block_on(async move {
        let shim = Shim::start_with(a.listen, target, spec, limits)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
        let rate = |r: Option<u64>| r.map_or("uncapped".into(), |b| format!("{} kbit/s", b / 1000));
        println!(
            "vcdn netem listening on http://{}/ → {target} (delay up {} ms, down {} ms; rate up {}, down {})",
            shim.local_addr(),
            spec.delay_up.as_millis(),
            spec.delay_down.as_millis(),
            rate(spec.rate_up_bps),
            rate(spec.rate_down_bps),
        );
        tracing::info!(listen = %shim.local_addr(), %target, ?spec, "vcdn netem ready");
        // The counters, every 10 s while they move.
        let mut last = ShimStats::default();
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let s = shim.stats();
            if s != last {
                tracing::info!(
                    bytes_up = s.bytes_up,
                    bytes_down = s.bytes_down,
                    connections = s.connections,
                    active = s.active,
                    refused = s.refused,
                    connect_failures = s.connect_failures,
                    queued_bytes = s.queued_bytes,
                    "netem counters"
                );
                last = s;
            }
        }
    })
}
