//! DASH manifests (MPD, ISO/IEC 23009-1) as a player needs them: the
//! video representations and, for each, the URL, start and length of every
//! segment.
//!
//! Supported: `SegmentTemplate` with `@duration` (`$Number$`) or with a
//! `SegmentTimeline` (`$Time$` or `$Number$`), the identifiers
//! `$RepresentationID$`, `$Number$`, `$Bandwidth$`, `$Time$` with optional
//! `%0Nd` widths and `$$`; `SegmentList` with `SegmentURL`s; `SegmentBase`
//! (one segment, the whole file); `BaseURL` at every level; templates and
//! lists inherited from the Period and AdaptationSet; static and dynamic
//! MPDs. GPAC 0.5 wrote `$Number$%d` (the width outside the dollars); that
//! is read as the number's format, as in [`crate::template`].
//!
//! Manifests come from the network, so the parser has limits: 16 MiB of
//! XML, 512 representations, 200,000 segments per representation.

use std::fmt::Write;

pub const MAX_MPD_BYTES: usize = 16 << 20;
pub const MAX_REPRESENTATIONS: usize = 512;
pub const MAX_SEGMENTS: u64 = 200_000;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MpdError {
    #[error("the MPD is larger than {MAX_MPD_BYTES} bytes")]
    TooLarge,
    #[error("the MPD is not well-formed XML: {0}")]
    Xml(String),
    #[error("not an MPD: the root element is <{0}>")]
    NotMpd(String),
    #[error("the MPD has no video representation with segments")]
    NoVideo,
    #[error("{0}")]
    Invalid(String),
}

/// One segment of a representation; `url` is relative to the MPD's URL
/// unless it is absolute.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub url: String,
    pub start_s: f64,
    pub duration_s: f64,
}

/// How a representation's segments are found.
#[derive(Debug, Clone, PartialEq)]
pub enum Segments {
    /// A template with a fixed segment duration: segment `i` (from 0) is
    /// number `start_number + i` and starts at `i * duration_s`. `count`
    /// is known for a static MPD with a duration; a live one runs on.
    Numbered {
        media: String,
        start_number: u64,
        duration_s: f64,
        count: Option<u64>,
    },
    /// Every segment spelled out (timeline or list).
    Listed(Vec<Segment>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Representation {
    pub id: String,
    pub bandwidth: u64,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub init: Option<String>,
    pub segments: Segments,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub dynamic: bool,
    pub duration_s: Option<f64>,
    /// `@availabilityStartTime` of a dynamic MPD, as written.
    pub availability_start: Option<String>,
    pub min_buffer_s: f64,
    /// Video representations by increasing bandwidth.
    pub representations: Vec<Representation>,
    /// Audio representations by increasing bandwidth (a player fetches
    /// one of them alongside the video; empty for video-only titles).
    pub audio: Vec<Representation>,
}

impl Representation {
    /// Segment `i` (from 0), if it exists.
    pub fn segment(&self, i: u64) -> Option<Segment> {
        match &self.segments {
            Segments::Numbered {
                media,
                start_number,
                duration_s,
                count,
            } => {
                if count.is_some_and(|c| i >= c) {
                    return None;
                }
                let n = start_number + i;
                Some(Segment {
                    url: expand(media, &self.id, self.bandwidth, n, 0),
                    start_s: i as f64 * duration_s,
                    duration_s: *duration_s,
                })
            }
            Segments::Listed(v) => v.get(usize::try_from(i).ok()?).cloned(),
        }
    }

    /// How many segments, when known.
    pub fn count(&self) -> Option<u64> {
        match &self.segments {
            Segments::Numbered { count, .. } => *count,
            Segments::Listed(v) => Some(v.len() as u64),
        }
    }
}

/// An ISO 8601 duration such as `PT0H9M56.46S` or `P1DT2H`, in seconds.
pub fn parse_duration(s: &str) -> Option<f64> {
    let rest = s.trim().strip_prefix('P')?;
    let (date, time) = rest.split_once('T').unwrap_or((rest, ""));
    let mut total = 0.0;
    let mut read = |part: &str, units: &[(char, f64)]| -> Option<()> {
        let mut num = String::new();
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                num.push(c);
            } else {
                let mult = units.iter().find(|(u, _)| *u == c)?.1;
                total += num.parse::<f64>().ok()? * mult;
                num.clear();
            }
        }
        num.is_empty().then_some(())
    };
    read(
        date,
        &[
            ('Y', 365.0 * 86_400.0),
            ('M', 30.0 * 86_400.0),
            ('W', 7.0 * 86_400.0),
            ('D', 86_400.0),
        ],
    )?;
    read(time, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)])?;
    total.is_finite().then_some(total)
}

/// An xs:dateTime such as `2026-11-22T00:08:06Z` or
/// `2026-11-22T01:08:06.5+01:00`, in Unix seconds (no zone means UTC).
pub fn parse_datetime(s: &str) -> Option<f64> {
    let s = s.trim();
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let (clock, offset_s) = if let Some(c) = time.strip_suffix('Z') {
        (c, 0.0)
    } else if let Some(i) = time.rfind(['+', '-']).filter(|&i| i >= 8) {
        let (c, z) = time.split_at(i);
        let sign = if z.starts_with('-') { -1.0 } else { 1.0 };
        let (h, mi) = z[1..].split_once(':')?;
        (
            c,
            sign * (h.parse::<f64>().ok()? * 3600.0 + mi.parse::<f64>().ok()? * 60.0),
        )
    } else {
        (time, 0.0)
    };
    let mut c = clock.splitn(3, ':');
    let (h, mi, sec): (f64, f64, f64) = (
        c.next()?.parse().ok()?,
        c.next()?.parse().ok()?,
        c.next()?.parse().ok()?,
    );
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + sec - offset_s)
}

/// Fills a `SegmentTemplate` pattern.
pub fn expand(pattern: &str, id: &str, bandwidth: u64, number: u64, time: u64) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut rest = pattern;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find('$') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let ident = &after[..j];
        rest = &after[j + 1..];
        let (name, width) = match ident.split_once('%') {
            Some((n, f)) => (n, width_of(f)),
            None => (ident, None),
        };
        let value = match name {
            "" => {
                out.push('$');
                continue;
            }
            "RepresentationID" => {
                out.push_str(id);
                continue;
            }
            "Number" => number,
            "Bandwidth" => bandwidth,
            "Time" => time,
            _ => {
                // Unknown identifiers are left as they are.
                out.push('$');
                out.push_str(ident);
                out.push('$');
                continue;
            }
        };
        // GPAC 0.5's `$Number$%d`: the width written after the dollars.
        let mut width = width;
        if width.is_none() && name == "Number" {
            if let Some(f) = rest.strip_prefix('%') {
                if let Some(end) = f.find('d') {
                    if f[..end].bytes().all(|b| b.is_ascii_digit()) {
                        width = width_of(&f[..=end]).or(Some(0));
                        rest = &f[end + 1..];
                    }
                }
            }
        }
        let _ = write!(out, "{value:0w$}", w = width.unwrap_or(0));
    }
    out.push_str(rest);
    out
}

/// `0Nd` → N (DASH's printf-style width).
fn width_of(f: &str) -> Option<usize> {
    f.strip_suffix('d')?
        .trim_start_matches('0')
        .parse::<usize>()
        .ok()
        .filter(|w| *w <= 20)
        .or(Some(0))
}

fn attr<'a>(n: roxmltree::Node<'a, '_>, name: &str) -> Option<&'a str> {
    n.attribute(name)
}

fn num<T: std::str::FromStr>(n: roxmltree::Node, name: &str) -> Option<T> {
    attr(n, name).and_then(|v| v.trim().parse().ok())
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

fn children<'a, 'i: 'a>(
    n: roxmltree::Node<'a, 'i>,
    name: &'a str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> + 'a {
    n.children()
        .filter(move |c| c.is_element() && c.tag_name().name() == name)
}

/// `base` + `BaseURL` of `n` (absolute ones replace).
fn base_of(base: &str, n: roxmltree::Node) -> String {
    match child(n, "BaseURL").and_then(|b| b.text()).map(str::trim) {
        Some(u) if u.contains("://") || u.starts_with('/') => u.to_string(),
        Some(u) => format!("{base}{u}"),
        None => base.to_string(),
    }
}

fn join(base: &str, url: &str) -> String {
    if url.contains("://") || url.starts_with('/') {
        url.to_string()
    } else {
        format!("{base}{url}")
    }
}

/// Template attributes, the innermost level winning.
#[derive(Default, Clone)]
struct Template<'a> {
    media: Option<&'a str>,
    init: Option<&'a str>,
    start_number: Option<u64>,
    timescale: Option<u64>,
    duration: Option<u64>,
    timeline: Option<roxmltree::Node<'a, 'a>>,
}

fn template<'a>(levels: &[roxmltree::Node<'a, 'a>]) -> Option<Template<'a>> {
    let mut t: Option<Template> = None;
    for l in levels {
        if let Some(st) = child(*l, "SegmentTemplate") {
            let mut cur = t.take().unwrap_or_default();
            cur.media = attr(st, "media").or(cur.media);
            cur.init = attr(st, "initialization").or(cur.init);
            cur.start_number = num(st, "startNumber").or(cur.start_number);
            cur.timescale = num(st, "timescale").or(cur.timescale);
            cur.duration = num(st, "duration").or(cur.duration);
            cur.timeline = child(st, "SegmentTimeline").or(cur.timeline);
            t = Some(cur);
        }
    }
    t
}

pub fn parse(xml: &str) -> Result<Manifest, MpdError> {
    if xml.len() > MAX_MPD_BYTES {
        return Err(MpdError::TooLarge);
    }
    let opts = roxmltree::ParsingOptions {
        allow_dtd: false,
        nodes_limit: 4_000_000,
    };
    let doc = roxmltree::Document::parse_with_options(xml, opts)
        .map_err(|e| MpdError::Xml(e.to_string()))?;
    let mpd = doc.root_element();
    if mpd.tag_name().name() != "MPD" {
        return Err(MpdError::NotMpd(mpd.tag_name().name().to_string()));
    }
    let dynamic = attr(mpd, "type") == Some("dynamic");
    let duration_s = attr(mpd, "mediaPresentationDuration").and_then(parse_duration);
    let min_buffer_s = attr(mpd, "minBufferTime")
        .and_then(parse_duration)
        .unwrap_or(2.0);
    let period =
        child(mpd, "Period").ok_or_else(|| MpdError::Invalid("the MPD has no Period".into()))?;
    let period_s = attr(period, "duration")
        .and_then(parse_duration)
        .or(duration_s);
    let base0 = base_of(&base_of("", mpd), period);
    let mut reps = Vec::new();
    let mut audio = Vec::new();
    for set in children(period, "AdaptationSet") {
        let is = |n: roxmltree::Node, kind: &str| {
            attr(n, "mimeType")
                .is_some_and(|m| m.strip_prefix(kind).is_some_and(|r| r.starts_with('/')))
                || attr(n, "contentType") == Some(kind)
        };
        let (set_video, set_audio) = (is(set, "video"), is(set, "audio"));
        let base1 = base_of(&base0, set);
        for rep in children(set, "Representation") {
            let to_audio = if set_video || is(rep, "video") {
                false
            } else if set_audio || is(rep, "audio") {
                true
            } else {
                continue;
            };
            if reps.len() + audio.len() >= MAX_REPRESENTATIONS {
                return Err(MpdError::Invalid(format!(
                    "more than {MAX_REPRESENTATIONS} representations"
                )));
            }
            let id = attr(rep, "id").unwrap_or("").to_string();
            let bandwidth: u64 = num(rep, "bandwidth").unwrap_or(0);
            let base = base_of(&base1, rep);
            let levels = [period, set, rep];
            let (init, segments) = if let Some(t) = template(&levels) {
                let media = t.media.ok_or_else(|| {
                    MpdError::Invalid(format!(
                        "representation {id}: SegmentTemplate without @media"
                    ))
                })?;
                let timescale = t.timescale.unwrap_or(1).max(1) as f64;
                let start_number = t.start_number.unwrap_or(1);
                let init = t
                    .init
                    .map(|i| join(&base, &expand(i, &id, bandwidth, start_number, 0)));
                let segments = if let Some(tl) = t.timeline {
                    let mut list = Vec::new();
                    let mut time: u64 = 0;
                    let mut number = start_number;
                    let end = period_s.map(|p| (p * timescale) as u64);
                    for s in children(tl, "S") {
                        time = num(s, "t").unwrap_or(time);
                        let d: u64 = num(s, "d").filter(|d| *d > 0).ok_or_else(|| {
                            MpdError::Invalid(format!(
                                "representation {id}: SegmentTimeline S without @d"
                            ))
                        })?;
                        let r: i64 = num(s, "r").unwrap_or(0);
                        let repeats = if r < 0 {
                            // Until the end of the period.
                            end.map_or(0, |e| e.saturating_sub(time).div_ceil(d).saturating_sub(1))
                        } else {
                            r as u64
                        };
                        for _ in 0..=repeats {
                            if list.len() as u64 >= MAX_SEGMENTS {
                                return Err(MpdError::Invalid(format!(
                                    "representation {id}: more than {MAX_SEGMENTS} segments"
                                )));
                            }
                            list.push(Segment {
                                url: join(&base, &expand(media, &id, bandwidth, number, time)),
                                start_s: time as f64 / timescale,
                                duration_s: d as f64 / timescale,
                            });
                            time += d;
                            number += 1;
                        }
                    }
                    Segments::Listed(list)
                } else {
                    let d = t.duration.filter(|d| *d > 0).ok_or_else(|| MpdError::Invalid(format!("representation {id}: SegmentTemplate needs @duration or a SegmentTimeline")))?;
                    let duration_s = d as f64 / timescale;
                    let count = if dynamic {
                        None
                    } else {
                        period_s.map(|p| (p / duration_s - 1e-9).ceil().max(0.0) as u64)
                    };
                    if count.is_some_and(|c| c > MAX_SEGMENTS) {
                        return Err(MpdError::Invalid(format!(
                            "representation {id}: more than {MAX_SEGMENTS} segments"
                        )));
                    }
                    Segments::Numbered {
                        media: join(&base, media),
                        start_number,
                        duration_s,
                        count,
                    }
                };
                (init, segments)
            } else if let Some(sl) = [rep, set, period]
                .iter()
                .find_map(|l| child(*l, "SegmentList"))
            {
                let timescale = num::<u64>(sl, "timescale").unwrap_or(1).max(1) as f64;
                let d = num::<u64>(sl, "duration").unwrap_or(0) as f64 / timescale;
                let init = child(sl, "Initialization")
                    .and_then(|i| attr(i, "sourceURL"))
                    .map(|u| join(&base, u));
                let mut list = Vec::new();
                for (i, u) in children(sl, "SegmentURL").enumerate() {
                    if i as u64 >= MAX_SEGMENTS {
                        return Err(MpdError::Invalid(format!(
                            "representation {id}: more than {MAX_SEGMENTS} segments"
                        )));
                    }
                    let url = attr(u, "media").map_or_else(|| base.clone(), |m| join(&base, m));
                    list.push(Segment {
                        url,
                        start_s: i as f64 * d,
                        duration_s: d,
                    });
                }
                (init, Segments::Listed(list))
            } else {
                // SegmentBase or a bare BaseURL: one segment, the whole file.
                let whole = period_s.unwrap_or(0.0);
                (
                    None,
                    Segments::Listed(vec![Segment {
                        url: base.clone(),
                        start_s: 0.0,
                        duration_s: whole,
                    }]),
                )
            };
            let r = Representation {
                id,
                bandwidth,
                width: num(rep, "width"),
                height: num(rep, "height"),
                init,
                segments,
            };
            if to_audio {
                audio.push(r);
            } else {
                reps.push(r);
            }
        }
    }
    if reps.is_empty() || reps.iter().all(|r| r.count() == Some(0)) {
        return Err(MpdError::NoVideo);
    }
    reps.sort_by_key(|r| r.bandwidth);
    audio.sort_by_key(|r| r.bandwidth);
    Ok(Manifest {
        dynamic,
        duration_s,
        availability_start: attr(mpd, "availabilityStartTime").map(str::to_string),
        min_buffer_s,
        representations: reps,
        audio,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_templates() {
        assert_eq!(parse_duration("PT0H9M56.46S"), Some(596.46));
        assert_eq!(parse_duration("PT476S"), Some(476.0));
        assert_eq!(parse_duration("P1DT2H"), Some(93_600.0));
        assert_eq!(parse_duration("PT1.5"), None);
        assert_eq!(parse_duration("T5S"), None);
        assert_eq!(
            expand("$RepresentationID$/$Number$.m4s", "high", 1, 7, 0),
            "high/7.m4s"
        );
        assert_eq!(
            expand(
                "seg-$Number%05d$-$Bandwidth$-$Time$-$$.m4s",
                "x",
                250_000,
                7,
                90_000
            ),
            "seg-00007-250000-90000-$.m4s"
        );
        assert_eq!(
            expand(
                "bunny_$Bandwidth$bps/BigBuckBunny_4s$Number$%d.m4s",
                "x",
                45_226,
                1,
                0
            ),
            "bunny_45226bps/BigBuckBunny_4s1.m4s"
        );
        assert_eq!(expand("a$Unknown$b", "x", 1, 1, 1), "a$Unknown$b");
        assert_eq!(expand("broken$Number", "x", 1, 1, 1), "broken$Number");
    }

    #[test]
    fn datetimes() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(
            parse_datetime("2026-11-22T00:08:06Z"),
            Some(1_795_306_086.0)
        );
        assert_eq!(
            parse_datetime("2026-11-22T01:08:06.5+01:00"),
            Some(1_795_306_086.5)
        );
        assert_eq!(parse_datetime("2000-02-29T00:00:00"), Some(951_782_400.0));
        assert_eq!(parse_datetime("2000-13-01T00:00:00Z"), None);
        assert_eq!(parse_datetime("yesterday"), None);
    }

    #[test]
    fn a_template_manifest_with_base_urls() {
        let m = parse(r#"<?xml version="1.0"?>
<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" mediaPresentationDuration="PT9S" minBufferTime="PT4S">
  <BaseURL>http://cdn.example/v/</BaseURL>
  <Period><AdaptationSet mimeType="video/mp4"><BaseURL>set/</BaseURL>
    <SegmentTemplate timescale="1000" duration="2000" startNumber="1" media="$RepresentationID$/$Number$.m4s" initialization="$RepresentationID$/init.mp4"/>
    <Representation id="high" bandwidth="2500000"/><Representation id="low" bandwidth="250000"/>
  </AdaptationSet><AdaptationSet mimeType="audio/mp4"><Representation id="a" bandwidth="64000"/></AdaptationSet></Period>
</MPD>"#).unwrap();
        assert!(!m.dynamic);
        assert_eq!(m.min_buffer_s, 4.0);
        let ids: Vec<&str> = m.representations.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["low", "high"], "video only, by bandwidth");
        let audio: Vec<&str> = m.audio.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(audio, ["a"], "audio apart");
        let low = &m.representations[0];
        assert_eq!(low.count(), Some(5));
        assert_eq!(
            low.init.as_deref(),
            Some("http://cdn.example/v/set/low/init.mp4")
        );
        let s = low.segment(4).unwrap();
        assert_eq!(
            (s.url.as_str(), s.start_s, s.duration_s),
            ("http://cdn.example/v/set/low/5.m4s", 8.0, 2.0)
        );
        assert_eq!(low.segment(5), None);
    }

    #[test]
    fn a_timeline_with_time_and_repeats() {
        let m = parse(r#"<MPD type="static" mediaPresentationDuration="PT10S"><Period>
  <AdaptationSet contentType="video"><SegmentTemplate timescale="90000" media="v_$Time$.m4s">
    <SegmentTimeline><S t="0" d="180000" r="2"/><S d="90000"/><S d="90000" r="-1"/></SegmentTimeline></SegmentTemplate>
    <Representation id="v" bandwidth="1"/></AdaptationSet></Period></MPD>"#).unwrap();
        let r = &m.representations[0];
        // 3 x 2 s, 1 x 1 s, then 1 s until 10 s: 3 more.
        assert_eq!(r.count(), Some(7));
        assert_eq!(r.segment(1).unwrap().url, "v_180000.m4s");
        assert_eq!(r.segment(3).unwrap().start_s, 6.0);
        assert_eq!(r.segment(6).unwrap().url, "v_810000.m4s");
    }

    #[test]
    fn a_segment_list() {
        let m = parse(r#"<MPD type="static" mediaPresentationDuration="PT4S"><Period><AdaptationSet mimeType="video/mp4">
  <Representation id="r" bandwidth="5"><SegmentList timescale="10" duration="20"><Initialization sourceURL="i.mp4"/>
    <SegmentURL media="a.m4s"/><SegmentURL media="b.m4s"/></SegmentList></Representation></AdaptationSet></Period></MPD>"#).unwrap();
        let r = &m.representations[0];
        assert_eq!(r.init.as_deref(), Some("i.mp4"));
        assert_eq!(
            r.segment(1).unwrap(),
            Segment {
                url: "b.m4s".into(),
                start_s: 2.0,
                duration_s: 2.0
            }
        );
    }

    #[test]
    fn a_live_manifest_runs_on() {
        let m = parse(r#"<MPD type="dynamic" availabilityStartTime="2026-11-22T00:00:00Z"><Period start="PT0S"><AdaptationSet mimeType="video/mp4">
  <SegmentTemplate timescale="1000" duration="2000" startNumber="1" media="$RepresentationID$/$Number$.m4s"/>
  <Representation id="low" bandwidth="250000"/></AdaptationSet></Period></MPD>"#).unwrap();
        assert!(m.dynamic);
        assert_eq!(
            m.availability_start.as_deref(),
            Some("2026-11-22T00:00:00Z")
        );
        assert_eq!(m.representations[0].count(), None);
        assert_eq!(
            m.representations[0].segment(1000).unwrap().url,
            "low/1001.m4s"
        );
    }

    #[test]
    fn bad_manifests_are_refused_with_a_reason() {
        assert!(matches!(parse("<MPD"), Err(MpdError::Xml(_))));
        assert_eq!(parse("<html/>"), Err(MpdError::NotMpd("html".into())));
        assert!(matches!(parse("<MPD/>"), Err(MpdError::Invalid(_))));
        assert_eq!(parse("<MPD><Period/></MPD>"), Err(MpdError::NoVideo));
        let huge = r#"<MPD type="static" mediaPresentationDuration="P100000D"><Period><AdaptationSet mimeType="video/mp4"><SegmentTemplate duration="1" media="$Number$"/><Representation id="r"/></AdaptationSet></Period></MPD>"#;
        assert!(matches!(parse(huge), Err(MpdError::Invalid(m)) if m.contains("more than")));
        let bomb = r#"<MPD><Period><AdaptationSet mimeType="video/mp4"><SegmentTemplate media="$Time$"><SegmentTimeline><S d="1" r="100000000"/></SegmentTimeline></SegmentTemplate><Representation id="r"/></AdaptationSet></Period></MPD>"#;
        assert!(matches!(parse(bomb), Err(MpdError::Invalid(m)) if m.contains("more than")));
    }

    /// The DASH data set's real manifests (`../shared/data/dash`): every
    /// representation and segment listed in the data set's CSV is there, at
    /// the URL the manifest's template gives.
    #[test]
    fn the_data_set_manifests_list_every_segment() {
        let dir = std::env::var("VCDN_DASH_DATA").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/dash").to_string()
        });
        for name in [
            "BigBuckBunny_4s",
            "OfForestAndMen_4s",
            "TheSwissAccount_4s",
            "Valkaama_4s",
        ] {
            let Ok(xml) = std::fs::read_to_string(format!("{dir}/{name}.mpd")) else {
                eprintln!("skipped: no {name}.mpd in {dir}");
                continue;
            };
            let csv = std::fs::read_to_string(format!("{dir}/{name}.segments.csv")).unwrap();
            let m = parse(&xml).unwrap();
            assert!(m.representations.len() >= 17, "{name}");
            let mut rows = 0;
            for line in csv.lines().skip(1) {
                let f: Vec<&str> = line.split(',').collect();
                let bw: u64 = f[1].parse().unwrap();
                // The CSV numbers Valkaama's segments by file name, whose
                // stem `Valkaama_4` runs into the number: "41" is number 1.
                let n: u64 = if name == "Valkaama_4s" {
                    f[4][1..].parse().unwrap()
                } else {
                    f[4].parse().unwrap()
                };
                let r = m
                    .representations
                    .iter()
                    .find(|r| r.bandwidth == bw)
                    .unwrap_or_else(|| panic!("{name}: no representation of {bw} b/s"));
                let count = r.count().unwrap();
                assert!(n >= 1 && n <= count + 1, "{name}: segment {n} of {count}");
                if n <= count {
                    let s = r.segment(n - 1).unwrap();
                    assert!(
                        s.url.contains(&format!("{bw}bps")) && s.url.ends_with(&format!("{n}.m4s")),
                        "{name}: {}",
                        s.url
                    );
                    assert!(
                        (s.duration_s - 4.0).abs() < 0.01,
                        "{name}: {}",
                        s.duration_s
                    );
                }
                rows += 1;
            }
            assert!(rows > 1000, "{name}: {rows}");
        }
    }
}
