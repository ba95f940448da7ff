//! `vcdn testbed`: flags → `vcdn_netem::testbed::Testbed`.

use std::path::PathBuf;

use clap::Args;
use vcdn_netem::testbed::{Testbed, TestbedSpec};

#[derive(Args)]
#[command(group = clap::ArgGroup::new("input").required(true))]
pub struct TestbedArgs {
    /// RTT matrix CSV: `src,dst,rtt_ms`, one line per directed pair
    /// (one-way delay = RTT / 2 each way).
    #[arg(long, group = "input")]
    rtt_matrix: Option<PathBuf>,
    /// Topology edge list `src,dst,delay_ms` (shared/data/topologies),
    /// completed by shortest paths.
    #[arg(long, group = "input")]
    topology: Option<PathBuf>,
    /// Cap every link (each direction) at this many Mbit/s [default: uncapped].
    #[arg(long)]
    rate_mbit: Option<f64>,
    /// Drop-tail queue of every rate-limited link, KB [default: 100 ms of the rate].
    #[arg(long, requires = "rate_mbit")]
    queue_kb: Option<u64>,
    /// Nodes whose TCP keeps its window when idle (tcp_slow_start_after_idle=0).
    #[arg(long, value_name = "NODE")]
    keep_window: Vec<String>,
    /// Run a command in this node (after `--`), then tear down and exit
    /// with its status.
    #[arg(long, value_name = "NODE", requires = "cmd")]
    run: Option<String>,
    /// The command for --run.
    #[arg(last = true)]
    cmd: Vec<String>,
}

pub fn run(a: TestbedArgs) -> Result<(), String> {
    let mut spec = match (&a.rtt_matrix, &a.topology) {
        (Some(p), _) => TestbedSpec::from_rtt_file(p),
        (_, Some(p)) => TestbedSpec::from_topology_file(p),
        _ => unreachable!("clap requires one input"),
    }
    .map_err(|e| e.to_string())?;
    if let Some(r) = a.rate_mbit {
        if !(r > 0.0 && r <= 1_000_000.0) {
            return Err(format!("--rate-mbit {r}: want a number above 0 (Mbit/s)"));
        }
        spec = spec.rate_all((r * 1e6) as u64);
    }
    if let Some(q) = a.queue_kb {
        spec = spec.queue_all(q.saturating_mul(1000));
    }
    for n in &a.keep_window {
        spec = spec.keep_window(n).map_err(|e| e.to_string())?;
    }
    if let Some(node) = &a.run {
        spec.index(node).ok_or_else(|| {
            format!(
                "--run {node}: no such node (nodes: {})",
                spec.nodes().join(", ")
            )
        })?;
    }
    // SIGINT and SIGTERM are taken by sigwait below; block them before the
    // forwarder thread starts so it inherits the mask.
    let signals = block_signals();
    let tb = Testbed::start(spec)
        .map_err(|e| format!("cannot start the test bed (it needs root): {e}"))?;
    for node in tb.nodes() {
        println!(
            "node {node}: address {} namespace {} (run a command in it: ip netns exec {} CMD)",
            tb.addr(node).expect("node"),
            tb.namespace(node).expect("node"),
            tb.namespace(node).expect("node"),
        );
    }
    if let Some(node) = a.run {
        let status = tb
            .command(&node, &a.cmd[0])
            .and_then(|mut c| c.args(&a.cmd[1..]).status())
            .map_err(|e| format!("cannot run {:?} in {node}: {e}", a.cmd[0]))?;
        log_stats(&tb);
        drop(tb);
        std::process::exit(status.code().unwrap_or(128 + 9));
    }
    println!("vcdn testbed running; Ctrl-C or SIGTERM tears it down");
    let mut sig: libc::c_int = 0;
    // SAFETY: sigwait on a signal set initialised by block_signals.
    unsafe { libc::sigwait(&signals, &mut sig) };
    log_stats(&tb);
    drop(tb);
    println!("vcdn testbed torn down");
    Ok(())
}

fn log_stats(tb: &Testbed) {
    let s = tb.stats();
    for l in &s.links {
        tracing::info!(from = %l.from, to = %l.to, packets = l.packets, bytes = l.bytes, drops = l.drops, "link");
    }
    tracing::info!(
        unroutable = s.unroutable,
        max_packet = s.max_packet,
        "forwarder"
    );
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set, then masking the calling
    // thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
