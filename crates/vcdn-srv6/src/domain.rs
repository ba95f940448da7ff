//! The SR domain `vcdn up` builds on its own host for services that route
//! with SRv6 (`routing: "srv6"`): a PoP namespace where the dispatcher
//! sits on the clients' path, and one namespace per edge or origin gateway
//! (a server of the paper's test bed: its own network stack, its agent,
//! its cache listening on the chunk addresses), joined by a bridge.
//!
//! ```text
//!  host ── vcdn-sr ═╗ veth             ╔═ e<key> ══ eth0 [vcdn-sr-<instance>] agent, cache
//!  clients          ╚═ uplink [vcdn-pop] lan (bridge)
//!  fd76:6364:c::/48      dispatcher    ╚═ e<key> ══ eth0 [vcdn-sr-<gateway>]   agent (accepts all)
//! ```
//!
//! Addresses (all in the ULA block `fd76:6364::/32`, "vcd"):
//! - `fd76:6364:0:1::/64`: the host (`::1`) to the PoP (`::2`);
//! - `fd76:6364:0:2::/64`: the PoP's LAN, the PoP `::1`, a node the 64-bit
//!   key of its instance;
//! - `fd76:6364:0:d::1`: the dispatcher's SID, alone in its /64 (agents
//!   trust dispatchers by /64);
//! - `fd76:6364:0:e:KEY`: a node's SID;
//! - `fd76:6364:c:N::/64`: service N's chunk addresses, routed from the
//!   host into the PoP.
//!
//! Every step is idempotent (`replace`, or "exists" taken as done), so a
//! control plane that died half way through finishes the job at its next
//! start; [`Domain::remove_node`], [`Domain::nodes`] and
//! [`Domain::remove_if_unused`] clean up.

use std::net::Ipv6Addr;

use crate::loader::Error;
use crate::route::Netns;

/// The PoP's namespace (the dispatcher's routes).
pub const POP: &str = "vcdn-pop";
/// Every node's namespace is `vcdn-sr-<instance id>`.
pub const NODE_PREFIX: &str = "vcdn-sr-";
/// The host's end of the link to the PoP.
pub const HOST_DEVICE: &str = "vcdn-sr";
/// The PoP's bridge, the device the dispatcher sends by.
pub const POP_LAN: &str = "lan";
/// A node's device.
pub const NODE_DEVICE: &str = "eth0";

const BLOCK: u128 = 0xfd76_6364 << 96;

fn addr(hi: u64, lo: u64) -> Ipv6Addr {
    Ipv6Addr::from(BLOCK | (hi as u128) << 64 | lo as u128)
}

/// The host's address towards the PoP (clients on the host use it).
pub fn host_address() -> Ipv6Addr {
    addr(1, 1)
}

fn pop_uplink() -> Ipv6Addr {
    addr(1, 2)
}

/// The PoP's address on its LAN: every node's next hop.
pub fn pop_lan() -> Ipv6Addr {
    addr(2, 1)
}

/// The dispatcher's SID.
pub fn dispatcher_sid() -> Ipv6Addr {
    addr(0xd, 1)
}

/// The /48 every service's chunk prefix is in.
pub fn chunk_block() -> Ipv6Addr {
    addr(0xc_0000, 0)
}

/// Service `n`'s chunk /64.
pub fn chunk_prefix(n: u16) -> Ipv6Addr {
    addr(0xc_0000 | n as u64, 0)
}

/// The node namespace of instance `id`.
pub fn node_netns(id: &str) -> String {
    format!("{NODE_PREFIX}{id}")
}

/// A node (an edge or an origin gateway) of the domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub netns: String,
    /// Its SID: the dispatcher's segment lists name it.
    pub sid: Ipv6Addr,
    /// Its address on the PoP's LAN.
    pub lan: Ipv6Addr,
    /// The PoP's end of its link.
    pub link: String,
}

impl Node {
    /// The node of instance `id`: its key is a hash of the id, so that the
    /// same instance gets the same addresses at every start.
    pub fn of(id: &str) -> Node {
        let key = fnv1a(id.as_bytes()).max(2);
        Node {
            netns: node_netns(id),
            sid: addr(0xe, key),
            lan: addr(2, key),
            link: format!("e{:08x}", key as u32),
        }
    }

    /// What the agent routes replies to clients by.
    pub fn clients_route() -> String {
        format!("::/0 via {}", pop_lan())
    }
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The domain on this host.
pub struct Domain;

impl Domain {
    /// Makes (or finds) the PoP and its link from the host, and routes the
    /// chunk block from the host into it.
    pub fn ensure() -> Result<Domain, Error> {
        crate::probe()?;
        add_netns(POP)?;
        let host = Netns::current();
        let pop = Netns::named(POP);
        // The link: made in the host's namespace, one end moved to the PoP
        // (made again when a half of it is missing).
        if pop.ip("link show dev uplink\n").is_err() {
            let _ = host.ip(&format!("link del {HOST_DEVICE}\n"));
            host.ip(&format!(
                "link add {HOST_DEVICE} type veth peer name uplink netns {POP}\n"
            ))?;
        }
        host.ip(&format!(
            "addr replace {}/64 dev {HOST_DEVICE} nodad\n\
             link set dev {HOST_DEVICE} up\n\
             route replace {}/48 via {} dev {HOST_DEVICE}\n",
            host_address(),
            chunk_block(),
            pop_uplink()
        ))?;
        let _ = pop.ip(&format!("link add {POP_LAN} type bridge\n"));
        pop.ip(&format!(
            "link set lo up\n\
             addr replace {}/64 dev uplink nodad\n\
             link set dev uplink up\n\
             addr replace {}/64 dev {POP_LAN} nodad\n\
             link set dev {POP_LAN} up\n",
            pop_uplink(),
            pop_lan()
        ))?;
        pop.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        Ok(Domain)
    }

    /// Makes (or finds) `node`'s namespace and link, and routes its SID.
    pub fn add_node(&self, node: &Node) -> Result<(), Error> {
        add_netns(&node.netns)?;
        let pop = Netns::named(POP);
        let ns = Netns::named(&node.netns);
        let _ = pop.ip(&format!(
            "link add {} type veth peer name {NODE_DEVICE} netns {}\n",
            node.link, node.netns
        ));
        pop.ip(&format!(
            "link set dev {} master {POP_LAN} up\n\
             route replace {}/128 via {} dev {POP_LAN}\n",
            node.link, node.sid, node.lan
        ))?;
        ns.ip(&format!(
            "link set lo up\n\
             addr replace {}/64 dev {NODE_DEVICE} nodad\n\
             link set dev {NODE_DEVICE} up\n",
            node.lan
        ))?;
        Ok(())
    }

    /// Removes `node`'s namespace (its routes, its link and its end in the
    /// PoP go with it) and its SID's route.
    pub fn remove_node(node: &Node) {
        let _ = Netns::named(POP).ip(&format!("route del {}/128\n", node.sid));
        let _ = Netns::current().ip(&format!("netns del {}\n", node.netns));
    }

    /// Removes the PoP (the link from the host and the host's route go
    /// with it) when no node is left; whether it did.
    pub fn remove_if_unused() -> bool {
        if !Domain::nodes().is_empty() || !std::path::Path::new("/run/netns").join(POP).exists() {
            return false;
        }
        Netns::current().ip(&format!("netns del {POP}\n")).is_ok()
    }

    /// The node namespaces that exist, by instance id.
    pub fn nodes() -> Vec<String> {
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_prefix(NODE_PREFIX)
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn add_netns(name: &str) -> Result<(), Error> {
    if std::path::Path::new("/run/netns").join(name).exists() {
        return Ok(());
    }
    Netns::current().ip(&format!("netns add {name}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_plan() {
        assert_eq!(dispatcher_sid().to_string(), "fd76:6364:0:d::1");
        assert_eq!(chunk_prefix(7).to_string(), "fd76:6364:c:7::");
        assert_eq!(chunk_block().to_string(), "fd76:6364:c::");
        let n = Node::of("svc-1-paris-0");
        assert_eq!(n, Node::of("svc-1-paris-0"));
        assert_ne!(n.sid, Node::of("svc-1-paris-1").sid);
        assert!(n.sid.to_string().starts_with("fd76:6364:0:e:"));
        assert!(n.lan.to_string().starts_with("fd76:6364:0:2:"));
        assert!(n.link.len() <= 15);
        // The dispatcher's /64 holds no node.
        assert_ne!(crate::upper64(n.sid), crate::upper64(dispatcher_sid()));
    }
}
