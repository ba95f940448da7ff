//! Zero-copy relaying with `splice(2)`: socket → pipe → socket, the bytes
//! never enter user space. [`relay_exact`] is the contract every relay
//! implements (a sockmap redirect can drop in behind the same signature):
//! move exactly `n` bytes from one connected socket to another, or fail.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::sockmap::Sockmap;

/// Pipe capacity asked for (the kernel may give less: it keeps its own).
const PIPE_SIZE: i32 = 1 << 20;

/// A pipe pair reused by one relaying task. A relay that fails may leave
/// bytes in it; [`Pipe::clean`] then replaces it.
pub struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    cap: usize,
    /// Bytes sitting in the pipe.
    held: usize,
    /// With `--relay sockmap`: the loaded verdict program that bodies of
    /// known length go through instead of this pipe (it rides along with
    /// the pipe because every relaying call already gets the pipe).
    pub sockmap: Option<Arc<Sockmap>>,
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are new and owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl on a descriptor we own.
        let cap = unsafe {
            libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE);
            libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        Ok(Pipe {
            r,
            w,
            cap: if cap > 0 { cap as usize } else { 65536 },
            held: 0,
            sockmap: None,
        })
    }

    /// This pipe, or a new one when a failed relay left bytes in it.
    pub fn clean(&mut self) -> io::Result<()> {
        if self.held != 0 {
            let sockmap = self.sockmap.take();
            *self = Pipe::new()?;
            self.sockmap = sockmap;
        }
        Ok(())
    }
}

fn splice(from: i32, to: i32, len: usize) -> io::Result<usize> {
    // SAFETY: plain syscall on descriptors the caller keeps open.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Moves exactly `n` bytes from `from` to `to` through `pipe`. Fails when
/// `from` ends early, on any socket error, and when neither side makes
/// progress for `stall`.
pub async fn relay_exact(
    from: &TcpStream,
    to: &TcpStream,
    n: u64,
    pipe: &mut Pipe,
    stall: Duration,
) -> io::Result<()> {
    pipe.clean()?;
    let mut left = n;
    // The last read found no room in the pipe, or no data: which one is
    // unknown while the pipe holds bytes (see below).
    let mut read_blocked = false;
    while left > 0 || pipe.held > 0 {
        let mut progress = false;
        if left > 0 && pipe.held < pipe.cap {
            let want = (left as usize).min(pipe.cap - pipe.held);
            let w = pipe.w.as_raw_fd();
            // EAGAIN from socket → pipe means "socket empty" or "pipe full":
            // a pipe holds a number of buffers, not of bytes, and a TCP
            // segment can take a whole one, so it fills long before `cap`
            // bytes. Only when the pipe is empty is it surely the socket,
            // and only then may the socket's readiness be cleared; clearing
            // it on a full pipe would wait for data that already arrived
            // (a lost wakeup: the relay stalls with bytes in the socket).
            let r = if pipe.held == 0 {
                from.try_io(Interest::READABLE, || splice(from.as_raw_fd(), w, want))
            } else {
                splice(from.as_raw_fd(), w, want)
            };
            read_blocked = false;
            match r {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("peer closed with {left} of {n} bytes not sent"),
                    ))
                }
                Ok(k) => {
                    left -= k as u64;
                    pipe.held += k;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => read_blocked = true,
                Err(e) => return Err(e),
            }
        }
        if pipe.held > 0 {
            let r = pipe.r.as_raw_fd();
            let held = pipe.held;
            match to.try_io(Interest::WRITABLE, || splice(r, to.as_raw_fd(), held)) {
                Ok(k) => {
                    pipe.held -= k;
                    progress |= k > 0;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if progress {
            continue;
        }
        // With bytes in the pipe, a blocked read waits for the pipe to
        // drain (the socket's readiness was kept, so waiting on it would
        // spin); with an empty pipe it waits for the socket.
        let can_fill = left > 0 && pipe.held < pipe.cap && !(read_blocked && pipe.held > 0);
        let can_drain = pipe.held > 0;
        let wait = async {
            tokio::select! {
                r = from.readable(), if can_fill => r,
                r = to.writable(), if can_drain => r,
            }
        };
        match tokio::time::timeout(stall, wait).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("relay stalled for {stall:?} with {left} of {n} bytes not sent"),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    #[tokio::test]
    async fn relays_exactly_n_bytes_and_leaves_the_rest() {
        let (mut a_out, a_in) = pair().await;
        let (b_out, mut b_in) = pair().await;
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let send = data.clone();
        let w = tokio::spawn(async move {
            a_out.write_all(&send).await.unwrap();
            a_out.write_all(b"rest").await.unwrap();
            a_out
        });
        let r = tokio::spawn(async move {
            let mut got = vec![0u8; 3_000_000];
            b_in.read_exact(&mut got).await.unwrap();
            got
        });
        let mut pipe = Pipe::new().unwrap();
        relay_exact(
            &a_in,
            &b_out,
            data.len() as u64,
            &mut pipe,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(r.await.unwrap(), data);
        let _keep = w.await.unwrap();
        let mut rest = [0u8; 4];
        let mut a_in = a_in;
        a_in.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"rest");
    }

    #[tokio::test]
    async fn early_end_and_stall_fail() {
        let (mut a_out, a_in) = pair().await;
        let (b_out, _b_in) = pair().await;
        a_out.write_all(b"abc").await.unwrap();
        let mut pipe = Pipe::new().unwrap();
        let e = relay_exact(&a_in, &b_out, 10, &mut pipe, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(a_out);
        let e = relay_exact(&a_in, &b_out, 10, &mut pipe, Duration::from_secs(2))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
