//! Fuzz the RFC 8941 Dictionary parser (`vcdn_http::sf`) and the cache's
//! readers of `CDN-Cache-Control`, `Cache-Control` and `Age` built on it.
//!
//! The input is field lines separated by `\n` (combined with ", " as RFC
//! 8941 §4.2 says). Never panics; whatever parses serialises, and the
//! serialisation parses back to the same Dictionary and serialises to the
//! same text (the canonical form is a fixed point). The whole input is also
//! parsed as one line, and the cache's directive readers run on the lines.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use vcdn_cache::policy;
use vcdn_http::sf::{parse_dictionary, parse_dictionary_lines, serialize_dictionary};

fn round_trip(parsed: &vcdn_http::sf::Dictionary) {
    let text = serialize_dictionary(parsed).expect("a parsed dictionary serialises");
    let again = parse_dictionary(text.as_bytes())
        .unwrap_or_else(|e| panic!("serialisation {text:?} does not parse: {e}"));
    assert_eq!(&again, parsed, "serialisation {text:?} parses to another value");
    assert_eq!(
        serialize_dictionary(&again).expect("serialises"),
        text,
        "the canonical form is not a fixed point"
    );
}

fuzz_target!(|data: &[u8]| {
    let lines: Vec<&[u8]> = data.split(|&c| c == b'\n').collect();
    if let Ok(d) = parse_dictionary_lines(lines.iter().copied()) {
        round_trip(&d);
    }
    if let Ok(d) = parse_dictionary(data) {
        round_trip(&d);
    }
    let values: Vec<Bytes> = lines.iter().map(|l| Bytes::copy_from_slice(l)).collect();
    if let Some(d) = policy::targeted_directives(values.iter()) {
        assert!(d.max_age.is_none_or(|v| v <= policy::DELTA_MAX));
        assert!(d.s_maxage.is_none_or(|v| v <= policy::DELTA_MAX));
    }
    let d = policy::parse_directives(values.iter());
    assert!(d.max_age.is_none_or(|v| v <= policy::DELTA_MAX));
    if let Some(age) = policy::parse_age(values.iter()) {
        assert!(age <= policy::DELTA_MAX);
    }
});
