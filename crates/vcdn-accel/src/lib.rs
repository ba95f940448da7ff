//! vcdn's dynamic-content acceleration: chains of TCP proxies that split a
//! long path into short hops, each with its own slow start (MOSTO,
//! Siracusano et al., IEEE JSAC 2017). Which chain a transfer takes is
//! decided in `vcdn_policy::chains`; this crate moves the bytes.

pub mod reactive;
pub mod rtt;
pub mod sockmap;
