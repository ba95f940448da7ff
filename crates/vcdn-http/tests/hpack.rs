//! HPACK codec (`vcdn_http::hpack`): the examples of RFC 7541 Appendix C,
//! every decoding error, the size update rules, the header list limit and
//! the "HPACK bomb" (memory measured with a counting allocator), and a
//! cross-check against an independent implementation (`httlib-hpack`): its
//! encoder's output (Huffman, incremental indexing, eviction, size updates)
//! must decode to the same fields with ours, and what our encoder writes must
//! decode to the same fields (and the same "never indexed" flags) with its.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use vcdn_http::hpack::{
    encode_int, huffman_decode, huffman_encode, Decoder, Encoder, HpackError, DEFAULT_TABLE_SIZE,
};

// ---------------------------------------------------------------------------
// Allocation accounting (per thread, so tests running in parallel do not
// disturb each other).

struct Counting;

thread_local! {
    /// Bytes currently allocated by this thread (allocations minus frees).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// Highest `LIVE` seen since the last `reset_peak`.
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// Number of allocations by this thread.
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn account(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
        if delta > 0 {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        account(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Run `f` and return its result with (allocations made, peak live bytes
/// above the live bytes at the start).
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, isize) {
    let start = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(start));
    let count = COUNT.with(|c| c.get());
    let out = f();
    let peak = PEAK.with(|p| p.get()) - start;
    (out, COUNT.with(|c| c.get()) - count, peak)
}

// ---------------------------------------------------------------------------
// Helpers.

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert!(digits.len().is_multiple_of(2), "odd hex: {s}");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn fields(list: &[(&str, &str)]) -> Fields {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn decode(d: &mut Decoder, block: &[u8]) -> Result<Fields, HpackError> {
    let mut out = Vec::new();
    let all = d.decode(block, usize::MAX, |n, v| out.push((n.to_vec(), v.to_vec())))?;
    assert!(all, "fields withheld without a list limit");
    Ok(out)
}

/// The dynamic table, newest first.
fn table(d: &Decoder) -> Fields {
    (0..d.table_len())
        .map(|i| d.dynamic_entry(i).unwrap())
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
}

fn show(f: &Fields) -> String {
    f.iter()
        .map(|(n, v)| {
            format!(
                "{}: {}",
                String::from_utf8_lossy(n),
                String::from_utf8_lossy(v)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// RFC 7541 Appendix C.

#[test]
fn c2_1_literal_with_indexing() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let got = decode(
        &mut d,
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"),
    )
    .unwrap();
    assert_eq!(got, fields(&[("custom-key", "custom-header")]));
    assert_eq!(table(&d), fields(&[("custom-key", "custom-header")]));
    assert_eq!(d.table_bytes(), 55);
}

#[test]
fn c2_2_literal_without_indexing() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let got = decode(&mut d, &hex("040c 2f73 616d 706c 652f 7061 7468")).unwrap();
    assert_eq!(got, fields(&[(":path", "/sample/path")]));
    assert_eq!((d.table_len(), d.table_bytes()), (0, 0));
}

#[test]
fn c2_3_literal_never_indexed() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let got = decode(&mut d, &hex("1008 7061 7373 776f 7264 0673 6563 7265 74")).unwrap();
    assert_eq!(got, fields(&[("password", "secret")]));
    assert_eq!((d.table_len(), d.table_bytes()), (0, 0));
}

#[test]
fn c2_4_indexed() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    assert_eq!(
        decode(&mut d, &hex("82")).unwrap(),
        fields(&[(":method", "GET")])
    );
    assert_eq!(d.table_bytes(), 0);
}

/// C.3 (raw strings) and C.4 (Huffman): three requests on one connection.
fn request_sequence(blocks: [&str; 3]) {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let base = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ];

    assert_eq!(decode(&mut d, &hex(blocks[0])).unwrap(), fields(&base));
    assert_eq!(table(&d), fields(&[(":authority", "www.example.com")]));
    assert_eq!(d.table_bytes(), 57);

    let mut second = base.to_vec();
    second.push(("cache-control", "no-cache"));
    assert_eq!(decode(&mut d, &hex(blocks[1])).unwrap(), fields(&second));
    assert_eq!(
        table(&d),
        fields(&[
            ("cache-control", "no-cache"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(d.table_bytes(), 110);

    assert_eq!(
        decode(&mut d, &hex(blocks[2])).unwrap(),
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ])
    );
    assert_eq!(
        table(&d),
        fields(&[
            ("custom-key", "custom-value"),
            ("cache-control", "no-cache"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(d.table_bytes(), 164);
}

#[test]
fn c3_requests_without_huffman() {
    request_sequence([
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ]);
}

#[test]
fn c4_requests_with_huffman() {
    request_sequence([
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ]);
}

/// C.5 (raw strings) and C.6 (Huffman): three responses with a 256-byte
/// table, so entries are evicted.
fn response_sequence(blocks: [&str; 3]) {
    let mut d = Decoder::new(256);
    let date1 = "Mon, 21 Oct 2013 20:13:21 GMT";
    let loc = "https://www.example.com";

    assert_eq!(
        decode(&mut d, &hex(blocks[0])).unwrap(),
        fields(&[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date1),
            ("location", loc)
        ])
    );
    assert_eq!(
        table(&d),
        fields(&[
            ("location", loc),
            ("date", date1),
            ("cache-control", "private"),
            (":status", "302")
        ])
    );
    assert_eq!(d.table_bytes(), 222);

    assert_eq!(
        decode(&mut d, &hex(blocks[1])).unwrap(),
        fields(&[
            (":status", "307"),
            ("cache-control", "private"),
            ("date", date1),
            ("location", loc)
        ])
    );
    assert_eq!(
        table(&d),
        fields(&[
            (":status", "307"),
            ("location", loc),
            ("date", date1),
            ("cache-control", "private")
        ])
    );
    assert_eq!(d.table_bytes(), 222);

    let date2 = "Mon, 21 Oct 2013 20:13:22 GMT";
    let cookie = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    assert_eq!(
        decode(&mut d, &hex(blocks[2])).unwrap(),
        fields(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", date2),
            ("location", loc),
            ("content-encoding", "gzip"),
            ("set-cookie", cookie),
        ])
    );
    assert_eq!(
        table(&d),
        fields(&[
            ("set-cookie", cookie),
            ("content-encoding", "gzip"),
            ("date", date2)
        ])
    );
    assert_eq!(d.table_bytes(), 215);
}

#[test]
fn c5_responses_without_huffman() {
    response_sequence([
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120
         474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738
         666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33
         3630 303b 2076 6572 7369 6f6e 3d31",
    ]);
}

#[test]
fn c6_responses_with_huffman() {
    response_sequence([
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718
         63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7
         b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ]);
}

// ---------------------------------------------------------------------------
// Errors: each is reported, with a message that says what was wrong.

fn error_of(block: &[u8]) -> HpackError {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    decode(&mut d, block).expect_err("block must be rejected")
}

#[test]
fn truncated_blocks_are_errors() {
    // Index with a continuation byte missing.
    assert_eq!(error_of(&[0xff]), HpackError::Truncated);
    // Literal with incremental indexing, name index 1, no value.
    assert_eq!(error_of(&[0x82, 0x41]), HpackError::Truncated);
    // Literal name whose length goes past the end.
    assert_eq!(error_of(&[0x40, 0x05, b'a', b'b']), HpackError::Truncated);
    // Value whose length goes past the end.
    assert_eq!(error_of(&[0x04, 0x05, b'/']), HpackError::Truncated);
    // Value length with a continuation byte missing.
    assert_eq!(error_of(&[0x04, 0x7f]), HpackError::Truncated);
    // Size update cut short.
    assert_eq!(error_of(&[0x3f]), HpackError::Truncated);
    // Every proper prefix of a valid block that cuts a representation.
    let block = hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65");
    for cut in [5, 6, 10, 16, 17, block.len() - 1] {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        decode(
            &mut d,
            &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
        )
        .unwrap();
        decode(&mut d, &hex("8286 84be 5808 6e6f 2d63 6163 6865")).unwrap();
        assert_eq!(
            decode(&mut d, &block[..cut]),
            Err(HpackError::Truncated),
            "cut at {cut}"
        );
    }
    assert!(HpackError::Truncated.to_string().contains("truncated"));
}

#[test]
fn oversized_integers_are_errors() {
    // An index with 6 continuation bytes.
    assert_eq!(
        error_of(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]),
        HpackError::IntegerOverflow
    );
    // Six continuation bytes are refused even when they add nothing (index 127)...
    assert_eq!(
        error_of(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]),
        HpackError::IntegerOverflow
    );
    // ...five are read (index 127 is then simply not in the table).
    assert_eq!(
        error_of(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x00]),
        HpackError::BadIndex {
            index: 127,
            dynamic: 0
        }
    );
    // A string length of 2^32.
    let mut block = vec![0x04];
    encode_int(1 << 32, 7, 0, &mut block);
    assert_eq!(error_of(&block), HpackError::IntegerOverflow);
    // A size update of 2^35 - 1.
    assert_eq!(
        error_of(&[0x3f, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        HpackError::IntegerOverflow
    );
    // A length of 2^32 - 1 is a valid integer but longer than the block.
    let mut block = vec![0x04];
    encode_int(u32::MAX as usize, 7, 0, &mut block);
    assert_eq!(error_of(&block), HpackError::Truncated);
    assert!(HpackError::IntegerOverflow
        .to_string()
        .contains("integer too large"));
}

#[test]
fn bad_indexes_are_errors() {
    assert_eq!(
        error_of(&[0x80]),
        HpackError::BadIndex {
            index: 0,
            dynamic: 0
        }
    );
    assert_eq!(
        error_of(&[0xbe]),
        HpackError::BadIndex {
            index: 62,
            dynamic: 0
        }
    );
    // Literal whose name index is past the tables (with indexing, without, never).
    assert_eq!(
        error_of(&[0x7e, 0x01, b'a']),
        HpackError::BadIndex {
            index: 62,
            dynamic: 0
        }
    );
    assert_eq!(
        error_of(&[0x0f, 0x2f, 0x01, b'a']),
        HpackError::BadIndex {
            index: 62,
            dynamic: 0
        }
    );
    assert_eq!(
        error_of(&[0x1f, 0x2f, 0x01, b'a']),
        HpackError::BadIndex {
            index: 62,
            dynamic: 0
        }
    );
    // A huge index.
    let mut block = Vec::new();
    encode_int(u32::MAX as usize, 7, 0x80, &mut block);
    assert_eq!(
        error_of(&block),
        HpackError::BadIndex {
            index: u32::MAX as u64,
            dynamic: 0
        }
    );

    // With one dynamic entry, 62 is valid and 63 is not.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    decode(
        &mut d,
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"),
    )
    .unwrap();
    assert_eq!(
        decode(&mut d, &[0xbe]).unwrap(),
        fields(&[("custom-key", "custom-header")])
    );
    assert_eq!(
        decode(&mut d, &[0xbf]),
        Err(HpackError::BadIndex {
            index: 63,
            dynamic: 1
        })
    );
    assert_eq!(
        HpackError::BadIndex {
            index: 63,
            dynamic: 1
        }
        .to_string(),
        "HPACK: index 63 is not in the table (61 static entries, 1 dynamic)"
    );
}

#[test]
fn bad_huffman_strings_are_errors() {
    // C.4.1 with the last padding bit cleared: padding not all ones.
    assert_eq!(
        error_of(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 fe")),
        HpackError::HuffmanPadding
    );
    // 'a' (00011) then a whole byte of padding: 11 bits of padding.
    assert_eq!(
        error_of(&[0x04, 0x82, 0x1f, 0xff]),
        HpackError::HuffmanPadding
    );
    // Exactly 8 bits of padding (an empty string coded as one 0xff byte).
    assert_eq!(error_of(&[0x04, 0x81, 0xff]), HpackError::HuffmanPadding);
    // 7 bits of padding: '0' (00000, 5 bits) twice is 10 bits, then 6 ones.
    assert_eq!(
        decode(&mut Decoder::new(4096), &[0x04, 0x82, 0x00, 0x3f]).unwrap(),
        fields(&[(":path", "00")])
    );
    // The same string without the extra byte is fine.
    assert_eq!(
        decode(&mut Decoder::new(4096), &[0x04, 0x81, 0x1f]).unwrap(),
        fields(&[(":path", "a")])
    );
    // EOS (30 one bits) inside a value, and inside a literal name.
    assert_eq!(
        error_of(&[0x04, 0x84, 0xff, 0xff, 0xff, 0xff]),
        HpackError::HuffmanEos
    );
    assert_eq!(
        error_of(&[0x40, 0x85, 0x1f, 0xff, 0xff, 0xff, 0xff, 0x00]),
        HpackError::HuffmanEos
    );
    assert!(HpackError::HuffmanEos.to_string().contains("EOS"));
    assert!(HpackError::HuffmanPadding.to_string().contains("padding"));
}

#[test]
fn table_size_updates() {
    // Too large: above the advertised maximum.
    let mut block = Vec::new();
    encode_int(4097, 5, 0x20, &mut block);
    block.push(0x82);
    assert_eq!(
        error_of(&block),
        HpackError::TableSizeUpdateTooLarge {
            size: 4097,
            max: 4096
        }
    );
    assert_eq!(
        HpackError::TableSizeUpdateTooLarge {
            size: 4097,
            max: 4096
        }
        .to_string(),
        "HPACK: dynamic table size update to 4097 exceeds the advertised maximum 4096"
    );

    // Not at the start of the block.
    assert_eq!(
        error_of(&[0x82, 0x20]),
        HpackError::TableSizeUpdateNotAtStart
    );
    assert_eq!(
        error_of(&[0x20, 0x82, 0x3f, 0xe1, 0x1f]),
        HpackError::TableSizeUpdateNotAtStart
    );

    // Two in a row are allowed (the smallest, then the final size); three are not.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut two = vec![0x20];
    encode_int(4096, 5, 0x20, &mut two);
    two.push(0x82);
    assert_eq!(decode(&mut d, &two).unwrap(), fields(&[(":method", "GET")]));
    assert_eq!(d.table_max(), 4096);
    assert_eq!(
        error_of(&[0x20, 0x20, 0x20, 0x82]),
        HpackError::TooManyTableSizeUpdates
    );

    // An update to 0 empties the table; a later one grows it back.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    decode(
        &mut d,
        &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
    )
    .unwrap();
    assert_eq!(d.table_bytes(), 57);
    decode(&mut d, &[0x20]).unwrap();
    assert_eq!((d.table_len(), d.table_bytes(), d.table_max()), (0, 0, 0));
    assert_eq!(
        decode(&mut d, &[0xbe]),
        Err(HpackError::BadIndex {
            index: 62,
            dynamic: 0
        })
    );
    // With a 0 table, a literal with indexing is passed but not stored.
    assert_eq!(
        decode(&mut d, &hex("418c f1e3 c2e5 f23a 6ba0 ab90 f4ff")),
        Ok(fields(&[(":authority", "www.example.com")]))
    );
    assert_eq!(d.table_len(), 0);
    let mut grow = Vec::new();
    encode_int(100, 5, 0x20, &mut grow);
    grow.extend(hex("418c f1e3 c2e5 f23a 6ba0 ab90 f4ff be"));
    assert_eq!(decode(&mut d, &grow).unwrap().len(), 2);
    assert_eq!(
        (d.table_len(), d.table_bytes(), d.table_max()),
        (1, 57, 100)
    );
}

#[test]
fn lowered_setting_requires_a_size_update() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    decode(
        &mut d,
        &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
    )
    .unwrap();
    decode(&mut d, &hex("8286 84be 5808 6e6f 2d63 6163 6865")).unwrap();
    assert_eq!(d.table_bytes(), 110);

    // This side now advertises 100: the table shrinks at once...
    d.set_max_table_size(100);
    assert_eq!(table(&d), fields(&[("cache-control", "no-cache")]));
    assert!(d.table_bytes() <= 100);
    // ...and the peer's next block must start with a size update.
    let missing = decode(&mut d, &[0x82]).unwrap_err();
    assert_eq!(missing, HpackError::TableSizeUpdateMissing { max: 100 });
    assert!(missing
        .to_string()
        .contains("expected a dynamic table size update to at most 100"));

    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    d.set_max_table_size(100);
    // An update above the new setting is refused, one within it accepted.
    let mut too_big = Vec::new();
    encode_int(101, 5, 0x20, &mut too_big);
    assert_eq!(
        decode(&mut d, &too_big),
        Err(HpackError::TableSizeUpdateTooLarge {
            size: 101,
            max: 100
        })
    );
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    d.set_max_table_size(100);
    let mut ok = Vec::new();
    encode_int(64, 5, 0x20, &mut ok);
    ok.push(0x82);
    assert_eq!(decode(&mut d, &ok).unwrap(), fields(&[(":method", "GET")]));
    assert_eq!(d.table_max(), 64);
    // Once acknowledged, later blocks need none.
    assert_eq!(
        decode(&mut d, &[0x82]).unwrap(),
        fields(&[(":method", "GET")])
    );

    // Lowered to 100, then 50, then raised to 4096 before the peer's next
    // block: the peer must still signal at most 50 first (then may grow it).
    let lowered_then_raised = || {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        d.set_max_table_size(100);
        d.set_max_table_size(50);
        d.set_max_table_size(DEFAULT_TABLE_SIZE);
        d
    };
    let mut only_final = Vec::new();
    encode_int(4096, 5, 0x20, &mut only_final);
    assert_eq!(
        decode(&mut lowered_then_raised(), &only_final),
        Err(HpackError::TableSizeUpdateMissing { max: 50 })
    );
    let mut both = Vec::new();
    encode_int(50, 5, 0x20, &mut both);
    encode_int(4096, 5, 0x20, &mut both);
    let mut d = lowered_then_raised();
    decode(&mut d, &both).unwrap();
    assert_eq!(d.table_max(), 4096);

    // Raising the setting requires nothing, and allows the peer to grow the table.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    d.set_max_table_size(8192);
    assert_eq!(decode(&mut d, &[0x82]).unwrap().len(), 1);
    assert_eq!(d.table_max(), 4096);
    let mut grow = Vec::new();
    encode_int(8192, 5, 0x20, &mut grow);
    decode(&mut d, &grow).unwrap();
    assert_eq!(d.table_max(), 8192);
}

// ---------------------------------------------------------------------------
// Dynamic table edge cases (§4.4).

#[test]
fn entry_larger_than_the_table_empties_it() {
    let mut d = Decoder::new(100);
    // ("a", 27 bytes): 60.
    let mut block = vec![0x40, 0x01, b'a', 27];
    block.extend_from_slice(&[b'x'; 27]);
    decode(&mut d, &block).unwrap();
    assert_eq!(d.table_bytes(), 60);
    // ("b", 68 bytes): 101 > 100, passed on but not stored, and the table is emptied.
    let mut block = vec![0x40, 0x01, b'b', 68];
    block.extend_from_slice(&[b'y'; 68]);
    let got = decode(&mut d, &block).unwrap();
    assert_eq!(got, vec![(b"b".to_vec(), vec![b'y'; 68])]);
    assert_eq!((d.table_len(), d.table_bytes()), (0, 0));
    // Exactly the table's size fits.
    let mut block = vec![0x40, 0x01, b'c', 67];
    block.extend_from_slice(&[b'z'; 67]);
    decode(&mut d, &block).unwrap();
    assert_eq!((d.table_len(), d.table_bytes()), (1, 100));
}

#[test]
fn new_entry_may_name_an_entry_it_evicts() {
    let mut d = Decoder::new(100);
    // ("name-0123456789", "v"): 48, then ("x", "y"): 34; 82 in all.
    let mut block = vec![0x40, 15];
    block.extend_from_slice(b"name-0123456789");
    block.extend_from_slice(&[1, b'v', 0x40, 1, b'x', 1, b'y']);
    decode(&mut d, &block).unwrap();
    assert_eq!(d.table_bytes(), 82);
    // Name index 63 (the oldest entry), a 40-byte value: 87, evicting both,
    // the one whose name it uses included.
    let mut block = Vec::new();
    encode_int(63, 6, 0x40, &mut block);
    block.push(40);
    block.extend_from_slice(&[b'w'; 40]);
    let got = decode(&mut d, &block).unwrap();
    let expect = vec![(b"name-0123456789".to_vec(), vec![b'w'; 40])];
    assert_eq!(got, expect);
    assert_eq!(table(&d), expect);
    assert_eq!(d.table_bytes(), 87);
}

// ---------------------------------------------------------------------------
// The header list limit and the HPACK bomb.

#[test]
fn list_limit_stops_passing_fields_but_keeps_the_table_in_step() {
    // :method GET is 42 bytes, :path / 38.
    let block = [0x82, 0x84];
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut n = 0;
    assert_eq!(d.decode(&block, 80, |_, _| n += 1), Ok(true));
    assert_eq!(n, 2);
    n = 0;
    assert_eq!(d.decode(&block, 79, |_, _| n += 1), Ok(false));
    assert_eq!(n, 1);
    n = 0;
    assert_eq!(d.decode(&block, 0, |_, _| n += 1), Ok(false));
    assert_eq!(n, 0);
    // Once a field is withheld, smaller ones after it are withheld too.
    let mut big = vec![0x04, 100];
    big.extend_from_slice(&[b'/'; 100]);
    big.push(0x82);
    let mut seen = Vec::new();
    assert_eq!(
        d.decode(&big, 100, |name, _| seen.push(name.to_vec())),
        Ok(false)
    );
    assert!(seen.is_empty());

    // A block past the limit still adds its entries: the next block sees them.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let first = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
    let mut passed = 0;
    assert_eq!(d.decode(&first, 50, |_, _| passed += 1), Ok(false));
    assert_eq!(passed, 1);
    assert_eq!(
        decode(&mut d, &[0xbe]).unwrap(),
        fields(&[(":authority", "www.example.com")])
    );
    // Errors after the limit are still reported.
    assert_eq!(
        d.decode(&[0x82, 0x82, 0xbf], 42, |_, _| {}),
        Err(HpackError::BadIndex {
            index: 63,
            dynamic: 1
        })
    );
}

#[test]
fn hpack_bomb_costs_no_memory() {
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    // One 4000-byte entry (4038 with its name and overhead) in the table...
    let mut first = vec![0x40, 6];
    first.extend_from_slice(b"x-bomb");
    encode_int(4000, 7, 0, &mut first);
    first.extend_from_slice(&[b'a'; 4000]);
    decode(&mut d, &first).unwrap();
    assert_eq!(d.table_bytes(), 4038);
    // ...referenced 16384 times: a 16 KiB block that decodes to 66 MB.
    let bomb = vec![0xbe; 16384];
    let limit = 64 * 1024;
    let mut passed = 0usize;
    let mut bytes = 0usize;
    let (result, allocations, peak) = measure(|| {
        d.decode(&bomb, limit, |n, v| {
            passed += 1;
            bytes += n.len() + v.len() + 32;
        })
    });
    assert_eq!(result, Ok(false));
    assert_eq!(passed, limit / 4038);
    assert!(bytes <= limit);
    assert_eq!(allocations, 0, "the bomb allocated");
    assert!(peak <= 0, "the bomb took {peak} bytes");
    assert_eq!(d.table_bytes(), 4038);

    // The same with a Huffman literal value naming the entry, 2000 times: the
    // scratch buffer is reused, memory stays flat.
    let mut block = Vec::new();
    for _ in 0..2000 {
        block.push(0x0f);
        block.push(62 - 15); // name index 62
        let mut v = Vec::new();
        huffman_encode(&[b'q'; 200], &mut v);
        encode_int(v.len(), 7, 0x80, &mut block);
        block.extend_from_slice(&v);
    }
    let (result, _, peak) = measure(|| d.decode(&block, limit, |_, _| {}));
    assert_eq!(result, Ok(false));
    assert!(peak <= 1024, "Huffman literals took {peak} bytes");

    // Entries added one after another (each evicts the previous): live memory
    // stays within the table's size.
    let mut block = Vec::new();
    for i in 0..1000u32 {
        block.push(0x40);
        block.push(8);
        block.extend_from_slice(format!("n{i:07}").as_bytes());
        encode_int(3000, 7, 0, &mut block);
        block.extend_from_slice(&[b'v'; 3000]);
    }
    let (result, _, peak) = measure(|| d.decode(&block, limit, |_, _| {}));
    assert_eq!(result, Ok(false));
    assert!(d.table_bytes() <= DEFAULT_TABLE_SIZE);
    assert!(
        peak <= 2 * DEFAULT_TABLE_SIZE as isize,
        "adding entries took {peak} bytes"
    );
}

#[test]
fn common_path_allocates_nothing() {
    // h2load's requests: the first adds :authority and user-agent to the
    // table; the following ones are all indexed.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut first = vec![0x82, 0x87];
    first.extend([0x44, 0x02, b'/', b'x']); // :path /x, indexed
    first.push(0x41); // :authority, indexed
    let mut v = Vec::new();
    huffman_encode(b"127.0.0.1:8080", &mut v);
    encode_int(v.len(), 7, 0x80, &mut first);
    first.extend_from_slice(&v);
    first.extend([0x7a, 0x0c]); // user-agent, indexed
    first.extend_from_slice(b"h2load/1.5.0");
    decode(&mut d, &first).unwrap();
    let next = [0x82, 0x87, 0xc0, 0xbf, 0xbe];
    let (got, allocations, _) = measure(|| {
        let mut n = 0;
        let all = d.decode(&next, 16 * 1024, |_, _| n += 1).unwrap();
        (all, n)
    });
    assert_eq!(got, (true, 5));
    assert_eq!(allocations, 0);
    assert_eq!(
        decode(&mut d, &next).unwrap(),
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/x"),
            (":authority", "127.0.0.1:8080"),
            ("user-agent", "h2load/1.5.0"),
        ])
    );
}

// ---------------------------------------------------------------------------
// The encoder.

#[test]
fn encoder_representations() {
    let mut e = Encoder::new();
    let mut out = Vec::new();
    // The first block starts with a size update to 0, once.
    e.status(200, &mut out);
    assert_eq!(out, [0x20, 0x88]);
    out.clear();
    for (code, byte) in [
        (200, 0x88),
        (204, 0x89),
        (206, 0x8a),
        (304, 0x8b),
        (400, 0x8c),
        (404, 0x8d),
        (500, 0x8e),
    ] {
        e.status(code, &mut out);
        assert_eq!(out, [byte], "{code}");
        out.clear();
    }
    e.status(302, &mut out);
    assert_eq!(out, [0x08, 0x03, b'3', b'0', b'2']);
    out.clear();
    // Exact static match: indexed.
    e.field(b"accept-encoding", b"gzip, deflate", &mut out);
    assert_eq!(out, [0x80 | 16]);
    out.clear();
    // Static name (28, above the 4-bit prefix), literal value without indexing.
    e.field(b"content-length", b"43", &mut out);
    assert_eq!(out, [0x0f, 28 - 15, 2, b'4', b'3']);
    out.clear();
    e.field(b"age", b"0", &mut out);
    assert_eq!(out, [0x0f, 21 - 15, 1, b'0']);
    out.clear();
    // Unknown name: literal name.
    e.field(b"x-cache", b"HIT", &mut out);
    assert_eq!(
        out,
        [0x00, 7, b'x', b'-', b'c', b'a', b'c', b'h', b'e', 3, b'H', b'I', b'T']
    );
    out.clear();
    // Sensitive: never indexed, even the static name's empty value.
    e.field(b"set-cookie", b"a=b", &mut out);
    assert_eq!(out, [0x1f, 55 - 15, 3, b'a', b'=', b'b']);
    out.clear();
    e.field(b"cookie", b"", &mut out);
    assert_eq!(out, [0x1f, 32 - 15, 0]);
    out.clear();
    // A trailer block of a new encoder starts with begin_block.
    let mut e = Encoder::new();
    e.begin_block(&mut out);
    e.begin_block(&mut out);
    e.field(b"grpc-status", b"0", &mut out);
    assert_eq!(out[0], 0x20);
    assert_eq!(out[1], 0x00);
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    assert_eq!(
        decode(&mut d, &out).unwrap(),
        fields(&[("grpc-status", "0")])
    );
}

/// A response field list with every kind of field the encoder meets.
fn response_fields(seed: u64) -> Fields {
    let mut rng = Rng(seed);
    let mut list = fields(&[
        ("content-type", "text/plain"),
        ("content-length", "43"),
        ("date", "Fri, 27 Nov 2026 07:24:44 GMT"),
        ("server", "vcdn"),
        ("accept-ranges", "bytes"),
        ("accept-encoding", "gzip, deflate"),
        ("cache-control", "public, max-age=3600"),
        ("etag", "\"5f3a-2b\""),
        ("set-cookie", "session=abc; HttpOnly"),
        ("authorization", "Basic dmNkbg=="),
        ("proxy-authorization", "x"),
        ("cookie", ""),
        ("x-cache", "HIT"),
        ("via", ""),
        ("link", "</style.css>; rel=preload; as=style"),
    ]);
    for _ in 0..rng.below(6) {
        let name = format!("x-{}", rng.below(1000));
        let value: Vec<u8> = (0..rng.below(300)).map(|_| rng.byte()).collect();
        list.push((name.into_bytes(), value));
    }
    list
}

#[test]
fn encoder_round_trips_through_both_decoders() {
    for huffman in [false, true] {
        let mut e = Encoder::new().with_huffman(huffman);
        let mut ours = Decoder::new(DEFAULT_TABLE_SIZE);
        let mut theirs = httlib_hpack::Decoder::default();
        for (i, status) in [200u16, 206, 302, 404, 503, 999, 100, 0, 65535]
            .into_iter()
            .enumerate()
        {
            let list = response_fields(i as u64);
            let mut block = Vec::new();
            e.status(status, &mut block);
            for (n, v) in &list {
                e.field(n, v, &mut block);
            }
            let mut expect = vec![(b":status".to_vec(), status.to_string().into_bytes())];
            expect.extend(list.iter().cloned());

            assert_eq!(
                decode(&mut ours, &block).unwrap(),
                expect,
                "huffman {huffman}, status {status}"
            );
            assert_eq!(ours.table_bytes(), 0, "the encoder must not index");

            let mut buf = block.clone();
            let mut out = Vec::new();
            theirs
                .decode(&mut buf, &mut out)
                .unwrap_or_else(|e| panic!("httlib-hpack rejected our block: {e:?}"));
            let got: Fields = out.iter().map(|(n, v, _)| (n.clone(), v.clone())).collect();
            assert_eq!(show(&got), show(&expect));
            assert_eq!(got, expect);
            for (n, _, flags) in &out {
                let sensitive = matches!(
                    &n[..],
                    b"set-cookie" | b"cookie" | b"authorization" | b"proxy-authorization"
                );
                assert_eq!(
                    flags & httlib_hpack::Decoder::NEVER_INDEXED != 0,
                    sensitive,
                    "{}",
                    String::from_utf8_lossy(n)
                );
                assert_eq!(flags & httlib_hpack::Decoder::WITH_INDEXING, 0);
            }
        }
    }
    // With Huffman on, values that compress are shorter.
    let mut plain = Vec::new();
    Encoder::new().field(b"date", b"Fri, 27 Nov 2026 07:24:44 GMT", &mut plain);
    let mut packed = Vec::new();
    Encoder::new()
        .with_huffman(true)
        .field(b"date", b"Fri, 27 Nov 2026 07:24:44 GMT", &mut packed);
    assert!(
        packed.len() < plain.len(),
        "{} vs {}",
        packed.len(),
        plain.len()
    );
}

// ---------------------------------------------------------------------------
// Cross-check: what an independent encoder writes, we read back.

/// xorshift64*: a seeded, reproducible generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0 ^ 0x9E37_79B9_7F4A_7C15;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

const NAMES: [&str; 14] = [
    ":method",
    ":path",
    ":authority",
    ":scheme",
    "user-agent",
    "accept",
    "accept-encoding",
    "cookie",
    "x-forwarded-for",
    "if-none-match",
    "x-request-id",
    "content-type",
    "referer",
    "traceparent",
];

fn random_field(rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let name = match rng.below(4) {
        0 => {
            let len = 1 + rng.below(20);
            (0..len).map(|_| b'a' + rng.below(26) as u8).collect()
        }
        _ => NAMES[rng.below(NAMES.len() as u64) as usize]
            .as_bytes()
            .to_vec(),
    };
    let value = match rng.below(5) {
        // Any bytes, so every Huffman code length occurs.
        0 => (0..rng.below(200)).map(|_| rng.byte()).collect(),
        1 => Vec::new(),
        2 => b"GET".to_vec(),
        // Long values: multi-byte lengths, and entries that evict others.
        3 => (0..rng.below(1500))
            .map(|_| b' ' + rng.below(95) as u8)
            .collect(),
        _ => format!("/v/{}", rng.below(50)).into_bytes(),
    };
    (name, value)
}

#[test]
fn decodes_what_httlib_encodes() {
    use httlib_hpack::Encoder as Their;
    let flag_sets = [
        0,
        Their::BEST_FORMAT,
        Their::WITH_INDEXING,
        Their::WITH_INDEXING | Their::BEST_FORMAT,
        Their::WITH_INDEXING | Their::HUFFMAN_NAME | Their::HUFFMAN_VALUE | Their::BEST_FORMAT,
        Their::HUFFMAN_VALUE,
        Their::NEVER_INDEXED | Their::HUFFMAN_NAME,
        Their::NEVER_INDEXED | Their::BEST_FORMAT | Their::HUFFMAN_VALUE,
    ];
    let mut total_fields = 0;
    for seed in 0..60u64 {
        let mut rng = Rng(seed);
        // Small tables make eviction frequent.
        let size = [4096u32, 256, 100, 0][seed as usize % 4];
        let mut theirs = Their::with_dynamic_size(4096);
        let mut ours = Decoder::new(4096);
        for block_no in 0..12 {
            let mut block = Vec::new();
            if block_no == 0 && size != 4096 {
                theirs.update_max_dynamic_size(size, &mut block).unwrap();
            }
            if block_no == 6 && rng.below(2) == 0 {
                // Two updates: shrink to 0, then back (RFC 7541 §4.2).
                theirs.update_max_dynamic_size(0, &mut block).unwrap();
                theirs.update_max_dynamic_size(size, &mut block).unwrap();
            }
            let mut expect = Vec::new();
            for _ in 0..1 + rng.below(15) {
                let (n, v) = random_field(&mut rng);
                let flags = flag_sets[rng.below(flag_sets.len() as u64) as usize];
                theirs
                    .encode((n.clone(), v.clone(), flags), &mut block)
                    .unwrap();
                expect.push((n, v));
            }
            let got = decode(&mut ours, &block)
                .unwrap_or_else(|e| panic!("seed {seed} block {block_no}: {e}\n{}", show(&expect)));
            assert_eq!(got, expect, "seed {seed} block {block_no}");
            assert!(
                ours.table_bytes() <= size as usize,
                "seed {seed}: table {} > {size}",
                ours.table_bytes()
            );
            assert_eq!(ours.table_max(), size as usize);
            total_fields += got.len();
        }
    }
    assert!(total_fields > 3000, "{total_fields}");
}

#[test]
fn huffman_matches_httlib() {
    let mut rng = Rng(7);
    for _ in 0..500 {
        let s: Vec<u8> = (0..rng.below(100)).map(|_| rng.byte()).collect();
        let mut ours = Vec::new();
        huffman_encode(&s, &mut ours);
        let mut theirs = Vec::new();
        httlib_hpack::Encoder::default()
            .encode(
                (
                    b"n".to_vec(),
                    s.clone(),
                    httlib_hpack::Encoder::HUFFMAN_VALUE,
                ),
                &mut theirs,
            )
            .unwrap();
        // Literal without indexing: 0x00, name length 1, 'n', then the value.
        let mut pos = 3;
        let mut len_block = theirs[pos..].to_vec();
        len_block[0] &= 0x7f;
        let mut p = 0;
        let len = vcdn_http::hpack::decode_int(&len_block, &mut p, 7).unwrap() as usize;
        pos += p;
        assert_eq!(&theirs[pos..pos + len], &ours[..], "{s:?}");
        let mut back = Vec::new();
        huffman_decode(&ours, &mut back).unwrap();
        assert_eq!(back, s);
    }
}
