//! HTTP/1.1 for vcdn.
//!
//! The wire format (request and response heads, chunked coding, dates) is
//! pure code without sockets, so it can be unit-tested and fuzzed alone; the
//! `serve` and `client` modules add a small tokio server and client for the
//! control endpoints (admin API, demo origin, `ctl` tools), which are not on
//! the cache's hot path.

pub mod admin_tls;
pub mod auth;
pub mod chunked;
pub mod client;
pub mod date;
pub mod h2;
pub mod header;
pub mod hpack;
pub mod request;
pub mod response;
pub mod serve;
pub mod sf;
pub mod stop;
pub mod tls;

pub use header::Headers;
pub use request::{parse_request, BodyFraming, Limits, Method, RequestHead};
pub use response::{parse_response, reason, ResponseHead};

/// Why a message was rejected; each maps to the status to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Malformed or ambiguous syntax (400).
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// Request line longer than the limit (414).
    #[error("request line too long")]
    UriTooLong,
    /// Header section too large or too many fields (431).
    #[error("request header fields too large")]
    HeadersTooLarge,
    /// Valid syntax for something vcdn does not implement (501).
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
    /// An HTTP major version other than 1 (505).
    #[error("HTTP version not supported")]
    VersionNotSupported,
}

impl ParseError {
    /// The status code that answers this error.
    pub fn status(&self) -> u16 {
        match self {
            ParseError::BadRequest(_) => 400,
            ParseError::UriTooLong => 414,
            ParseError::HeadersTooLarge => 431,
            ParseError::NotImplemented(_) => 501,
            ParseError::VersionNotSupported => 505,
        }
    }
}
