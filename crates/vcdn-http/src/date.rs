//! HTTP dates (IMF-fixdate), with the formatted current second cached per
//! thread because every response carries one.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, from the coarse real-time clock: HTTP
/// dates and ages have one-second resolution, and the coarse clock is a
/// plain memory read where the precise one reads the CPU's counter.
pub fn unix_now() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    u64::try_from(t.tv_sec).unwrap_or_else(|_| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// Format a Unix time as an HTTP date.
pub fn format(secs: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Parse an HTTP date (IMF-fixdate, RFC 850 or asctime) to Unix seconds.
pub fn parse(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?;
    httpdate::parse_http_date(s.trim())
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

thread_local! {
    static CACHED: RefCell<(u64, [u8; 29])> = const { RefCell::new((0, [0; 29])) };
}

/// Append the current time as an HTTP date to `out` (29 bytes).
pub fn write_now(out: &mut Vec<u8>) {
    let now = unix_now();
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != now {
            let s = format(now);
            c.1.copy_from_slice(&s.as_bytes()[..29]);
            c.0 = now;
        }
        out.extend_from_slice(&c.1);
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        assert_eq!(super::format(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            super::parse(b"Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784111777)
        );
        assert_eq!(
            super::parse(b"Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784111777)
        );
        assert_eq!(super::parse(b"garbage"), None);
        let mut v = Vec::new();
        super::write_now(&mut v);
        assert_eq!(v.len(), 29);
    }
}
