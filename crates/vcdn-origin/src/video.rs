//! A real, decodable DASH title, so a real player (dash.js in a browser)
//! can play through a vCDN: a test pattern made once with Debian's
//! `ffmpeg`, kept on disk, and served at `/video/testsrc-{S}s/manifest.mpd`
//! with its segments.
//!
//! The title is `testsrc2` 1280x720 at 25 fps with a 440 Hz tone, in three
//! H.264 representations (240p, 480p, 720p at 300, 1000 and 2500 kbit/s,
//! constant bitrate so that the ladder means what it says: the test pattern
//! would otherwise compress far below it), a keyframe every 2 s, AAC at
//! 96 kbit/s, segments of S seconds named by `$RepresentationID$` and
//! `$Number$`, video and audio in separate adaptation sets.
//!
//! A title is made into a temporary directory and renamed into place when
//! ffmpeg has finished, so a crash never leaves a half title that looks
//! whole; two processes making the same title both succeed (the first
//! rename wins, the other drops its copy).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

/// Where the titles are served.
pub const PREFIX: &str = "/video/";
/// The video ladder: (height, kbit/s).
pub const LADDER: [(u32, u32); 3] = [(240, 300), (480, 1000), (720, 2500)];
/// The audio bitrate, kbit/s.
pub const AUDIO_KBPS: u32 = 96;
/// ffmpeg numbers representations in the order of its `-map`s: the three
/// videos, then the audio.
const AUDIO_REPRESENTATION: usize = LADDER.len();
/// A temporary directory older than this was left by a crashed generator.
const STALE_TMP: Duration = Duration::from_secs(600);

/// Which title: its segment duration and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TitleSpec {
    pub segment_s: u32,
    pub length_s: u32,
}

impl TitleSpec {
    pub fn new(segment_s: u32, length_s: u32) -> Result<TitleSpec, VideoError> {
        // Keyframes come every 2 s, so segments are a multiple of 2 s.
        if ![2, 4, 6, 8, 10].contains(&segment_s) {
            return Err(VideoError::Spec(format!(
                "segments of {segment_s} s: use 2, 4, 6, 8 or 10"
            )));
        }
        if !(segment_s..=3600).contains(&length_s) {
            return Err(VideoError::Spec(format!(
                "a title of {length_s} s: use {segment_s} to 3600"
            )));
        }
        Ok(TitleSpec {
            segment_s,
            length_s,
        })
    }

    /// The name it is served under: `testsrc-2s`.
    pub fn name(&self) -> String {
        format!("testsrc-{}s", self.segment_s)
    }

    /// Its directory in the cache: `testsrc-2s-40s`.
    pub fn key(&self) -> String {
        format!("testsrc-{}s-{}s", self.segment_s, self.length_s)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    #[error("ffmpeg is not installed: install Debian's ffmpeg: apt-get install ffmpeg")]
    NoFfmpeg,
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("ffmpeg could not make {key} ({status}): {stderr}")]
    Ffmpeg {
        key: String,
        status: String,
        stderr: String,
    },
    #[error("{0}")]
    Spec(String),
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> VideoError {
    let path = p.display().to_string();
    move |error| VideoError::Io { path, error }
}

/// The title `spec` in `cache_dir` (`cache_dir/testsrc-2s-40s/`), made
/// with ffmpeg first if it is not there (about half a second of two cores
/// per second of title).
pub fn ensure_title(cache_dir: &Path, spec: TitleSpec) -> Result<PathBuf, VideoError> {
    let dir = cache_dir.join(spec.key());
    if dir.join("manifest.mpd").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache_dir).map_err(io(cache_dir))?;
    remove_stale(cache_dir, &spec);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = TmpDir(cache_dir.join(format!(
        ".tmp-{}-{}-{nanos}",
        spec.key(),
        std::process::id()
    )));
    std::fs::create_dir(&tmp.0).map_err(io(&tmp.0))?;
    let t0 = Instant::now();
    tracing::info!(title = %spec.key(), dir = %cache_dir.display(), "making a DASH title with ffmpeg (about {} s)", spec.length_s / 2 + 2);
    let out = Command::new("ffmpeg")
        .args(ffmpeg_args(spec))
        .current_dir(&tmp.0)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VideoError::NoFfmpeg,
            _ => VideoError::Io {
                path: "ffmpeg".into(),
                error: e,
            },
        })?;
    if !out.status.success() || !tmp.0.join("manifest.mpd").is_file() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: String = stderr
            .chars()
            .rev()
            .take(1000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(VideoError::Ffmpeg {
            key: spec.key(),
            status: out.status.to_string(),
            stderr: tail.trim().to_string(),
        });
    }
    match std::fs::rename(&tmp.0, &dir) {
        Ok(()) => {}
        // Another process finished first: use its copy (TmpDir removes ours).
        Err(_) if dir.join("manifest.mpd").is_file() => {}
        Err(e) => return Err(io(&dir)(e)),
    }
    let bytes: u64 = std::fs::read_dir(&dir)
        .map_err(io(&dir))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    tracing::info!(title = %spec.key(), bytes, "made the DASH title in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(dir)
}

/// A generator's temporary directory, removed unless renamed into place
/// (also when it fails or panics).
struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes temporary directories of `spec` that crashed generators left.
fn remove_stale(cache_dir: &Path, spec: &TitleSpec) {
    let prefix = format!(".tmp-{}-", spec.key());
    let Ok(rd) = std::fs::read_dir(cache_dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TMP);
        if old && e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// ffmpeg's arguments, run in the directory the title is made in.
fn ffmpeg_args(spec: TitleSpec) -> Vec<String> {
    let len = spec.length_s;
    let mut a: Vec<String> = [
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostdin",
        "-y",
        "-f",
        "lavfi",
        "-i",
        &format!("testsrc2=size=1280x720:rate=25:duration={len}"),
        "-f",
        "lavfi",
        "-i",
        &format!("sine=frequency=440:sample_rate=48000:duration={len}"),
        "-filter_complex",
        "[0:v]split=3[a][b][c];[a]scale=-2:240[v0];[b]scale=-2:480[v1];[c]null[v2]",
        "-map",
        "[v0]",
        "-map",
        "[v1]",
        "-map",
        "[v2]",
        "-map",
        "1:a",
        "-c:v",
        "libx264",
        "-preset",
        "veryfast",
        "-profile:v",
        "main",
        "-pix_fmt",
        "yuv420p",
        // A keyframe every 2 s (25 fps), never elsewhere.
        "-g",
        "50",
        "-keyint_min",
        "50",
        "-sc_threshold",
        "0",
        "-x264-params",
        "nal-hrd=cbr",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (i, (_, kbps)) in LADDER.iter().enumerate() {
        for opt in ["b", "minrate", "maxrate", "bufsize"] {
            a.push(format!("-{opt}:v:{i}"));
            a.push(format!("{kbps}k"));
        }
    }
    for s in [
        "-c:a",
        "aac",
        "-b:a",
        &format!("{AUDIO_KBPS}k"),
        "-f",
        "dash",
        "-seg_duration",
        &spec.segment_s.to_string(),
        "-use_template",
        "1",
        "-use_timeline",
        "0",
        "-adaptation_sets",
        "id=0,streams=v id=1,streams=a",
        "manifest.mpd",
    ] {
        a.push(s.to_string());
    }
    a
}

/// One made title, ready to serve: only the files listed here are served.
#[derive(Debug)]
pub struct Title {
    dir: PathBuf,
    /// File name -> size.
    files: HashMap<String, u64>,
}

impl Title {
    /// Lists a made title's directory.
    pub fn open(dir: &Path) -> Result<Title, VideoError> {
        let files = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let len = e.metadata().ok()?.len();
                content_type(&name).map(|_| (name, len))
            })
            .collect::<HashMap<_, _>>();
        if !files.contains_key("manifest.mpd") {
            return Err(VideoError::Spec(format!(
                "{}: no manifest.mpd",
                dir.display()
            )));
        }
        Ok(Title {
            dir: dir.to_path_buf(),
            files,
        })
    }

    /// Files served (the manifest and every segment).
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Bytes of all its files.
    pub fn bytes(&self) -> u64 {
        self.files.values().sum()
    }
}

/// The Content-Type of a title's file, or `None` for a name that is not
/// one of ffmpeg's (`manifest.mpd`, `init-streamR.m4s`,
/// `chunk-streamR-NNNNN.m4s`).
pub fn content_type(file: &str) -> Option<&'static str> {
    if file == "manifest.mpd" {
        return Some("application/dash+xml");
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    let stem = file.strip_suffix(".m4s")?;
    let rep = match stem.strip_prefix("init-stream") {
        Some(rep) => rep,
        None => {
            let (rep, number) = stem.strip_prefix("chunk-stream")?.split_once('-')?;
            if !digits(number) {
                return None;
            }
            rep
        }
    };
    if !digits(rep) {
        return None;
    }
    let rep: usize = rep.parse().ok()?;
    if rep > AUDIO_REPRESENTATION {
        return None;
    }
    Some(if rep == AUDIO_REPRESENTATION {
        "audio/mp4"
    } else {
        "video/mp4"
    })
}

/// A title's state in the library.
#[derive(Debug, Clone)]
enum Slot {
    Making,
    Ready(Arc<Title>),
    Failed(String),
}

/// The titles an origin serves, by name; the missing ones are made on a
/// background thread (at start, or on the first request for a title), so
/// the origin answers at once (503 with Retry-After for a title still
/// being made).
#[derive(Debug, Clone, Default)]
pub struct Library {
    slots: Arc<Mutex<Vec<(String, Slot)>>>,
    /// Titles still to make, and where, until the maker thread starts.
    to_make: Arc<Mutex<Option<ToMake>>>,
}

/// Where to make which titles.
type ToMake = (PathBuf, Vec<TitleSpec>);

/// What a request below [`PREFIX`] resolves to.
#[derive(Debug)]
pub enum Lookup {
    /// A file to send: its path, size and Content-Type.
    File {
        path: PathBuf,
        size: u64,
        content_type: &'static str,
        manifest: bool,
    },
    /// The title is being made.
    Making(String),
    /// The title could not be made.
    Failed(String, String),
    /// No such title or file.
    NotFound,
}

impl Library {
    /// Serves `specs` from `cache_dir`: the titles already made at once,
    /// the others once a background thread has made them (in order).
    pub fn start(cache_dir: &Path, specs: &[TitleSpec]) -> Library {
        let lib = Library::on_demand(cache_dir, specs);
        lib.make_missing();
        lib
    }

    /// Like [`Library::start`], but the missing titles are only made when
    /// one of them is first requested (so an origin that nobody watches
    /// never spends CPU on ffmpeg).
    pub fn on_demand(cache_dir: &Path, specs: &[TitleSpec]) -> Library {
        let lib = Library::default();
        let mut missing = Vec::new();
        for s in specs {
            let slot = match Title::open(&cache_dir.join(s.key())) {
                Ok(t) => Slot::Ready(Arc::new(t)),
                Err(_) => {
                    missing.push(*s);
                    Slot::Making
                }
            };
            lib.slots.lock().push((s.name(), slot));
        }
        if !missing.is_empty() {
            *lib.to_make.lock() = Some((cache_dir.to_path_buf(), missing));
        }
        lib
    }

    /// Starts making the missing titles (once).
    fn make_missing(&self) {
        let Some((dir, missing)) = self.to_make.lock().take() else {
            return;
        };
        let lib = self.clone();
        let names: Vec<String> = missing.iter().map(|s| s.name()).collect();
        let spawned = std::thread::Builder::new()
            .name("vcdn-video".into())
            .spawn(move || {
                for s in missing {
                    let slot = match ensure_title(&dir, s).and_then(|d| Title::open(&d)) {
                        Ok(t) => Slot::Ready(Arc::new(t)),
                        Err(e) => {
                            tracing::error!(title = %s.key(), "{e}");
                            Slot::Failed(e.to_string())
                        }
                    };
                    lib.set(&s.name(), slot);
                }
            });
        if let Err(e) = spawned {
            for n in names {
                self.set(&n, Slot::Failed(format!("cannot start a thread: {e}")));
            }
        }
    }

    fn set(&self, name: &str, slot: Slot) {
        if let Some(s) = self.slots.lock().iter_mut().find(|(n, _)| n == name) {
            s.1 = slot;
        }
    }

    /// The served names, in order.
    pub fn names(&self) -> Vec<String> {
        self.slots.lock().iter().map(|(n, _)| n.clone()).collect()
    }

    /// Whether every title is ready.
    pub fn ready(&self) -> bool {
        self.slots
            .lock()
            .iter()
            .all(|(_, s)| matches!(s, Slot::Ready(_)))
    }

    /// What `path` (below [`PREFIX`], `NAME/FILE`) is. Only file names
    /// listed in a made title's directory are ever served, so no request
    /// reaches another file.
    pub fn lookup(&self, path: &str) -> Lookup {
        let Some((name, file)) = path.split_once('/') else {
            return Lookup::NotFound;
        };
        let slot = self
            .slots
            .lock()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone());
        match slot {
            None => Lookup::NotFound,
            Some(Slot::Making) => {
                self.make_missing();
                Lookup::Making(name.to_string())
            }
            Some(Slot::Failed(e)) => Lookup::Failed(name.to_string(), e),
            Some(Slot::Ready(t)) => match (t.files.get(file), content_type(file)) {
                (Some(&size), Some(ct)) => Lookup::File {
                    path: t.dir.join(file),
                    size,
                    content_type: ct,
                    manifest: file == "manifest.mpd",
                },
                _ => Lookup::NotFound,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_follow_ffmpeg_names() {
        assert_eq!(content_type("manifest.mpd"), Some("application/dash+xml"));
        assert_eq!(content_type("init-stream0.m4s"), Some("video/mp4"));
        assert_eq!(content_type("chunk-stream2-00017.m4s"), Some("video/mp4"));
        assert_eq!(content_type("init-stream3.m4s"), Some("audio/mp4"));
        assert_eq!(content_type("chunk-stream3-00001.m4s"), Some("audio/mp4"));
        for bad in [
            "",
            "chunk-stream4-00001.m4s",
            "chunk-stream1-.m4s",
            "chunk-stream1-0a.m4s",
            "init-stream.m4s",
            "manifest.mpd.tmp",
            "../manifest.mpd",
            "x.m4s",
        ] {
            assert_eq!(content_type(bad), None, "{bad}");
        }
    }

    /// A library over a fake title directory (no ffmpeg needed).
    fn library(dir: &Path) -> Library {
        let t = dir.join("testsrc-2s-8s");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("manifest.mpd"), "<MPD/>").unwrap();
        std::fs::write(t.join("chunk-stream0-00001.m4s"), "abc").unwrap();
        std::fs::write(t.join("notes.txt"), "secret").unwrap();
        std::fs::write(dir.join("outside.m4s"), "secret").unwrap();
        Library::start(dir, &[TitleSpec::new(2, 8).unwrap()])
    }

    #[test]
    fn only_listed_files_of_a_title_resolve() {
        let dir = std::env::temp_dir().join(format!("vcdn-video-unit-{}", std::process::id()));
        let lib = library(&dir);
        assert!(lib.ready());
        assert_eq!(lib.names(), ["testsrc-2s"]);
        match lib.lookup("testsrc-2s/chunk-stream0-00001.m4s") {
            Lookup::File {
                path,
                size,
                content_type,
                manifest,
            } => {
                assert_eq!(path, dir.join("testsrc-2s-8s/chunk-stream0-00001.m4s"));
                assert_eq!((size, content_type, manifest), (3, "video/mp4", false));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            lib.lookup("testsrc-2s/manifest.mpd"),
            Lookup::File { manifest: true, .. }
        ));
        for bad in [
            "",
            "testsrc-2s",
            "testsrc-2s/",
            "testsrc-2s/notes.txt",
            "testsrc-2s/../outside.m4s",
            "testsrc-2s/..%2foutside.m4s",
            "testsrc-2s/%2e%2e/outside.m4s",
            "testsrc-2s//manifest.mpd",
            "testsrc-2s/manifest.mpd/x",
            "testsrc-2s-8s/manifest.mpd",
            "../testsrc-2s-8s/manifest.mpd",
            "testsrc-4s/manifest.mpd",
        ] {
            assert!(matches!(lib.lookup(bad), Lookup::NotFound), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn on_demand_makes_nothing_until_asked() {
        let dir = std::env::temp_dir().join(format!("vcdn-video-lazy-{}", std::process::id()));
        let lib = Library::on_demand(&dir, &[TitleSpec::new(4, 8).unwrap()]);
        assert!(!lib.ready());
        assert!(lib.to_make.lock().is_some());
        assert!(!dir.exists(), "nothing was made");
        assert!(matches!(
            lib.lookup("testsrc-6s/manifest.mpd"),
            Lookup::NotFound
        ));
        assert!(
            lib.to_make.lock().is_some(),
            "an unknown name starts nothing"
        );
    }

    #[test]
    fn specs_are_checked_and_named() {
        let s = TitleSpec::new(4, 60).unwrap();
        assert_eq!(
            (s.name(), s.key()),
            ("testsrc-4s".into(), "testsrc-4s-60s".into())
        );
        assert!(TitleSpec::new(3, 60).is_err());
        assert!(TitleSpec::new(2, 1).is_err());
        assert!(TitleSpec::new(2, 3601).is_err());
    }

    #[test]
    fn the_ladder_is_constant_bitrate_in_ffmpeg_args() {
        let a = ffmpeg_args(TitleSpec::new(2, 40).unwrap()).join(" ");
        assert!(a.contains("-b:v:2 2500k -minrate:v:2 2500k -maxrate:v:2 2500k"));
        assert!(a.contains("-seg_duration 2 "));
        assert!(a.contains("duration=40"));
        assert!(a.ends_with("manifest.mpd"));
    }
}
