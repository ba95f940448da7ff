//! Placeholder for the HTTP/2 front end (contract 2 of issue 18): the
//! `h2` helper writes the real one, and this file is replaced at merge.
//! Until then a connection that chose `h2` by ALPN is closed.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::proxy::Cache;

/// Serve one HTTP/2 connection (here: shut it). The caller holds the
/// connection slot.
pub(crate) async fn serve<IO>(cache: Arc<Cache>, io: IO, peer: SocketAddr, already_read: Bytes)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let _ = (cache, peer, already_read);
    let mut io = io;
    let _ = io.shutdown().await;
}
