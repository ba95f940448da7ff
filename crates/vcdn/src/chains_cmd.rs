//! `vcdn chains`: which proxy chain MOSTO's model picks between two
//! locations for a transfer size, and the pair's whole Pareto front.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use vcdn_cache::config::parse_size;
use vcdn_policy::chains::{ChainTable, RttMatrix};

/// Largest input file read.
const MAX_FILE: u64 = 64 << 20;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["rtt_matrix", "topology"])))]
pub struct ChainsArgs {
    /// RTTs between locations: CSV lines `src,dst,rtt_ms`, one per directed
    /// pair (header optional); pairs left out are unknown.
    #[arg(long)]
    rtt_matrix: Option<PathBuf>,
    /// An edge list `src,dst,delay_ms` of one-way link delays (as
    /// shared/data/topologies/*.edges.csv), completed to a full mesh by
    /// shortest paths, RTT = 2 × delay.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// Where the transfer enters the chain (a node name).
    #[arg(long)]
    from: String,
    /// Where it leaves (a node name).
    #[arg(long)]
    to: String,
    /// Transfer size, e.g. 14600, 500K, 2M [default: unknown, chosen as large].
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
}

/// A text input file, refused above `max` bytes (read no further).
pub(crate) fn read_limited(path: &Path, max: u64) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    f.take(max + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > max {
        return Err(format!("{}: larger than {max} bytes", path.display()));
    }
    Ok(text)
}

fn read(path: &Path) -> Result<String, String> {
    read_limited(path, MAX_FILE)
}

pub fn run(a: ChainsArgs) -> Result<(), String> {
    let (path, m) = match (&a.rtt_matrix, &a.topology) {
        (Some(p), _) => (p, RttMatrix::from_csv(&read(p)?)),
        (None, Some(p)) => (p, RttMatrix::from_topology(&read(p)?)),
        (None, None) => return Err("give --rtt-matrix FILE or --topology FILE".into()),
    };
    let m = m.map_err(|e| format!("{}: {e}", path.display()))?;
    let node = |name: &str| {
        m.index(name).ok_or_else(|| {
            let some: Vec<&str> = m.names().iter().take(10).map(String::as_str).collect();
            let more = if m.len() > 10 { ", …" } else { "" };
            format!(
                "{}: no node named {name:?} (its {} nodes: {}{more})",
                path.display(),
                m.len(),
                some.join(", ")
            )
        })
    };
    let (from, to) = (node(&a.from)?, node(&a.to)?);
    let table = ChainTable::build(&m);
    let chain = table.lookup(from, to, a.size).map_err(|_| {
        let parts = m.components().len();
        let why = if parts > 1 {
            format!(" (the input has {parts} parts with no link between them)")
        } else {
            String::new()
        };
        format!("no path from {} to {}{why}", a.from, a.to)
    })?;
    let names =
        |nodes: &[usize]| -> Vec<String> { nodes.iter().map(|&k| m.names()[k].clone()).collect() };
    let r = chain.rounds;
    let front = table
        .front(from, to)
        .map_err(|e| e.to_string())?
        .iter()
        .map(|p| Point {
            chain: names(&p.nodes),
            proxies: p.proxies,
            sum_rtt_ms: p.sum_ms,
            max_rtt_ms: p.max_ms,
            predicted_ms: p.sum_ms / 2.0 + (r - 1) as f64 * p.max_ms,
        })
        .collect();
    let out = Answer {
        from: a.from,
        to: a.to,
        size_bytes: a.size,
        rounds: r,
        chain: Point {
            chain: names(&chain.nodes),
            proxies: chain.nodes.len().saturating_sub(2),
            sum_rtt_ms: chain.sum_ms,
            max_rtt_ms: chain.max_ms,
            predicted_ms: chain.predicted_ms,
        },
        front,
    };
    let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
    // A closed pipe (`| head`) is not worth a panic.
    let _ = writeln!(std::io::stdout(), "{text}");
    Ok(())
}

/// What `vcdn chains` prints.
#[derive(Serialize)]
struct Answer {
    from: String,
    to: String,
    /// null: unknown, chosen as the largest size class.
    size_bytes: Option<u64>,
    /// Slow-start rounds of the size (IW 10 segments, doubling per RTT).
    rounds: u32,
    /// The chosen chain.
    chain: Point,
    /// The pair's Pareto front of (Σ RTT, max RTT), least max RTT first.
    front: Vec<Point>,
}

#[derive(Serialize)]
struct Point {
    /// Node names from `from` to `to`.
    chain: Vec<String>,
    /// Nodes between the two ends.
    proxies: usize,
    sum_rtt_ms: f64,
    max_rtt_ms: f64,
    /// ½·Σ RTT + (rounds − 1)·max RTT.
    predicted_ms: f64,
}
