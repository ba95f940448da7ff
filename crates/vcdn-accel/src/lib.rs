//! vcdn's dynamic-content acceleration: chains of TCP proxies that split a
//! long path into short hops, each with its own slow start (MOSTO,
//! Siracusano et al., IEEE JSAC 2017). Which chain a transfer takes is
//! decided in `vcdn_policy::chains`; this crate moves the bytes.
//!
//! The data path (`vcdn proxy`): [`proxy`] serves clients and peers on one
//! port, [`wire`] is the hop protocol (`docs/accel-protocol.md`),
//! [`splice`] the zero-copy relay, [`pool`] the warm hop connections,
//! [`estimate`] the transfer-size estimate, [`table`] the chain lookup;
//! [`rtt`] measures RTTs to the peers and reports them to the controller,
//! [`reactive`] holds a socket and starts the proxy on the first
//! connection, [`sockmap`] relays in the kernel with a BPF redirect
//! (experimental: see its doc).

pub mod admin;
pub mod conn;
pub mod estimate;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod reactive;
pub mod rtt;
pub mod sockmap;
pub mod splice;
pub mod table;
pub mod wire;

pub use proxy::{run_until_stopped, start, Proxy, ProxyConfig, RelayMode, Running, Timeouts};
