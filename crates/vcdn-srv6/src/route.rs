//! The routes that put the programs on the data path (iproute2: the
//! `ip route … encap bpf` and `encap seg6local action End.BPF` forms take
//! pinned programs), and the way an accepted connection reaches the local
//! cache.
//!
//! **Local delivery.** The kernel's `bpf_lwt_seg6_action(End.DT6)` looks the
//! inner destination up with local delivery off, so a chunk address routed
//! `local` is refused. The agent's table therefore routes the service's /64
//! out of one end of a veth pair whose other end is in the same namespace
//! (a hairpin, with a permanent neighbour entry so no neighbour discovery
//! runs for chunk addresses); arriving there, the chunk addresses are local
//! (`local PREFIX dev lo`, so a server listening on `[::]` accepts
//! connections to any of them). 6LB used a VM's interface for the same hop.
//!
//! **MTU.** Client packets grow by up to 96 bytes (outer IPv6 and an SRH of
//! three segments), so the MSS the servers advertise is lowered on the
//! route to clients (`advmss`): a Packet Too Big for an encapsulated
//! packet would go to the dispatcher, not to the client.
//!
//! **Redirects.** An edge that passes a SYN on to the origin forwards it
//! out of the device it came in on; Linux then sends the sender (the
//! dispatcher's SID) an ICMPv6 redirect, at most one a second per
//! destination, which the dispatcher drops. An interface without a
//! link-local address sends none (the test bed's TUN devices have none).
//!
//! Every change is undone when the returned [`Routes`] is dropped.

use std::net::Ipv6Addr;
use std::process::{Command, Stdio};

use crate::agent::Agent;
use crate::dispatcher::Dispatcher;
use crate::loader::Error;

/// The MSS servers advertise to clients: 1500 − 40 (IPv6) − 20 (TCP) −
/// 96 (outer IPv6 and an SRH of three segments, the most the dispatcher adds).
pub const ADVMSS: u32 = 1344;

/// Where iproute2 runs: this process's namespace, or a named one
/// (`/run/netns/NAME`, entered with nsenter so that bpffs stays visible).
#[derive(Clone, Debug)]
pub struct Netns(Option<String>);

impl Netns {
    pub fn current() -> Netns {
        Netns(None)
    }

    pub fn named(name: &str) -> Netns {
        Netns(Some(name.to_string()))
    }

    fn command(&self, program: &str) -> Command {
        match &self.0 {
            None => Command::new(program),
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(program);
                c
            }
        }
    }

    /// Runs `ip -batch -` with `batch`.
    pub fn ip(&self, batch: &str) -> Result<(), Error> {
        run(self.command("ip").args(["-batch", "-"]), batch)
    }

    pub(crate) fn sysctl(&self, key: &str, value: &str) -> Result<(), Error> {
        run(
            self.command("sysctl")
                .args(["-qw", &format!("{key}={value}")]),
            "",
        )
    }
}

fn run(cmd: &mut Command, input: &str) -> Result<(), Error> {
    use std::io::Write;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(what.clone(), e))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(input.as_bytes())
            .map_err(|e| Error::io(what.clone(), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(what.clone(), e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("{what} <<< {}", input.trim()),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Routes set up; dropping removes them (best effort: a namespace that is
/// gone took them along).
pub struct Routes {
    ns: Netns,
    undo: String,
}

impl Drop for Routes {
    fn drop(&mut self) {
        // `-force`: go on past lines that fail (already gone).
        let _ = run(
            self.ns.command("ip").args(["-force", "-batch", "-"]),
            &self.undo,
        );
    }
}

/// A dispatcher's own routes in `ns`: its SID through `learn` out of
/// `dev`, encapsulations sent from its SID, forwarding on. Replaces what a
/// dispatcher that died left.
pub fn dispatcher(ns: &Netns, d: &Dispatcher, sid: Ipv6Addr, dev: &str) -> Result<Routes, Error> {
    ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    d.learn_program(|learn| {
        ns.ip(&format!(
            "route replace {sid}/128 encap seg6local action End.BPF endpoint pinned {} dev {dev}\n\
             sr tunsrc set {sid}\n",
            learn.display()
        ))
    })?;
    Ok(Routes {
        ns: ns.clone(),
        undo: format!("route del {sid}/128 dev {dev}\nsr tunsrc set ::\n"),
    })
}

/// A service's /64 (`prefix`) routed through the dispatcher's `dispatch`
/// out of `dev`.
pub fn dispatched_prefix(
    ns: &Netns,
    d: &Dispatcher,
    prefix: Ipv6Addr,
    dev: &str,
) -> Result<Routes, Error> {
    d.dispatch_program(|dispatch| {
        ns.ip(&format!(
            "route replace {prefix}/64 encap bpf in pinned {} dev {dev}\n",
            dispatch.display()
        ))
    })?;
    Ok(Routes {
        ns: ns.clone(),
        undo: format!("route del {prefix}/64 dev {dev}\n"),
    })
}

/// An agent in `ns`: its SID through `agent` out of `dev`; `clients` (a
/// route's destination, e.g. `::/0`, with what else it needs: `via ADDR`)
/// through `steer_reply` with the lowered MSS; the hairpin of `table` that
/// delivers `prefixes` locally; forwarding on. Replaces what an agent that
/// died left.
pub fn agent(
    ns: &Netns,
    a: &Agent,
    table: u32,
    prefixes: &[Ipv6Addr],
    dev: &str,
    clients: &str,
) -> Result<Routes, Error> {
    ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    let (out, back) = (format!("vh{table}a"), format!("vh{table}b"));
    let mac = format!(
        "02:76:63:64:{:02x}:{:02x}",
        (table >> 8) & 0xff,
        table & 0xff
    );
    // A hairpin left by an agent that died goes first (with its routes).
    let _ = run(
        ns.command("ip").args(["-force", "-batch", "-"]),
        &format!("link del {out}\n"),
    );
    let mut batch = format!(
        "link add {out} type veth peer name {back}\n\
         link set dev {back} address {mac}\n\
         link set dev {out} up\n\
         link set dev {back} up\n\
         neigh replace fe80::1 lladdr {mac} dev {out} nud permanent\n"
    );
    let mut undo = format!("link del {out}\n");
    for p in prefixes {
        batch += &format!(
            "route replace local {p}/64 dev lo\n\
             route replace {p}/64 via fe80::1 dev {out} table {table}\n"
        );
        undo += &format!("route del local {p}/64 dev lo\n");
    }
    let sid = a.sid();
    a.agent_program(|agent| {
        a.reply_program(|reply| {
            batch += &format!(
                "route replace {sid}/128 encap seg6local action End.BPF endpoint pinned {} dev {dev}\n\
                 route replace {clients} dev {dev} encap bpf xmit pinned {} headroom 80 advmss {ADVMSS}\n",
                agent.display(),
                reply.display()
            );
            ns.ip(&batch)
        })
    })?;
    undo += &format!("route del {sid}/128 dev {dev}\nroute replace {clients} dev {dev}\n");
    Ok(Routes {
        ns: ns.clone(),
        undo,
    })
}
