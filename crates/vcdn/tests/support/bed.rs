//! `vcdn` processes inside the nodes of a namespace test bed
//! (`vcdn_netem::testbed` or `vcdn_netem::lan`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use vcdn_netem::Bed;

/// A process in a node, killed when dropped (the bed also kills whatever
/// is left in its namespaces when it is dropped).
pub struct InNode(pub Child);

impl InNode {
    /// Stops the process as an operator would, with SIGTERM, and waits up
    /// to 5 s for it to exit (then kills it).
    pub fn terminate(mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < until {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for InNode {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `vcdn ARGS` in `node` and waits for the line that says where it
/// listens.
pub fn start_in(tb: &impl Bed, node: &str, args: &[String]) -> InNode {
    let mut child = tb
        .command(node, env!("CARGO_BIN_EXE_vcdn").as_ref())
        .unwrap()
        .args(args)
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("vcdn starts in the node");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let p = InNode(child);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("vcdn {args:?} in {node} prints where it listens"));
        // Servers say "listening on"; the router says where its admin is.
        if line.contains("listening on") || line.contains("admin on") {
            return p;
        }
    }
}
