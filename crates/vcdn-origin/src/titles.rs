//! Real DASH titles from a data set, so players can be tested on real
//! manifests and real encodings without the media files: for every
//! `NAME.mpd` in a folder that has a `NAME.segments.csv` beside it
//! (`representation,bandwidth_bps,width,height,segment,size_bytes`, as in
//! the ITEC DASH data set of `shared/data/dash`), the origin serves the
//! manifest as written at `/dash/data/NAME.mpd` and every segment it names,
//! at the URL its template gives, with the size the data set records and
//! synthetic bytes.
//!
//! The CSV's `segment` column is the number at the end of the segment's
//! file name (for Valkaama, whose stem `Valkaama_4` runs into the number,
//! "41" is segment 1): segments are matched on those trailing digits, so
//! every title needs the same rule.

use std::collections::HashMap;
use std::path::Path;

use vcdn_content::mpd;

/// Where the titles are served.
pub const PREFIX: &str = "/dash/data/";
/// Size of an initialization segment (the data set does not record them;
/// GPAC's are under a kilobyte).
pub const INIT_BYTES: u64 = 900;
/// Largest data set read: CSV and MPD bytes together.
const MAX_BYTES: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TitlesError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{0}: the manifest cannot be read: {1}")]
    Mpd(String, mpd::MpdError),
    #[error("{0} line {1}: expected representation,bandwidth_bps,width,height,segment,size_bytes")]
    Csv(String, usize),
    #[error("{0}: no NAME.mpd with a NAME.segments.csv beside it")]
    Empty(String),
    #[error("{0}: the data set is larger than {MAX_BYTES} bytes")]
    TooLarge(String),
}

/// The titles of a data set, ready to serve.
#[derive(Debug, Default)]
pub struct Titles {
    /// Manifest text by `NAME`.
    manifests: HashMap<String, String>,
    /// Object size by path below [`PREFIX`].
    sizes: HashMap<String, u64>,
}

impl Titles {
    /// Reads every title of the folder `dir`.
    pub fn load(dir: &Path) -> Result<Titles, TitlesError> {
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |error| TitlesError::Io { path, error }
        };
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_suffix(".mpd").map(str::to_string)
            })
            .filter(|n| dir.join(format!("{n}.segments.csv")).is_file())
            .collect();
        names.sort();
        if names.is_empty() {
            return Err(TitlesError::Empty(dir.display().to_string()));
        }
        let mut t = Titles::default();
        let mut read = 0u64;
        for name in names {
            let mut text = |file: String| {
                let p = dir.join(file);
                let len = std::fs::metadata(&p).map_err(io(&p))?.len();
                read += len;
                if read > MAX_BYTES {
                    return Err(TitlesError::TooLarge(dir.display().to_string()));
                }
                std::fs::read_to_string(&p).map_err(io(&p))
            };
            let xml = text(format!("{name}.mpd"))?;
            let csv = text(format!("{name}.segments.csv"))?;
            t.add(&name, xml, &csv)?;
        }
        Ok(t)
    }

    /// One title: its manifest and the sizes its CSV gives.
    fn add(&mut self, name: &str, xml: String, csv: &str) -> Result<(), TitlesError> {
        let m = mpd::parse(&xml).map_err(|e| TitlesError::Mpd(format!("{name}.mpd"), e))?;
        // (bandwidth, trailing digits of the file name) -> bytes
        let mut recorded: HashMap<(u64, String), u64> = HashMap::new();
        for (i, line) in csv.lines().enumerate().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let bad = || TitlesError::Csv(format!("{name}.segments.csv"), i + 1);
            let [_, bw, _, _, seg, size] = f.as_slice() else {
                return Err(bad());
            };
            let bw = bw.parse::<u64>().map_err(|_| bad())?;
            let size = size.parse::<u64>().map_err(|_| bad())?;
            recorded.insert((bw, seg.to_string()), size);
        }
        for r in &m.representations {
            if let Some(init) = &r.init {
                self.sizes.insert(init.clone(), INIT_BYTES);
            }
            for i in 0..r.count().unwrap_or(0) {
                let Some(s) = r.segment(i) else { break };
                let stem = s.url.rsplit('/').next().unwrap_or("");
                let stem = stem.rsplit_once('.').map_or(stem, |(a, _)| a);
                let digits = &stem[stem.trim_end_matches(|c: char| c.is_ascii_digit()).len()..];
                if let Some(size) = recorded.get(&(r.bandwidth, digits.to_string())) {
                    self.sizes.insert(s.url, *size);
                }
            }
        }
        self.manifests.insert(name.to_string(), xml);
        Ok(())
    }

    /// The titles' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.manifests.keys().map(String::as_str).collect();
        v.sort();
        v
    }

    /// The manifest served at `PREFIX` + `NAME.mpd`.
    pub fn manifest(&self, file: &str) -> Option<&str> {
        self.manifests
            .get(file.strip_suffix(".mpd")?)
            .map(String::as_str)
    }

    /// Size of the segment at `path` (below [`PREFIX`]).
    pub fn size(&self, path: &str) -> Option<u64> {
        self.sizes.get(path).copied()
    }

    /// Segments known (initialization segments included).
    pub fn objects(&self) -> usize {
        self.sizes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MPD: &str = r#"<MPD type="static" mediaPresentationDuration="PT8S"><Period>
<AdaptationSet mimeType="video/mp4"><SegmentTemplate duration="4" media="v_$Bandwidth$/x_4$Number$.m4s" initialization="v_$Bandwidth$/init.mp4"/>
<Representation id="a" bandwidth="100"/><Representation id="b" bandwidth="200"/></AdaptationSet></Period></MPD>"#;

    #[test]
    fn segments_get_the_recorded_sizes_by_the_digits_ending_their_name() {
        let mut t = Titles::default();
        let csv = "representation,bandwidth_bps,width,height,segment,size_bytes\n\
                   a,100,1,1,41,1000\na,100,1,1,42,1100\nb,200,1,1,41,2000\n";
        t.add("T", MPD.into(), csv).unwrap();
        assert_eq!(t.size("v_100/x_41.m4s"), Some(1000));
        assert_eq!(t.size("v_100/x_42.m4s"), Some(1100));
        assert_eq!(t.size("v_200/x_41.m4s"), Some(2000));
        assert_eq!(t.size("v_200/x_42.m4s"), None, "not in the CSV");
        assert_eq!(t.size("v_200/init.mp4"), Some(INIT_BYTES));
        assert_eq!(t.manifest("T.mpd"), Some(MPD));
        assert_eq!(t.manifest("T"), None);
    }

    #[test]
    fn a_bad_csv_line_is_named() {
        let mut t = Titles::default();
        let e = t
            .add("T", MPD.into(), "header\na,100,1,1,41\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "T.segments.csv line 2: expected representation,bandwidth_bps,width,height,segment,size_bytes"
        );
    }

    /// Every segment row of the real data set gets a URL.
    #[test]
    fn the_data_set_loads_whole() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/dash");
        if !Path::new(dir).is_dir() {
            eprintln!("skipped: no data set at {dir}");
            return;
        }
        let t = Titles::load(Path::new(dir)).unwrap();
        assert_eq!(
            t.names(),
            [
                "BigBuckBunny_4s",
                "OfForestAndMen_4s",
                "TheSwissAccount_4s",
                "Valkaama_4s"
            ]
        );
        let rows: usize = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".segments.csv"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap().lines().count() - 1)
            .sum();
        let inits = t.sizes.keys().filter(|k| k.ends_with(".mp4")).count();
        // A CSV may record one segment past the manifest's duration.
        let segments = t.objects() - inits;
        assert!(
            segments <= rows && segments + 200 > rows,
            "{segments} of {rows}"
        );
        assert_eq!(
            t.size("media/BigBuckBunny/4sec/bunny_45226bps/BigBuckBunny_4s1.m4s"),
            Some(21504)
        );
    }
}
