//! The Huffman code of RFC 7541 Appendix B: encoding, and a table-driven
//! decoder that reads four bits at a time.
//!
//! The decoder is a state machine over the 256 internal nodes of the code
//! tree: for each node and each nibble, [`DECODE`] says which node the walk
//! ends at, whether it completed a symbol on the way (at most one: the
//! shortest code is 5 bits), whether it reached EOS (an error, §5.2), and
//! whether a string may end there (the bits read since the last symbol are
//! fewer than 8 and all ones, i.e. a valid padding). The table is built at
//! compile time from the code lengths, so decoding is two lookups per input
//! byte and no initialisation check.

use super::HpackError;

/// `(code, bit length)` of each symbol 0..=255 and of EOS (256), RFC 7541
/// Appendix B. The pairs are data taken from the `h2` crate's copy of the
/// table (MIT licence, `src/hpack/huffman/table.rs`), EOS (30 one bits)
/// added; the unit tests check that the code is complete and canonical.
pub(crate) const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// The EOS symbol's number in [`CODES`].
const EOS: u16 = 256;

/// Number of internal nodes of the code tree (257 leaves, a full binary tree).
const NODES: usize = 256;

/// A child in [`Tree::child`]: an internal node (below `LEAF`) or `LEAF | symbol`.
const LEAF: u16 = 0x200;
const UNSET: u16 = 0xFFFF;

struct Tree {
    child: [[u16; 2]; NODES],
    depth: [u8; NODES],
    /// Whether the path from the root to this node is all one bits.
    all_ones: [bool; NODES],
}

const fn build_tree() -> Tree {
    let mut t = Tree {
        child: [[UNSET; 2]; NODES],
        depth: [0; NODES],
        all_ones: [true; NODES],
    };
    let mut nodes = 1; // node 0 is the root
    let mut sym = 0;
    while sym < CODES.len() {
        let (code, len) = CODES[sym];
        let mut node = 0;
        let mut i = len as u32;
        while i > 1 {
            i -= 1;
            let bit = ((code >> i) & 1) as usize;
            let c = t.child[node][bit];
            if c == UNSET {
                assert!(nodes < NODES, "Huffman code has too many internal nodes");
                t.child[node][bit] = nodes as u16;
                t.depth[nodes] = t.depth[node] + 1;
                t.all_ones[nodes] = t.all_ones[node] && bit == 1;
                node = nodes;
                nodes += 1;
            } else {
                assert!(c & LEAF == 0, "Huffman code is not prefix-free");
                node = c as usize;
            }
        }
        let bit = (code & 1) as usize;
        assert!(
            t.child[node][bit] == UNSET,
            "Huffman code is not prefix-free"
        );
        t.child[node][bit] = LEAF | sym as u16;
        sym += 1;
    }
    assert!(nodes == NODES, "Huffman code tree is not full");
    t
}

/// One transition of the decoder: from a node, read four bits.
#[derive(Clone, Copy)]
pub(crate) struct Step {
    /// The node the walk ends at (0 = root).
    next: u8,
    /// The symbol completed on the way, when `flags & EMIT`.
    sym: u8,
    flags: u8,
}

const EMIT: u8 = 1;
/// The string may end after this step: the pending bits are a valid padding.
const ACCEPT: u8 = 2;
/// The walk reached EOS: the string is invalid.
const FAIL: u8 = 4;

const fn build_decode() -> [[Step; 16]; NODES] {
    let t = build_tree();
    let mut table = [[Step {
        next: 0,
        sym: 0,
        flags: 0,
    }; 16]; NODES];
    let mut state = 0;
    while state < NODES {
        let mut nibble = 0;
        while nibble < 16 {
            let mut node = state;
            let mut flags = 0;
            let mut sym = 0;
            let mut b = 4;
            while b > 0 {
                b -= 1;
                let c = t.child[node][(nibble >> b) & 1];
                assert!(c != UNSET, "Huffman code tree is not full");
                if c & LEAF != 0 {
                    let s = c & !LEAF;
                    if s == EOS {
                        flags = FAIL;
                        break;
                    }
                    assert!(flags & EMIT == 0, "two symbols in one nibble");
                    flags |= EMIT;
                    sym = s as u8;
                    node = 0;
                } else {
                    node = c as usize;
                }
            }
            if flags & FAIL == 0 && t.all_ones[node] && t.depth[node] <= 7 {
                flags |= ACCEPT;
            }
            table[state][nibble] = Step {
                next: node as u8,
                sym,
                flags,
            };
            nibble += 1;
        }
        state += 1;
    }
    table
}

/// The decoder's transitions, indexed by node and nibble (12 KiB).
static DECODE: [[Step; 16]; NODES] = build_decode();

/// Append the Huffman decoding of `src` to `dst`.
///
/// Errors: the string contains EOS, or ends with a padding longer than 7
/// bits or not made of one bits (RFC 7541 §5.2).
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), HpackError> {
    // The shortest code is 5 bits: at most 8/5 symbols per byte.
    dst.reserve(src.len() + src.len() / 2 + src.len() / 8 + 1);
    let mut state = 0u8;
    let mut accept = true;
    for &byte in src {
        for nibble in [byte >> 4, byte & 0x0F] {
            let step = DECODE[state as usize][nibble as usize];
            if step.flags & FAIL != 0 {
                return Err(HpackError::HuffmanEos);
            }
            if step.flags & EMIT != 0 {
                dst.push(step.sym);
            }
            state = step.next;
            accept = step.flags & ACCEPT != 0;
        }
    }
    if accept {
        Ok(())
    } else {
        Err(HpackError::HuffmanPadding)
    }
}

/// Length in bytes of the Huffman encoding of `src`.
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| CODES[b as usize].1 as usize).sum();
    bits.div_ceil(8)
}

/// Append the Huffman encoding of `src` to `dst`, padded with one bits.
pub fn encode(src: &[u8], dst: &mut Vec<u8>) {
    dst.reserve(encoded_len(src));
    // Bits not yet written are the low `pending` bits of `acc` (fewer than 8
    // between symbols, so a 30-bit code always fits).
    let mut acc: u64 = 0;
    let mut pending: u32 = 0;
    for &b in src {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | code as u64;
        pending += len as u32;
        while pending >= 8 {
            pending -= 8;
            dst.push((acc >> pending) as u8);
        }
    }
    if pending > 0 {
        dst.push((acc << (8 - pending)) as u8 | (0xFF >> pending));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is a complete canonical code, as RFC 7541 Appendix B's is:
    /// sorted by (length, symbol), each code is the previous one plus one,
    /// shifted left when the length grows, and the last one (EOS) is all ones.
    #[test]
    fn code_table_is_complete_and_canonical() {
        let mut order: Vec<usize> = (0..CODES.len()).collect();
        order.sort_by_key(|&s| (CODES[s].1, s));
        let mut expect: u64 = 0;
        let mut prev_len = CODES[order[0]].1;
        assert_eq!(prev_len, 5);
        for (i, &s) in order.iter().enumerate() {
            let (code, len) = CODES[s];
            if i > 0 {
                expect = (expect + 1) << (len - prev_len);
            }
            assert_eq!(code as u64, expect, "symbol {s}");
            prev_len = len;
        }
        assert_eq!(CODES[256], (0x3fff_ffff, 30));
        assert_eq!(expect, 0x3fff_ffff);
        let kraft: u64 = CODES.iter().map(|&(_, l)| 1u64 << (30 - l)).sum();
        assert_eq!(kraft, 1 << 30);
    }

    #[test]
    fn rfc_examples() {
        // RFC 7541 C.4.1 and C.4.2.
        let mut out = Vec::new();
        encode(b"www.example.com", &mut out);
        assert_eq!(
            out,
            [0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff]
        );
        assert_eq!(encoded_len(b"www.example.com"), 12);
        let mut back = Vec::new();
        decode(&out, &mut back).unwrap();
        assert_eq!(back, b"www.example.com");
        out.clear();
        encode(b"no-cache", &mut out);
        assert_eq!(out, [0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]);
    }

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            for n in 1..=9 {
                let s = vec![b; n];
                let mut enc = Vec::new();
                encode(&s, &mut enc);
                assert_eq!(enc.len(), encoded_len(&s));
                let mut dec = Vec::new();
                decode(&enc, &mut dec).unwrap_or_else(|e| panic!("byte {b} x{n}: {e}"));
                assert_eq!(dec, s);
            }
        }
        let all: Vec<u8> = (0..=255).rev().collect();
        let mut enc = Vec::new();
        encode(&all, &mut enc);
        let mut dec = Vec::new();
        decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, all);
    }

    #[test]
    fn empty_string_is_valid() {
        let mut dec = Vec::new();
        decode(&[], &mut dec).unwrap();
        assert!(dec.is_empty());
    }

    #[test]
    fn padding_rules() {
        // 'a' is 00011 (5 bits): 3 bits of padding.
        let mut dec = Vec::new();
        assert_eq!(decode(&[0b0001_1111], &mut dec), Ok(()));
        assert_eq!(dec, b"a");
        // Padding not all ones.
        assert_eq!(
            decode(&[0b0001_1110], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
        assert_eq!(
            decode(&[0b0001_1011], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
        // A whole byte of padding (8 bits > 7).
        assert_eq!(
            decode(&[0b0001_1111, 0xFF], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
        assert_eq!(
            decode(&[0xFF], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
        // 7 one bits after a 9-bit... use '0' (00000, 5 bits) + 3 ones, then
        // a full symbol: "00" = 00000 00000 + 6 ones = 16 bits.
        let mut dec = Vec::new();
        assert_eq!(decode(&[0b0000_0000, 0b0011_1111], &mut dec), Ok(()));
        assert_eq!(dec, b"00");
        // An incomplete symbol that is not a prefix of EOS: '0' then 0 bits.
        assert_eq!(
            decode(&[0b0000_0000], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
    }

    #[test]
    fn eos_is_an_error() {
        // EOS alone: 30 ones, padded with 2 ones.
        assert_eq!(
            decode(&[0xFF, 0xFF, 0xFF, 0xFF], &mut Vec::new()),
            Err(HpackError::HuffmanEos)
        );
        // 'a' then EOS then padding: 00011 + 30 ones + 5 ones = 40 bits.
        assert_eq!(
            decode(&[0b0001_1111, 0xFF, 0xFF, 0xFF, 0xFF], &mut Vec::new()),
            Err(HpackError::HuffmanEos)
        );
    }
}
