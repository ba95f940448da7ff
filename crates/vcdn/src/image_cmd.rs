//! `vcdn image`: the cache image for the kubernetes VIM, made by the
//! project itself from a built binary: one layer holding `/vcdn` and the
//! shared objects it loads (none for a static build), written as a
//! docker-archive (what `ctr images import`, `docker load` and `skopeo
//! copy docker-archive:` read). No registry and no container tool needed
//! here; in production, push it to any registry.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use sha2::Digest;

#[derive(Args)]
pub struct ImageArgs {
    /// Where to write the docker-archive.
    #[arg(long)]
    out: PathBuf,
    /// Its reference [default: the one `vcdn up --region-vim` uses].
    #[arg(long)]
    tag: Option<String>,
    /// The binary to package [default: this one].
    #[arg(long)]
    binary: Option<PathBuf>,
}

pub fn run(a: ImageArgs) -> Result<(), String> {
    let binary = match a.binary {
        Some(b) => b,
        None => std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?,
    };
    let tag = a
        .tag
        .unwrap_or_else(vcdn_control::kubernetes::default_image);
    let mut files = vec![(PathBuf::from("vcdn"), binary.clone(), 0o755)];
    for lib in shared_objects(&binary)? {
        let inside = lib.strip_prefix("/").unwrap_or(&lib).to_path_buf();
        files.push((inside, lib, 0o755));
    }
    let mut layer = Tar::default();
    for (inside, from, mode) in &files {
        let data = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
        layer.file(inside, &data, *mode);
    }
    // The kubelet mounts /etc/resolv.conf and /etc/hosts; glibc 2.34 and
    // later resolve with them without NSS modules.
    layer.file(Path::new("etc/nsswitch.conf"), b"hosts: files dns\n", 0o644);
    let layer = layer.finish();
    let diff = format!("sha256:{}", hex(&sha2::Sha256::digest(&layer)));
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/vcdn"], "User": "65534:65534"},
        "rootfs": {"type": "layers", "diff_ids": [diff]},
    })
    .to_string();
    let config_name = format!("{}.json", hex(&sha2::Sha256::digest(config.as_bytes())));
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": ["layer.tar"],
    }])
    .to_string();
    let mut archive = Tar::default();
    archive.file(Path::new(&config_name), config.as_bytes(), 0o644);
    archive.file(Path::new("manifest.json"), manifest.as_bytes(), 0o644);
    archive.file(Path::new("layer.tar"), &layer, 0o644);
    let bytes = archive.finish();
    let mut tmp = a.out.clone().into_os_string();
    tmp.push(".tmp");
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, &a.out))
        .map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
    println!(
        "wrote {} ({tag}, {} files, {:.1} MB, layer {diff})",
        a.out.display(),
        files.len() + 1,
        bytes.len() as f64 / 1e6
    );
    Ok(())
}

/// The shared objects a dynamic binary loads (`ldd`), none for a static
/// one.
fn shared_objects(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("cannot run ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "not a dynamic executable": a static build needs nothing else.
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libz.so.1 => /lib/…/libz.so.1 (0x…)" or "/lib64/ld-linux….so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A ustar archive in memory, with the directories of its files.
#[derive(Default)]
struct Tar {
    out: Vec<u8>,
    dirs: std::collections::BTreeSet<PathBuf>,
}

impl Tar {
    fn file(&mut self, path: &Path, data: &[u8], mode: u32) {
        let mut parents: Vec<PathBuf> = path.ancestors().skip(1).map(Path::to_path_buf).collect();
        parents.reverse();
        for d in parents.into_iter().filter(|d| !d.as_os_str().is_empty()) {
            if self.dirs.insert(d.clone()) {
                self.entry(&format!("{}/", d.display()), b'5', 0o755, &[]);
            }
        }
        self.entry(&path.display().to_string(), b'0', mode, data);
    }

    fn entry(&mut self, name: &str, kind: u8, mode: u32, data: &[u8]) {
        let mut h = [0u8; 512];
        let put = |h: &mut [u8; 512], at: usize, v: &[u8]| h[at..at + v.len()].copy_from_slice(v);
        assert!(name.len() < 100, "tar names here are short: {name}");
        put(&mut h, 0, name.as_bytes());
        put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
        put(&mut h, 108, b"0000000\0");
        put(&mut h, 116, b"0000000\0");
        put(&mut h, 124, format!("{:011o}\0", data.len()).as_bytes());
        put(&mut h, 136, b"00000000000\0");
        put(&mut h, 148, b"        ");
        h[156] = kind;
        put(&mut h, 257, b"ustar\0");
        put(&mut h, 263, b"00");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
        self.out.extend_from_slice(&h);
        self.out.extend_from_slice(data);
        self.out.resize(self.out.len().div_ceil(512) * 512, 0);
    }

    fn finish(mut self) -> Vec<u8> {
        self.out.resize(self.out.len() + 1024, 0);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The archive reads back with GNU tar, the layer's files whole.
    #[test]
    fn the_layer_is_a_tar_that_tar_reads() {
        let mut t = Tar::default();
        t.file(Path::new("lib/x86_64-linux-gnu/libz.so.1"), b"abc", 0o755);
        t.file(Path::new("vcdn"), &vec![7u8; 1000], 0o755);
        let d = std::env::temp_dir().join(format!("vcdn-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("l.tar"), t.finish()).unwrap();
        let out = std::process::Command::new("tar")
            .args(["-tvf", "l.tar"])
            .current_dir(&d)
            .output()
            .unwrap();
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{list}");
        assert!(list.contains("lib/x86_64-linux-gnu/libz.so.1"), "{list}");
        assert!(list.contains("1000 ") && list.contains("vcdn"), "{list}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
