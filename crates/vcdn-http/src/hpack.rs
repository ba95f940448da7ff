//! PLACEHOLDER until the `hpack` branch lands (it replaces this file):
//! HPACK (RFC 7541) without Huffman decoding, enough for hand-made blocks.

use std::collections::VecDeque;

pub const DEFAULT_TABLE_SIZE: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HpackError {
    Malformed,
}

impl std::fmt::Display for HpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("malformed header block")
    }
}

static STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

pub struct Decoder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
    limit: usize,
}

fn int(b: &[u8], at: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let mask = ((1u16 << prefix) - 1) as u8;
    let first = *b.get(*at).ok_or(HpackError::Malformed)? & mask;
    *at += 1;
    if first < mask {
        return Ok(first as usize);
    }
    let mut v = mask as usize;
    let mut shift = 0;
    loop {
        let c = *b.get(*at).ok_or(HpackError::Malformed)?;
        *at += 1;
        if shift > 28 {
            return Err(HpackError::Malformed);
        }
        v += ((c & 0x7f) as usize) << shift;
        shift += 7;
        if c & 0x80 == 0 {
            return Ok(v);
        }
    }
}

fn string<'a>(b: &'a [u8], at: &mut usize) -> Result<&'a [u8], HpackError> {
    let huff = *b.get(*at).ok_or(HpackError::Malformed)? & 0x80 != 0;
    let n = int(b, at, 7)?;
    if huff || b.len() - *at < n {
        return Err(HpackError::Malformed);
    }
    let s = &b[*at..*at + n];
    *at += n;
    Ok(s)
}

impl Decoder {
    pub fn new(max_table_size: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: max_table_size,
            limit: max_table_size,
        }
    }

    pub fn set_max_table_size(&mut self, n: usize) {
        self.limit = n;
        self.max = self.max.min(n);
        self.evict();
    }

    pub fn table_bytes(&self) -> usize {
        self.size
    }

    fn evict(&mut self) {
        while self.size > self.max {
            let (n, v) = self.table.pop_back().expect("size matches");
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn get(&self, i: usize) -> Result<(Vec<u8>, Vec<u8>), HpackError> {
        if i == 0 {
            return Err(HpackError::Malformed);
        }
        if i <= 61 {
            let (n, v) = STATIC[i - 1];
            return Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
        self.table.get(i - 62).cloned().ok_or(HpackError::Malformed)
    }

    pub fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<bool, HpackError> {
        let mut at = 0;
        let mut list = 0;
        let mut fits = true;
        let mut any = false;
        while at < block.len() {
            let b = block[at];
            let (n, v, add) = if b & 0x80 != 0 {
                let (n, v) = self.get(int(block, &mut at, 7)?)?;
                (n, v, false)
            } else if b & 0xe0 == 0x20 {
                if any {
                    return Err(HpackError::Malformed);
                }
                let n = int(block, &mut at, 5)?;
                if n > self.limit {
                    return Err(HpackError::Malformed);
                }
                self.max = n;
                self.evict();
                continue;
            } else {
                let (prefix, add) = if b & 0x40 != 0 { (6, true) } else { (4, false) };
                let i = int(block, &mut at, prefix)?;
                let n = if i == 0 {
                    string(block, &mut at)?.to_vec()
                } else {
                    self.get(i)?.0
                };
                let v = string(block, &mut at)?.to_vec();
                (n, v, add)
            };
            any = true;
            list += n.len() + v.len() + 32;
            if list > max_list_size {
                fits = false;
            }
            if fits {
                field(&n, &v);
            }
            if add {
                self.size += n.len() + v.len() + 32;
                self.table.push_front((n, v));
                self.evict();
            }
        }
        Ok(fits)
    }
}

#[derive(Default)]
pub struct Encoder;

fn put_int(out: &mut Vec<u8>, first: u8, prefix: u8, mut v: usize) {
    let max = (1usize << prefix) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder
    }

    pub fn status(&mut self, code: u16, out: &mut Vec<u8>) {
        match code {
            200 => out.push(0x88),
            204 => out.push(0x89),
            206 => out.push(0x8a),
            304 => out.push(0x8b),
            400 => out.push(0x8c),
            404 => out.push(0x8d),
            500 => out.push(0x8e),
            _ => {
                out.push(0x08);
                out.push(3);
                out.extend_from_slice(format!("{code:03}").as_bytes());
            }
        }
    }

    pub fn field(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        out.push(0);
        put_int(out, 0, 7, name.len());
        out.extend_from_slice(name);
        put_int(out, 0, 7, value.len());
        out.extend_from_slice(value);
    }
}
