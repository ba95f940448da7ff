//! Flags of the decodable DASH titles a demo origin serves (`vcdn origin`,
//! `vcdn up --demo`).

use std::path::{Path, PathBuf};

use clap::Args;
use vcdn_origin::video::{Library, TitleSpec};

#[derive(Args, Debug, Clone)]
pub struct VideoArgs {
    /// Serve decodable DASH titles (a test pattern made once with Debian's
    /// ffmpeg, kept in DIR) at /video/testsrc-{S}s/manifest.mpd; missing
    /// ones are made in the background at start (~0.5 s per second of title;
    /// with `vcdn up --demo`, on the first request, in DATA_DIR/video).
    #[arg(long, value_name = "DIR", env = "VCDN_ORIGIN_VIDEO_DIR")]
    pub video_dir: Option<PathBuf>,
    /// Length of each title, seconds.
    #[arg(long, default_value_t = 60, value_name = "S")]
    pub video_seconds: u32,
    /// Segment durations, one title each (even seconds).
    #[arg(long, default_value = "2,4", value_delimiter = ',', value_name = "S,…")]
    pub video_segments: Vec<u32>,
}

impl VideoArgs {
    /// The titles to serve, from `--video-dir` or else `default_dir`
    /// (none when neither is given); the missing ones are made at once, or
    /// with `on_demand` when one is first requested.
    pub fn library(
        &self,
        default_dir: Option<&Path>,
        on_demand: bool,
    ) -> Result<Option<Library>, String> {
        let Some(dir) = self.video_dir.as_deref().or(default_dir) else {
            return Ok(None);
        };
        let specs = self
            .video_segments
            .iter()
            .map(|&s| TitleSpec::new(s, self.video_seconds))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let lib = if on_demand {
            Library::on_demand(dir, &specs)
        } else {
            Library::start(dir, &specs)
        };
        let state = if lib.ready() {
            "ready"
        } else if on_demand {
            "missing ones are made with ffmpeg on the first request, in about a minute"
        } else {
            "missing ones are being made with ffmpeg in the background"
        };
        println!(
            "serving decodable titles from {} at {} ({state}); watch one at /watch",
            dir.display(),
            lib.names()
                .iter()
                .map(|n| format!("{}{n}/manifest.mpd", vcdn_origin::video::PREFIX))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(Some(lib))
    }
}
