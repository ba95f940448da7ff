//! `vcdn player`: DASH sessions against a server, with QoE.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use vcdn_player::{PlayerOptions, Quality};

#[derive(Args)]
pub struct PlayerArgs {
    /// The MPD, http://host:port/path/manifest.mpd
    #[arg(long)]
    url: String,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Seconds to play.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Seconds over which sessions start.
    #[arg(long, default_value_t = 1.0)]
    ramp: f64,
    /// highest, lowest, adaptive, or a representation index (0 = lowest).
    #[arg(long, default_value = "highest", value_parser = parse_quality)]
    quality: Quality,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    let opts = PlayerOptions {
        url: a.url.clone(),
        sessions: a.sessions,
        duration: Duration::from_secs_f64(a.duration),
        ramp: Duration::from_secs_f64(a.ramp),
        quality: a.quality,
        progress: !a.quiet,
        ..PlayerOptions::default()
    };
    let report = rt
        .block_on(vcdn_player::run(opts))
        .map_err(|e| e.to_string())?;
    println!("{}", vcdn_player::describe(&report));
    if let Some(p) = a.report {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        println!("report written to {}", p.display());
    }
    Ok(())
}
