//! HTTP/2 (RFC 9113), the server side, sans I/O: [`frame`] (the wire
//! format), [`request`] (a stream's fields as an HTTP/1.1 request head)
//! and [`conn`] (the connection's state machine). The edge's front end
//! (`vcdn-cache`'s `h2front`) drives it over its own sockets. Header
//! blocks are decoded with [`crate::hpack`]. Not implemented: server push
//! (never sent; SETTINGS_ENABLE_PUSH is accepted and ignored) and
//! priorities (PRIORITY frames and fields are parsed, checked, ignored).

pub mod conn;
pub mod frame;
pub mod request;

pub use conn::{Config, Connection, Error, Event};
pub use frame::Reason;
pub use request::{Body, Request};
