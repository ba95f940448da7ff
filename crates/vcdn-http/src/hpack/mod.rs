//! HPACK (RFC 7541): header compression for vcdn's own HTTP/2 connection.
//!
//! * [`Decoder`] reads the peer's header blocks: the whole of RFC 7541
//!   (integers, Huffman and raw strings, indexed fields, the three literal
//!   kinds, the dynamic table with eviction, size updates). It is hardened
//!   against hostile peers: integers are bounded (at most 2^32 - 1, at most
//!   5 continuation bytes), every index and length is checked, size updates
//!   are only accepted at the start of a block, at most two, never above what
//!   this side advertised, and the decoded fields are handed to a callback
//!   (slices of the block or of the table) instead of being collected, so a
//!   block that decodes to a huge header list (an "HPACK bomb": one large
//!   entry referenced thousands of times) costs no memory beyond the
//!   dynamic table and stops being passed on past the caller's limit.
//! * [`Encoder`] writes response fields without a dynamic table, as nginx
//!   does: no per-connection table, nothing to keep in step with the peer.
//!
//! Every [`HpackError`] is a connection error of type COMPRESSION_ERROR in
//! HTTP/2 (RFC 9113 §4.3): once a block fails, the two tables may be out of
//! step and the connection must be closed.

mod huffman;
mod table;

use table::{DynamicTable, Entry, STATIC};

pub use table::ENTRY_OVERHEAD;

/// The dynamic table size both sides start with (SETTINGS_HEADER_TABLE_SIZE's
/// initial value, RFC 9113 §6.5.2).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Integers are rejected above this (RFC 7541 leaves the bound to the
/// implementation; no index, length or table size is legitimately larger).
pub const MAX_INT: u64 = u32::MAX as u64;

/// Huffman scratch buffers larger than this are given back after the block.
const SCRATCH_KEEP: usize = 16 * 1024;

/// Why a header block could not be decoded. Every one is a connection
/// error COMPRESSION_ERROR in HTTP/2 (RFC 9113 §4.3); Display says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ends in the middle of a representation.
    #[error("HPACK: header block truncated inside a field representation")]
    Truncated,
    /// An integer above 2^32 - 1 or with more than 5 continuation bytes.
    #[error("HPACK: integer too large (above 2^32-1 or more than 5 continuation bytes)")]
    IntegerOverflow,
    /// An index that is 0 or past the end of the static and dynamic tables.
    #[error("HPACK: index {index} is not in the table (61 static entries, {dynamic} dynamic)")]
    BadIndex { index: u64, dynamic: usize },
    /// A Huffman-coded string contains the EOS symbol (RFC 7541 §5.2).
    #[error("HPACK: Huffman string contains EOS")]
    HuffmanEos,
    /// A Huffman-coded string ends with a padding longer than 7 bits or not
    /// made of one bits (RFC 7541 §5.2).
    #[error("HPACK: Huffman string padding is longer than 7 bits or not all ones")]
    HuffmanPadding,
    /// A dynamic table size update above the SETTINGS_HEADER_TABLE_SIZE this
    /// side advertised (RFC 7541 §6.3).
    #[error("HPACK: dynamic table size update to {size} exceeds the advertised maximum {max}")]
    TableSizeUpdateTooLarge { size: u64, max: usize },
    /// A dynamic table size update after the first field of the block (RFC 7541 §4.2).
    #[error("HPACK: dynamic table size update after the start of the header block")]
    TableSizeUpdateNotAtStart,
    /// More than two size updates at the start of one block (RFC 7541 §4.2
    /// allows the smallest and the final size only).
    #[error("HPACK: more than two dynamic table size updates in one header block")]
    TooManyTableSizeUpdates,
    /// This side lowered its SETTINGS_HEADER_TABLE_SIZE below the table's
    /// size and the peer's next block did not start with a size update to at
    /// most the lowest value set since its last block (RFC 7541 §4.2).
    #[error("HPACK: expected a dynamic table size update to at most {max} at the start of the header block")]
    TableSizeUpdateMissing { max: usize },
}

/// Decode an HPACK integer (RFC 7541 §5.1) whose first byte is
/// `block[*pos]` with a `prefix`-bit prefix (1 to 8), advancing `pos`.
///
/// At most 5 continuation bytes and at most [`MAX_INT`].
#[inline]
pub fn decode_int(block: &[u8], pos: &mut usize, prefix: u8) -> Result<u64, HpackError> {
    debug_assert!((1..=8).contains(&prefix));
    let Some(&first) = block.get(*pos) else {
        return Err(HpackError::Truncated);
    };
    *pos += 1;
    let mask = ((1u16 << prefix) - 1) as u8;
    let mut value = (first & mask) as u64;
    if value < mask as u64 {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let Some(&b) = block.get(*pos) else {
            return Err(HpackError::Truncated);
        };
        *pos += 1;
        value += ((b & 0x7F) as u64) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(HpackError::IntegerOverflow);
        }
    }
    if value > MAX_INT {
        return Err(HpackError::IntegerOverflow);
    }
    Ok(value)
}

/// Append an HPACK integer (RFC 7541 §5.1): `flags` are the bits of the
/// first byte above the `prefix`-bit prefix (1 to 8).
#[inline]
pub fn encode_int(value: usize, prefix: u8, flags: u8, out: &mut Vec<u8>) {
    debug_assert!((1..=8).contains(&prefix));
    let mask = ((1u16 << prefix) - 1) as usize;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7F) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Append the Huffman encoding of `s` (RFC 7541 Appendix B), padded with
/// one bits. Without the string literal's length prefix.
pub fn huffman_encode(s: &[u8], out: &mut Vec<u8>) {
    huffman::encode(s, out)
}

/// Length of [`huffman_encode`]'s output for `s`.
pub fn huffman_encoded_len(s: &[u8]) -> usize {
    huffman::encoded_len(s)
}

/// Append the Huffman decoding of `s` to `out` (errors: EOS, bad padding).
pub fn huffman_decode(s: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    huffman::decode(s, out)
}

/// Read a string literal (RFC 7541 §5.2) at `block[*pos]`: a slice of the
/// block when raw, of `scratch` when Huffman-coded.
#[inline]
fn read_string<'a>(
    block: &'a [u8],
    pos: &mut usize,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], HpackError> {
    let Some(&first) = block.get(*pos) else {
        return Err(HpackError::Truncated);
    };
    let len = decode_int(block, pos, 7)? as usize;
    let Some(raw) = block.get(*pos..).and_then(|rest| rest.get(..len)) else {
        return Err(HpackError::Truncated);
    };
    *pos += len;
    if first & 0x80 == 0 {
        return Ok(raw);
    }
    scratch.clear();
    huffman::decode(raw, scratch)?;
    Ok(scratch)
}

/// The field at HPACK index `index` (1-based: static table, then dynamic).
#[inline]
fn lookup(table: &DynamicTable, index: u64) -> Result<(&[u8], &[u8]), HpackError> {
    let i = index as usize;
    let found = if i == 0 {
        None
    } else if i <= STATIC.len() {
        Some(STATIC[i - 1])
    } else {
        table.get(i - STATIC.len() - 1)
    };
    found.ok_or(HpackError::BadIndex {
        index,
        dynamic: table.len(),
    })
}

/// Passes fields to the caller until the header list limit is reached.
struct Sink<F> {
    field: F,
    left: usize,
    passing: bool,
}

impl<F: FnMut(&[u8], &[u8])> Sink<F> {
    #[inline]
    fn pass(&mut self, name: &[u8], value: &[u8]) {
        if !self.passing {
            return;
        }
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size <= self.left {
            self.left -= size;
            (self.field)(name, value);
        } else {
            self.passing = false;
        }
    }
}

/// Decodes the header blocks of one connection's peer (one per direction:
/// the dynamic table is connection state).
pub struct Decoder {
    table: DynamicTable,
    /// The SETTINGS_HEADER_TABLE_SIZE this side advertises: the limit of the
    /// peer's size updates.
    max_allowed: usize,
    /// Set when this side lowered its limit below the table's maximum: the
    /// peer's next block must start with a size update to at most this (the
    /// smallest limit since the last block, RFC 7541 §4.2).
    update_required: Option<usize>,
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("entries", &self.table.len())
            .field("table_bytes", &self.table.size())
            .field("table_max", &self.table.max())
            .field("max_allowed", &self.max_allowed)
            .finish()
    }
}

impl Decoder {
    /// `max_table_size`: the SETTINGS_HEADER_TABLE_SIZE this side advertises;
    /// the peer's dynamic table size updates may not exceed it.
    ///
    /// The table starts with that maximum. A peer's encoder starts with
    /// [`DEFAULT_TABLE_SIZE`] until it has seen this side's SETTINGS, so a
    /// connection that advertises less than 4096 should start with
    /// `new(DEFAULT_TABLE_SIZE)` and call [`set_max_table_size`](Self::set_max_table_size)
    /// when the peer acknowledges the SETTINGS; one that keeps the default
    /// (as vcdn does) just uses `new(DEFAULT_TABLE_SIZE)`.
    pub fn new(max_table_size: usize) -> Decoder {
        Decoder {
            table: DynamicTable::new(max_table_size),
            max_allowed: max_table_size,
            update_required: None,
            name_buf: Vec::new(),
            value_buf: Vec::new(),
        }
    }

    /// Change the SETTINGS_HEADER_TABLE_SIZE this side advertises (call it
    /// when the peer acknowledges the SETTINGS frame). A lower value than the
    /// table's current maximum shrinks the table now (evicting the oldest
    /// entries) and requires the peer's next block to start with a size
    /// update to at most that value (RFC 7541 §4.2: after several changes,
    /// the smallest), as nghttp2 does; a higher one only allows the peer to
    /// grow the table by a size update.
    pub fn set_max_table_size(&mut self, n: usize) {
        self.max_allowed = n;
        if n < self.table.max() {
            self.table.set_max(n);
            self.update_required = Some(self.update_required.map_or(n, |r| r.min(n)));
        }
    }

    /// Bytes the dynamic table holds, counted as RFC 7541 §4.1 does (name +
    /// value + 32 per entry); never more than the table's maximum size. The
    /// heap it takes is the names and values plus less than 32 bytes per
    /// entry of bookkeeping, so this bounds it.
    pub fn table_bytes(&self) -> usize {
        self.table.size()
    }

    /// Entry `i` of the dynamic table, 0 being the newest (HPACK index
    /// `62 + i`), for tests and diagnostics.
    pub fn dynamic_entry(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.table.get(i)
    }

    /// Number of entries in the dynamic table.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }

    /// The dynamic table's current maximum size (the last size update, or
    /// the value given to [`new`](Self::new)).
    pub fn table_max(&self) -> usize {
        self.table.max()
    }

    /// Decode one complete header block (a HEADERS frame's fragment and its
    /// CONTINUATIONs, joined). Calls `field(name, value)` for each field in
    /// order, Huffman already decoded. Once the fields passed would exceed
    /// `max_list_size` (sizes as RFC 7541 §4.1: name + value + 32), no
    /// further field is passed but decoding goes on to the end so the
    /// dynamic table stays in step with the peer's; returns Ok(false)
    /// then, Ok(true) when every field was passed.
    ///
    /// Names and values are passed as they are on the wire: checking them
    /// (lowercase names, no pseudo-header after a regular one, no forbidden
    /// bytes, RFC 9113 §8.2) is the caller's job.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        field: impl FnMut(&[u8], &[u8]),
    ) -> Result<bool, HpackError> {
        let result = self.decode_block(
            block,
            Sink {
                field,
                left: max_list_size,
                passing: true,
            },
        );
        if self.name_buf.capacity() > SCRATCH_KEEP {
            self.name_buf = Vec::new();
        }
        if self.value_buf.capacity() > SCRATCH_KEEP {
            self.value_buf = Vec::new();
        }
        result
    }

    fn decode_block<F: FnMut(&[u8], &[u8])>(
        &mut self,
        block: &[u8],
        mut sink: Sink<F>,
    ) -> Result<bool, HpackError> {
        let mut pos = 0;

        // Dynamic table size updates: only here, at the start (§4.2).
        let mut updates = 0;
        let mut smallest = u64::MAX;
        while let Some(&b) = block.get(pos) {
            if b & 0xE0 != 0x20 {
                break;
            }
            updates += 1;
            if updates > 2 {
                return Err(HpackError::TooManyTableSizeUpdates);
            }
            let size = decode_int(block, &mut pos, 5)?;
            if size > self.max_allowed as u64 {
                return Err(HpackError::TableSizeUpdateTooLarge {
                    size,
                    max: self.max_allowed,
                });
            }
            self.table.set_max(size as usize);
            smallest = smallest.min(size);
        }
        if let Some(max) = self.update_required {
            if smallest > max as u64 {
                return Err(HpackError::TableSizeUpdateMissing { max });
            }
            self.update_required = None;
        }

        while let Some(&b) = block.get(pos) {
            if b & 0x80 != 0 {
                // Indexed field (§6.1).
                let index = decode_int(block, &mut pos, 7)?;
                let (name, value) = lookup(&self.table, index)?;
                sink.pass(name, value);
            } else if b & 0x40 != 0 {
                // Literal with incremental indexing (§6.2.1).
                let index = decode_int(block, &mut pos, 6)?;
                let name = if index == 0 {
                    read_string(block, &mut pos, &mut self.name_buf)?
                } else {
                    lookup(&self.table, index)?.0
                };
                let value = read_string(block, &mut pos, &mut self.value_buf)?;
                if self.table.fits(name.len(), value.len()) {
                    // Copy first: `name` may be an entry that adding evicts (§4.4).
                    let entry = Entry::new(name, value);
                    sink.pass(entry.name(), entry.value());
                    self.table.push(entry);
                } else {
                    sink.pass(name, value);
                    self.table.clear();
                }
            } else if b & 0x20 != 0 {
                return Err(HpackError::TableSizeUpdateNotAtStart);
            } else {
                // Literal without indexing (0000) or never indexed (0001), §6.2.2-3.
                let index = decode_int(block, &mut pos, 4)?;
                let name = if index == 0 {
                    read_string(block, &mut pos, &mut self.name_buf)?
                } else {
                    lookup(&self.table, index)?.0
                };
                let value = read_string(block, &mut pos, &mut self.value_buf)?;
                sink.pass(name, value);
            }
        }
        Ok(sink.passing)
    }
}

/// Whether a field must be sent "never indexed" (RFC 7541 §7.1.3): it
/// carries credentials an intermediary must not put in a compression context.
fn sensitive(name: &[u8]) -> bool {
    matches!(
        name,
        b"set-cookie" | b"cookie" | b"authorization" | b"proxy-authorization"
    )
}

/// Encodes response fields without a dynamic table (as nginx does: no
/// per-connection memory, no state to keep in step): indexed when the
/// static table has the exact field, else a literal without indexing
/// naming the static table's name index when there is one; "never indexed"
/// for sensitive fields (set-cookie, authorization, proxy-authorization, cookie).
///
/// The first block an `Encoder` starts (with [`status`](Self::status) or
/// [`begin_block`](Self::begin_block)) begins with a dynamic table size
/// update to 0, once, as nginx does: the peer's decoder then holds no table
/// for us, and a SETTINGS_HEADER_TABLE_SIZE the peer lowers later never
/// requires another update (nghttp2 rejects a block that lacks one after
/// lowering it below the table's size). Keep one `Encoder` per connection
/// to send that byte once; a new one per block is valid too.
///
/// Huffman coding of values is off by default: it saves about a quarter of
/// the bytes of a literal but costs CPU on every response, while the bytes
/// saved are a few dozen per response, cheaper to send (and encrypt) than to
/// compress on the cache's hit path, the cost vcdn optimises.
/// [`with_huffman`](Self::with_huffman) turns it on (used when shorter).
#[derive(Debug, Clone, Default)]
pub struct Encoder {
    huffman: bool,
    table_size_sent: bool,
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Huffman-code literal names and values when that is shorter.
    pub fn with_huffman(mut self, on: bool) -> Encoder {
        self.huffman = on;
        self
    }

    /// Start a header block: writes the one-time size update to 0 if this
    /// encoder has not written it yet. [`status`](Self::status) calls it; a
    /// block without `:status` (trailers) must call it first.
    #[inline]
    pub fn begin_block(&mut self, out: &mut Vec<u8>) {
        if !self.table_size_sent {
            self.table_size_sent = true;
            out.push(0x20); // dynamic table size update to 0
        }
    }

    /// `:status` (indexed for 200, 204, 206, 304, 400, 404, 500). Starts the
    /// block (see [`begin_block`](Self::begin_block)).
    pub fn status(&mut self, code: u16, out: &mut Vec<u8>) {
        self.begin_block(out);
        let index = match code {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => 0,
        };
        if index != 0 {
            out.push(0x80 | index);
            return;
        }
        // Literal without indexing, name index 8 (:status).
        out.push(0x08);
        let mut digits = [0u8; 5];
        let mut n = code;
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        out.push((digits.len() - start) as u8);
        out.extend_from_slice(&digits[start..]);
    }

    /// A field with a lowercase name (the caller lowercases).
    pub fn field(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let never = sensitive(name);
        let flags = if never { 0x10 } else { 0x00 };
        match table::static_name(name) {
            Some(first) => {
                if !never {
                    if let Some(index) = table::static_exact(first, name, value) {
                        encode_int(index, 7, 0x80, out);
                        return;
                    }
                }
                encode_int(first, 4, flags, out);
            }
            None => {
                out.push(flags);
                self.string(name, out);
            }
        }
        self.string(value, out);
    }

    fn string(&self, s: &[u8], out: &mut Vec<u8>) {
        if self.huffman {
            let len = huffman::encoded_len(s);
            if len < s.len() {
                encode_int(len, 7, 0x80, out);
                huffman::encode(s, out);
                return;
            }
        }
        encode_int(s.len(), 7, 0x00, out);
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_round_trip(value: usize, prefix: u8) {
        let mut out = vec![0xAA];
        encode_int(value, prefix, 0, &mut out);
        let mut pos = 1;
        assert_eq!(
            decode_int(&out, &mut pos, prefix),
            Ok(value as u64),
            "{value} prefix {prefix}"
        );
        assert_eq!(pos, out.len());
    }

    #[test]
    fn integers_round_trip() {
        for prefix in 1..=8 {
            for value in [
                0,
                1,
                14,
                15,
                16,
                30,
                31,
                126,
                127,
                128,
                254,
                255,
                256,
                1337,
                16_383,
                16_384,
                1 << 21,
                1 << 28,
            ] {
                int_round_trip(value, prefix);
            }
            int_round_trip(u32::MAX as usize, prefix);
        }
    }

    #[test]
    fn integer_rfc_examples() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with 5 bits; C.1.3: 42 with 8 bits.
        let mut out = Vec::new();
        encode_int(10, 5, 0, &mut out);
        assert_eq!(out, [0x0a]);
        out.clear();
        encode_int(1337, 5, 0, &mut out);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        out.clear();
        encode_int(42, 8, 0, &mut out);
        assert_eq!(out, [0x2a]);
        // The flags above the prefix are kept and ignored on decode.
        out.clear();
        encode_int(1337, 5, 0xE0, &mut out);
        assert_eq!(out, [0xff, 0x9a, 0x0a]);
        let mut pos = 0;
        assert_eq!(decode_int(&out, &mut pos, 5), Ok(1337));
    }

    #[test]
    fn integer_bounds() {
        let mut pos = 0;
        // u32::MAX with a 7-bit prefix: 127 + 0xFFFFFF80 over 5 continuation bytes.
        let mut out = Vec::new();
        encode_int(u32::MAX as usize, 7, 0, &mut out);
        assert_eq!(out.len(), 6);
        assert_eq!(decode_int(&out, &mut pos, 7), Ok(MAX_INT));
        // One more is too large.
        out.clear();
        encode_int(u32::MAX as usize + 1, 7, 0, &mut out);
        pos = 0;
        assert_eq!(
            decode_int(&out, &mut pos, 7),
            Err(HpackError::IntegerOverflow)
        );
        // Six continuation bytes, even of zeros, are refused.
        pos = 0;
        assert_eq!(
            decode_int(&[0x7f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], &mut pos, 7),
            Err(HpackError::IntegerOverflow)
        );
        // Five, with a zero tail, are accepted (redundant but valid encoding).
        pos = 0;
        assert_eq!(
            decode_int(&[0x7f, 0x81, 0x80, 0x80, 0x80, 0x00], &mut pos, 7),
            Ok(128)
        );
        // Truncated continuation.
        pos = 0;
        assert_eq!(
            decode_int(&[0x7f, 0x80], &mut pos, 7),
            Err(HpackError::Truncated)
        );
        pos = 0;
        assert_eq!(decode_int(&[], &mut pos, 7), Err(HpackError::Truncated));
    }
}
