//! Synthetic DASH content: video-on-demand titles and live channels with
//! real MPDs, whose segment sizes follow the CDNaaS paper's Table II (H.264
//! DASH, 2 s chunks): low quality 250 kb/s, sizes 69,852–250,785 B, mean
//! 73,262 B; high quality 2,500 kb/s, sizes 80,755–843,744 B, mean
//! 434,830 B. Deterministic for a seed; no media files.
//!
//! Paths:
//! - `/dash/vod/{title}/manifest.mpd[?duration_s=S]` (static MPD, default
//!   476 s like the paper's test video), segments
//!   `/dash/vod/{title}/{rep}/{n}.m4s` (n from 1), `/{rep}/init.mp4`;
//! - `/dash/live/{channel}/manifest.mpd` (dynamic MPD whose segments appear
//!   every 2 s from the origin's start), segments as for VOD;
//! - the dynamic endpoint is in the crate root (`/dynamic?size=N`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds of video per segment.
pub const SEGMENT_S: u64 = 2;
/// The paper's test video lasts 475 s: 238 segments of 2 s.
pub const DEFAULT_DURATION_S: u64 = 476;
/// Live segments kept available behind the live edge.
pub const TIME_SHIFT_S: u64 = 30;
/// Size of every initialization segment.
pub const INIT_BYTES: u64 = 862;

/// One representation and its segment-size distribution (Table II).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Representation {
    pub id: &'static str,
    pub bandwidth: u64,
    pub width: u32,
    pub height: u32,
    pub min: u64,
    pub mean: u64,
    pub max: u64,
}

pub const REPRESENTATIONS: [Representation; 2] = [
    Representation {
        id: "low",
        bandwidth: 250_000,
        width: 640,
        height: 360,
        min: 69_852,
        mean: 73_262,
        max: 250_785,
    },
    Representation {
        id: "high",
        bandwidth: 2_500_000,
        width: 1920,
        height: 1080,
        min: 80_755,
        mean: 434_830,
        max: 843_744,
    },
];

pub fn representation(id: &str) -> Option<&'static Representation> {
    REPRESENTATIONS.iter().find(|r| r.id == id)
}

/// splitmix64: a good 64-bit mix, so sizes look random but are fixed.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_str(seed: u64, s: &str) -> u64 {
    s.bytes().fold(mix(seed), |h, b| mix(h ^ b as u64))
}

/// Size of segment `number` of `rep` in `title`: `min + (max - min) * u^k`
/// with `u` uniform from a hash and `k = (max - min) / (mean - min) - 1`,
/// whose expectation is exactly the table's mean (most segments are small,
/// a few are large, as in real encodings).
pub fn segment_size(seed: u64, title: &str, rep: &Representation, number: u64) -> u64 {
    let h = mix(hash_str(seed, title) ^ mix(number.wrapping_mul(0x1000_0001) ^ rep.bandwidth));
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    let span = (rep.max - rep.min) as f64;
    let k = span / (rep.mean - rep.min) as f64 - 1.0;
    rep.min + (span * u.powf(k)).round() as u64
}

/// Whether a title or channel name is acceptable in a path.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn adaptation_set(indent: &str) -> String {
    let mut out = format!(
        "{indent}<AdaptationSet mimeType=\"video/mp4\" codecs=\"avc1.64001f\" segmentAlignment=\"true\" startWithSAP=\"1\">\n\
         {indent}  <SegmentTemplate timescale=\"1000\" duration=\"{}\" startNumber=\"1\" media=\"$RepresentationID$/$Number$.m4s\" initialization=\"$RepresentationID$/init.mp4\"/>\n",
        SEGMENT_S * 1000
    );
    for r in &REPRESENTATIONS {
        out.push_str(&format!(
            "{indent}  <Representation id=\"{}\" bandwidth=\"{}\" width=\"{}\" height=\"{}\" frameRate=\"25\"/>\n",
            r.id, r.bandwidth, r.width, r.height
        ));
    }
    out.push_str(&format!("{indent}</AdaptationSet>\n"));
    out
}

/// The static MPD of a VOD title of `duration_s` seconds.
pub fn vod_mpd(duration_s: u64) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"urn:mpeg:dash:profile:isoff-live:2011\" type=\"static\" mediaPresentationDuration=\"PT{duration_s}S\" minBufferTime=\"PT{}S\">\n\
         \x20 <Period id=\"1\" start=\"PT0S\">\n{}  </Period>\n</MPD>\n",
        2 * SEGMENT_S,
        adaptation_set("    ")
    )
}

/// Segments of a VOD title.
pub fn vod_segments(duration_s: u64) -> u64 {
    duration_s.div_ceil(SEGMENT_S)
}

/// The dynamic MPD of a live channel that started at `start` (Unix s).
pub fn live_mpd(start: u64, now: SystemTime) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"urn:mpeg:dash:profile:isoff-live:2011\" type=\"dynamic\" availabilityStartTime=\"{}\" publishTime=\"{}\" minimumUpdatePeriod=\"PT{SEGMENT_S}S\" timeShiftBufferDepth=\"PT{TIME_SHIFT_S}S\" suggestedPresentationDelay=\"PT{}S\" minBufferTime=\"PT{}S\">\n\
         \x20 <Period id=\"1\" start=\"PT0S\">\n{}  </Period>\n</MPD>\n",
        iso8601(start),
        iso8601(now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())),
        3 * SEGMENT_S,
        2 * SEGMENT_S,
        adaptation_set("    ")
    )
}

/// Why a live segment cannot be served now.
#[derive(Debug, PartialEq, Eq)]
pub enum LiveError {
    /// Not produced yet: available in this long.
    Future(Duration),
    /// Fell out of the time-shift window.
    Gone,
}

/// Whether live segment `number` (from 1, covering
/// `[(n-1)·2 s, n·2 s)` after the start) is available at `now`.
pub fn live_available(start: u64, number: u64, now: SystemTime) -> Result<(), LiveError> {
    let elapsed = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .saturating_sub(Duration::from_secs(start));
    let ready = Duration::from_secs(number.max(1) * SEGMENT_S);
    if elapsed < ready {
        return Err(LiveError::Future(ready - elapsed));
    }
    if elapsed > ready + Duration::from_secs(TIME_SHIFT_S + 2 * SEGMENT_S) {
        return Err(LiveError::Gone);
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` for Unix seconds (civil-from-days).
pub fn iso8601(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_sizes_follow_table_ii() {
        for r in &REPRESENTATIONS {
            let n = 20_000;
            let sizes: Vec<u64> = (1..=n).map(|i| segment_size(7, "title", r, i)).collect();
            let mean = sizes.iter().sum::<u64>() as f64 / n as f64;
            assert!(
                (mean / r.mean as f64 - 1.0).abs() < 0.02,
                "{}: mean {mean} vs {}",
                r.id,
                r.mean
            );
            assert!(sizes.iter().all(|&s| s >= r.min && s <= r.max), "{}", r.id);
            // Deterministic for a seed, different across seeds and titles.
            assert_eq!(segment_size(7, "title", r, 5), sizes[4]);
            assert!(
                (1..50).any(|i| segment_size(8, "title", r, i) != segment_size(7, "title", r, i))
            );
            assert!(
                (1..50).any(|i| segment_size(7, "other", r, i) != segment_size(7, "title", r, i))
            );
        }
    }

    #[test]
    fn a_vod_mpd_names_both_representations_and_its_length() {
        let m = vod_mpd(476);
        assert!(
            m.contains("type=\"static\"") && m.contains("mediaPresentationDuration=\"PT476S\"")
        );
        assert!(
            m.contains("id=\"low\" bandwidth=\"250000\"")
                && m.contains("id=\"high\" bandwidth=\"2500000\"")
        );
        assert!(m.contains("media=\"$RepresentationID$/$Number$.m4s\""));
        assert_eq!(vod_segments(476), 238);
        assert_eq!(vod_segments(5), 3);
    }

    #[test]
    fn live_segments_appear_every_two_seconds_and_age_out() {
        let start = 1_000_000;
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(start + s);
        assert_eq!(
            live_available(start, 1, at(1)),
            Err(LiveError::Future(Duration::from_secs(1)))
        );
        assert_eq!(live_available(start, 1, at(2)), Ok(()));
        assert_eq!(live_available(start, 5, at(11)), Ok(()));
        assert_eq!(live_available(start, 1, at(100)), Err(LiveError::Gone));
        let m = live_mpd(start, at(10));
        assert!(
            m.contains("type=\"dynamic\"")
                && m.contains("availabilityStartTime=\"1970-01-12T13:46:40Z\""),
            "{m}"
        );
    }

    #[test]
    fn iso8601_matches_known_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_795_306_086), "2026-11-22T00:08:06Z");
    }
}
