//! Zero-configuration telemetry after the ANDy thesis (seed 004): every node
//! runs the same agent, finds the data sink or the tracker by UDP broadcast,
//! and relays local ports to topics (Apache Kafka as the data sink) or
//! straight to the consumers a tracker names (peer-to-peer mode).
//!
//! The protocol, with what vcdn adds to the thesis (envelope, timers,
//! leases, authentication), is specified in `docs/telemetry-protocol.md`.

pub mod agent;
pub mod datasink;
pub mod envelope;
pub mod kafka;
pub mod keys;
pub mod message;
pub mod node;
pub mod record;
