//! DNS over UDP.
//!
//! UDP: one blocking thread per `dns.threads`, each with its own
//! `SO_REUSEPORT` socket, receiving and sending up to 64 datagrams per
//! system call (`recvmmsg`/`sendmmsg`); the compiled snapshot is re-read
//! only when its version changes, so the hot path takes no lock.
//! TCP is in [`super::tcp`].

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use super::answer::{answer, Transport};
use crate::state::Router;

const BATCH: usize = 64;
const MAX_PACKET: usize = 4096;

fn udp_socket(addr: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(false).ok();
    }
    // Room for bursts while a thread is busy answering.
    let _ = s.set_recv_buffer_size(4 << 20);
    s.bind(&addr.into())?;
    Ok(s)
}

/// Binds `threads` UDP sockets on one address (its port chosen by the
/// kernel when `addr`'s is 0). Returns them with the bound address.
pub fn bind_udp(addr: SocketAddr, threads: usize) -> io::Result<(Vec<Socket>, SocketAddr)> {
    let first = udp_socket(addr)?;
    let bound = first
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("UDP socket has no inet address"))?;
    let mut sockets = vec![first];
    for _ in 1..threads.max(1) {
        sockets.push(udp_socket(bound)?);
    }
    Ok((sockets, bound))
}

/// Serves DNS over UDP on `sockets`, one thread each.
pub fn start_udp(router: Arc<Router>, sockets: Vec<Socket>) -> io::Result<()> {
    for (i, s) in sockets.into_iter().enumerate() {
        let router = router.clone();
        std::thread::Builder::new()
            .name(format!("dns-udp-{i}"))
            .spawn(move || udp_loop(router, s))?;
    }
    Ok(())
}

fn sockaddr_to_ip(ss: &libc::sockaddr_storage) -> Option<IpAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(IpAddr::from(
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(
                ip.to_ipv4_mapped()
                    .map(IpAddr::V4)
                    .unwrap_or(IpAddr::V6(ip)),
            )
        }
        _ => None,
    }
}

/// An all-zero C struct.
///
/// # Safety
/// Only for plain C structs whose all-zero bit pattern is valid
/// (`sockaddr_storage`, `iovec`, `mmsghdr`: integers and null pointers).
unsafe fn zeroed<T>() -> T {
    // SAFETY: the caller guarantees all-zero is a valid T.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

fn udp_loop(router: Arc<Router>, socket: Socket) {
    let fd = socket.as_raw_fd();
    let mut snap = router.snapshot();
    let mut rbufs = vec![[0u8; MAX_PACKET]; BATCH];
    let mut wbufs: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(1232)).collect();
    let mut addrs: Vec<libc::sockaddr_storage> = (0..BATCH).map(|_| unsafe { zeroed() }).collect();
    // The message headers point into `rbufs`, `addrs` and `iov`, which are
    // allocated once here and never grow, so the pointers stay valid.
    let mut iov: Vec<libc::iovec> = rbufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: MAX_PACKET,
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH).map(|_| unsafe { zeroed() }).collect();
    for i in 0..BATCH {
        msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    let mut out_iov: Vec<libc::iovec> = (0..BATCH).map(|_| unsafe { zeroed() }).collect();
    let mut out: Vec<libc::mmsghdr> = (0..BATCH).map(|_| unsafe { zeroed() }).collect();
    loop {
        for m in msgs.iter_mut() {
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        }
        // SAFETY: msgs points at BATCH valid buffers and addresses.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(error = %e, "DNS UDP receive failed");
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let n = n as usize;
        if router.version() != snap.version {
            snap = router.snapshot();
        }
        router
            .metrics
            .dns_udp
            .fetch_add(n as u64, Ordering::Relaxed);
        let mut k = 0;
        for i in 0..n {
            let len = msgs[i].msg_len as usize;
            let Some(src) = sockaddr_to_ip(&addrs[i]) else {
                continue;
            };
            if !answer(
                &snap,
                &router.metrics,
                &rbufs[i][..len],
                src,
                Transport::Udp,
                &mut wbufs[i],
            ) {
                continue;
            }
            out_iov[k] = libc::iovec {
                iov_base: wbufs[i].as_mut_ptr().cast(),
                iov_len: wbufs[i].len(),
            };
            out[k].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
            out[k].msg_hdr.msg_namelen = msgs[i].msg_hdr.msg_namelen;
            out[k].msg_hdr.msg_iov = &mut out_iov[k];
            out[k].msg_hdr.msg_iovlen = 1;
            k += 1;
        }
        let mut sent = 0;
        while sent < k {
            // SAFETY: out[sent..k] point at live answers and addresses.
            let r = unsafe { libc::sendmmsg(fd, out[sent..k].as_mut_ptr(), (k - sent) as u32, 0) };
            if r <= 0 {
                // A failing destination (e.g. unreachable) must not stall
                // the others: skip it.
                sent += 1;
            } else {
                sent += r as usize;
            }
        }
    }
}
