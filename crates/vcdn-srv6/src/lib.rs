//! In-network server selection on Linux's SRv6 data path (the content-aware
//! data-plane paper, §II-B and §III-A, on the 6LB design).
//!
//! Every chunk has its own IPv6 address (`vcdn name`: the service's /64 and
//! the 64-bit chunk id). A **dispatcher** on the clients' path gives each new
//! connection to a chunk address an SRv6 segment list (edge, origin, chunk
//! address); the **agent** on the edge decides on the SYN, in the kernel,
//! whether the edge serves it (the chunk is in its LRU filter) or the SYN
//! goes on to the origin untouched. The accepting server's SYN-ACK passes
//! once through the dispatcher, which learns where the connection lives and
//! steers the client's later packets straight there; replies go straight to
//! the client.
//!
//! - `bpf/dispatcher.bpf.c`, `bpf/agent.bpf.c`: the programs, compiled by
//!   `build.rs` with clang for the running kernel's headers.
//! - [`loader`]: libbpf (through libbpf-rs) loads them; the verifier's
//!   refusal is an [`Error`] with its log, never a panic. Programs are pinned
//!   in bpffs so that routes can name them.
//! - [`dispatcher::Dispatcher`], [`agent::Agent`]: the maps user space
//!   drives (services, edge tables, trusted peers, the filter and its size),
//!   and the counters.
//! - [`route`]: the routes that attach the programs (iproute2), and the
//!   local delivery path of accepted connections.
//!
//! What the kernel needs: `CONFIG_IPV6_SEG6_LWTUNNEL`, `CONFIG_IPV6_SEG6_BPF`,
//! `CONFIG_LWTUNNEL_BPF`, bpffs, root. [`probe`] says which is missing.

pub mod agent;
pub mod dispatcher;
pub mod domain;
pub mod host;
mod loader;
pub mod packet;
pub mod route;

pub use loader::{probe, render_program_runs, Error, ProgramRuns};

/// The upper 64 bits of an address: a server's locator or a service's /64.
pub fn upper64(a: std::net::Ipv6Addr) -> u64 {
    (u128::from(a) >> 64) as u64
}

/// The lower 64 bits: the chunk id of a chunk address.
pub fn lower64(a: std::net::Ipv6Addr) -> u64 {
    u128::from(a) as u64
}
