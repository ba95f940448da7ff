//! Fuzz `vcdn_http::chunked::ChunkedDecoder`.
//!
//! The whole input is a chunked body (plus whatever follows it). It is
//! decoded four ways: in one piece, one byte at a time, and twice in pieces of
//! pseudo-random sizes (0 to 64 bytes; a 0-byte piece calls `decode` again
//! without new bytes), the piece sizes seeded from the first byte and the
//! length. Checked:
//!
//! * never panics; `decode` only ever removes bytes from the front of the
//!   buffer; `Data` is never empty;
//! * the total decoded data never exceeds the bytes consumed, hence never the
//!   input length;
//! * once `Done`, `decode` keeps returning `Done` and consumes nothing;
//! * every split gives the same outcome as the one-piece decode: both `Done`
//!   with the same bytes and the same number of bytes consumed (what follows
//!   the body is left in the buffer), both errors, or both waiting for more
//!   with the same bytes decoded so far.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use vcdn_http::chunked::{ChunkedDecoder, Decoded};
use vcdn_http::ParseError;

#[derive(Debug, PartialEq, Eq)]
enum End {
    Done { consumed: usize },
    Error(ParseError),
    NeedMore,
}

#[derive(Debug)]
struct Outcome {
    data: Vec<u8>,
    end: End,
}

/// Decode `input` fed in pieces whose sizes `next_piece` returns.
fn decode(input: &[u8], mut next_piece: impl FnMut() -> usize) -> Outcome {
    let mut dec = ChunkedDecoder::new();
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut fed = 0;
    loop {
        let take = next_piece().min(input.len() - fed);
        buf.extend_from_slice(&input[fed..fed + take]);
        fed += take;
        loop {
            let before = buf.len();
            let step = dec.decode(&mut buf);
            assert!(buf.len() <= before, "decode grew the buffer from {before} to {}", buf.len());
            let consumed = fed - buf.len();
            match step {
                Ok(Decoded::Data(b)) => {
                    assert!(!b.is_empty(), "empty Data");
                    data.extend_from_slice(&b);
                    assert!(
                        data.len() <= consumed && consumed <= input.len(),
                        "decoded {} bytes from {consumed} consumed of {} input",
                        data.len(),
                        input.len()
                    );
                }
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::Done) => {
                    assert!(dec.is_done(), "Done but is_done() is false");
                    assert!(data.len() <= consumed, "decoded {} bytes from {consumed} consumed", data.len());
                    let left = buf.len();
                    assert_eq!(dec.decode(&mut buf), Ok(Decoded::Done), "decode after Done");
                    assert_eq!(buf.len(), left, "decode after Done consumed bytes");
                    return Outcome { data, end: End::Done { consumed } };
                }
                Err(e) => return Outcome { data, end: End::Error(e) },
            }
        }
        if fed == input.len() {
            assert!(!dec.is_done(), "is_done() without Done");
            return Outcome { data, end: End::NeedMore };
        }
    }
}

fn same_outcome(a: &Outcome, b: &Outcome) -> bool {
    match (&a.end, &b.end) {
        // Error messages may legitimately differ with the read boundaries.
        (End::Error(_), End::Error(_)) => true,
        (ea, eb) => ea == eb && a.data == b.data,
    }
}

fuzz_target!(|input: &[u8]| {
    let whole = decode(input, || usize::MAX);

    let bytewise = decode(input, || 1);
    assert!(
        same_outcome(&whole, &bytewise),
        "one byte at a time differs from one piece:\n whole: {whole:?}\n bytewise: {bytewise:?}"
    );

    let seed = input.first().copied().unwrap_or(0) as u64;
    for round in 0..2u64 {
        // xorshift64*, seeded from the first byte, the length and the round.
        let mut x = (seed << 32 | input.len() as u64 | round << 56) ^ 0x9E37_79B9_7F4A_7C15;
        let pieces = decode(input, || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 58) as usize // 0..=63
        });
        assert!(
            same_outcome(&whole, &pieces),
            "split decode (round {round}) differs from one piece:\n whole: {whole:?}\n split: {pieces:?}"
        );
    }
});
