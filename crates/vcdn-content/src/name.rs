//! Chunk names: a video chunk (a DASH or HLS segment) as a 64-bit identifier.
//!
//! The content-aware data plane (Desmouceaux et al., *A Content-aware Data-plane for Efficient
//! and Scalable Video Delivery*, §II-A) names every video chunk with one 64-bit identifier that
//! holds the video, the chunk's index within the video and metadata (duration, quality). Putting
//! that identifier in the last 64 bits of an IPv6 address (see [`crate::address`]) lets the
//! network layer see *which chunk* a packet asks for. In vcdn the same identifier is the key of
//! the router's LRU admission filter and of consistent hashing, so a fixed, documented layout
//! matters: every component, and every version, must agree on it.
//!
//! # Layout of the 64-bit chunk id
//!
//! Most significant bit first:
//!
//! ```text
//!  63                          36 35                 16 15      10 9              0
//! +------------------------------+---------------------+----------+----------------+
//! |        video id (28)         |  chunk index (20)   | quality  | duration (10)  |
//! |                              |                     |   (6)    |  20 ms units   |
//! +------------------------------+---------------------+----------+----------------+
//! ```
//!
//! | field    | bits   | range                         | meaning                                   |
//! |----------|--------|-------------------------------|-------------------------------------------|
//! | video    | 63..36 | 0 ..= 268 435 455 (2^28 − 1)  | the video (a title, or one live channel)  |
//! | chunk    | 35..16 | 0 ..= 1 048 575 (2^20 − 1)    | index of the chunk within the video       |
//! | quality  | 15..10 | 0 ..= 63                      | representation, lowest bitrate first      |
//! | duration | 9..0   | 0 ..= 1023 units of 20 ms     | 0 – 20.46 s; 0 means "not given"          |
//!
//! The video is in the high bits so that all chunks of a video are one contiguous range of ids
//! (and of addresses), which keeps a video's chunks together in sorted tables and lets a
//! network filter match a whole video with one mask. A producer prefix holds 2^28 (268 million)
//! videos. At 4 s per chunk the chunk index covers 48 days of one video. The 64 qualities leave
//! room for large bitrate ladders: the manifests of the DASH data set have 17 to 20
//! representations each.
//!
//! The video and the chunk index fall on hexadecimal digits: of the 16 digits of an id, the
//! first 7 are the video and the next 5 the chunk (`000002a000070cc8` is video `0x2a`, chunk
//! `0x7`). The last 4 digits hold quality and duration, which are not aligned (`0cc8` is
//! quality 3, 200 units), and in an address the fields straddle the 16-bit groups, so read an
//! id or an address with [`ChunkName::from_id`] (or `vcdn name decode`), not by eye.
//!
//! An earlier layout (video 30 | chunk 20 | quality 4 | duration 10 bits) could not name more
//! than 16 representations; ids and addresses written under it decode differently under this
//! one.
//!
//! # Durations
//!
//! A duration is kept as a whole number of 20 ms units, so the usual segment durations 2 s,
//! 4 s, 1.92 s and 3.84 s are exact. Other durations are **rounded to the nearest 20 ms**, a
//! value exactly halfway between two units rounding up (so 10 ms becomes 20 ms). A duration is
//! rejected if it is negative, NaN or infinite, or if it rounds to more than 1023 units
//! (20.46 s). [`ChunkDuration`] does the conversions, from a [`Duration`], from seconds (`f64`
//! or text) and from a DASH `duration`/`timescale` pair.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

/// Bits of the video id.
pub const VIDEO_BITS: u32 = 28;
/// Bits of the chunk index.
pub const CHUNK_BITS: u32 = 20;
/// Bits of the quality.
pub const QUALITY_BITS: u32 = 6;
/// Bits of the duration (in 20 ms units).
pub const DURATION_BITS: u32 = 10;

const DURATION_SHIFT: u32 = 0;
const QUALITY_SHIFT: u32 = DURATION_SHIFT + DURATION_BITS;
const CHUNK_SHIFT: u32 = QUALITY_SHIFT + QUALITY_BITS;
const VIDEO_SHIFT: u32 = CHUNK_SHIFT + CHUNK_BITS;
const _: () = assert!(VIDEO_SHIFT + VIDEO_BITS == 64);

const fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

/// A field of a [`ChunkName`], as named in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The video id (28 bits).
    Video,
    /// The chunk index within the video (20 bits).
    Chunk,
    /// The quality / representation index (6 bits).
    Quality,
    /// The chunk duration in 20 ms units (10 bits).
    Duration,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Video => "video id",
            Field::Chunk => "chunk index",
            Field::Quality => "quality",
            Field::Duration => "duration (in 20 ms units)",
        })
    }
}

/// Why a chunk name, a duration or a chunk id could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// An integer field does not fit its bits.
    #[error("{field} {value} is out of range (maximum {max})")]
    OutOfRange {
        /// The field.
        field: Field,
        /// The value given.
        value: u64,
        /// The largest value the field holds.
        max: u64,
    },
    /// A duration rounds to more than 20.46 s.
    #[error(
        "duration {seconds} s is out of range (maximum 20.46 s; durations are kept in 20 ms units)"
    )]
    DurationOutOfRange {
        /// The duration given, in seconds, as text.
        seconds: String,
    },
    /// A duration is negative, NaN, infinite or not a number at all.
    #[error(
        "duration {input:?} is not valid: expected a finite, non-negative number of seconds such as 4 or 3.84"
    )]
    InvalidDuration {
        /// The duration given, as text.
        input: String,
    },
    /// Text that is not a chunk id.
    #[error(
        "chunk id {input:?} is not valid: expected up to 16 hexadecimal digits such as 000002a000070cc8"
    )]
    InvalidId {
        /// The text given.
        input: String,
    },
}

/// Formats seconds for an error message (no 300-digit numbers).
fn seconds_text(secs: f64) -> String {
    if secs.abs() < 1e9 {
        format!("{secs}")
    } else {
        format!("{secs:e}")
    }
}

/// A chunk duration, a whole number of 20 ms units from 0 to 1023 (0 – 20.46 s).
///
/// 0 means "duration not given". Conversions round to the nearest 20 ms (halfway rounds up);
/// see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ChunkDuration(u16);

impl ChunkDuration {
    /// The unit: 20 ms.
    pub const UNIT: Duration = Duration::from_millis(20);
    /// No duration given.
    pub const ZERO: ChunkDuration = ChunkDuration(0);
    /// The longest duration: 1023 units, 20.46 s.
    pub const MAX: ChunkDuration = ChunkDuration(mask(DURATION_BITS) as u16);

    const UNIT_NANOS: u128 = 20_000_000;
    const UNITS_PER_SECOND: f64 = 50.0;

    /// A duration of `units` × 20 ms; `units` must be at most 1023.
    pub fn from_units(units: u16) -> Result<Self, NameError> {
        if units > Self::MAX.0 {
            return Err(NameError::DurationOutOfRange {
                seconds: Self::units_text(u64::from(units)),
            });
        }
        Ok(ChunkDuration(units))
    }

    /// `duration` rounded to the nearest 20 ms (halfway rounds up).
    pub fn from_duration(duration: Duration) -> Result<Self, NameError> {
        let units = (duration.as_nanos() + Self::UNIT_NANOS / 2) / Self::UNIT_NANOS;
        if units > u128::from(Self::MAX.0) {
            return Err(NameError::DurationOutOfRange {
                seconds: seconds_text(duration.as_secs_f64()),
            });
        }
        Ok(ChunkDuration(units as u16))
    }

    /// `secs` seconds rounded to the nearest 20 ms (halfway rounds up).
    ///
    /// `secs` is a binary approximation, so a value written exactly halfway between two units
    /// (such as 0.03) may round either way; use [`from_duration`](Self::from_duration) or
    /// [`from_units`](Self::from_units) when that matters. `-0.0` counts as 0.
    pub fn from_secs_f64(secs: f64) -> Result<Self, NameError> {
        if !secs.is_finite() || secs < 0.0 {
            return Err(NameError::InvalidDuration {
                input: seconds_text(secs),
            });
        }
        let units = (secs * Self::UNITS_PER_SECOND).round();
        if units > f64::from(Self::MAX.0) {
            return Err(NameError::DurationOutOfRange {
                seconds: seconds_text(secs),
            });
        }
        Ok(ChunkDuration(units as u16))
    }

    /// A DASH duration: `duration` ticks of a clock of `timescale` ticks per second (the
    /// `@duration` and `@timescale` of a `SegmentTemplate`), rounded to the nearest 20 ms.
    ///
    /// For example 480479 / 120000 (4.004 s) gives 4.00 s.
    pub fn from_timescale(duration: u64, timescale: u64) -> Result<Self, NameError> {
        if timescale == 0 {
            return Err(NameError::InvalidDuration {
                input: format!("{duration}/0"),
            });
        }
        // units = round(duration * 50 / timescale), exactly, in integers.
        let num = u128::from(duration) * 50;
        let den = u128::from(timescale);
        let units = (2 * num + den) / (2 * den);
        if units > u128::from(Self::MAX.0) {
            return Err(NameError::DurationOutOfRange {
                seconds: seconds_text(duration as f64 / timescale as f64),
            });
        }
        Ok(ChunkDuration(units as u16))
    }

    /// The number of 20 ms units.
    pub fn units(self) -> u16 {
        self.0
    }

    /// The duration as a [`Duration`].
    pub fn as_duration(self) -> Duration {
        Self::UNIT * u32::from(self.0)
    }

    /// The duration in seconds.
    pub fn as_secs_f64(self) -> f64 {
        f64::from(self.0) / Self::UNITS_PER_SECOND
    }

    fn units_text(units: u64) -> String {
        format!("{}.{:02}", units / 50, (units % 50) * 2)
    }
}

/// Seconds with two decimals and an `s`, exact: `4.00s`, `3.84s`, `0.00s`.
impl fmt::Display for ChunkDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", Self::units_text(u64::from(self.0)))
    }
}

/// Parses seconds, with an optional `s` suffix: `4`, `3.84`, `3.84s`, `1.92 s`.
impl FromStr for ChunkDuration {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t.strip_suffix('s').unwrap_or(t).trim_end();
        // f64's parser also takes "inf", "NaN" and exponents; from_secs_f64 rejects the first two.
        match t.parse::<f64>() {
            Ok(secs) => Self::from_secs_f64(secs).map_err(|e| match e {
                NameError::InvalidDuration { .. } => NameError::InvalidDuration {
                    input: s.to_string(),
                },
                other => other,
            }),
            Err(_) => Err(NameError::InvalidDuration {
                input: s.to_string(),
            }),
        }
    }
}

impl TryFrom<Duration> for ChunkDuration {
    type Error = NameError;

    fn try_from(d: Duration) -> Result<Self, Self::Error> {
        Self::from_duration(d)
    }
}

/// A 64-bit chunk identifier, laid out as in the [module documentation](self).
///
/// Every `u64` is a valid chunk id: [`ChunkName::from_id`] never fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub u64);

impl ChunkId {
    /// The chunk name this id encodes.
    pub fn name(self) -> ChunkName {
        ChunkName::from_id(self)
    }
}

/// 16 lowercase hexadecimal digits, such as `000002a000070cc8`.
impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Parses 1 to 16 hexadecimal digits (either case), with an optional `0x` prefix.
impl FromStr for ChunkId {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let digits = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(NameError::InvalidId {
                input: s.to_string(),
            });
        }
        u64::from_str_radix(digits, 16)
            .map(ChunkId)
            .map_err(|_| NameError::InvalidId {
                input: s.to_string(),
            })
    }
}

impl From<ChunkId> for u64 {
    fn from(id: ChunkId) -> u64 {
        id.0
    }
}

impl From<u64> for ChunkId {
    fn from(id: u64) -> ChunkId {
        ChunkId(id)
    }
}

/// The name of one video chunk: video, chunk index, quality and duration.
///
/// The fields are private so that a `ChunkName` always fits the layout; build one with
/// [`new`](Self::new) (which checks every range) or [`from_id`](Self::from_id). Names order
/// like their ids: by video, then chunk, quality and duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkName {
    video: u32,
    chunk: u32,
    quality: u8,
    duration: ChunkDuration,
}

impl ChunkName {
    /// The largest video id, 2^28 − 1 (268 435 455).
    pub const MAX_VIDEO: u32 = mask(VIDEO_BITS) as u32;
    /// The largest chunk index, 2^20 − 1.
    pub const MAX_CHUNK: u32 = mask(CHUNK_BITS) as u32;
    /// The largest quality, 63.
    pub const MAX_QUALITY: u8 = mask(QUALITY_BITS) as u8;

    /// A chunk name, checking that every field fits its bits.
    ///
    /// The integer fields are taken as `u64` so that a value parsed from a command line or a
    /// request is checked here, with an error naming the field, its value and its maximum.
    pub fn new(
        video: u64,
        chunk: u64,
        quality: u64,
        duration: ChunkDuration,
    ) -> Result<Self, NameError> {
        let check = |field, value: u64, max: u64| {
            if value > max {
                Err(NameError::OutOfRange { field, value, max })
            } else {
                Ok(value)
            }
        };
        let video = check(Field::Video, video, Self::MAX_VIDEO.into())? as u32;
        let chunk = check(Field::Chunk, chunk, Self::MAX_CHUNK.into())? as u32;
        let quality = check(Field::Quality, quality, Self::MAX_QUALITY.into())? as u8;
        Ok(ChunkName {
            video,
            chunk,
            quality,
            duration,
        })
    }

    /// The name an id encodes. Every id decodes to a valid name.
    pub fn from_id(id: ChunkId) -> Self {
        let field = |shift, bits| (id.0 >> shift) & mask(bits);
        ChunkName {
            video: field(VIDEO_SHIFT, VIDEO_BITS) as u32,
            chunk: field(CHUNK_SHIFT, CHUNK_BITS) as u32,
            quality: field(QUALITY_SHIFT, QUALITY_BITS) as u8,
            duration: ChunkDuration(field(DURATION_SHIFT, DURATION_BITS) as u16),
        }
    }

    /// The 64-bit id of this chunk.
    pub fn id(&self) -> ChunkId {
        ChunkId(
            (u64::from(self.video) << VIDEO_SHIFT)
                | (u64::from(self.chunk) << CHUNK_SHIFT)
                | (u64::from(self.quality) << QUALITY_SHIFT)
                | (u64::from(self.duration.0) << DURATION_SHIFT),
        )
    }

    /// The video id.
    pub fn video(&self) -> u32 {
        self.video
    }

    /// The chunk index within the video.
    pub fn chunk(&self) -> u32 {
        self.chunk
    }

    /// The quality (representation index, lowest bitrate first).
    pub fn quality(&self) -> u8 {
        self.quality
    }

    /// The chunk duration ([`ChunkDuration::ZERO`] when not given).
    pub fn duration(&self) -> ChunkDuration {
        self.duration
    }
}

/// `video=42 chunk=7 quality=3 duration=4.00s`.
impl fmt::Display for ChunkName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "video={} chunk={} quality={} duration={}",
            self.video, self.chunk, self.quality, self.duration
        )
    }
}

/// The 28-bit video id of a video known by name: the top 28 bits of XXH3-64 of the name's
/// UTF-8 bytes.
///
/// This is one-way: the name cannot be recovered from the id (keep a catalog if you need it),
/// and two names can share an id. With 28 bits, the chance that some two of `n` names collide
/// is about 1 − e^(−n² / 2^29), close to n² / 2^29 while small: 0.2 % for 1 000 names, 1.7 %
/// for 3 000, 17 % for 10 000. Give large catalogs numeric video ids instead.
pub fn video_id_from_name(name: &str) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(name.as_bytes()) >> (64 - VIDEO_BITS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(units: u16) -> ChunkDuration {
        ChunkDuration::from_units(units).unwrap()
    }

    #[test]
    fn layout_is_the_documented_one() {
        let n = ChunkName::new(1, 1, 1, d(1)).unwrap();
        assert_eq!(n.id().0, (1 << 36) | (1 << 16) | (1 << 10) | 1);
        let n = ChunkName::new(42, 7, 3, d(200)).unwrap();
        assert_eq!(n.id().0, (42 << 36) | (7 << 16) | (3 << 10) | 200);
        assert_eq!(n.id().to_string(), "000002a000070cc8");
        assert_eq!(
            (VIDEO_BITS, CHUNK_BITS, QUALITY_BITS, DURATION_BITS),
            (28, 20, 6, 10)
        );
        assert_eq!(ChunkName::MAX_VIDEO, 268_435_455);
        assert_eq!(ChunkName::MAX_CHUNK, 1_048_575);
        assert_eq!(ChunkName::MAX_QUALITY, 63);
        assert_eq!(ChunkDuration::MAX.units(), 1023);
    }

    #[test]
    fn each_field_at_its_maximum_fills_exactly_its_bits() {
        let only = |v: u32, c: u32, q: u8, u: u16| {
            ChunkName::new(v.into(), c.into(), q.into(), d(u))
                .unwrap()
                .id()
                .0
        };
        assert_eq!(only(ChunkName::MAX_VIDEO, 0, 0, 0), 0xffff_fff0_0000_0000);
        assert_eq!(only(0, ChunkName::MAX_CHUNK, 0, 0), 0x0000_000f_ffff_0000);
        assert_eq!(only(0, 0, ChunkName::MAX_QUALITY, 0), 0x0000_0000_0000_fc00);
        assert_eq!(only(0, 0, 0, 1023), 0x0000_0000_0000_03ff);
        // The lowest bit of each field, and qualities the old 4-bit field could not hold.
        assert_eq!(only(1, 0, 0, 0), 1 << 36);
        assert_eq!(only(0, 1, 0, 0), 1 << 16);
        assert_eq!(only(0, 0, 1, 0), 1 << 10);
        assert_eq!(only(0, 0, 16, 0), 1 << 14);
        assert_eq!(only(0, 0, 32, 0), 1 << 15);
        // Each field decodes alone, without spilling into its neighbours.
        for (id, want) in [
            (0xffff_fff0_0000_0000, (ChunkName::MAX_VIDEO, 0, 0, 0)),
            (0x0000_000f_ffff_0000, (0, ChunkName::MAX_CHUNK, 0, 0)),
            (0x0000_0000_0000_fc00, (0, 0, ChunkName::MAX_QUALITY, 0)),
            (0x0000_0000_0000_03ff, (0, 0, 0, 1023)),
        ] {
            let n = ChunkName::from_id(ChunkId(id));
            let got = (n.video(), n.chunk(), n.quality(), n.duration().units());
            assert_eq!(got, want, "{id:016x}");
        }
    }

    #[test]
    fn fields_round_trip_through_the_id_at_every_extreme() {
        let videos = [0, 1, 12345, u64::from(ChunkName::MAX_VIDEO)];
        let chunks = [0, 1, 777, u64::from(ChunkName::MAX_CHUNK)];
        let qualities = [0, 1, 7, 15, 16, 32, u64::from(ChunkName::MAX_QUALITY)];
        let durations = [0, 1, 100, 200, 1023];
        for &v in &videos {
            for &c in &chunks {
                for &q in &qualities {
                    for &u in &durations {
                        let n = ChunkName::new(v, c, q, d(u)).unwrap();
                        let back = ChunkName::from_id(n.id());
                        assert_eq!(back, n);
                        assert_eq!(u64::from(back.video()), v);
                        assert_eq!(u64::from(back.chunk()), c);
                        assert_eq!(u64::from(back.quality()), q);
                        assert_eq!(back.duration().units(), u);
                        assert_eq!(back.id(), n.id());
                    }
                }
            }
        }
        let max = ChunkName::new(
            ChunkName::MAX_VIDEO.into(),
            ChunkName::MAX_CHUNK.into(),
            ChunkName::MAX_QUALITY.into(),
            ChunkDuration::MAX,
        )
        .unwrap();
        assert_eq!(max.id(), ChunkId(u64::MAX));
        assert_eq!(ChunkName::from_id(ChunkId(0)).id(), ChunkId(0));
    }

    #[test]
    fn every_id_decodes_and_re_encodes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(ChunkName::from_id(ChunkId(x)).id(), ChunkId(x));
        }
    }

    #[test]
    fn each_out_of_range_field_is_named_with_value_and_maximum() {
        let e = ChunkName::new(1 << 28, 0, 0, ChunkDuration::ZERO).unwrap_err();
        assert_eq!(
            e,
            NameError::OutOfRange {
                field: Field::Video,
                value: 1 << 28,
                max: (1 << 28) - 1
            }
        );
        assert_eq!(
            e.to_string(),
            "video id 268435456 is out of range (maximum 268435455)"
        );
        // The largest video id of the old 30-bit layout no longer fits.
        assert!(ChunkName::new(1_073_741_823, 0, 0, ChunkDuration::ZERO).is_err());
        let e = ChunkName::new(0, 1 << 20, 0, ChunkDuration::ZERO).unwrap_err();
        assert_eq!(
            e.to_string(),
            "chunk index 1048576 is out of range (maximum 1048575)"
        );
        let e = ChunkName::new(0, 0, 64, ChunkDuration::ZERO).unwrap_err();
        assert_eq!(
            e,
            NameError::OutOfRange {
                field: Field::Quality,
                value: 64,
                max: 63
            }
        );
        assert_eq!(e.to_string(), "quality 64 is out of range (maximum 63)");
        assert!(ChunkName::new(0, 0, 63, ChunkDuration::ZERO).is_ok());
        assert!(ChunkName::new(0, 0, u64::MAX, ChunkDuration::ZERO).is_err());
        let e = ChunkName::new(u64::MAX, 0, 0, ChunkDuration::ZERO).unwrap_err();
        assert!(matches!(
            e,
            NameError::OutOfRange {
                field: Field::Video,
                ..
            }
        ));
        let e = ChunkDuration::from_units(1024).unwrap_err();
        assert_eq!(
            e.to_string(),
            "duration 20.48 s is out of range (maximum 20.46 s; durations are kept in 20 ms units)"
        );
        assert!(ChunkDuration::from_secs_f64(20.5).is_err());
        assert!(ChunkDuration::from_secs_f64(1e300).is_err());
        assert!(ChunkDuration::from_duration(Duration::from_secs(21)).is_err());
        assert!(ChunkDuration::from_duration(Duration::MAX).is_err());
        assert!(ChunkDuration::from_timescale(u64::MAX, 1).is_err());
    }

    #[test]
    fn common_segment_durations_are_exact() {
        for (secs, units) in [
            (2.0, 100),
            (4.0, 200),
            (3.84, 192),
            (1.92, 96),
            (20.46, 1023),
        ] {
            let dur = ChunkDuration::from_secs_f64(secs).unwrap();
            assert_eq!(dur.units(), units, "{secs}");
            assert_eq!(dur.as_secs_f64(), secs);
        }
        assert_eq!(
            ChunkDuration::from_duration(Duration::from_millis(3840))
                .unwrap()
                .as_duration(),
            Duration::from_millis(3840)
        );
        assert_eq!(d(192).to_string(), "3.84s");
        assert_eq!(d(0).to_string(), "0.00s");
        assert_eq!(d(1023).to_string(), "20.46s");
        assert_eq!(d(1).to_string(), "0.02s");
    }

    #[test]
    fn durations_round_to_the_nearest_20_ms_halfway_up() {
        let ms = |m| ChunkDuration::from_duration(Duration::from_millis(m)).unwrap();
        assert_eq!(ms(0).units(), 0);
        assert_eq!(ms(9).units(), 0);
        assert_eq!(ms(10).units(), 1);
        assert_eq!(ms(29).units(), 1);
        assert_eq!(ms(30).units(), 2);
        assert_eq!(ms(4004).units(), 200);
        assert_eq!(ms(20_469).units(), 1023);
        assert!(ChunkDuration::from_duration(Duration::from_millis(20_470)).is_err());
        assert_eq!(ChunkDuration::from_secs_f64(4.004).unwrap().units(), 200);
        assert_eq!(ChunkDuration::from_secs_f64(20.469).unwrap().units(), 1023);
        assert_eq!(ChunkDuration::from_secs_f64(-0.0).unwrap().units(), 0);
        // DASH: 384 ticks at 96 Hz, 480479 ticks at 120 kHz.
        assert_eq!(ChunkDuration::from_timescale(384, 96).unwrap().units(), 200);
        assert_eq!(
            ChunkDuration::from_timescale(480_479, 120_000)
                .unwrap()
                .units(),
            200
        );
        assert_eq!(ChunkDuration::from_timescale(1, 100).unwrap().units(), 1);
    }

    #[test]
    fn invalid_durations_are_rejected() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.001, -4.0] {
            assert!(
                matches!(
                    ChunkDuration::from_secs_f64(bad),
                    Err(NameError::InvalidDuration { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            ChunkDuration::from_timescale(1, 0),
            Err(NameError::InvalidDuration { .. })
        ));
        for bad in ["", "s", "four", "-1", "NaN", "inf", "4ss", "0x10"] {
            let e = bad.parse::<ChunkDuration>().unwrap_err();
            assert_eq!(
                e,
                NameError::InvalidDuration {
                    input: bad.to_string()
                },
                "{bad:?}"
            );
        }
        assert!(matches!(
            "21".parse::<ChunkDuration>(),
            Err(NameError::DurationOutOfRange { .. })
        ));
    }

    #[test]
    fn durations_parse_from_seconds() {
        for (text, units) in [("4", 200), ("3.84", 192), ("3.84s", 192), (" 1.92 s ", 96)] {
            assert_eq!(text.parse::<ChunkDuration>().unwrap().units(), units);
        }
    }

    #[test]
    fn ids_print_as_16_hex_digits_and_parse_back() {
        for id in [0, 1, 0x0000_02a0_0007_0cc8, u64::MAX] {
            let text = ChunkId(id).to_string();
            assert_eq!(text.len(), 16);
            assert_eq!(text.parse::<ChunkId>().unwrap(), ChunkId(id));
        }
        assert_eq!("0xA".parse::<ChunkId>().unwrap(), ChunkId(10));
        assert_eq!("ff".parse::<ChunkId>().unwrap(), ChunkId(255));
        for bad in ["", "0x", "xyz", "12345678901234567", "-1", "+1", "1 2"] {
            assert!(bad.parse::<ChunkId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_display_their_fields() {
        let n = ChunkName::new(42, 7, 3, d(200)).unwrap();
        assert_eq!(n.to_string(), "video=42 chunk=7 quality=3 duration=4.00s");
    }

    #[test]
    fn video_names_hash_to_28_bits() {
        let a = video_id_from_name("big-buck-bunny");
        assert!(a <= ChunkName::MAX_VIDEO);
        // The top 28 bits of the hash.
        assert_eq!(
            u64::from(a),
            xxhash_rust::xxh3::xxh3_64(b"big-buck-bunny") >> 36
        );
        for name in ["", "valkaama", "of-forest-and-men", "/a/$Number$.ts"] {
            assert!(video_id_from_name(name) <= ChunkName::MAX_VIDEO, "{name}");
        }
        assert_eq!(a, video_id_from_name("big-buck-bunny"));
        assert_ne!(a, video_id_from_name("valkaama"));
    }
}
