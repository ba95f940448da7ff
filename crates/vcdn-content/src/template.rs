//! Segment templates: DASH segment URL paths mapped to chunk names and back.
//!
//! A player asks for a chunk by URL, not by chunk id, so the request router must turn each
//! request path into the chunk's [`ChunkName`] (hence its id, the key of the LRU admission
//! filter and of consistent hashing). A [`SegmentTemplate`] says where the video, the quality
//! and the chunk index sit in a path, in the syntax of a DASH `SegmentTemplate@media`
//! attribute. The router runs [`SegmentTemplate::match_path`] on every request, on untrusted
//! input, so matching never panics, takes time linear in the path's length, allocates nothing
//! for the usual templates, and gives up on paths over [`MAX_PATH_LEN`] bytes.
//!
//! # Template syntax
//!
//! Literal text with placeholders in DASH's `$Name$` form; `$$` is a literal `$`.
//!
//! | placeholder                       | field   | matches in a path                |
//! |-----------------------------------|---------|----------------------------------|
//! | `$Video$`                         | video   | one or more bytes other than `/` |
//! | `$RepresentationID$`, `$Quality$` | quality | one or more bytes other than `/` |
//! | `$Bandwidth$`, `$Bandwidth%0Nd$`  | quality | one or more decimal digits       |
//! | `$Number$`, `$Number%0Nd$`        | chunk   | one or more decimal digits       |
//!
//! `%0Nd` is DASH's printf-style width (1 ≤ N ≤ 20): the number is zero-padded to N digits.
//! Each placeholder appears at most once, at most one of `$RepresentationID$`, `$Quality$` and
//! `$Bandwidth$` is used, `$Number$` is required, and two placeholders must be separated by
//! literal text (otherwise `12345` could be split anywhere). `$Time$` and `$SubNumber$` are not
//! supported: the chunk index must come from `$Number$`. A template describes a path only, so
//! `?`, `#`, whitespace and control characters are rejected.
//!
//! GPAC 0.5 wrote manifests with `$Number$%d` (the width outside the dollars; see the
//! BigBuckBunny manifest of the DASH data set, whose segments are `BigBuckBunny_4s1.m4s`, not
//! `BigBuckBunny_4s1%d.m4s`). A `%d` or `%0Nd` right after `$Number$` is therefore read as
//! the number's format. It cannot be meant literally: `%d.` is not a valid percent-escape.
//!
//! # Matching
//!
//! The query string is ignored. The path is compared byte for byte: no percent-decoding, no
//! `..` or `//` normalization (that is the HTTP layer's job). A template that starts with `/`
//! must match the whole path; a *relative* template (as found in manifests, relative to the
//! manifest's URL) must match the end of the path, starting at its beginning or right after a
//! `/`, so `media/bunny_$Bandwidth$bps/seg$Number$.m4s` matches
//! `/dash/media/bunny_45226bps/seg1.m4s`.
//!
//! The path is first split along the template: each placeholder takes one or more bytes of its
//! kind (see the table), and where several splits are possible the earlier placeholders take
//! as much as they can (as a backtracking regex would). The values are then read, and the path
//! does not match if any is out of place:
//!
//! * `$Number$` is the chunk index, as written (no `startNumber` offset, so `vcdn name decode`
//!   shows the number of the URL). It must be written as the template would write it: no extra
//!   leading zeros (`seg-007` does not match `seg-$Number$`, `seg-00007` matches
//!   `seg-$Number%05d$`), and it must be at most 2^20 − 1.
//! * `$RepresentationID$` / `$Quality$` is looked up in the template's list of representation
//!   ids, in quality order (`["250k", "1700k"]`: `250k` is quality 0, `1700k` quality 1). An id
//!   not in the list that is a plain decimal number below 64 (`0`, `7`, `63`; not `07`, not
//!   `64`) is the quality itself (so with that list `1` and `1700k` name the same quality);
//!   anything else does not match.
//! * `$Bandwidth$` is looked up in the template's list of bandwidths, in quality order; a
//!   bandwidth not in the list does not match.
//! * Either list holds at most 64 entries ([`MAX_REPRESENTATIONS`]), what the 6-bit quality
//!   field can tell apart: enough for every representation of the DASH data set's manifests
//!   (17 to 20 each), so each of their segments has its own chunk id. A path whose
//!   representation is not in the list does not match, and [`crate::content_id`] hashes it.
//! * `$Video$` is a video id if it is a plain decimal number below 2^28 (`42`; not `042`).
//!   Anything else is a video *name*, whose id is [`video_id_from_name`]: the top 28 bits of its
//!   XXH3-64 hash. That is one way only: the id does not give back the name, which is why
//!   [`SegmentTemplate::match_segment`] returns the name as it appeared. A template without
//!   `$Video$` names one video, by default the one whose name is the template text itself
//!   (so two manifests' templates give two videos); [`SegmentTemplate::with_video`] sets it.
//! * A template without a quality placeholder gives quality 0; the duration is the template's
//!   segment duration (0, "not given", unless set).
//!
//! [`SegmentTemplate::render`] goes the other way. For every path `p` that matches,
//! `render(name, video_name)` with the match's name and video name gives back `p` (its
//! matched part, without the query), except when `p` gave its quality as a number that the
//! representation list also names: then the list's id is written.

use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

use thiserror::Error;

use crate::name::{video_id_from_name, ChunkDuration, ChunkName, NameError, QUALITY_BITS};

mod matcher;

use matcher::{Captures, Class, Program, MAX_SLOTS};

/// Paths longer than this (in bytes, query included) never match.
pub const MAX_PATH_LEN: usize = 8 * 1024;
/// The longest template accepted, in bytes.
pub const MAX_TEMPLATE_LEN: usize = 1024;
/// The largest printf width, `%020d`.
pub const MAX_WIDTH: usize = 20;
/// The most representations (or bandwidths) a template lists, 64: the quality field has 6 bits.
pub const MAX_REPRESENTATIONS: usize = 1 << QUALITY_BITS;

/// Why a template or its settings were rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TemplateError {
    /// The template is empty.
    #[error("segment template is empty: expected a path such as /vod/$Video$/$RepresentationID$/seg-$Number$.m4s")]
    Empty,
    /// The template is longer than [`MAX_TEMPLATE_LEN`].
    #[error("segment template is {len} bytes long; the maximum is {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// [`MAX_TEMPLATE_LEN`].
        max: usize,
    },
    /// A character that cannot be part of a URL path as sent.
    #[error("segment template has {ch:?} at byte {at}: a template describes a URL path, without query, fragment, whitespace or control characters (percent-encode them)")]
    InvalidChar {
        /// The character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
    /// A `$` without its closing `$`.
    #[error("unterminated placeholder at byte {at}: `$` opens a `$Name$` placeholder and needs a closing `$` (write `$$` for a literal `$`)")]
    Unterminated {
        /// Byte offset of the opening `$`.
        at: usize,
    },
    /// A placeholder name this module does not know.
    #[error("unknown placeholder `{placeholder}` at byte {at}: expected $Video$, $RepresentationID$ (or $Quality$), $Bandwidth$ or $Number$ (write `$$` for a literal `$`)")]
    UnknownPlaceholder {
        /// The placeholder as written.
        placeholder: String,
        /// Byte offset of its opening `$`.
        at: usize,
    },
    /// A DASH placeholder that chunk naming cannot use.
    #[error("placeholder `{placeholder}` at byte {at} is not supported: {reason}")]
    Unsupported {
        /// The placeholder as written.
        placeholder: String,
        /// Byte offset of its opening `$`.
        at: usize,
        /// Why.
        reason: &'static str,
    },
    /// A width format that is not `%0Nd`.
    #[error("bad format in `{placeholder}` at byte {at}: expected `%0<width>d` with a width from 1 to 20, as in $Number%05d$")]
    BadFormat {
        /// The placeholder as written.
        placeholder: String,
        /// Byte offset of its opening `$`.
        at: usize,
    },
    /// A width format on a placeholder that is not a number.
    #[error("`{placeholder}` at byte {at} cannot take a width format: only $Number$ and $Bandwidth$ can")]
    FormatNotAllowed {
        /// The placeholder as written.
        placeholder: String,
        /// Byte offset of its opening `$`.
        at: usize,
    },
    /// Two placeholders with nothing between them.
    #[error("`{second}` at byte {at} follows `{first}` with nothing between them: put literal text (such as `/`, `-` or `_`) between placeholders so that a path can be split")]
    AdjacentPlaceholders {
        /// The first placeholder as written.
        first: String,
        /// The second placeholder as written.
        second: String,
        /// Byte offset of the second one.
        at: usize,
    },
    /// The same placeholder twice.
    #[error("`{placeholder}` appears twice (at bytes {first_at} and {at}): each placeholder may appear once")]
    DuplicatePlaceholder {
        /// The placeholder as written (the second time).
        placeholder: String,
        /// Byte offset of the first one.
        first_at: usize,
        /// Byte offset of the second one.
        at: usize,
    },
    /// Two placeholders that both give the quality.
    #[error("`{second}` at byte {at} and `{first}` both give the quality: use only one of $RepresentationID$, $Quality$ and $Bandwidth$")]
    TwoQualityKeys {
        /// The first placeholder as written.
        first: String,
        /// The second placeholder as written.
        second: String,
        /// Byte offset of the second one.
        at: usize,
    },
    /// No `$Number$`.
    #[error(
        "segment template has no $Number$ placeholder: the chunk index must come from the path"
    )]
    MissingNumber,
    /// More than [`MAX_REPRESENTATIONS`] representations or bandwidths.
    #[error("more than {max} {what} given: the 6-bit quality field holds {max}")]
    TooManyRepresentations {
        /// "representation ids" or "bandwidths".
        what: &'static str,
        /// [`MAX_REPRESENTATIONS`].
        max: usize,
    },
    /// A representation id that cannot appear in a path segment.
    #[error("representation id {id:?} cannot be matched in a path: it must be non-empty, without `/`, `?`, `#`, whitespace or control characters")]
    InvalidRepresentation {
        /// The id.
        id: String,
    },
    /// The same representation id or bandwidth twice.
    #[error("{what} {value} is listed twice: each quality needs its own")]
    DuplicateRepresentation {
        /// "representation id" or "bandwidth".
        what: &'static str,
        /// The repeated value.
        value: String,
    },
    /// A fixed video id for a template that reads it from the path.
    #[error("this template takes the video from $Video$; a fixed video id only applies to templates without it")]
    VideoFromPath,
    /// A fixed video id out of range.
    #[error(transparent)]
    Video(#[from] NameError),
}

/// Which field a placeholder gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Video,
    Representation,
    Bandwidth,
    Number,
}

impl Key {
    fn class(self) -> Class {
        match self {
            Key::Video | Key::Representation => Class::Segment,
            Key::Bandwidth | Key::Number => Class::Digit,
        }
    }

    fn is_quality(self) -> bool {
        matches!(self, Key::Representation | Key::Bandwidth)
    }
}

/// One placeholder of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    key: Key,
    /// Zero-padding width; 0 for none.
    width: usize,
    /// As written, for error messages.
    token: String,
    /// Byte offset of its opening `$`.
    at: usize,
}

/// A template's match: the chunk name, and the video name when the path named the video by
/// name rather than by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentMatch<'p> {
    /// The chunk.
    pub name: ChunkName,
    /// The `$Video$` text, if it was a name (then `name.video()` is its hash).
    pub video_name: Option<&'p str>,
}

/// A DASH-style segment URL template with its settings (quality order, segment duration,
/// video); see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentTemplate {
    source: String,
    /// `slots.len() + 1` literals, around and between the placeholders.
    literals: Vec<String>,
    slots: Vec<Slot>,
    relative: bool,
    /// Number of `/` in the literals (hence in any matching path part).
    slashes: usize,
    /// The shortest path part that can match.
    min_len: usize,
    /// The Pike VM program, for templates the one-pass matcher cannot split.
    program: Option<Program>,
    representations: Vec<String>,
    bandwidths: Vec<u64>,
    segment_duration: ChunkDuration,
    /// The video of templates without `$Video$`.
    video: u32,
}

impl SegmentTemplate {
    /// Parses and checks a template such as `/vod/$Video$/$RepresentationID$/seg-$Number$.m4s`.
    ///
    /// The settings start empty: no representation ids or bandwidths, duration 0 ("not
    /// given"), and for a template without `$Video$` the video whose name is the template.
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        if source.is_empty() {
            return Err(TemplateError::Empty);
        }
        if source.len() > MAX_TEMPLATE_LEN {
            return Err(TemplateError::TooLong {
                len: source.len(),
                max: MAX_TEMPLATE_LEN,
            });
        }
        if let Some((at, ch)) = source
            .char_indices()
            .find(|&(_, c)| c == '?' || c == '#' || c.is_whitespace() || c.is_control())
        {
            return Err(TemplateError::InvalidChar { ch, at });
        }

        let mut literals = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        let mut literal = String::new();
        let mut i = 0;
        while let Some(offset) = source[i..].find('$') {
            let at = i + offset;
            literal.push_str(&source[i..at]);
            if source[at + 1..].starts_with('$') {
                literal.push('$');
                i = at + 2;
                continue;
            }
            let close = source[at + 1..]
                .find('$')
                .map(|o| at + 1 + o)
                .ok_or(TemplateError::Unterminated { at })?;
            let token = &source[at..=close];
            let inner = &token[1..token.len() - 1];
            let (name, format) = match inner.find('%') {
                Some(p) => (&inner[..p], Some(&inner[p..])),
                None => (inner, None),
            };
            let key = match name {
                "Video" => Key::Video,
                "RepresentationID" | "Quality" => Key::Representation,
                "Bandwidth" => Key::Bandwidth,
                "Number" => Key::Number,
                "Time" => {
                    return Err(TemplateError::Unsupported {
                        placeholder: token.to_string(),
                        at,
                        reason: "time-based segment addressing gives no chunk index; use $Number$",
                    })
                }
                "SubNumber" => {
                    return Err(TemplateError::Unsupported {
                        placeholder: token.to_string(),
                        at,
                        reason: "sub-segments are not named; use $Number$",
                    })
                }
                _ => {
                    return Err(TemplateError::UnknownPlaceholder {
                        placeholder: token.to_string(),
                        at,
                    })
                }
            };
            let mut width = 0;
            if let Some(format) = format {
                if key.class() != Class::Digit {
                    return Err(TemplateError::FormatNotAllowed {
                        placeholder: token.to_string(),
                        at,
                    });
                }
                width = parse_width(format).ok_or_else(|| TemplateError::BadFormat {
                    placeholder: token.to_string(),
                    at,
                })?;
            }
            i = close + 1;
            if key == Key::Number && format.is_none() {
                // GPAC 0.5's `$Number$%d`: the format outside the dollars.
                if let Some((w, len)) = gpac_width(&source[i..]) {
                    width = w;
                    i += len;
                }
            }
            if let Some(prev) = slots.last() {
                if literal.is_empty() {
                    return Err(TemplateError::AdjacentPlaceholders {
                        first: prev.token.clone(),
                        second: token.to_string(),
                        at,
                    });
                }
            }
            if let Some(prev) = slots
                .iter()
                .find(|s| s.key == key && s.token[1..].starts_with(name))
            {
                return Err(TemplateError::DuplicatePlaceholder {
                    placeholder: token.to_string(),
                    first_at: prev.at,
                    at,
                });
            }
            if let Some(prev) = slots
                .iter()
                .find(|s| key.is_quality() && s.key.is_quality())
            {
                return Err(TemplateError::TwoQualityKeys {
                    first: prev.token.clone(),
                    second: token.to_string(),
                    at,
                });
            }
            literals.push(std::mem::take(&mut literal));
            slots.push(Slot {
                key,
                width,
                token: token.to_string(),
                at,
            });
        }
        literal.push_str(&source[i..]);
        literals.push(literal);
        if !slots.iter().any(|s| s.key == Key::Number) {
            return Err(TemplateError::MissingNumber);
        }
        debug_assert!(slots.len() <= MAX_SLOTS);

        let lits: Vec<&[u8]> = literals.iter().map(|l| l.as_bytes()).collect();
        let classes: Vec<Class> = slots.iter().map(|s| s.key.class()).collect();
        let program =
            (!matcher::is_simple(&lits, &classes)).then(|| Program::compile(&lits, &classes));
        Ok(SegmentTemplate {
            source: source.to_string(),
            relative: !source.starts_with('/'),
            slashes: literals.iter().map(|l| l.matches('/').count()).sum(),
            min_len: literals.iter().map(String::len).sum::<usize>() + slots.len(),
            literals,
            slots,
            program,
            representations: Vec::new(),
            bandwidths: Vec::new(),
            segment_duration: ChunkDuration::ZERO,
            video: video_id_from_name(source),
        })
    }

    /// Sets the representation ids that `$RepresentationID$` / `$Quality$` map to qualities,
    /// lowest quality first (at most 64, distinct, usable in a path segment).
    pub fn with_representations<I, S>(mut self, ids: I) -> Result<Self, TemplateError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut list: Vec<String> = Vec::new();
        for id in ids {
            let id = id.into();
            if list.len() == MAX_REPRESENTATIONS {
                return Err(TemplateError::TooManyRepresentations {
                    what: "representation ids",
                    max: MAX_REPRESENTATIONS,
                });
            }
            if id.is_empty()
                || id
                    .chars()
                    .any(|c| matches!(c, '/' | '?' | '#') || c.is_whitespace() || c.is_control())
            {
                return Err(TemplateError::InvalidRepresentation { id });
            }
            if list.contains(&id) {
                return Err(TemplateError::DuplicateRepresentation {
                    what: "representation id",
                    value: format!("{id:?}"),
                });
            }
            list.push(id);
        }
        self.representations = list;
        Ok(self)
    }

    /// Sets the bandwidths (bits/s) that `$Bandwidth$` maps to qualities, lowest quality first
    /// (at most 64, distinct).
    pub fn with_bandwidths<I>(mut self, bandwidths: I) -> Result<Self, TemplateError>
    where
        I: IntoIterator<Item = u64>,
    {
        let mut list: Vec<u64> = Vec::new();
        for bandwidth in bandwidths {
            if list.len() == MAX_REPRESENTATIONS {
                return Err(TemplateError::TooManyRepresentations {
                    what: "bandwidths",
                    max: MAX_REPRESENTATIONS,
                });
            }
            if list.contains(&bandwidth) {
                return Err(TemplateError::DuplicateRepresentation {
                    what: "bandwidth",
                    value: bandwidth.to_string(),
                });
            }
            list.push(bandwidth);
        }
        self.bandwidths = list;
        Ok(self)
    }

    /// A service's template as its configuration states it: the path, the representation ids
    /// in quality order (bandwidths when the path has `$Bandwidth$`), the segment duration in
    /// seconds. The router's content ids and the cache's chunk addresses both come from this,
    /// so that the two agree on which chunk a path names.
    pub fn for_service(
        path: &str,
        representations: &[String],
        segment_duration_s: f64,
    ) -> Result<Self, String> {
        let mut t = SegmentTemplate::parse(path).map_err(|e| e.to_string())?;
        if !representations.is_empty() {
            t = if path.contains("$Bandwidth") {
                let bandwidths: Vec<u64> = representations
                    .iter()
                    .map(|r| {
                        r.parse()
                            .map_err(|_| format!("bandwidth '{r}' is not a number"))
                    })
                    .collect::<Result<_, _>>()?;
                t.with_bandwidths(bandwidths).map_err(|e| e.to_string())?
            } else {
                t.with_representations(representations.iter().cloned())
                    .map_err(|e| e.to_string())?
            };
        }
        let d = ChunkDuration::from_secs_f64(segment_duration_s).map_err(|e| e.to_string())?;
        Ok(t.with_segment_duration(d))
    }

    /// Sets the duration given to every chunk of this template.
    pub fn with_segment_duration(mut self, duration: ChunkDuration) -> Self {
        self.segment_duration = duration;
        self
    }

    /// Sets the video id of a template without `$Video$` (at most 2^28 − 1).
    pub fn with_video(mut self, video: u64) -> Result<Self, TemplateError> {
        if self.has(Key::Video) {
            return Err(TemplateError::VideoFromPath);
        }
        self.video = ChunkName::new(video, 0, 0, ChunkDuration::ZERO)?.video();
        Ok(self)
    }

    /// Sets the video of a template without `$Video$` by name (see [`video_id_from_name`]).
    pub fn with_video_name(self, name: &str) -> Result<Self, TemplateError> {
        self.with_video(video_id_from_name(name).into())
    }

    /// The template as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template is relative (does not start with `/`) and so matches the end of a
    /// path.
    pub fn is_relative(&self) -> bool {
        self.relative
    }

    /// The representation ids, lowest quality first.
    pub fn representations(&self) -> &[String] {
        &self.representations
    }

    /// The bandwidths, lowest quality first.
    pub fn bandwidths(&self) -> &[u64] {
        &self.bandwidths
    }

    /// The duration given to every chunk.
    pub fn segment_duration(&self) -> ChunkDuration {
        self.segment_duration
    }

    /// The fixed video id, for a template without `$Video$`.
    pub fn video(&self) -> Option<u32> {
        (!self.has(Key::Video)).then_some(self.video)
    }

    fn has(&self, key: Key) -> bool {
        self.slots.iter().any(|s| s.key == key)
    }

    /// The chunk a request path names, or `None` if the path is not one of this template's
    /// segments (or is longer than [`MAX_PATH_LEN`]). The query string is ignored.
    pub fn match_path(&self, path: &str) -> Option<ChunkName> {
        self.match_segment(path).map(|m| m.name)
    }

    /// Like [`match_path`](Self::match_path), also giving the video name when the path named
    /// the video by name.
    pub fn match_segment<'p>(&self, path: &'p str) -> Option<SegmentMatch<'p>> {
        if path.len() > MAX_PATH_LEN {
            return None;
        }
        let part = self.matched_part(strip_query(path))?;
        if part.len() < self.min_len {
            return None;
        }
        let caps = match &self.program {
            None => {
                let lits: [&[u8]; MAX_SLOTS + 1] =
                    std::array::from_fn(|i| self.literals.get(i).map_or(&[][..], |l| l.as_bytes()));
                let classes: [Class; MAX_SLOTS] = std::array::from_fn(|i| {
                    self.slots.get(i).map_or(Class::Digit, |s| s.key.class())
                });
                let n = self.slots.len();
                matcher::split_simple(&lits[..=n], &classes[..n], part.as_bytes())?
            }
            Some(program) => program.split(part.as_bytes())?,
        };
        self.read(part, &caps)
    }

    /// The part of `path` the template must match whole: all of it for an absolute template,
    /// for a relative one the part after the slash that leaves as many slashes as the template
    /// has (placeholders never match a `/`).
    fn matched_part<'p>(&self, path: &'p str) -> Option<&'p str> {
        if !self.relative {
            return Some(path);
        }
        let mut seen = 0;
        for (i, b) in path.bytes().enumerate().rev() {
            if b == b'/' {
                if seen == self.slashes {
                    return Some(&path[i + 1..]);
                }
                seen += 1;
            }
        }
        (seen == self.slashes).then_some(path)
    }

    /// Reads the captured values.
    fn read<'p>(&self, part: &'p str, caps: &Captures) -> Option<SegmentMatch<'p>> {
        let mut video = u64::from(self.video);
        let mut video_name = None;
        let mut quality = 0;
        let mut chunk = 0;
        for (slot, &(start, end)) in self.slots.iter().zip(caps) {
            let text = part.get(start..end)?;
            match slot.key {
                Key::Video => match canonical_decimal(text, 0) {
                    Some(v) if v <= u64::from(ChunkName::MAX_VIDEO) => video = v,
                    _ => {
                        video = video_id_from_name(text).into();
                        video_name = Some(text);
                    }
                },
                Key::Representation => {
                    quality = match self.representations.iter().position(|r| r == text) {
                        Some(q) => q as u64,
                        None => canonical_decimal(text, 0)
                            .filter(|&q| q <= u64::from(ChunkName::MAX_QUALITY))?,
                    }
                }
                Key::Bandwidth => {
                    let bandwidth = canonical_decimal(text, slot.width)?;
                    quality = self.bandwidths.iter().position(|&b| b == bandwidth)? as u64;
                }
                Key::Number => chunk = canonical_decimal(text, slot.width)?,
            }
        }
        let name = ChunkName::new(video, chunk, quality, self.segment_duration).ok()?;
        Some(SegmentMatch { name, video_name })
    }

    /// The path (relative if the template is) of chunk `name`.
    ///
    /// `video_name`, if given, is written for `$Video$` instead of the video id; it should be
    /// the name whose [`video_id_from_name`] is `name.video()`, or the path will name another
    /// video. A quality beyond the template's lists is written as a number, and the duration
    /// is not part of a path: such names do not come back unchanged from
    /// [`match_path`](Self::match_path).
    pub fn render(&self, name: &ChunkName, video_name: Option<&str>) -> String {
        let mut out = String::with_capacity(self.source.len() + 24);
        let quality = usize::from(name.quality());
        for (literal, slot) in self.literals.iter().zip(&self.slots) {
            out.push_str(literal);
            // Writing to a String cannot fail.
            let _ = match slot.key {
                Key::Video => match video_name {
                    Some(v) => write!(out, "{v}"),
                    None => write!(out, "{}", name.video()),
                },
                Key::Representation => match self.representations.get(quality) {
                    Some(id) => write!(out, "{id}"),
                    None => write!(out, "{quality}"),
                },
                Key::Bandwidth => {
                    let bandwidth = self.bandwidths.get(quality).copied();
                    let bandwidth = bandwidth.unwrap_or(quality as u64);
                    write!(out, "{bandwidth:0width$}", width = slot.width)
                }
                Key::Number => write!(out, "{:0width$}", name.chunk(), width = slot.width),
            };
        }
        if let Some(last) = self.literals.last() {
            out.push_str(last);
        }
        out
    }
}

impl FromStr for SegmentTemplate {
    type Err = TemplateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The template as given.
impl fmt::Display for SegmentTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// `path` without its query string (from the first `?`).
pub fn strip_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

/// The width of a `%0Nd` (or `%d`, width 0) format.
fn parse_width(format: &str) -> Option<usize> {
    let inner = format.strip_prefix('%')?.strip_suffix('d')?;
    if inner.is_empty() {
        return Some(0);
    }
    let digits = inner.strip_prefix('0')?;
    if digits.is_empty() || digits.len() > 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let width: usize = digits.parse().ok()?;
    (1..=MAX_WIDTH).contains(&width).then_some(width)
}

/// A `%d` or `%0Nd` at the start of `rest` (GPAC's `$Number$%d`): its width and length.
fn gpac_width(rest: &str) -> Option<(usize, usize)> {
    let bytes = rest.as_bytes();
    if bytes.first() != Some(&b'%') {
        return None;
    }
    let digits = bytes[1..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits > 3 || bytes.get(1 + digits) != Some(&b'd') {
        return None;
    }
    let len = digits + 2;
    parse_width(&rest[..len]).map(|w| (w, len))
}

/// The value of `text` if it is decimal digits written as `%0{width}d` would write them: no
/// leading zeros beyond the padding. At most 20 digits.
fn canonical_decimal(text: &str, width: usize) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value = text.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })?;
    let digits = value.checked_ilog10().map_or(1, |l| l as usize + 1);
    (text.len() == digits.max(width)).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn t(s: &str) -> SegmentTemplate {
        SegmentTemplate::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn secs(s: f64) -> ChunkDuration {
        ChunkDuration::from_secs_f64(s).unwrap()
    }

    fn name(video: u64, chunk: u64, quality: u64, duration: ChunkDuration) -> ChunkName {
        ChunkName::new(video, chunk, quality, duration).unwrap()
    }

    fn vod() -> SegmentTemplate {
        t("/vod/$Video$/$RepresentationID$/seg-$Number$.m4s")
            .with_representations(["250k", "700k", "1700k"])
            .unwrap()
            .with_segment_duration(secs(4.0))
    }

    // ---- parsing ----

    fn err(s: &str) -> TemplateError {
        SegmentTemplate::parse(s).unwrap_err()
    }

    #[test]
    fn rejects_bad_templates_with_clear_messages() {
        assert_eq!(err(""), TemplateError::Empty);
        let e = err("/v/$Video$/$Time$.m4s");
        assert!(
            matches!(e, TemplateError::Unsupported { at: 11, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("$Time$"), "{e}");
        let e = err("/v/$Vidoe$/$Number$.m4s");
        assert_eq!(
            e,
            TemplateError::UnknownPlaceholder {
                placeholder: "$Vidoe$".into(),
                at: 3
            }
        );
        assert_eq!(
            e.to_string(),
            "unknown placeholder `$Vidoe$` at byte 3: expected $Video$, $RepresentationID$ \
             (or $Quality$), $Bandwidth$ or $Number$ (write `$$` for a literal `$`)"
        );
        let e = err("/v/$Video$$Number$.m4s");
        assert_eq!(
            e,
            TemplateError::AdjacentPlaceholders {
                first: "$Video$".into(),
                second: "$Number$".into(),
                at: 10
            }
        );
        assert!(e.to_string().contains("put literal text"), "{e}");
        // The GPAC `%d` does not count as a separator.
        assert!(matches!(
            err("/v/$Number$%d$Video$"),
            TemplateError::AdjacentPlaceholders { .. }
        ));
        let e = err("/v/$Video$/$RepresentationID$.m4s");
        assert_eq!(e, TemplateError::MissingNumber);
        assert!(e.to_string().contains("no $Number$"), "{e}");
        assert_eq!(err("/v/$Number.m4s"), TemplateError::Unterminated { at: 3 });
        assert!(matches!(
            err("/v/$Number$/$Number$.m4s"),
            TemplateError::DuplicatePlaceholder {
                first_at: 3,
                at: 12,
                ..
            }
        ));
        assert!(matches!(
            err("/v/$RepresentationID$/$Bandwidth$/$Number$"),
            TemplateError::TwoQualityKeys { .. }
        ));
        assert!(matches!(
            err("/v/$Quality$/$RepresentationID$/$Number$"),
            TemplateError::TwoQualityKeys { .. }
        ));
        for bad in ["%5d", "%05", "%0d", "%021d", "%05x", "%-5d", "%0005d"] {
            let e = err(&format!("/v/$Number{bad}$.m4s"));
            assert!(matches!(e, TemplateError::BadFormat { .. }), "{bad}: {e}");
        }
        assert!(matches!(
            err("/v/$Video%05d$/$Number$"),
            TemplateError::FormatNotAllowed { .. }
        ));
        assert!(matches!(
            err("/v/$Number$.m4s?x=1"),
            TemplateError::InvalidChar { ch: '?', at: 15 }
        ));
        assert!(matches!(
            err("/v/$Number$ .m4s"),
            TemplateError::InvalidChar { ch: ' ', .. }
        ));
        assert!(matches!(
            err("/v/$Number$#f"),
            TemplateError::InvalidChar { ch: '#', .. }
        ));
        let long = format!("/{}$Number$", "a".repeat(MAX_TEMPLATE_LEN));
        assert!(matches!(err(&long), TemplateError::TooLong { .. }));
        assert!(matches!(
            err("/v/$$Number$"),
            TemplateError::Unterminated { at: 11 }
        ));
    }

    #[test]
    fn accepts_dash_forms() {
        for ok in [
            "/vod/$Video$/$RepresentationID$/seg-$Number$.m4s",
            "/vod/$Video$/$Quality$/seg-$Number%05d$.m4s",
            "$RepresentationID$/$Number$.m4s",
            "chunk-stream$RepresentationID$-$Number%05d$.m4s",
            "bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s",
            "/a$$b/$Number%d$",
            "/$Number%020d$",
            "/$Number$",
        ] {
            let tpl = t(ok);
            assert_eq!(tpl.to_string(), ok);
            assert_eq!(tpl.source(), ok);
        }
    }

    #[test]
    fn rejects_bad_settings() {
        assert_eq!(MAX_REPRESENTATIONS, 64);
        let ids: Vec<String> = (0..65).map(|i| format!("r{i}")).collect();
        let e = vod().with_representations(ids).unwrap_err();
        assert_eq!(
            e,
            TemplateError::TooManyRepresentations {
                what: "representation ids",
                max: 64
            }
        );
        assert_eq!(
            e.to_string(),
            "more than 64 representation ids given: the 6-bit quality field holds 64"
        );
        assert!(vod()
            .with_representations((0..64).map(|i| format!("r{i}")))
            .is_ok());
        assert!(matches!(
            vod().with_representations(["a", "a"]),
            Err(TemplateError::DuplicateRepresentation { .. })
        ));
        for bad in ["", "a/b", "a b", "a?b", "a#b", "a\nb"] {
            assert!(
                matches!(
                    vod().with_representations([bad]),
                    Err(TemplateError::InvalidRepresentation { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            vod().with_bandwidths([1, 1]),
            Err(TemplateError::DuplicateRepresentation { .. })
        ));
        let e = vod().with_bandwidths(0..65).unwrap_err();
        assert_eq!(
            e.to_string(),
            "more than 64 bandwidths given: the 6-bit quality field holds 64"
        );
        assert!(vod().with_bandwidths(0..64).is_ok());
        assert_eq!(vod().with_video(1), Err(TemplateError::VideoFromPath));
        let e = t("/v/$Number$").with_video(1 << 28).unwrap_err();
        assert_eq!(
            e.to_string(),
            "video id 268435456 is out of range (maximum 268435455)"
        );
        assert!(t("/v/$Number$").with_video((1 << 28) - 1).is_ok());
    }

    // ---- matching and rendering ----

    #[test]
    fn maps_representations_to_qualities_in_order() {
        let tpl = vod();
        let n = tpl.match_path("/vod/42/1700k/seg-17.m4s").unwrap();
        assert_eq!(n, name(42, 17, 2, secs(4.0)));
        assert_eq!(
            tpl.match_path("/vod/42/250k/seg-0.m4s").unwrap().quality(),
            0
        );
        assert_eq!(
            tpl.match_path("/vod/42/700k/seg-1.m4s").unwrap().quality(),
            1
        );
        assert_eq!(tpl.render(&n, None), "/vod/42/1700k/seg-17.m4s");
        // A numeric id not in the list is the quality itself, if below 64 and plain.
        assert_eq!(tpl.match_path("/vod/42/7/seg-1.m4s").unwrap().quality(), 7);
        for q in [15, 16, 19, 63] {
            let path = format!("/vod/42/{q}/seg-1.m4s");
            assert_eq!(tpl.match_path(&path).unwrap().quality(), q, "{path}");
        }
        assert_eq!(tpl.match_path("/vod/42/64/seg-1.m4s"), None);
        assert_eq!(tpl.match_path("/vod/42/07/seg-1.m4s"), None);
        assert_eq!(tpl.match_path("/vod/42/063/seg-1.m4s"), None);
        assert_eq!(tpl.match_path("/vod/42/3000k/seg-1.m4s"), None);
        // ... and renders back as that number.
        let seven = name(42, 1, 7, secs(4.0));
        assert_eq!(tpl.render(&seven, None), "/vod/42/7/seg-1.m4s");
        // $Quality$ is the same placeholder.
        let q = t("/vod/$Video$/$Quality$/seg-$Number$.m4s");
        assert_eq!(q.match_path("/vod/1/3/seg-2.m4s").unwrap().quality(), 3);
    }

    #[test]
    fn full_lists_of_64_name_qualities_0_to_63() {
        let ids: Vec<String> = (0..MAX_REPRESENTATIONS).map(|i| format!("r{i}")).collect();
        let tpl = vod().with_representations(ids).unwrap();
        for q in 0..64u8 {
            let path = format!("/vod/42/r{q}/seg-5.m4s");
            let n = tpl.match_path(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!((n.quality(), n.chunk()), (q, 5));
            assert_eq!(tpl.render(&n, None), path);
        }
        assert_eq!(tpl.match_path("/vod/42/r64/seg-5.m4s"), None);

        let tpl = t("/v/$Bandwidth$/$Number$.m4s")
            .with_bandwidths((0..64).map(|q| 100_000 + 1000 * q))
            .unwrap();
        let n = tpl.match_path("/v/163000/9.m4s").unwrap();
        assert_eq!((n.quality(), n.chunk()), (63, 9));
        assert_eq!(tpl.render(&n, None), "/v/163000/9.m4s");
        assert_eq!(tpl.match_path("/v/164000/9.m4s"), None);
    }

    #[test]
    fn ignores_the_query_string() {
        let tpl = vod();
        let a = tpl.match_path("/vod/42/250k/seg-3.m4s").unwrap();
        for p in [
            "/vod/42/250k/seg-3.m4s?",
            "/vod/42/250k/seg-3.m4s?token=abc&x=/1",
            "/vod/42/250k/seg-3.m4s??",
        ] {
            assert_eq!(tpl.match_path(p), Some(a), "{p}");
        }
    }

    #[test]
    fn names_videos_by_number_or_by_hashed_name() {
        let tpl = vod();
        let m = tpl
            .match_segment("/vod/big-buck-bunny/250k/seg-3.m4s")
            .unwrap();
        assert_eq!(m.video_name, Some("big-buck-bunny"));
        assert_eq!(m.name.video(), video_id_from_name("big-buck-bunny"));
        assert_eq!(
            tpl.render(&m.name, m.video_name),
            "/vod/big-buck-bunny/250k/seg-3.m4s"
        );
        // Without the name, the id is written: another path, the same chunk.
        let by_id = tpl.render(&m.name, None);
        assert_eq!(tpl.match_path(&by_id), Some(m.name));

        let max = u64::from(ChunkName::MAX_VIDEO);
        let path = format!("/vod/{max}/250k/seg-3.m4s");
        let m = tpl.match_segment(&path).unwrap();
        assert_eq!((u64::from(m.name.video()), m.video_name), (max, None));
        // Not plain numbers below 2^28: names.
        for v in ["268435456", "1073741823", "042", "99999999999999999999999"] {
            let path = format!("/vod/{v}/250k/seg-3.m4s");
            let m = tpl.match_segment(&path).unwrap();
            assert_eq!(m.video_name, Some(v));
            assert_eq!(m.name.video(), video_id_from_name(v));
        }
        assert_eq!(
            tpl.match_segment("/vod/0/250k/seg-3.m4s")
                .unwrap()
                .name
                .video(),
            0
        );
    }

    #[test]
    fn chunk_numbers_cover_the_field_and_no_more() {
        let tpl = vod();
        let max = ChunkName::MAX_CHUNK;
        let n = tpl
            .match_path(&format!("/vod/1/250k/seg-{max}.m4s"))
            .unwrap();
        assert_eq!(n.chunk(), max);
        assert_eq!(
            tpl.match_path(&format!("/vod/1/250k/seg-{}.m4s", max + 1)),
            None
        );
        assert_eq!(
            tpl.match_path("/vod/1/250k/seg-18446744073709551615.m4s"),
            None
        );
        assert_eq!(
            tpl.match_path("/vod/1/250k/seg-18446744073709551616.m4s"),
            None
        );
        assert_eq!(tpl.match_path("/vod/1/250k/seg-007.m4s"), None);
        assert_eq!(tpl.match_path("/vod/1/250k/seg-0.m4s").unwrap().chunk(), 0);
    }

    #[test]
    fn printf_widths_match_and_render_exactly() {
        let tpl = t("/v/$Video$/$RepresentationID$/seg-$Number%05d$.m4s")
            .with_representations(["a", "b"])
            .unwrap();
        let n = tpl.match_path("/v/9/b/seg-00017.m4s").unwrap();
        assert_eq!((n.video(), n.chunk(), n.quality()), (9, 17, 1));
        assert_eq!(tpl.render(&n, None), "/v/9/b/seg-00017.m4s");
        assert_eq!(tpl.match_path("/v/9/b/seg-17.m4s"), None);
        assert_eq!(tpl.match_path("/v/9/b/seg-000017.m4s"), None);
        // Wider than the width: printed in full, without padding.
        let n = tpl.match_path("/v/9/b/seg-123456.m4s").unwrap();
        assert_eq!(n.chunk(), 123_456);
        assert_eq!(tpl.render(&n, None), "/v/9/b/seg-123456.m4s");
        assert_eq!(tpl.match_path("/v/9/b/seg-0123456.m4s"), None);
        let zero = name(9, 0, 0, ChunkDuration::ZERO);
        assert_eq!(tpl.render(&zero, None), "/v/9/a/seg-00000.m4s");
        assert_eq!(tpl.match_path("/v/9/a/seg-00000.m4s"), Some(zero));

        let bw = t("/v/$Bandwidth%08d$/$Number$.m4s")
            .with_bandwidths([45_226, 2_087_347])
            .unwrap();
        let n = bw.match_path("/v/02087347/5.m4s").unwrap();
        assert_eq!((n.quality(), n.chunk()), (1, 5));
        assert_eq!(bw.render(&n, None), "/v/02087347/5.m4s");
        assert_eq!(bw.match_path("/v/2087347/5.m4s"), None);
    }

    #[test]
    fn round_trips_names_at_the_extremes() {
        let tpl =
            t("/v/$Video$/q$Quality$/$Number%07d$.m4s").with_segment_duration(ChunkDuration::MAX);
        for video in [0, 1, u64::from(ChunkName::MAX_VIDEO)] {
            for chunk in [0, 1, u64::from(ChunkName::MAX_CHUNK)] {
                for quality in [0, 1, u64::from(ChunkName::MAX_QUALITY)] {
                    let n = name(video, chunk, quality, ChunkDuration::MAX);
                    let path = tpl.render(&n, None);
                    assert_eq!(tpl.match_path(&path), Some(n), "{path}");
                }
            }
        }
    }

    #[test]
    fn rejects_paths_that_do_not_fit() {
        let tpl = vod();
        for p in [
            "",
            "/",
            "/vod/42/250k/seg-3.m4",
            "/vod/42/250k/seg-3.m4sx",
            "/vod/42/250k/seg-.m4s",
            "/vod/42/250k/seg-x.m4s",
            "/vod//250k/seg-3.m4s",
            "/vod/42//seg-3.m4s",
            "/vod/4/2/250k/seg-3.m4s",
            "/x/vod/42/250k/seg-3.m4s",
            "vod/42/250k/seg-3.m4s",
            "/vod/42/250k/seg-3.m4s/",
            "/VOD/42/250k/seg-3.m4s",
            "?/vod/42/250k/seg-3.m4s",
        ] {
            assert_eq!(tpl.match_path(p), None, "{p:?}");
        }
        // Over 8 KiB: no match, even when the path would fit.
        let long_name = "n".repeat(MAX_PATH_LEN);
        assert_eq!(
            tpl.match_path(&format!("/vod/{long_name}/250k/seg-3.m4s")),
            None
        );
        let fits = "n".repeat(MAX_PATH_LEN - "/vod//250k/seg-3.m4s".len());
        assert!(tpl
            .match_path(&format!("/vod/{fits}/250k/seg-3.m4s"))
            .is_some());
        // The limit counts the query too.
        let query = "q".repeat(MAX_PATH_LEN);
        assert_eq!(
            tpl.match_path(&format!("/vod/1/250k/seg-3.m4s?{query}")),
            None
        );
    }

    #[test]
    fn splits_ambiguous_templates_greedily() {
        // ffmpeg's default naming: the representation id may itself hold a `-`.
        let tpl = t("/live/chunk-$RepresentationID$-$Number%05d$.m4s")
            .with_representations(["audio-en", "video-480p", "video-1080p"])
            .unwrap();
        assert!(tpl.program.is_some());
        let n = tpl.match_path("/live/chunk-video-1080p-00042.m4s").unwrap();
        assert_eq!((n.quality(), n.chunk()), (2, 42));
        assert_eq!(tpl.render(&n, None), "/live/chunk-video-1080p-00042.m4s");
        let n = tpl.match_path("/live/chunk-3-00001.m4s").unwrap();
        assert_eq!((n.quality(), n.chunk()), (3, 1));
        assert_eq!(tpl.match_path("/live/chunk-video-00042.m4s"), None);

        let tpl = t("/v/$Video$_$RepresentationID$_$Number$.ts")
            .with_representations(["hd"])
            .unwrap();
        let m = tpl.match_segment("/v/my_movie_hd_12.ts").unwrap();
        assert_eq!(m.video_name, Some("my_movie"));
        assert_eq!((m.name.quality(), m.name.chunk()), (0, 12));
        assert_eq!(tpl.render(&m.name, m.video_name), "/v/my_movie_hd_12.ts");
    }

    #[test]
    fn relative_templates_match_the_end_of_a_path_at_a_slash() {
        let tpl = t("media/$RepresentationID$/$Number$.m4s")
            .with_representations(["lo", "hi"])
            .unwrap();
        assert!(tpl.is_relative());
        let n = tpl.match_path("media/hi/3.m4s").unwrap();
        assert_eq!((n.quality(), n.chunk()), (1, 3));
        for p in [
            "/media/hi/3.m4s",
            "/dash/x/media/hi/3.m4s",
            "//media/hi/3.m4s",
        ] {
            assert_eq!(tpl.match_path(p), Some(n), "{p}");
        }
        for p in [
            "/xmedia/hi/3.m4s",
            "/media/hi/x/3.m4s",
            "hi/3.m4s",
            "/media/hi/3.m4s/",
        ] {
            assert_eq!(tpl.match_path(p), None, "{p}");
        }
        assert_eq!(tpl.render(&n, None), "media/hi/3.m4s");
    }

    #[test]
    fn literal_dollars_and_other_bytes_compare_as_written() {
        let tpl = t("/a$$b/%7E/é/$Number$");
        assert_eq!(tpl.match_path("/a$b/%7E/é/3").unwrap().chunk(), 3);
        assert_eq!(tpl.match_path("/a$b/~/é/3"), None);
        assert_eq!(
            tpl.render(&name(0, 3, 0, ChunkDuration::ZERO), None),
            "/a$b/%7E/é/3"
        );
        // Multi-byte characters inside a capture.
        let tpl = t("/v/$Video$/$Number$");
        let m = tpl.match_segment("/v/çà/1").unwrap();
        assert_eq!(m.video_name, Some("çà"));
    }

    #[test]
    fn templates_without_video_name_one_video() {
        let a = t("/a/$Number$.ts");
        let b = t("/b/$Number$.ts");
        assert_eq!(a.video(), Some(video_id_from_name("/a/$Number$.ts")));
        assert_ne!(a.video(), b.video());
        assert_eq!(
            a.match_path("/a/1.ts").unwrap().video(),
            video_id_from_name("/a/$Number$.ts")
        );
        let a = a.with_video(77).unwrap();
        assert_eq!(a.match_path("/a/1.ts").unwrap().video(), 77);
        let a = a.with_video_name("bunny").unwrap();
        assert_eq!(a.video(), Some(video_id_from_name("bunny")));
        assert_eq!(vod().video(), None);
    }

    #[test]
    fn canonical_decimals() {
        assert_eq!(canonical_decimal("0", 0), Some(0));
        assert_eq!(canonical_decimal("00", 0), None);
        assert_eq!(canonical_decimal("00", 2), Some(0));
        assert_eq!(canonical_decimal("010", 3), Some(10));
        assert_eq!(canonical_decimal("10", 3), None);
        assert_eq!(canonical_decimal("1000", 3), Some(1000));
        assert_eq!(canonical_decimal("", 0), None);
        assert_eq!(canonical_decimal("1a", 0), None);
        assert_eq!(canonical_decimal("18446744073709551615", 0), Some(u64::MAX));
        assert_eq!(canonical_decimal("18446744073709551616", 0), None);
    }

    // ---- the DASH data set's manifests ----

    /// `attr="value"` in an XML tag line.
    fn attr<'a>(line: &'a str, name: &str) -> Option<&'a str> {
        let start = line.find(&format!(" {name}=\""))? + name.len() + 3;
        let len = line[start..].find('"')?;
        Some(&line[start..start + len])
    }

    /// A GPAC-made manifest: its segment template and, for each representation in manifest
    /// order, its bandwidth and the file names listed in its SegmentSize elements.
    struct Manifest {
        media: String,
        initialization: String,
        timescale: u64,
        duration: u64,
        representations: Vec<(u64, Vec<String>)>,
    }

    fn read_manifest(mpd: &str) -> Manifest {
        let mut manifest = Manifest {
            media: String::new(),
            initialization: String::new(),
            timescale: 0,
            duration: 0,
            representations: Vec::new(),
        };
        for line in mpd.lines() {
            if line.contains("<Representation ") {
                let bandwidth = attr(line, "bandwidth").unwrap().parse().unwrap();
                manifest.representations.push((bandwidth, Vec::new()));
            }
            if line.contains("<SegmentTemplate ") {
                manifest.media = attr(line, "media").unwrap().to_string();
                manifest.initialization = attr(line, "initialization").unwrap().to_string();
                manifest.timescale = attr(line, "timescale").unwrap().parse().unwrap();
                manifest.duration = attr(line, "duration").unwrap().parse().unwrap();
            }
            if line.contains("<SegmentSize ") {
                let file = attr(line, "id").unwrap().to_string();
                manifest.representations.last_mut().unwrap().1.push(file);
            }
        }
        manifest
    }

    /// How a manifest's SegmentSize file names relate to its template.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Files {
        /// The file names are the template's (`BigBuckBunny_4s7.m4s` for
        /// `BigBuckBunny_4s$Number$%d.m4s`): the listed files are the segment URLs.
        FollowTemplate,
        /// The file names are not the template's (TheSwissAccount lists
        /// `TheSwissAccount_7.m4s` for `TheSwissAccount_4s$Number$.m4s`): the segment URLs are
        /// the ones a DASH client builds from the template, for the listed numbers.
        Differ,
    }

    /// Every segment URL of a manifest, in every representation, maps to its own chunk id,
    /// with the chunk number of the URL, the quality of its bandwidth (qualities in increasing
    /// bandwidth, every representation listed) and the manifest's duration: none falls back
    /// to hashing. Returns the manifest's bandwidths in manifest order.
    fn check_manifest(
        mpd: &str,
        file_prefix: &str,
        files: Files,
        expected_reps: usize,
        expected_segments: usize,
    ) -> Vec<u64> {
        let m = read_manifest(mpd);
        assert_eq!(m.representations.len(), expected_reps);
        assert!(expected_reps <= MAX_REPRESENTATIONS);
        let mut bandwidths: Vec<u64> = m.representations.iter().map(|r| r.0).collect();
        bandwidths.sort_unstable();
        let duration = ChunkDuration::from_timescale(m.duration, m.timescale).unwrap();
        assert_eq!(duration.units(), 200); // 4 s segments
        let tpl = t(&m.media)
            .with_bandwidths(bandwidths.iter().copied())
            .unwrap()
            .with_segment_duration(duration);
        let mut chunk_ids = HashSet::new();
        let mut qualities = HashSet::new();
        let mut count = 0;
        for (bandwidth, names) in &m.representations {
            let quality = bandwidths.iter().position(|b| b == bandwidth).unwrap();
            for file in names {
                let number: u32 = file
                    .strip_prefix(file_prefix)
                    .and_then(|f| f.strip_suffix(".m4s"))
                    .unwrap_or_else(|| panic!("{file}"))
                    .parse()
                    .unwrap_or_else(|e| panic!("{file}: {e}"));
                // The URL a DASH client builds from @media (GPAC's `$Number$%d` included).
                let url = m
                    .media
                    .replace("$Bandwidth$", &bandwidth.to_string())
                    .replace("$Number$%d", &number.to_string())
                    .replace("$Number$", &number.to_string());
                let (dir, url_file) = url.rsplit_once('/').unwrap_or(("", &url));
                match files {
                    Files::FollowTemplate => assert_eq!(url_file, file),
                    Files::Differ => {
                        assert_ne!(url_file, file);
                        let listed = format!("/{dir}/{file}");
                        assert_eq!(tpl.match_path(&listed), None, "{listed}");
                    }
                }
                count += 1;
                for path in [
                    url.clone(),
                    format!("/{url}"),
                    format!("/dash/{url}?session=1"),
                ] {
                    let n = tpl.match_path(&path).unwrap_or_else(|| panic!("{path}"));
                    assert_eq!(n.chunk(), number, "{path}");
                    assert_eq!(usize::from(n.quality()), quality, "{path}");
                    assert_eq!(n.duration(), duration);
                    assert_eq!(Some(n.video()), tpl.video());
                    // The chunk id, not a hash of the path.
                    assert_eq!(crate::content_id(Some(&tpl), &path), n.id().0, "{path}");
                }
                let n = tpl.match_path(&url).unwrap();
                assert_eq!(tpl.render(&n, None), url);
                assert!(chunk_ids.insert(n.id()), "{url}: chunk id {} twice", n.id());
                qualities.insert(quality);
            }
        }
        assert_eq!(count, expected_segments);
        assert_eq!(chunk_ids.len(), count, "chunk ids are distinct");
        assert_eq!(
            qualities,
            (0..expected_reps).collect(),
            "every quality is used"
        );
        // The init segments are not chunks.
        for bandwidth in &bandwidths {
            let init = m
                .initialization
                .replace("$Bandwidth$", &bandwidth.to_string());
            assert_eq!(tpl.match_path(&init), None, "{init}");
        }
        m.representations.iter().map(|r| r.0).collect()
    }

    /// An excerpt of BigBuckBunny_4s.mpd (three of its twenty representations, the first
    /// segments of each), kept here so the test runs without the data set.
    const BUNNY_EXCERPT: &str = r#"
      <Representation id="320x240 45.0kbps" mimeType="video/mp4" codecs="avc1.42c00d" width="320"  height="240" frameRate="24" sar="1:1" startWithSAP="1"  bandwidth="45226" >
	  	<SegmentTemplate timescale="96" media="media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s" startNumber="1" duration="384" initialization="media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s_init.mp4" />
		<SegmentSize id="BigBuckBunny_4s1.m4s" size="168.0" scale="Kbits"/>
	    <SegmentSize id="BigBuckBunny_4s2.m4s" size="184.0" scale="Kbits"/>
	    <SegmentSize id="BigBuckBunny_4s10.m4s" size="192.0" scale="Kbits"/>
	    <SegmentSize id="BigBuckBunny_4s150.m4s" size="192.0" scale="Kbits"/>
	  </Representation>
      <Representation id="320x240 89.0kbps" mimeType="video/mp4" codecs="avc1.42c00d" width="320"  height="240" frameRate="24" sar="1:1" startWithSAP="1"  bandwidth="88783" >
	  	<SegmentTemplate timescale="96" media="media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s" startNumber="1" duration="384" initialization="media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s_init.mp4" />
		<SegmentSize id="BigBuckBunny_4s1.m4s" size="168.0" scale="Kbits"/>
	    <SegmentSize id="BigBuckBunny_4s2.m4s" size="184.0" scale="Kbits"/>
	  </Representation>
	  <Representation id="1920x1080 3.9Mbps" mimeType="video/mp4" codecs="avc1.42c032" width="1920" height="1080" frameRate="24" sar="1:1" startWithSAP="1" bandwidth="3936261" >
	  	<SegmentTemplate timescale="96" media="media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s" startNumber="1" duration="384" initialization="media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s_init.mp4" />
		<SegmentSize id="BigBuckBunny_4s1.m4s" size="168.0" scale="Kbits"/>
	    <SegmentSize id="BigBuckBunny_4s150.m4s" size="192.0" scale="Kbits"/>
	  </Representation>
"#;

    /// The twenty bandwidths of BigBuckBunny_4s.mpd, in manifest (and increasing) order.
    const BUNNY_BANDWIDTHS: [u64; 20] = [
        45_226, 88_783, 128_503, 177_437, 217_761, 255_865, 323_047, 378_355, 509_091, 577_751,
        782_553, 1_008_699, 1_207_152, 1_473_801, 2_087_347, 2_409_742, 2_944_291, 3_340_509,
        3_613_836, 3_936_261,
    ];

    #[test]
    fn big_buck_bunny_excerpt_urls_map_to_distinct_chunks() {
        let bandwidths = check_manifest(
            BUNNY_EXCERPT,
            "BigBuckBunny_4s",
            Files::FollowTemplate,
            3,
            8,
        );
        assert_eq!(bandwidths, [45_226, 88_783, 3_936_261]);
    }

    #[test]
    fn all_twenty_big_buck_bunny_bandwidths_name_a_quality() {
        let tpl = t("media/BigBuckBunny/4sec/bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s")
            .with_bandwidths(BUNNY_BANDWIDTHS)
            .unwrap()
            .with_segment_duration(secs(4.0));
        let mut ids = HashSet::new();
        for (quality, bandwidth) in BUNNY_BANDWIDTHS.iter().enumerate() {
            for number in [1, 75, 150] {
                let path = format!(
                    "/media/BigBuckBunny/4sec/bunny_{bandwidth}bps/BigBuckBunny_4s{number}.m4s"
                );
                let n = tpl.match_path(&path).unwrap_or_else(|| panic!("{path}"));
                assert_eq!((usize::from(n.quality()), n.chunk()), (quality, number));
                assert_eq!(crate::content_id(Some(&tpl), &path), n.id().0);
                assert!(ids.insert(n.id()), "{path}");
            }
        }
        // The 1080p representation, beyond what a 4-bit quality could name.
        let top = tpl
            .match_path("/media/BigBuckBunny/4sec/bunny_3936261bps/BigBuckBunny_4s7.m4s")
            .unwrap();
        assert_eq!((top.quality(), top.chunk()), (19, 7));
    }

    /// The data set's manifest `file`, where present (`VCDN_DASH_DATA`, default
    /// `../shared/data/dash` next to the repository).
    fn data_set(file: &str) -> Option<String> {
        let dir = std::env::var("VCDN_DASH_DATA").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/dash").to_string()
        });
        let text = std::fs::read_to_string(format!("{dir}/{file}")).ok();
        if text.is_none() {
            eprintln!("skipped: no {file} in the DASH data set at {dir}");
        }
        text
    }

    #[test]
    fn big_buck_bunny_urls_all_map_to_distinct_chunks() {
        let Some(mpd) = data_set("BigBuckBunny_4s.mpd") else {
            return;
        };
        // 20 representations × 150 segments, all of them chunks.
        let bandwidths = check_manifest(&mpd, "BigBuckBunny_4s", Files::FollowTemplate, 20, 3000);
        // The manifest lists them by increasing bandwidth: quality q is its q-th.
        assert_eq!(bandwidths, BUNNY_BANDWIDTHS);
    }

    #[test]
    fn of_forest_and_men_urls_all_map_to_distinct_chunks() {
        let Some(mpd) = data_set("OfForestAndMen_4s.mpd") else {
            return;
        };
        // 19 representations × 114 segments.
        let bandwidths = check_manifest(&mpd, "OfForestAndMen_4s", Files::FollowTemplate, 19, 2166);
        assert!(bandwidths.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn valkaama_urls_all_map_to_distinct_chunks() {
        let Some(mpd) = data_set("Valkaama_4s.mpd") else {
            return;
        };
        // 20 representations × 1162 segments, named `Valkaama_4<number>.m4s`. The manifest does
        // not list the representations by bandwidth; the qualities follow the bandwidths.
        let bandwidths = check_manifest(&mpd, "Valkaama_4", Files::FollowTemplate, 20, 23_240);
        assert!(!bandwidths.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_swiss_account_template_urls_all_map_to_distinct_chunks() {
        let Some(mpd) = data_set("TheSwissAccount_4s.mpd") else {
            return;
        };
        // 17 representations × 862 segments. Its SegmentSize names (`TheSwissAccount_7.m4s`)
        // are not those of its template (`TheSwissAccount_4s$Number$.m4s`), so the URLs checked
        // are the template's, which a DASH client requests.
        check_manifest(&mpd, "TheSwissAccount_", Files::Differ, 17, 14_654);
    }

    #[test]
    fn valkaama_numbers_follow_the_literal_4() {
        // `Valkaama_4$Number$%d.m4s`: the file Valkaama_41.m4s is chunk 1 (the segments.csv of
        // the data set reads "41" from the name), Valkaama_4123.m4s chunk 123.
        let tpl = t("media/Valkaama/4sec/valkaama_$Bandwidth$bps/Valkaama_4$Number$%d.m4s")
            .with_bandwidths([45_679])
            .unwrap();
        let dir = "/media/Valkaama/4sec/valkaama_45679bps";
        assert_eq!(
            tpl.match_path(&format!("{dir}/Valkaama_41.m4s"))
                .unwrap()
                .chunk(),
            1
        );
        assert_eq!(
            tpl.match_path(&format!("{dir}/Valkaama_4123.m4s"))
                .unwrap()
                .chunk(),
            123
        );
    }

    // ---- many pseudo-random inputs ----

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    const TEMPLATES: &[&str] = &[
        "/vod/$Video$/$RepresentationID$/seg-$Number$.m4s",
        "/v/$Video$/$Quality$/$Number%03d$.ts",
        "chunk-$RepresentationID$-$Number%05d$.m4s",
        "$Video$_$RepresentationID$_$Number$",
        "bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s",
        "/$Number$",
        "$Number$1$Video$",
        "/a$$/$Video$$$-$Number$-",
        "/x/$Bandwidth%02d$-$Number$/$Video$",
    ];

    const PIECES: &[&str] = &[
        "/",
        "vod",
        "v",
        "seg-",
        ".m4s",
        ".ts",
        "chunk",
        "-",
        "_",
        "$",
        "bunny_",
        "bps",
        "BigBuckBunny_4s",
        "%d",
        "a",
        "x",
        "250k",
        "1700k",
        "hd",
        "0",
        "1",
        "7",
        "15",
        "16",
        "63",
        "64",
        "007",
        "45226",
        "268435455",
        "268435456",
        "1073741823",
        "1048575",
        "1048576",
        "99999999999999999999",
        "?",
        "?q=1",
        "é",
        "\u{0}",
        "%",
        "//",
        "..",
    ];

    fn random_path(rng: &mut Rng, tpl: &SegmentTemplate) -> String {
        let mut p = String::new();
        match rng.below(3) {
            // A rendering of a random name, then mutated.
            0 => {
                let n = ChunkName::from_id(crate::name::ChunkId(rng.next()));
                p = tpl.render(&n, None);
                if rng.below(2) == 0 {
                    let cut = rng.below(p.len() + 1);
                    if p.is_char_boundary(cut) {
                        p.insert_str(cut, PIECES[rng.below(PIECES.len())]);
                    }
                }
            }
            // Pieces.
            1 => {
                for _ in 0..rng.below(16) {
                    p.push_str(PIECES[rng.below(PIECES.len())]);
                }
            }
            // Bytes.
            _ => {
                let bytes: Vec<u8> = (0..rng.below(40))
                    .map(|_| b"/-_.09a$?%"[rng.below(10)])
                    .collect();
                p = String::from_utf8(bytes).unwrap();
            }
        }
        p
    }

    #[test]
    fn match_path_never_panics_and_inverts_render() {
        let mut rng = Rng(0x005e_ed0f_c0de);
        let mut matched = 0;
        for &source in TEMPLATES {
            let tpl = t(source)
                .with_representations(["250k", "1700k", "hd", "x-1", "7"])
                .unwrap()
                .with_bandwidths([45_226, 1, 88_783])
                .unwrap();
            let lits: Vec<&[u8]> = tpl.literals.iter().map(|l| l.as_bytes()).collect();
            let classes: Vec<Class> = tpl.slots.iter().map(|s| s.key.class()).collect();
            let program = Program::compile(&lits, &classes);
            for _ in 0..3000 {
                let path = random_path(&mut rng, &tpl);
                let m = tpl.match_segment(&path);
                if let Some(m) = m {
                    matched += 1;
                    // The path (its matched part, without the query) comes back exactly,
                    // unless its quality was a number not in the list that the list names
                    // otherwise ("3" and the 4th id both name quality 3): then the rendering
                    // names the same chunk.
                    let rendered = tpl.render(&m.name, m.video_name);
                    let clean = strip_query(&path);
                    if !clean.ends_with(&rendered) {
                        assert!(usize::from(m.name.quality()) < tpl.representations().len());
                        assert_eq!(tpl.match_path(&rendered), Some(m.name), "{path}");
                    } else if tpl.is_relative() {
                        let before = &clean[..clean.len() - rendered.len()];
                        assert!(before.is_empty() || before.ends_with('/'), "{path}");
                    } else {
                        assert_eq!(clean, rendered);
                    }
                }
                // The one-pass matcher and the Pike VM split alike.
                if tpl.program.is_none() {
                    if let Some(part) = tpl.matched_part(strip_query(&path)) {
                        let n = tpl.slots.len();
                        let simple = matcher::split_simple(&lits, &classes, part.as_bytes());
                        let vm = program.split(part.as_bytes());
                        assert_eq!(
                            simple.map(|c| c[..n].to_vec()),
                            vm.map(|c| c[..n].to_vec()),
                            "{source}: {path:?}"
                        );
                    }
                }
            }
        }
        assert!(matched > 1000, "only {matched} matches");
    }
}
