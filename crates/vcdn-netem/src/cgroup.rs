//! CPU limits for test bed nodes: one cgroup per node with a CFS quota,
//! on cgroup v2 (`cpu.max`) or on the v1 `cpu` controller
//! (`cpu.cfs_quota_us`), whichever the host has (the same two writers as
//! the control plane's local VIM, kept here so that vcdn-netem needs
//! nothing from vcdn-control).
//!
//! Groups are named `PREFIX<pid>-…` directly under the hierarchy's root,
//! so that a later test bed can tell from the pid whether their owner
//! still runs and remove them if not ([`remove_stale`]).

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The CFS period every group gets: 10 ms. A VM's vCPUs are not taken
/// away in long blocks; with the kernel's default 100 ms, a node limited to
/// half a CPU that uses its quota early in a period stalls for up to 50 ms,
/// a latency the thesis's VMs did not have and the telemetry measurements
/// would show. 10 ms bounds that stall to 5 ms at the same share.
pub const PERIOD_US: u64 = 10_000;

/// Where CPU cgroups are made on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2 mounted at this directory, with the `cpu` controller
    /// enabled for its children.
    V2(PathBuf),
    /// The cgroup v1 `cpu` controller mounted at this directory.
    V1(PathBuf),
}

impl Hierarchy {
    /// The host's CPU hierarchy: v2 at `/sys/fs/cgroup` if it offers the
    /// `cpu` controller (enabling it for children), else v1 at
    /// `/sys/fs/cgroup/cpu`.
    pub fn detect() -> io::Result<Hierarchy> {
        let root = Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if v2.split_whitespace().any(|c| c == "cpu") {
            let on = std::fs::read_to_string(root.join("cgroup.subtree_control"))
                .unwrap_or_default()
                .split_whitespace()
                .any(|c| c == "cpu");
            if on || std::fs::write(root.join("cgroup.subtree_control"), "+cpu").is_ok() {
                return Ok(Hierarchy::V2(root.to_path_buf()));
            }
        }
        let v1 = root.join("cpu");
        if v1.join("cpu.cfs_quota_us").exists() {
            return Ok(Hierarchy::V1(v1));
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no cgroup cpu controller (neither v2 cpu.max nor v1 cpu.cfs_quota_us)",
        ))
    }

    fn root(&self) -> &Path {
        match self {
            Hierarchy::V2(p) | Hierarchy::V1(p) => p,
        }
    }
}

/// Throttling counters of a group (`cpu.stat`, same keys in v1 and v2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttling {
    /// CFS periods in which the group had runnable tasks.
    pub periods: u64,
    /// Periods in which it used up its quota and was throttled.
    pub throttled: u64,
}

/// One group with a CPU quota. [`CpuGroup::remove`] kills what is left in
/// it and deletes it; dropping it does the same.
#[derive(Debug)]
pub struct CpuGroup {
    dir: PathBuf,
    procs: CString,
    cpus: f64,
}

impl CpuGroup {
    /// Creates the group `name` under `h`, limited to `cpus` CPUs (a
    /// fraction of one, or several: quota = `cpus` × the period).
    pub fn create(h: &Hierarchy, name: &str, cpus: f64) -> io::Result<CpuGroup> {
        if !(cpus.is_finite() && cpus > 0.0) || name.contains('/') || name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cgroup {name:?} with {cpus} CPUs"),
            ));
        }
        let quota = ((cpus * PERIOD_US as f64) as u64).max(1000);
        let dir = h.root().join(name);
        let shown = dir.display().to_string();
        let ctx =
            |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{shown}: {what}: {e}"));
        std::fs::create_dir(&dir).map_err(|e| ctx(e, "mkdir"))?;
        let g = CpuGroup {
            procs: CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?,
            dir,
            cpus,
        };
        match h {
            Hierarchy::V2(_) => {
                std::fs::write(g.dir.join("cpu.max"), format!("{quota} {PERIOD_US}"))
                    .map_err(|e| ctx(e, "cpu.max"))?
            }
            Hierarchy::V1(_) => {
                std::fs::write(g.dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
                    .map_err(|e| ctx(e, "cpu.cfs_period_us"))?;
                std::fs::write(g.dir.join("cpu.cfs_quota_us"), quota.to_string())
                    .map_err(|e| ctx(e, "cpu.cfs_quota_us"))?;
            }
        }
        Ok(g)
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CPUs the group may use.
    pub fn cpus(&self) -> f64 {
        self.cpus
    }

    /// `cgroup.procs` as a C string: a process moves itself into the group
    /// by writing "0" to it (from `pre_exec`, see [`join_self`]).
    pub fn procs_path(&self) -> &CString {
        &self.procs
    }

    /// Moves the process `pid` into the group.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.dir)
    }

    /// The throttling counters now.
    pub fn throttling(&self) -> io::Result<Throttling> {
        let text = std::fs::read_to_string(self.dir.join("cpu.stat"))?;
        let mut t = Throttling::default();
        for l in text.lines() {
            let mut f = l.split_whitespace();
            let (Some(k), Some(v)) = (f.next(), f.next().and_then(|v| v.parse().ok())) else {
                continue;
            };
            match k {
                "nr_periods" => t.periods = v,
                "nr_throttled" => t.throttled = v,
                _ => {}
            }
        }
        Ok(t)
    }

    /// Kills every process in the group and deletes it (waiting up to a
    /// second for the killed ones to leave).
    pub fn remove(&self) -> io::Result<()> {
        remove_dir(&self.dir)
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot remove a test bed cgroup");
        }
    }
}

/// Moves the calling process into the group whose `cgroup.procs` is
/// `procs`. Only async-signal-safe calls: fit for `pre_exec`.
pub fn join_self(procs: &CString) -> io::Result<()> {
    // SAFETY: open/write/close with a NUL-terminated path and a 1-byte buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let w = libc::write(fd, b"0".as_ptr().cast(), 1);
        let e = io::Error::last_os_error();
        libc::close(fd);
        if w != 1 {
            return Err(e);
        }
    }
    Ok(())
}

fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn remove_dir(dir: &Path) -> io::Result<()> {
    let me = std::process::id();
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        for pid in pids_in(dir) {
            if pid != me {
                // SAFETY: kill(2) with a pid and a signal number.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Busy while killed processes are still exiting.
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The groups named `prefix…` that exist now (all processes').
pub fn list(h: &Hierarchy, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(h.root())
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the groups named `prefix<pid>-…` whose process no longer runs.
pub fn remove_stale(h: &Hierarchy, prefix: &str) {
    for dir in list(h, prefix) {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(pid) = name.strip_prefix(prefix).and_then(|r| r.split('-').next()) else {
            continue;
        };
        if !crate::netns::pid_runs(pid) {
            if let Err(e) = remove_dir(&dir) {
                tracing::warn!(cgroup = %dir.display(), error = %e, "cannot remove a stale test bed cgroup");
            }
        }
    }
}
