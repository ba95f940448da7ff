//! Authoritative geo-DNS: wire format, answers, and the UDP/TCP servers.

pub mod answer;
pub mod server;
pub mod tcp;
pub mod wire;
