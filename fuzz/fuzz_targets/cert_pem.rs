//! Fuzz `vcdn_http::tls::parse_bundle` and `tls::inspect`: what a customer
//! uploads as a certificate and key (PEM), and the DER inside it.
//!
//! The input is split at a point chosen by its first byte into the
//! certificate part and the key part. Never panics; a bundle that parses
//! has a leaf whose fingerprint is the SHA-256 of its first certificate, and
//! `covers` and `check_validity` answer for any name and time. The raw
//! input is also wrapped in a CERTIFICATE PEM block, so the X.509 parser
//! sees arbitrary DER.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vcdn_http::tls;

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in data.chunks(3) {
        let n = c.iter().enumerate().fold(0u32, |a, (i, &b)| a | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                s.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map_or(0, |&b| b as usize * data.len() / 256);
    let (cert, key) = data.split_at(cut);
    if let Ok(b) = tls::parse_bundle(cert, key) {
        assert!(b.info.fingerprint.starts_with("sha256:"));
        assert_eq!(b.info.fingerprint, tls::fingerprint(b.key.cert[0].as_ref()));
        let _ = b.info.covers("a.example");
        let _ = b.info.check_validity(i64::MAX);
        let _ = b.info.check_validity(i64::MIN);
        let _ = b.info.not_after_rfc3339();
    }
    let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", base64(data));
    if let Ok(chain) = tls::parse_chain(pem.as_bytes()) {
        if let Ok(info) = tls::inspect(&chain) {
            let _ = info.covers("*.example");
            let _ = info.check_validity(0);
            let _ = tls::rfc3339(info.not_after);
        }
    }
});
