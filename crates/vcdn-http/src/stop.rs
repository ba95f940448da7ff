//! SIGTERM and SIGINT, taken over before a server says it is ready.
//!
//! A handler installed at the first await of a shutdown future comes too
//! late: between the "listening on" line and that await, a SIGTERM meets
//! the default action and kills the process without its drain. A
//! supervisor that scales in right after a start (or a test that waits for
//! the line and then for one exchange in flight) does exactly that. So a
//! server creates its [`StopSignal`] first, starts, prints where it
//! listens, and only then waits on it.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGTERM and SIGINT as one future; registered when created.
pub struct StopSignal {
    term: Signal,
    int: Signal,
}

impl StopSignal {
    /// Takes over SIGTERM and SIGINT now. Needs a Tokio runtime with
    /// signals enabled; fails only when the runtime cannot register them.
    pub fn install() -> Result<Self, String> {
        let term =
            signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
        let int =
            signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
        Ok(Self { term, int })
    }

    /// Waits for either signal and names it.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
