//! Reproductions of the papers behind vcdn, made with vcdn's own code.
//!
//! - [`lru_filter`]: the LRU filter of Desmouceaux et al., IM 2019 (Fig. 5,
//!   Fig. 7, §V-A, Tables I and II); binary `lru-filter`.
//! - [`andy`]: the ANDy thesis's latency and throughput measurement
//!   (seed 004, §4.3).
//! - [`irm`]: IRM simulation (seeded Zipf requests, the real
//!   `vcdn_policy` admission filters, an O(1) LRU cache).
//! - [`mosto`]: MOSTO's Fig. 3 and runtime claim (JSAC 2017, §V-A);
//!   binary `mosto`.
//! - [`cdnsim`]: plots of CDNSim's Figs 1 and 2 (MiniCache paper §3) from
//!   `vcdn sim` summaries; binary `cdnsim-plot`.
//! - [`svg`]: a tiny SVG line chart for the figures.

pub mod andy;
pub mod cdnsim;
pub mod content_aware;
pub mod irm;
pub mod lru_filter;
pub mod mosto;
pub mod svg;
