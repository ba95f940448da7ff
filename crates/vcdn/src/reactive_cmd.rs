//! `vcdn reactive`: hold a listening socket and start a server on the
//! first connection (see `vcdn_accel::reactive`).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use vcdn_accel::reactive::{hold, HoldOptions};

#[derive(Args)]
pub struct ReactiveArgs {
    /// Address to hold.
    #[arg(long)]
    listen: SocketAddr,
    /// Longest wait before restarting a server that failed, in seconds.
    #[arg(long, default_value_t = 10.0)]
    backoff_max: f64,
    /// The server and its arguments; it finds the socket at fd 3, e.g.
    /// `-- vcdn origin --listen-fd 3 --idle-exit 30`.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<OsString>,
}

pub fn run(a: ReactiveArgs) -> Result<(), String> {
    let l = std::net::TcpListener::bind(a.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let mut command = a.command.into_iter();
    let program = PathBuf::from(command.next().ok_or("no command given after --")?);
    let opts = HoldOptions {
        backoff_max: Duration::try_from_secs_f64(a.backoff_max)
            .map_err(|e| format!("--backoff-max: {e}"))?,
        ..HoldOptions::default()
    };
    println!(
        "vcdn reactive listening on http://{addr}, starting {} on the first connection",
        program.display()
    );
    hold(l, program, command.collect(), opts).map_err(|e| format!("holding {addr}: {e}"))
}
