//! CDNSim: a discrete-event, fluid flow-level simulator of elastic CDNs at
//! country scale (MiniCache paper §3), running vcdn's own policies.
//!
//! - [`graph`]: AS graphs (CAIDA input, the open topologies, synthetic
//!   country graphs of Table 2's sizes) and routes from the origin.
//! - [`workload`]: who watches which channel, at which quality, for how
//!   long; the paper's and the original code's presets.
//! - [`share`]: exact max-min bandwidth sharing with per-flow caps,
//!   incremental over saturated links; the original's approximation.
//! - [`engine`]: the event loop, players, caches and their boot.
//! - [`cache`]: a site's VoD store behind vcdn's LRU admission filter.
//! - [`qoe`]: start time, buffering ratio, buffering events, playback
//!   ratio; peaks per VM and per AS.
//! - [`rng`], [`dist`]: seeded streams and distributions.

pub mod cache;
pub mod dist;
pub mod engine;
pub mod graph;
pub mod qoe;
pub mod rng;
pub mod share;
pub mod workload;
