//! vcdn's pure decision code: no I/O and no clocks of its own, so the live
//! router and cache and the simulator run the very same policies.
//!
//! - [`admission`]: the LRU filter of the content-aware data plane
//!   (Desmouceaux et al., IM 2019, §III-A) that sends only recently seen
//!   content to the edge and everything else straight to the origin.
//! - [`hashing`]: consistent (rendezvous) hashing of content over a region's
//!   healthy caches, so a chunk keeps going to the same cache.
//! - [`popularity`]: online estimates of the Zipf exponent α and the
//!   catalogue size N from a request stream, which the filter sizing needs.
//! - [`dimensioning`]: vCPUs per region from demand, quality target and the
//!   capacity model (CDNaaS §V-A).
//! - [`placement`]: instances onto hosts, consolidated or spread.
//! - [`autoscale`]: scale-out and scale-in decisions with hysteresis.
//! - [`origin`]: which addresses a customer's origin may have (the
//!   operator's policy against server-side request forgery).
//! - [`net`]: IP networks.
//! - [`abr`]: a DASH player's bitrate adaptation and buffer target, as
//!   the reference player (dash.js) decides them.
//! - [`chains`]: MOSTO's split-TCP proxy chains: all-pairs Pareto fronts of
//!   (Σ RTT, max RTT) and the best chain per transfer size, from an RTT
//!   matrix.

pub mod abr;
pub mod admission;
pub mod autoscale;
pub mod chains;
pub mod dimensioning;
pub mod hashing;
pub mod net;
pub mod origin;
pub mod placement;
pub mod popularity;
