//! vcdn's analytical models.
//!
//! - [`filter`]: Che's approximation of an LRU filter in front of an LRU
//!   cache, its N → ∞ limit and the optimal filter size (Desmouceaux et al.,
//!   IM 2019, §III-B/C); [`filter::filter_capacity`] sizes a live router's
//!   filter.
//! - [`capacity`]: what one vCPU of a cache sustains (requests/s per object
//!   size, video sessions per MOS, response times per load), the planner's
//!   input (CDNaaS paper §IV–V-A), in a documented TOML format.
//! - [`qoe`]: a MOS per 16 s window of a video session from stalls and
//!   picture quality (Hoßfeld et al.'s stalling model, ITU-T G.1070's
//!   quality), with the CDNaaS paper's windowing, 8 s and recency rules.
//! - [`numeric`]: the quadrature, root finding, minimisation and special
//!   functions they rest on (no dependencies).

pub mod capacity;
pub mod filter;
pub mod numeric;
pub mod qoe;
