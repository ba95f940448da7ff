//! Loading the BPF objects with libbpf (libbpf-rs), keeping libbpf's log so
//! that a program the verifier refuses is reported with the verifier's own
//! words; pinning programs in bpffs so that iproute2 can attach them to
//! routes; removing the pins again (also those of a process that died).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, OpenObject, PrintLevel};

/// Where vcdn pins its programs: one directory per loaded object,
/// `<pid>-<seq>-<name>`.
pub(crate) const PIN_ROOT: &str = "/sys/fs/bpf/vcdn";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "this vcdn was built without its BPF programs (clang was missing when it was built): \
         install clang (Debian: apt-get install clang) and rebuild; meanwhile the HTTP-level \
         filter (router 302s, the cache's --admission-filter) works"
    )]
    NotBuilt,
    #[error("loading BPF programs needs root (CAP_BPF and CAP_NET_ADMIN): {0}")]
    Permission(String),
    #[error(
        "the kernel refused the {what} programs ({reason}); libbpf and the verifier said:{log}"
    )]
    Refused {
        what: &'static str,
        reason: String,
        /// The end of libbpf's log (the verifier's explanation), if any.
        log: String,
    },
    #[error("the kernel lacks {0}")]
    Missing(String),
    #[error("BPF map {map}: {reason}")]
    Map { map: &'static str, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn map(map: &'static str, e: impl std::fmt::Display) -> Error {
        Error::Map {
            map,
            reason: e.to_string(),
        }
    }
}

/// libbpf's messages during the current load (loads are serialised).
static LOG: Mutex<String> = Mutex::new(String::new());
static LOADING: Mutex<()> = Mutex::new(());
static SEQ: AtomicU64 = AtomicU64::new(0);

fn keep_log(_level: PrintLevel, msg: String) {
    let mut log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: the verifier's log of a large program can be megabytes;
    // its end says why.
    if log.len() > 1 << 20 {
        let cut = log.len() - (1 << 19);
        let cut = (cut..log.len())
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(0);
        log.drain(..cut);
    }
    log.push_str(&msg);
}

/// Opens the object `bytes`, lets `tune` adjust it (map sizes), loads it.
pub(crate) fn load(
    what: &'static str,
    bytes: &[u8],
    tune: impl FnOnce(&mut OpenObject) -> Result<(), Error>,
) -> Result<Object, Error> {
    if bytes.is_empty() {
        return Err(Error::NotBuilt);
    }
    let _one = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    remove_stale();
    LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
    libbpf_rs::set_print(Some((PrintLevel::Info, keep_log)));
    let result = ObjectBuilder::default()
        .open_memory(bytes)
        .map_err(|e| refused(what, &e))
        .and_then(|mut open| {
            tune(&mut open)?;
            open.load().map_err(|e| refused(what, &e))
        });
    libbpf_rs::set_print(None);
    result
}

fn refused(what: &'static str, e: &libbpf_rs::Error) -> Error {
    let log = std::mem::take(&mut *LOG.lock().unwrap_or_else(|e| e.into_inner()));
    // The verifier's refusal is EACCES too: only without root is it about
    // rights.
    // SAFETY: geteuid has no preconditions.
    if e.kind() == libbpf_rs::ErrorKind::PermissionDenied && unsafe { libc::geteuid() } != 0 {
        return Error::Permission(e.to_string());
    }
    let tail: Vec<&str> = log.lines().rev().take(25).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Error::Refused {
        what,
        reason: e.to_string(),
        log: if tail.is_empty() {
            String::new()
        } else {
            format!("\n{}", tail.join("\n"))
        },
    }
}

/// Pins `program` of `obj` in `dir` for as long as `f` runs (iproute2
/// attaches programs by path), then unpins it: the route that names it
/// keeps it loaded, and nothing is left in bpffs when the process dies.
pub(crate) fn with_pinned<T>(
    obj: &libbpf_rs::Object,
    program: &str,
    f: impl FnOnce(&Path) -> Result<T, Error>,
) -> Result<T, Error> {
    let mut prog = obj
        .progs_mut()
        .find(|p| p.name() == program)
        .ok_or_else(|| Error::map("programs", format!("no program {program}")))?;
    let dir = PinDir::create(program)?;
    let path = dir.path(program);
    prog.pin(&path).map_err(|e| {
        Error::io(
            format!("pin {program}"),
            std::io::Error::other(e.to_string()),
        )
    })?;
    let r = f(&path);
    let _ = prog.unpin(&path);
    r
}

/// How often each program of `obj` ran and for how long, by name: the
/// kernel counts time only while `kernel.bpf_stats_enabled` is 1 (it costs
/// two clock reads per run, so it is off unless an operator turns it on).
pub(crate) fn program_runs(obj: &libbpf_rs::Object) -> Vec<ProgramRuns> {
    use std::os::fd::{AsFd, AsRawFd};
    obj.progs()
        .map(|p| {
            let mut info = libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            // SAFETY: the kernel writes at most `len` bytes into `info`.
            let r = unsafe {
                libbpf_sys::bpf_prog_get_info_by_fd(p.as_fd().as_raw_fd(), &mut info, &mut len)
            };
            ProgramRuns {
                name: p.name().to_string_lossy().into_owned(),
                runs: if r == 0 { info.run_cnt } else { 0 },
                nanoseconds: if r == 0 { info.run_time_ns } else { 0 },
            }
        })
        .collect()
}

/// Runs of one program (see [`program_runs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramRuns {
    pub name: String,
    pub runs: u64,
    pub nanoseconds: u64,
}

/// How often each BPF program ran and the CPU time it took (counted by the
/// kernel while `kernel.bpf_stats_enabled` is 1), as `PREFIX_program_*`.
pub fn render_program_runs(o: &mut String, prefix: &str, runs: &[ProgramRuns]) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "# HELP {prefix}_program_runs_total Runs of each BPF program."
    );
    let _ = writeln!(o, "# TYPE {prefix}_program_runs_total counter");
    for r in runs {
        let _ = writeln!(
            o,
            "{prefix}_program_runs_total{{program=\"{}\"}} {}",
            r.name, r.runs
        );
    }
    let _ = writeln!(
        o,
        "# HELP {prefix}_program_seconds_total CPU time in each BPF program (0 unless kernel.bpf_stats_enabled=1)."
    );
    let _ = writeln!(o, "# TYPE {prefix}_program_seconds_total counter");
    for r in runs {
        let _ = writeln!(
            o,
            "{prefix}_program_seconds_total{{program=\"{}\"}} {:.9}",
            r.name,
            r.nanoseconds as f64 / 1e9
        );
    }
}

/// An owned handle of `obj`'s map `name`.
pub(crate) fn handle(obj: &Object, name: &'static str) -> Result<MapHandle, Error> {
    let m = obj
        .maps()
        .find(|m| m.name() == name)
        .ok_or_else(|| Error::map(name, "not in the object"))?;
    MapHandle::try_from(&m).map_err(|e| Error::map(name, e))
}

/// The first `n` per-CPU counters of `map`, each summed over CPUs.
pub(crate) fn sum_counters(map: &MapHandle, n: u32) -> Result<Vec<u64>, Error> {
    (0..n)
        .map(|i| {
            let per_cpu = map
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
                .map_err(|e| Error::map("stats", e))?
                .unwrap_or_default();
            Ok(per_cpu
                .iter()
                .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                .sum())
        })
        .collect()
}

/// A directory of pins, removed (with its pins) when dropped; one a process
/// that died left is removed by the next load.
struct PinDir {
    path: PathBuf,
}

impl PinDir {
    fn create(name: &str) -> Result<PinDir, Error> {
        mount_bpffs()?;
        remove_stale();
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(PIN_ROOT).join(format!("{}-{seq}-{name}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| Error::io(format!("mkdir {}", path.display()), e))?;
        Ok(PinDir { path })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Mounts bpffs on /sys/fs/bpf when nothing is mounted there.
fn mount_bpffs() -> Result<(), Error> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf"))
    {
        return Ok(());
    }
    let out = std::process::Command::new("mount")
        .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
        .output()
        .map_err(|e| Error::io("mount bpffs", e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: "mount -t bpf bpf /sys/fs/bpf".into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Removes pin directories of processes that no longer run (a crash leaves
/// them; the programs stay loaded while pinned).
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir(PIN_ROOT) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Checks that this kernel and this process can run the SRv6 data path:
/// BPF programs built in, root, bpffs, seg6 and LWT BPF in the kernel. The
/// error says what is missing.
pub fn probe() -> Result<(), Error> {
    if crate::dispatcher::OBJECT.is_empty() {
        return Err(Error::NotBuilt);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Permission("not running as root".into()));
    }
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return Err(Error::Missing("IPv6".into()));
    }
    if !Path::new("/proc/sys/net/ipv6/conf/all/seg6_enabled").exists() {
        return Err(Error::Missing("SRv6 (CONFIG_IPV6_SEG6_LWTUNNEL)".into()));
    }
    mount_bpffs()
}

#[cfg(all(test, vcdn_bpf))]
mod tests {
    use super::*;

    /// Needs root (loading BPF).
    #[test]
    fn a_program_the_verifier_refuses_is_an_error_with_the_verifiers_words() {
        let bytes = include_bytes!(concat!(env!("OUT_DIR"), "/tests-refused.bpf.o"));
        match load("test", bytes, |_| Ok(())) {
            Err(Error::Refused { what, log, .. }) => {
                assert_eq!(what, "test");
                assert!(
                    log.contains("invalid") || log.contains("R1"),
                    "the verifier's log: {log}"
                );
            }
            Err(e) => panic!("not a refusal: {e}"),
            Ok(_) => panic!("the verifier accepted an out-of-bounds read"),
        }
        let msg = load("test", bytes, |_| Ok(())).err().unwrap().to_string();
        assert!(
            msg.starts_with("the kernel refused the test programs"),
            "{msg}"
        );
    }

    #[test]
    fn without_programs_loading_says_how_to_get_them() {
        let e = load("test", &[], |_| Ok(())).err().unwrap();
        assert!(matches!(e, Error::NotBuilt));
        assert!(e.to_string().contains("install clang"), "{e}");
    }
}
