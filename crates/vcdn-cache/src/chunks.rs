//! Chunk addresses (the SRv6 data path, issue 21). The edge's agent lets a
//! connection in for the one chunk its destination address names (the
//! service's /64 and the 64-bit chunk id, `vcdn name`), after that chunk
//! passed the LRU filter in the kernel; the cache listens on the whole /64.
//! A client that connected to a popular chunk's address could otherwise ask
//! for any other path on that connection and get it into the cache past the
//! filter. So a request on a chunk address must name that chunk, through
//! the service's template as the router and the player name it
//! (`vcdn_content::content_id`), or it is answered 421 Misdirected Request
//! (RFC 9110 §15.5.20) and the connection closes.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use vcdn_content::{ContentPrefix, SegmentTemplate};

use crate::config::CacheConfig;

/// The chunk prefixes a cache answers on and how paths name chunks there.
pub struct ChunkAddresses {
    prefixes: Vec<ContentPrefix>,
    template: Option<SegmentTemplate>,
}

impl ChunkAddresses {
    /// From `chunk_prefixes` and `chunk_template`; None without prefixes.
    pub fn new(cfg: &CacheConfig) -> Result<Option<ChunkAddresses>, String> {
        if cfg.chunk_prefixes.is_empty() {
            if cfg.chunk_template.is_some() {
                return Err("chunk_template is given without chunk_prefixes".into());
            }
            if cfg.chunk_listen.is_some() || cfg.chunk_netns.is_some() {
                // Chunk connections unchecked would let any path in.
                return Err("chunk_listen and chunk_netns need chunk_prefixes".into());
            }
            return Ok(None);
        }
        let prefixes = cfg
            .chunk_prefixes
            .iter()
            .map(|p| p.parse().map_err(|e| format!("chunk prefix '{p}': {e}")))
            .collect::<Result<_, String>>()?;
        let template = cfg
            .chunk_template
            .as_ref()
            .map(|t| {
                SegmentTemplate::for_service(&t.path, &t.representations, t.segment_duration_s)
            })
            .transpose()
            .map_err(|e| format!("chunk_template: {e}"))?;
        Ok(Some(ChunkAddresses { prefixes, template }))
    }

    /// The chunk id a connection to `local` was let in for, when `local`
    /// is in one of the prefixes.
    pub fn of_local(&self, local: SocketAddr) -> Option<u64> {
        let IpAddr::V6(a) = local.ip() else {
            return None;
        };
        self.prefixes
            .iter()
            .find_map(|p| p.chunk_id(a))
            .map(|id| id.0)
    }

    /// Why a request for `path_and_query` on a connection to chunk `id` is
    /// refused; None when the path names that chunk.
    pub fn misdirected(&self, path_and_query: &[u8], id: u64) -> Option<String> {
        let named = std::str::from_utf8(path_and_query)
            .map(|p| vcdn_content::content_id(self.template.as_ref(), p))
            .ok();
        if named == Some(id) {
            return None;
        }
        Some(match named {
            Some(other) => format!(
                "this address serves chunk {id:016x} only; the requested path is chunk \
                 {other:016x}: connect to that chunk's own address"
            ),
            None => format!("this address serves chunk {id:016x} only"),
        })
    }
}

/// Binds `n` listeners on `addr` (one per serving thread, `SO_REUSEPORT`)
/// in the network namespace `netns`, or in this process's. A socket stays
/// in the namespace it was made in, so a short-lived thread enters the
/// namespace, binds, and ends; the serving threads accept from there while
/// everything else the cache opens stays in its own namespace.
pub fn bind_listeners(
    addr: SocketAddr,
    netns: Option<&str>,
    n: usize,
) -> Result<Vec<TcpListener>, String> {
    let bind = move || {
        let all = || -> std::io::Result<Vec<TcpListener>> {
            let first = crate::server::bind_reuseport(addr)?;
            // The others on the port the first got (port 0 picks one).
            let at = first.local_addr()?;
            std::iter::once(Ok(first))
                .chain((1..n).map(|_| crate::server::bind_reuseport(at)))
                .collect()
        };
        all().map_err(|e| format!("cannot listen for chunk addresses on {addr}: {e}"))
    };
    let Some(ns) = netns else {
        return bind();
    };
    let path = if ns.contains('/') {
        PathBuf::from(ns)
    } else {
        Path::new("/run/netns").join(ns)
    };
    let file =
        std::fs::File::open(&path).map_err(|e| format!("chunk_netns {}: {e}", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            use std::os::fd::AsRawFd;
            // SAFETY: setns(2) on an open namespace file, for this thread only.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(format!(
                    "cannot enter the network namespace {}: {} (needs root)",
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
            bind()
        })
        .join()
        .unwrap_or_else(|_| Err("the thread binding chunk listeners panicked".into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ChunkTemplate;

    fn addresses(template: Option<ChunkTemplate>) -> ChunkAddresses {
        let cfg = CacheConfig {
            chunk_prefixes: vec!["2001:db8:c::/64".into()],
            chunk_template: template,
            ..CacheConfig::default()
        };
        ChunkAddresses::new(&cfg).unwrap().unwrap()
    }

    #[test]
    fn a_path_must_name_the_chunk_of_its_address() {
        let c = addresses(None);
        let id = vcdn_content::content_id(None, "/size/150000");
        let at = |id: u64| {
            let a = std::net::Ipv6Addr::from(0x2001_0db8_000c_0000_u128 << 64 | id as u128);
            SocketAddr::from((a, 80))
        };
        assert_eq!(c.of_local(at(id)), Some(id));
        assert_eq!(c.misdirected(b"/size/150000", id), None);
        // The query never counts, as for the router's content ids.
        assert_eq!(c.misdirected(b"/size/150000?token=x", id), None);
        let refused = c.misdirected(b"/size/90000", id).unwrap();
        assert!(refused.contains(&format!("{id:016x}")), "{refused}");
        assert!(c.misdirected(b"/\xff", id).is_some());
        // Outside the prefixes, or IPv4: not a chunk address.
        assert_eq!(c.of_local("[2001:db8:d::1]:80".parse().unwrap()), None);
        assert_eq!(c.of_local("127.0.0.1:80".parse().unwrap()), None);
    }

    #[test]
    fn with_a_template_paths_name_chunks_as_the_router_names_them() {
        let c = addresses(Some(ChunkTemplate {
            path: "/vod/$Video$/$RepresentationID$/seg-$Number$.m4s".into(),
            representations: vec!["360p".into(), "720p".into()],
            segment_duration_s: 2.0,
        }));
        let t = SegmentTemplate::for_service(
            "/vod/$Video$/$RepresentationID$/seg-$Number$.m4s",
            &["360p".into(), "720p".into()],
            2.0,
        )
        .unwrap();
        let id = vcdn_content::content_id(Some(&t), "/vod/42/720p/seg-7.m4s");
        assert_eq!(c.misdirected(b"/vod/42/720p/seg-7.m4s", id), None);
        assert!(c.misdirected(b"/vod/42/720p/seg-8.m4s", id).is_some());
        assert!(c.misdirected(b"/vod/42/360p/seg-7.m4s", id).is_some());
    }

    #[test]
    fn bad_chunk_settings_are_refused_at_start() {
        let bad = CacheConfig {
            chunk_prefixes: vec!["2001:db8:c::/48".into()],
            ..CacheConfig::default()
        };
        let e = ChunkAddresses::new(&bad).err().unwrap();
        assert!(e.contains("2001:db8:c::/48"), "{e}");
        let orphan = CacheConfig {
            chunk_template: Some(ChunkTemplate {
                path: "/x/$Number$".into(),
                representations: vec![],
                segment_duration_s: 2.0,
            }),
            ..CacheConfig::default()
        };
        assert!(ChunkAddresses::new(&orphan).is_err());
        // A chunk listener whose connections nothing would check.
        let unchecked = CacheConfig {
            chunk_listen: Some("[::1]:0".parse().unwrap()),
            ..CacheConfig::default()
        };
        let e = ChunkAddresses::new(&unchecked).err().unwrap();
        assert!(e.contains("need chunk_prefixes"), "{e}");
    }

    #[test]
    fn chunk_listeners_are_bound_in_the_namespace_asked_for() {
        let here = bind_listeners("[::1]:0".parse().unwrap(), None, 2).unwrap();
        assert_eq!(here.len(), 2);
        // SO_REUSEPORT: the second is on the first's port.
        let port = here[0].local_addr().unwrap().port();
        assert_eq!(here[1].local_addr().unwrap().port(), port);
        let e = bind_listeners("[::1]:0".parse().unwrap(), Some("vcdn-no-such-ns"), 1)
            .err()
            .unwrap();
        assert!(e.contains("/run/netns/vcdn-no-such-ns"), "{e}");
        // This process's own namespace, by path: the same stack.
        let own = bind_listeners("[::1]:0".parse().unwrap(), Some("/proc/self/ns/net"), 1).unwrap();
        std::net::TcpStream::connect(own[0].local_addr().unwrap()).unwrap();
    }
}
