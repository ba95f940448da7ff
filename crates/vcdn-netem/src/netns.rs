//! Network namespaces and TUN/TAP devices of the packet-level test beds
//! ([`crate::testbed`], [`crate::lan`]): created with `ip` (iproute2) and
//! ioctls, found again by name, removed at teardown or, when a process died
//! without its teardown, by the next test bed that starts. Each test bed
//! kind names its namespaces `PREFIX<pid>-…`, so that the pid says whether
//! their owner still runs.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Every namespace of the TUN test bed is named `PREFIX<pid>-<seq>-<node>`.
pub const PREFIX: &str = "vcdntb-";

const NETNS_DIR: &str = "/run/netns";

/// Runs `ip ARGS`, with `batch` on its stdin when given.
pub fn ip<I, S>(args: I, batch: Option<&str>) -> io::Result<()>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new("ip");
    cmd.args(args)
        .stdin(if batch.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run ip (iproute2): {e}")))?;
    if let (Some(b), Some(mut stdin)) = (batch, child.stdin.take()) {
        stdin.write_all(b.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Opens the namespace `name` (for `setns`).
pub fn open(name: &str) -> io::Result<File> {
    File::open(Path::new(NETNS_DIR).join(name))
}

/// Deletes the namespace `name` after killing every process still in it.
pub fn delete(name: &str) -> io::Result<()> {
    kill_all_in(name);
    ip(["netns", "del", name], None)
}

/// Deletes the namespaces named `prefix<pid>-…` whose process no longer
/// runs.
pub fn remove_stale(prefix: &str) {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for e in dir.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(prefix).and_then(|r| r.split('-').next()) else {
            continue;
        };
        if !pid_runs(pid) {
            if let Err(e) = delete(&name) {
                tracing::warn!(namespace = %name, error = %e, "cannot remove a stale test bed namespace");
            }
        }
    }
}

/// Whether `pid` (a decimal process id) is a running process; false for
/// anything else.
pub fn pid_runs(pid: &str) -> bool {
    pid.parse::<u32>().is_ok() && Path::new("/proc").join(pid).exists()
}

/// The namespaces named `prefix…` that exist now (all processes').
pub fn list(prefix: &str) -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILLs every process whose network namespace is `name` (what
/// `ip netns pids` lists): what callers started in a node and left running.
pub fn kill_all_in(name: &str) {
    let Ok(ns) = std::fs::metadata(Path::new(NETNS_DIR).join(name)) else {
        return;
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    for e in procs.filter_map(Result::ok) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(m) = std::fs::metadata(e.path().join("ns/net")) else {
            continue;
        };
        if m.ino() == ns.ino() && m.dev() == ns.dev() {
            // SAFETY: kill(2) with a pid and a signal number.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// Moves the calling thread into the namespace open as `ns`.
pub fn enter(ns: &File) -> io::Result<()> {
    // SAFETY: setns(2) on an open namespace file descriptor.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates a TUN device (IP packets, no packet-information header, no
/// virtio-net header, hence no segmentation offload: the kernel hands it
/// packets of at most the MTU). Returns the open device and its name
/// (`vtb<N>`, chosen by the kernel so parallel test beds never collide).
pub fn open_tun() -> io::Result<(OwnedFd, String)> {
    open_device(false, "vtb%d")
}

/// Creates a TAP device (Ethernet frames; otherwise as [`open_tun`]) named
/// `name` in the calling thread's network namespace.
pub fn open_tap(name: &str) -> io::Result<(OwnedFd, String)> {
    open_device(true, name)
}

/// A TUN (`tap` false) or TAP device; `name` may hold a `%d` for the
/// kernel to fill in. The device lives in the network namespace of the
/// calling thread, and as long as its descriptor.
fn open_device(tap: bool, name: &str) -> io::Result<(OwnedFd, String)> {
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    const IFF_TUN: libc::c_short = 0x0001;
    const IFF_TAP: libc::c_short = 0x0002;
    const IFF_NO_PI: libc::c_short = 0x1000;
    if name.is_empty() || name.len() > 15 || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad device name {name:?}"),
        ));
    }
    // SAFETY: open(2) with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot open /dev/net/tun: {e}"),
        ));
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ifreq: 16 bytes of name, then the flags (a short) in the union.
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    let kind = if tap { IFF_TAP } else { IFF_TUN };
    ifr[16..18].copy_from_slice(&(kind | IFF_NO_PI).to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which ifr is
    // large enough to hold.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, ifr.as_mut_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot create the TUN/TAP device {name}: {e}"),
        ));
    }
    let end = ifr[..16].iter().position(|&b| b == 0).unwrap_or(16);
    Ok((fd, String::from_utf8_lossy(&ifr[..end]).into_owned()))
}

/// Writes `value` to the sysctl `key` (dotted) of the calling thread's
/// network namespace.
pub fn sysctl(key: &str, value: &str) -> io::Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::write(&path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("sysctl {key}={value}: {e}")))
}

/// Runs `f` on a thread inside the namespace open as `ns` and returns what
/// it returns: sockets it creates belong to that namespace (and stay there
/// when handed out), threads it spawns start there too.
pub fn run_in<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        let h = s.spawn(move || -> io::Result<T> {
            enter(ns)?;
            Ok(f())
        });
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A command that runs `program` inside the namespace open as `ns` and,
/// given a `cgroup.procs` path, inside that cgroup.
pub fn command(
    ns: std::sync::Arc<File>,
    cgroup_procs: Option<std::ffi::CString>,
    program: impl AsRef<OsStr>,
) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    // SAFETY: the closure only calls setns(2), open(2), write(2) and
    // close(2), which are async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            enter(&ns)?;
            if let Some(p) = &cgroup_procs {
                crate::cgroup::join_self(p)?;
            }
            Ok(())
        });
    }
    cmd
}
