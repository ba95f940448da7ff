//! Fuzz `vcdn_http::hpack::Decoder` (and, on what it decodes, the Encoder).
//!
//! Input: byte 0 chooses the advertised table size (`(b & 0x7f) * 4`, 0 to
//! 508: small, so entries are evicted and size updates hit the limit) and,
//! with its top bit, lowers the setting to half after the first block (the
//! peer must then start the next block with a size update); byte 1 chooses
//! the header list limit (`b * 8`). The rest is a sequence of header blocks,
//! each preceded by its length byte, decoded in order on one connection by
//! two decoders: one with the limit, one without. Checked:
//!
//! * never panics;
//! * `table_bytes() <= table_max() <= ` the advertised size, after every block;
//! * both decoders give the same outcome (the same error, or success) and
//!   their tables stay in step: the limit never changes what is decoded;
//! * the limited decoder passes exactly the longest prefix of the full list
//!   whose sizes (name + value + 32) fit the limit, and says Ok(true) only
//!   when that is the whole list;
//! * each decoded list, re-encoded by `Encoder` (raw and Huffman), decodes
//!   back to the same list.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vcdn_http::hpack::{Decoder, Encoder};

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn size(f: &(Vec<u8>, Vec<u8>)) -> usize {
    f.0.len() + f.1.len() + 32
}

fn round_trip(list: &Fields, huffman: bool) {
    let mut e = Encoder::new().with_huffman(huffman);
    let mut block = Vec::new();
    e.begin_block(&mut block);
    for (n, v) in list {
        e.field(n, v, &mut block);
    }
    let mut d = Decoder::new(4096);
    let mut back = Fields::new();
    let all = d
        .decode(&block, usize::MAX, |n, v| back.push((n.to_vec(), v.to_vec())))
        .expect("our own encoding must decode");
    assert!(all);
    assert_eq!(&back, list, "re-encoded list differs (huffman {huffman})");
    assert_eq!(d.table_bytes(), 0, "the encoder indexed a field");
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 {
        return;
    }
    let max = (input[0] & 0x7f) as usize * 4;
    let lower_after_first = input[0] & 0x80 != 0;
    let limit = input[1] as usize * 8;
    let mut limited = Decoder::new(max);
    let mut full = Decoder::new(max);

    let mut rest = &input[2..];
    let mut block_no = 0;
    while let Some((&len, tail)) = rest.split_first() {
        let len = (len as usize).min(tail.len());
        let (block, next) = tail.split_at(len);
        rest = next;

        let mut got = Fields::new();
        let r1 = limited.decode(block, limit, |n, v| got.push((n.to_vec(), v.to_vec())));
        let mut all = Fields::new();
        let r2 = full.decode(block, usize::MAX, |n, v| all.push((n.to_vec(), v.to_vec())));

        for d in [&limited, &full] {
            assert!(d.table_bytes() <= d.table_max(), "table {} > max {}", d.table_bytes(), d.table_max());
            assert!(d.table_max() <= max, "table max {} > advertised {max}", d.table_max());
        }
        assert_eq!(limited.table_bytes(), full.table_bytes(), "tables out of step");
        assert_eq!(limited.table_len(), full.table_len(), "tables out of step");
        match (&r1, &r2) {
            (Err(a), Err(b)) => {
                assert_eq!(a, b);
                // A connection error: the connection ends here.
                return;
            }
            (Ok(complete), Ok(true)) => {
                let mut used = 0;
                let fit = all
                    .iter()
                    .take_while(|f| {
                        used += size(f);
                        used <= limit
                    })
                    .count();
                assert_eq!(got.len(), fit, "passed {} fields, {fit} fit the limit", got.len());
                assert_eq!(&got[..], &all[..fit]);
                assert_eq!(*complete, fit == all.len());
                round_trip(&all, false);
                round_trip(&all, true);
            }
            _ => panic!("limited and full decoders disagree: {r1:?} vs {r2:?}"),
        }

        if block_no == 0 && lower_after_first {
            limited.set_max_table_size(max / 2);
            full.set_max_table_size(max / 2);
            assert!(limited.table_bytes() <= max / 2);
        }
        block_no += 1;
    }
});
