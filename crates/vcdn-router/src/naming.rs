//! Request path → content id, the key of admission filters and consistent
//! hashing: the chunk id of `vcdn-content` (video, chunk, quality and
//! duration packed in 64 bits, as in the content-aware data-plane paper)
//! when the service declares a DASH segment template and the path matches
//! it, else a hash of the path without its query.

use vcdn_content::template::SegmentTemplate;

use crate::config::TemplateConfig;

/// A service's way of naming its content.
pub struct Namer {
    template: Option<SegmentTemplate>,
}

impl Namer {
    pub fn new(t: Option<&TemplateConfig>) -> Result<Namer, String> {
        let template = t
            .map(|t| {
                SegmentTemplate::for_service(&t.path, &t.representations, t.segment_duration_s)
            })
            .transpose()?;
        Ok(Namer { template })
    }

    /// The content id of a request target.
    pub fn content_id(&self, target: &str) -> u64 {
        vcdn_content::content_id(self.template.as_ref(), target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_ids_from_a_template_and_hashes_otherwise() {
        let t = TemplateConfig {
            path: "/vod/$Video$/$RepresentationID$/seg-$Number$.m4s".into(),
            representations: vec!["250k".into(), "1700k".into()],
            segment_duration_s: 2.0,
        };
        let n = Namer::new(Some(&t)).unwrap();
        let a = n.content_id("/vod/42/1700k/seg-7.m4s?token=x");
        let name = vcdn_content::name::ChunkName::from_id(vcdn_content::name::ChunkId(a));
        assert_eq!((name.video(), name.chunk(), name.quality()), (42, 7, 1));
        assert_ne!(a, n.content_id("/vod/42/1700k/seg-8.m4s"));
        // Not a segment: hashed, query ignored.
        assert_eq!(
            n.content_id("/vod/42/manifest.mpd?a=1"),
            n.content_id("/vod/42/manifest.mpd")
        );
        let plain = Namer::new(None).unwrap();
        assert_eq!(plain.content_id("/x?y"), plain.content_id("/x"));
        let bad = TemplateConfig {
            path: "/no-number".into(),
            representations: vec![],
            segment_duration_s: 2.0,
        };
        assert!(Namer::new(Some(&bad)).is_err());
    }
}
