//! Fuzz `vcdn_content::SegmentTemplate` (parse, match_path, render) and `content_id`.
//!
//! Input layout: the first byte chooses the template's settings, the rest is
//! `TEMPLATE \0 PATH` (both taken as lossy UTF-8; without a `\0` the whole rest is the
//! template and also the path). Settings bits: 0 = representation ids
//! `["250k", "1700k", "hd", "x-1", "a_b"]`, 1 = bandwidths `[45226, 88783, 0, 7]`,
//! 2 = segment duration 4 s, 3 = fixed video 12345 (templates without `$Video$`).
//!
//! Checked, besides "never panics":
//!
//! * `SegmentTemplate::parse` either fails or keeps the source text (`Display`).
//! * `match_path` agrees with `match_segment`, ignores the query (same result for the path
//!   without it), and gives `None` for paths over `MAX_PATH_LEN` bytes.
//! * A match carries the template's duration and (without `$Video$`) its video.
//! * Render inverts match: `render(name, video_name)` is the path's matched part: the whole
//!   path without query for an absolute template, its end after a `/` (or all of it) for a
//!   relative one. The one allowed difference: with a representation list, a numeric id not in
//!   the list names quality `q`, which renders as the list's `q`-th id; that rendering must then
//!   match the same chunk on a template without ambiguity, and at least not panic otherwise.
//! * `content_id` is the chunk id on a match, else the same hash as without a template, that
//!   of the path without its query.
//! * Rendering a name derived from the input and matching it back never panics.
//! * The path text also goes through the `ContentPrefix`, `ChunkDuration` and `ChunkId`
//!   parsers; what parses prints back to something that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vcdn_content::template::{strip_query, MAX_PATH_LEN};
use vcdn_content::{content_id, ChunkDuration, ChunkId, ChunkName, ContentPrefix, SegmentTemplate};

fn configure(tpl: SegmentTemplate, flags: u8) -> SegmentTemplate {
    let mut tpl = tpl;
    if flags & 1 != 0 {
        tpl = tpl
            .with_representations(["250k", "1700k", "hd", "x-1", "a_b"])
            .expect("valid representation ids");
    }
    if flags & 2 != 0 {
        tpl = tpl
            .with_bandwidths([45_226, 88_783, 0, 7])
            .expect("valid bandwidths");
    }
    if flags & 4 != 0 {
        tpl = tpl.with_segment_duration(ChunkDuration::from_units(200).expect("4 s"));
    }
    if flags & 8 != 0 && tpl.video().is_some() {
        tpl = tpl.with_video(12_345).expect("video id in range");
    }
    tpl
}

fn check_other_parsers(text: &str) {
    if let Ok(prefix) = text.parse::<ContentPrefix>() {
        assert_eq!(prefix.to_string().parse::<ContentPrefix>(), Ok(prefix));
    }
    if let Ok(d) = text.parse::<ChunkDuration>() {
        assert_eq!(d.to_string().parse::<ChunkDuration>(), Ok(d));
    }
    if let Ok(id) = text.parse::<ChunkId>() {
        assert_eq!(id.to_string().parse::<ChunkId>(), Ok(id));
        assert_eq!(ChunkName::from_id(id).id(), id);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (template, path) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, rest),
    };
    let template = String::from_utf8_lossy(template);
    let path = String::from_utf8_lossy(path);
    check_other_parsers(&path);

    let Ok(tpl) = SegmentTemplate::parse(&template) else {
        return;
    };
    assert_eq!(tpl.to_string(), template);
    let tpl = configure(tpl, flags);

    let m = tpl.match_segment(&path);
    assert_eq!(tpl.match_path(&path), m.map(|m| m.name));
    let clean = strip_query(&path);
    if path.len() > MAX_PATH_LEN {
        assert_eq!(m, None);
    } else {
        assert_eq!(tpl.match_path(clean), m.map(|m| m.name));
    }

    match m {
        Some(m) => {
            assert_eq!(content_id(Some(&tpl), &path), m.name.id().0);
            assert_eq!(m.name.duration(), tpl.segment_duration());
            if let Some(video) = tpl.video() {
                assert_eq!(m.name.video(), video);
                assert_eq!(m.video_name, None);
            }
            let rendered = tpl.render(&m.name, m.video_name);
            if clean.ends_with(&rendered) {
                let before = &clean[..clean.len() - rendered.len()];
                if tpl.is_relative() {
                    assert!(before.is_empty() || before.ends_with('/'), "{before:?}");
                } else {
                    assert!(before.is_empty(), "{before:?}");
                }
            } else {
                // Only a numeric representation id standing for a listed quality renders
                // differently.
                assert!(usize::from(m.name.quality()) < tpl.representations().len());
                let _ = tpl.match_path(&rendered);
            }
        }
        None => {
            // The hash of the path without query, as without a template.
            assert_eq!(content_id(Some(&tpl), &path), content_id(None, clean));
            assert_eq!(content_id(None, &path), content_id(None, clean));
        }
    }

    // Any name renders, and the rendering can be matched (it need not come back: the name
    // may hold a quality the template cannot write).
    let id = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let name = ChunkName::from_id(ChunkId(id));
    let rendered = tpl.render(&name, None);
    let _ = tpl.match_segment(&rendered);
});
