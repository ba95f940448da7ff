//! Raw IPv6 packets for tests and benchmarks of the data path: SYNs to
//! chunk addresses, SRv6 encapsulations (well-formed or not), sent from a
//! raw socket as a client or an attacker would.

use std::net::Ipv6Addr;

/// An IPv6 packet: header (hop limit 64) and `payload`.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0];
    p.extend((payload.len() as u16).to_be_bytes());
    p.extend([next, 64]);
    p.extend(src.octets());
    p.extend(dst.octets());
    p.extend(payload);
    p
}

/// A TCP SYN from `sport` to port 80, with its checksum.
pub fn syn(src: Ipv6Addr, dst: Ipv6Addr, sport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&80u16.to_be_bytes());
    t[4..8].copy_from_slice(&(sport as u32).wrapping_mul(7919).to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x02;
    t[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&[0, 0, 0, 20, 0, 0, 0, 6]);
    add(&t);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    t[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    ipv6(src, dst, 6, &t)
}

/// An SRv6 encapsulation of `inner` from `src` with segments `segs` in
/// visiting order (the first is the destination), the SRH's next header
/// `next` (41: an IPv6 packet follows).
pub fn srv6(src: Ipv6Addr, segs: &[Ipv6Addr], next: u8, inner: &[u8]) -> Vec<u8> {
    let n = segs.len() as u8;
    let mut srh = vec![next, 2 * n, 4, n - 1, n - 1, 0, 0, 0];
    for s in segs.iter().rev() {
        srh.extend(s.octets());
    }
    srh.extend(inner);
    ipv6(src, segs[0], 43, &srh)
}

/// Sends `packets` (each a whole IPv6 packet) from a raw socket of the
/// calling thread's network namespace, pausing `pause` every `burst`
/// packets so a device queue is not overrun. Needs root.
pub fn send_raw(
    packets: &[Vec<u8>],
    burst: usize,
    pause: std::time::Duration,
) -> std::io::Result<()> {
    // SAFETY: plain socket calls on a descriptor owned here and closed on
    // every path.
    unsafe {
        let fd = libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_RAW);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for (i, p) in packets.iter().enumerate() {
            if p.len() < 40 {
                continue;
            }
            let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
            sa.sin6_family = libc::AF_INET6 as u16;
            sa.sin6_addr.s6_addr.copy_from_slice(&p[24..40]);
            let n = libc::sendto(
                fd,
                p.as_ptr().cast(),
                p.len(),
                0,
                (&sa as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as u32,
            );
            if n != p.len() as isize {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(e);
            }
            if burst > 0 && i % burst == burst - 1 {
                std::thread::sleep(pause);
            }
        }
        libc::close(fd);
    }
    Ok(())
}
