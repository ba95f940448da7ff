//! Reactive start (MOSTO §V: a proxy location without a running proxy
//! boots one on the first connection). A small holder process owns the
//! listening socket. While no server runs it waits, with `poll(2)`, for the
//! socket to become readable, i.e. for a connection to complete its
//! handshake in the kernel's accept queue; it does not accept it. It then
//! starts the server with the socket inherited as fd 3
//! (`vcdn proxy --listen-fd 3 --idle-exit S ...`); the server accepts the
//! waiting connection itself and exits after S idle seconds; the holder
//! reaps it and holds again. Connections that arrive while the server is
//! starting or exiting wait in the same accept queue, which the holder
//! keeps open throughout, so none is refused.
//!
//! The holder is blocking code without a runtime: one `poll(2)` on the
//! listener (holding) or on a pidfd of the child (running), plus a
//! self-pipe that SIGTERM and SIGINT write to. On a signal it stops the
//! child (SIGTERM, then SIGKILL after a grace period) and returns. The
//! child also gets `PR_SET_PDEATHSIG`, so it dies even if the holder is
//! killed outright: no child is ever left behind.
//!
//! A server that exits with an error (or is killed by a signal) is started
//! again only after a backoff that doubles up to a limit, so a broken
//! configuration does not fork in a loop while a client waits.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The fd number the server finds its listening socket at.
pub const LISTEN_FD: RawFd = 3;

#[derive(Debug, Clone)]
pub struct HoldOptions {
    /// First wait after a failed server, doubled on each further failure.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How long a stopping server may take after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
}

impl Default for HoldOptions {
    fn default() -> Self {
        HoldOptions {
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            stop_grace: Duration::from_secs(5),
        }
    }
}

/// Write end of the self-pipe the signal handler writes to (-1: none).
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // Async-signal-safe; a full pipe already carries the news.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }
}

/// A pipe whose read end becomes readable on SIGTERM or SIGINT.
fn signal_pipe() -> io::Result<OwnedFd> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), fds[1]) };
    let old = SIGNAL_PIPE.swap(w, Ordering::SeqCst);
    if old >= 0 {
        unsafe { libc::close(old) };
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(r)
}

/// Wait until one of `fds` is readable, or `timeout` passes (`None`:
/// forever). Returns which were readable.
fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    loop {
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(p.iter().map(|x| x.revents != 0).collect());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A running server, stopped (and reaped) when dropped.
struct Server {
    child: Child,
    pidfd: OwnedFd,
    grace: Duration,
}

impl Server {
    fn start(
        listener: RawFd,
        program: &PathBuf,
        args: &[OsString],
        grace: Duration,
    ) -> io::Result<Server> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        unsafe {
            cmd.pre_exec(move || {
                // Place the socket at fd 3 without CLOEXEC (dup2 onto
                // itself would keep the flag, so clear it explicitly).
                if listener != LISTEN_FD && libc::dup2(listener, LISTEN_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::fcntl(LISTEN_FD, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                // Die with the holder, whatever kills it.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(Server {
            child,
            pidfd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
            grace,
        })
    }

    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        if !matches!(
            wait_readable(&[self.pidfd.as_raw_fd()], Some(self.grace)),
            Ok(r) if r[0]
        ) {
            tracing::warn!(pid = self.child.id(), "server ignored SIGTERM; killing it");
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Hold `listener` and run `program args` on it whenever a connection
/// waits and no server runs; return after SIGTERM or SIGINT, with the
/// server stopped. Installs handlers for both signals (for the process).
pub fn hold(
    listener: std::net::TcpListener,
    program: PathBuf,
    args: Vec<OsString>,
    opts: HoldOptions,
) -> io::Result<()> {
    let signals = signal_pipe()?;
    let (lfd, sfd) = (listener.as_raw_fd(), signals.as_raw_fd());
    let mut backoff = Duration::ZERO;
    loop {
        // Holding: wait for a completed handshake or a signal.
        let r = wait_readable(&[lfd, sfd], None)?;
        if r[1] {
            return Ok(());
        }
        let started = Instant::now();
        let mut server = match Server::start(lfd, &program, &args, opts.stop_grace) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(program = %program.display(), error = %e, "cannot start the server");
                backoff = next_backoff(backoff, &opts);
                if wait_readable(&[sfd], Some(backoff))?[0] {
                    return Ok(());
                }
                continue;
            }
        };
        let pid = server.child.id();
        tracing::info!(pid, "connection waiting: server started");
        // Running: wait for the server to exit or a signal.
        let r = wait_readable(&[server.pidfd.as_raw_fd(), sfd], None)?;
        if r[1] {
            tracing::info!(pid, "signal: stopping the server");
            server.stop();
            return Ok(());
        }
        let status = server.child.wait()?;
        let ran = started.elapsed();
        if exited_cleanly(status) {
            tracing::info!(pid, ran_s = ran.as_secs_f64(), "server exited idle");
            backoff = Duration::ZERO;
        } else {
            backoff = next_backoff(backoff, &opts);
            tracing::warn!(pid, %status, ran_s = ran.as_secs_f64(), retry_in = ?backoff, "server failed");
            if wait_readable(&[sfd], Some(backoff))?[0] {
                return Ok(());
            }
        }
    }
}

fn exited_cleanly(s: ExitStatus) -> bool {
    s.success()
}

fn next_backoff(cur: Duration, opts: &HoldOptions) -> Duration {
    (cur * 2).clamp(opts.backoff_min, opts.backoff_max)
}

/// The listening socket a holder handed over at `fd` (for a server's
/// `--listen-fd`): checked to be a listening TCP socket, marked
/// close-on-exec (so it does not leak further) and non-blocking (ready for
/// `tokio::net::TcpListener::from_std`). Takes ownership of `fd`.
pub fn inherited_listener(fd: RawFd) -> io::Result<std::net::TcpListener> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("fd {fd} {what}"));
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(bad("is not open"));
    }
    let get = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    if get(libc::SO_TYPE) != Some(libc::SOCK_STREAM) {
        return Err(bad("is not a stream socket"));
    }
    if get(libc::SO_ACCEPTCONN) != Some(1) {
        return Err(bad("is not listening"));
    }
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    l.set_nonblocking(true)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_bounds_and_resets() {
        let o = HoldOptions::default();
        let mut b = Duration::ZERO;
        b = next_backoff(b, &o);
        assert_eq!(b, Duration::from_millis(200));
        b = next_backoff(b, &o);
        assert_eq!(b, Duration::from_millis(400));
        for _ in 0..20 {
            b = next_backoff(b, &o);
        }
        assert_eq!(b, Duration::from_secs(10));
    }

    #[test]
    fn inherited_listener_checks_the_fd() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(l);
        let back = inherited_listener(fd).unwrap();
        assert_eq!(back.local_addr().unwrap(), addr);
        // A connected (not listening) socket is refused.
        let c = std::net::TcpStream::connect(addr).unwrap();
        let err = inherited_listener(std::os::fd::IntoRawFd::into_raw_fd(c)).unwrap_err();
        assert!(err.to_string().contains("not listening"), "{err}");
        assert!(inherited_listener(-1).is_err());
    }
}
