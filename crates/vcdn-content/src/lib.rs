//! vcdn's content naming: video chunks as 64-bit identifiers, inside IPv6 addresses, and the
//! DASH segment URLs that name them.
//!
//! The content-aware data plane (Desmouceaux et al., §II-A) gives every video chunk (a DASH or
//! HLS segment) a 64-bit identifier and a globally routable IPv6 address, so that the network
//! can see which chunk a request is for. vcdn uses the identifier as the key of its LRU
//! admission filter and of consistent hashing, at HTTP level in the request router; this crate
//! holds the naming, in three parts:
//!
//! * [`name`]: [`ChunkName`] (video, chunk index, quality, duration) ↔ [`ChunkId`], with the
//!   fixed bit layout;
//! * [`address`]: a producer's /64 [`ContentPrefix`] + [`ChunkId`] ↔ IPv6 address;
//! * [`template`]: DASH segment URL paths ↔ [`ChunkName`] through a [`SegmentTemplate`];
//! * [`mpd`]: DASH manifests read as a player needs them (representations, and the URL, start
//!   and length of every segment), for the player emulator.
//!
//! [`content_id`] is what the admission filter keys on for any request path, chunk or not;
//! [`describe`] is the human form of a chunk name, as `vcdn name decode` prints it.
//!
//! ```
//! use vcdn_content::{address, describe, ChunkDuration, ChunkName, ContentPrefix};
//!
//! // vcdn name encode --prefix 2001:db8:1:2::/64 --video 42 --chunk 7 --quality 3 --duration 4
//! let prefix: ContentPrefix = "2001:db8:1:2::/64".parse()?;
//! let duration: ChunkDuration = "4".parse()?;
//! let name = ChunkName::new(42, 7, 3, duration)?;
//! let addr = prefix.address(name.id());
//! assert_eq!(addr.to_string(), "2001:db8:1:2:0:2a0:7:cc8");
//!
//! // vcdn name decode 2001:db8:1:2:0:2a0:7:cc8
//! let (prefix, name) = address::decode(addr);
//! assert_eq!(
//!     describe(Some(&prefix), &name),
//!     "prefix: 2001:db8:1:2::/64\n\
//!      id: 000002a000070cc8\n\
//!      video: 42\n\
//!      chunk: 7\n\
//!      quality: 3\n\
//!      duration: 4.00s\n\
//!      address: 2001:db8:1:2:0:2a0:7:cc8\n"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt::Write as _;

pub mod address;
pub mod mpd;
pub mod name;
pub mod template;

pub use address::{ContentPrefix, PrefixError};
pub use name::{video_id_from_name, ChunkDuration, ChunkId, ChunkName, Field, NameError};
pub use template::{SegmentMatch, SegmentTemplate, TemplateError};

/// The id the admission filter (and consistent hashing) uses for a request path.
///
/// When `template` matches the path, the chunk id of the segment; otherwise XXH3-64 of the
/// path without its query string. Content that is not a chunk (a manifest, an init segment, an
/// image) thus still gets a stable id, the same for every request of that path, so the filter
/// judges its popularity like a chunk's. The query string never counts: two requests that
/// differ only in session tokens are the same content. Hashed ids and chunk ids share one
/// 64-bit space; a collision between them is as unlikely as between two hashes.
pub fn content_id(template: Option<&SegmentTemplate>, path: &str) -> u64 {
    match template.and_then(|t| t.match_path(path)) {
        Some(name) => name.id().0,
        None => xxhash_rust::xxh3::xxh3_64(template::strip_query(path).as_bytes()),
    }
}

/// A chunk name in human form, one `field: value` line each: `prefix` (if given), `id` (16 hex
/// digits), `video`, `chunk`, `quality`, `duration` (seconds) and `address` (if a prefix is
/// given). This is what `vcdn name decode ADDR` prints.
pub fn describe(prefix: Option<&ContentPrefix>, name: &ChunkName) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    if let Some(prefix) = prefix {
        let _ = writeln!(out, "prefix: {prefix}");
    }
    let _ = writeln!(out, "id: {}", name.id());
    let _ = writeln!(out, "video: {}", name.video());
    let _ = writeln!(out, "chunk: {}", name.chunk());
    let _ = writeln!(out, "quality: {}", name.quality());
    let _ = writeln!(out, "duration: {}", name.duration());
    if let Some(prefix) = prefix {
        let _ = writeln!(out, "address: {}", prefix.address(name.id()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_id_is_the_chunk_id_for_segments() {
        let tpl: SegmentTemplate = "/vod/$Video$/$RepresentationID$/seg-$Number$.m4s"
            .parse()
            .unwrap();
        let tpl = tpl
            .with_representations(["250k", "1700k"])
            .unwrap()
            .with_segment_duration(ChunkDuration::from_secs_f64(4.0).unwrap());
        let want = ChunkName::new(42, 7, 1, ChunkDuration::from_units(200).unwrap())
            .unwrap()
            .id()
            .0;
        assert_eq!(content_id(Some(&tpl), "/vod/42/1700k/seg-7.m4s"), want);
        assert_eq!(content_id(Some(&tpl), "/vod/42/1700k/seg-7.m4s?t=1"), want);
    }

    #[test]
    fn content_id_hashes_other_paths_without_their_query() {
        let tpl: SegmentTemplate = "/vod/$Video$/seg-$Number$.m4s".parse().unwrap();
        let manifest = xxhash_rust::xxh3::xxh3_64(b"/vod/42/manifest.mpd");
        for t in [None, Some(&tpl)] {
            assert_eq!(content_id(t, "/vod/42/manifest.mpd"), manifest);
            assert_eq!(content_id(t, "/vod/42/manifest.mpd?token=x"), manifest);
        }
        assert_ne!(
            content_id(None, "/vod/42/a.mpd"),
            content_id(None, "/vod/42/b.mpd")
        );
        // Without a template even segment paths are hashed.
        assert_eq!(
            content_id(None, "/vod/42/seg-7.m4s"),
            xxhash_rust::xxh3::xxh3_64(b"/vod/42/seg-7.m4s")
        );
        assert_ne!(
            content_id(Some(&tpl), "/vod/42/seg-7.m4s"),
            content_id(None, "/vod/42/seg-7.m4s")
        );
    }

    #[test]
    fn describe_prints_one_field_per_line() {
        let name = ChunkName::from_id(ChunkId(u64::MAX));
        assert_eq!(
            describe(None, &name),
            "id: ffffffffffffffff\nvideo: 268435455\nchunk: 1048575\nquality: 63\nduration: 20.46s\n"
        );
        let prefix: ContentPrefix = "2001:db8::".parse().unwrap();
        let text = describe(Some(&prefix), &name);
        assert!(text.starts_with("prefix: 2001:db8::/64\n"), "{text}");
        assert!(
            text.ends_with("address: 2001:db8::ffff:ffff:ffff:ffff\n"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 7);
    }
}
