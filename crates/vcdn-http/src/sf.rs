//! Structured Field Values (RFC 8941): a strict parser and a serialiser of
//! the Dictionary type, with every Item type of RFC 8941 (Integer, Decimal,
//! String, Token, Byte Sequence, Boolean), Parameters and Inner Lists.
//!
//! Why a parser of our own: targeted cache-control fields
//! (`CDN-Cache-Control`, RFC 9213) are Dictionaries, and RFC 9213 §2.1 says a
//! field that fails to parse is ignored as a whole, so the cache needs the
//! exact RFC 8941 §4.2 algorithms, not a lenient split on commas. The code
//! follows those algorithms step by step (the section of each is in its doc
//! comment): any syntax error fails the whole field, whitespace is SP only
//! except OWS around the commas of a Dictionary, keys are lowercase, an
//! Integer has at most 15 digits, a Decimal at most 12 integer and 3
//! fractional digits, a later duplicate key overrides an earlier one (in
//! the earlier one's position), and several field lines are combined with
//! a comma before parsing (RFC 8941 §4.2).
//!
//! Limits beyond the RFC's minimums (§3: 1024 members, 256 parameters, 256
//! inner-list members) fail the field, so no input makes the parser spend
//! more than linear time or memory in its length.

use std::fmt::Write as _;

/// Most members of a Dictionary (RFC 8941 §3.2 asks for at least 1024).
pub const MAX_MEMBERS: usize = 1024;
/// Most parameters of one Item or Inner List (§3.1.2 asks for 256).
pub const MAX_PARAMS: usize = 256;
/// Most members of one Inner List (§3.1.1 asks for 256).
pub const MAX_INNER: usize = 256;

/// Largest magnitude of an Integer (§3.3.1): 15 decimal digits.
const MAX_INTEGER: i64 = 999_999_999_999_999;

/// A Decimal (§3.3.2), kept exactly as thousandths: at most 12 integer
/// digits and 3 fractional ones, so an `i64` holds every value and there is
/// no rounding on the way in or out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Decimal {
    pub thousandths: i64,
}

impl Decimal {
    pub fn as_f64(self) -> f64 {
        self.thousandths as f64 / 1000.0
    }
}

/// A Bare Item (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BareItem {
    Integer(i64),
    Decimal(Decimal),
    String(String),
    Token(String),
    ByteSequence(Vec<u8>),
    Boolean(bool),
}

/// Parameters (§3.1.2): keys unique, in order of first appearance.
pub type Parameters = Vec<(String, BareItem)>;

/// An Item (§3.3): a bare item with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub bare: BareItem,
    pub params: Parameters,
}

/// The value of a Dictionary member (§3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Member {
    Item(Item),
    InnerList(Vec<Item>, Parameters),
}

impl Member {
    /// The bare item of a member that is an Item (not an Inner List).
    pub fn bare(&self) -> Option<&BareItem> {
        match self {
            Member::Item(i) => Some(&i.bare),
            Member::InnerList(..) => None,
        }
    }
}

/// A Dictionary (§3.2): keys unique, in order of first appearance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dictionary(pub Vec<(String, Member)>);

impl Dictionary {
    pub fn get(&self, key: &str) -> Option<&Member> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, m)| m)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Member)> {
        self.0.iter().map(|(k, m)| (k.as_str(), m))
    }
}

/// Why a field failed to parse. The field is then ignored as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid structured field at byte {at}: {what}")]
pub struct SfError {
    pub at: usize,
    pub what: &'static str,
}

/// Parse the field lines of one field as a Dictionary: the lines are
/// combined with ", " (RFC 8941 §4.2, RFC 9110 §5.3) and parsed as one
/// value (§4.2 "Parsing Structured Fields" with type Dictionary).
pub fn parse_dictionary_lines<'a, I>(lines: I) -> Result<Dictionary, SfError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut joined = Vec::new();
    for (i, l) in lines.into_iter().enumerate() {
        if i > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(l);
    }
    parse_dictionary(&joined)
}

/// Parse one field value as a Dictionary (RFC 8941 §4.2).
pub fn parse_dictionary(input: &[u8]) -> Result<Dictionary, SfError> {
    // §4.2 step 1: the input must be ASCII.
    if let Some(at) = input.iter().position(|c| !c.is_ascii()) {
        return Err(SfError {
            at,
            what: "a byte outside ASCII",
        });
    }
    let mut p = Parser { s: input, at: 0 };
    p.skip_sp(); // step 2: discard leading SP
    let dict = p.dictionary()?;
    p.skip_sp(); // step 6: discard leading SP
    if !p.done() {
        return Err(p.err("characters after the end of the dictionary"));
    }
    Ok(dict)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.at >= self.s.len()
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }
    fn err(&self, what: &'static str) -> SfError {
        SfError { at: self.at, what }
    }
    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.at += 1;
        }
    }
    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// §4.2.2 Parsing a Dictionary.
    fn dictionary(&mut self) -> Result<Dictionary, SfError> {
        let mut dict: Vec<(String, Member)> = Vec::new();
        while !self.done() {
            let key = self.key()?;
            let member = if self.peek() == Some(b'=') {
                self.at += 1;
                self.item_or_inner_list()?
            } else {
                Member::Item(Item {
                    bare: BareItem::Boolean(true),
                    params: self.parameters()?,
                })
            };
            if !upsert(&mut dict, key, member, MAX_MEMBERS) {
                return Err(self.err("more dictionary members than this parser takes"));
            }
            self.skip_ows();
            if self.done() {
                break;
            }
            if self.peek() != Some(b',') {
                return Err(self.err("expected a comma between dictionary members"));
            }
            self.at += 1;
            self.skip_ows();
            if self.done() {
                return Err(self.err("a trailing comma"));
            }
        }
        Ok(Dictionary(dict))
    }

    /// §4.2.1.1 Parsing an Item or Inner List.
    fn item_or_inner_list(&mut self) -> Result<Member, SfError> {
        if self.peek() == Some(b'(') {
            let (items, params) = self.inner_list()?;
            Ok(Member::InnerList(items, params))
        } else {
            Ok(Member::Item(self.item()?))
        }
    }

    /// §4.2.1.2 Parsing an Inner List.
    fn inner_list(&mut self) -> Result<(Vec<Item>, Parameters), SfError> {
        self.at += 1; // '('
        let mut items = Vec::new();
        while !self.done() {
            self.skip_sp();
            if self.done() {
                break;
            }
            if self.peek() == Some(b')') {
                self.at += 1;
                let params = self.parameters()?;
                return Ok((items, params));
            }
            if items.len() >= MAX_INNER {
                return Err(self.err("more inner-list members than this parser takes"));
            }
            items.push(self.item()?);
            if !matches!(self.peek(), Some(b' ' | b')')) {
                return Err(self.err("expected a space or ')' after an inner-list member"));
            }
        }
        Err(self.err("an inner list without its ')'"))
    }

    /// §4.2.3 Parsing an Item.
    fn item(&mut self) -> Result<Item, SfError> {
        let bare = self.bare_item()?;
        let params = self.parameters()?;
        Ok(Item { bare, params })
    }

    /// §4.2.3.1 Parsing a Bare Item.
    fn bare_item(&mut self) -> Result<BareItem, SfError> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string().map(BareItem::String),
            Some(b'*' | b'A'..=b'Z' | b'a'..=b'z') => Ok(BareItem::Token(self.token())),
            Some(b':') => self.byte_sequence().map(BareItem::ByteSequence),
            Some(b'?') => self.boolean().map(BareItem::Boolean),
            Some(_) => Err(self.err("not the start of an item")),
            None => Err(self.err("an item is missing")),
        }
    }

    /// §4.2.3.2 Parsing Parameters.
    fn parameters(&mut self) -> Result<Parameters, SfError> {
        let mut params: Parameters = Vec::new();
        while self.peek() == Some(b';') {
            self.at += 1;
            self.skip_sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.at += 1;
                self.bare_item()?
            } else {
                BareItem::Boolean(true)
            };
            if !upsert(&mut params, key, value, MAX_PARAMS) {
                return Err(self.err("more parameters than this parser takes"));
            }
        }
        Ok(params)
    }

    /// §4.2.3.3 Parsing a Key: lcalpha or "*", then lcalpha, DIGIT, "_",
    /// "-", "." or "*".
    fn key(&mut self) -> Result<String, SfError> {
        if !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
            return Err(self.err("a key must start with a lowercase letter or '*'"));
        }
        let start = self.at;
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.at += 1;
        }
        Ok(ascii(&self.s[start..self.at]))
    }

    /// §4.2.4 Parsing an Integer or Decimal.
    fn number(&mut self) -> Result<BareItem, SfError> {
        let mut negative = false;
        if self.peek() == Some(b'-') {
            self.at += 1;
            negative = true;
        }
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.err("a number must start with a digit"));
        }
        let start = self.at;
        let mut dot = None;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' => {}
                b'.' if dot.is_none() => {
                    if self.at - start > 12 {
                        return Err(self.err("a decimal has more than 12 integer digits"));
                    }
                    dot = Some(self.at);
                }
                _ => break,
            }
            self.at += 1;
            let len = self.at - start;
            if dot.is_none() && len > 15 {
                return Err(self.err("an integer has more than 15 digits"));
            }
            if dot.is_some() && len > 16 {
                return Err(self.err("a decimal has more than 16 characters"));
            }
        }
        let digits = |s: &[u8]| s.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
        let sign = if negative { -1 } else { 1 };
        match dot {
            None => Ok(BareItem::Integer(sign * digits(&self.s[start..self.at]))),
            Some(d) => {
                let frac = &self.s[d + 1..self.at];
                if frac.is_empty() {
                    return Err(self.err("a decimal ends with '.'"));
                }
                if frac.len() > 3 {
                    return Err(self.err("a decimal has more than 3 fractional digits"));
                }
                let scale = [100, 10, 1][frac.len() - 1];
                let whole = digits(&self.s[start..d]);
                Ok(BareItem::Decimal(Decimal {
                    thousandths: sign * (whole * 1000 + digits(frac) * scale),
                }))
            }
        }
    }

    /// §4.2.5 Parsing a String: printable ASCII, with `\"` and `\\` the only
    /// escapes.
    fn string(&mut self) -> Result<String, SfError> {
        self.at += 1; // '"'
        let mut out = String::new();
        while let Some(c) = self.peek() {
            self.at += 1;
            match c {
                b'\\' => match self.peek() {
                    Some(n @ (b'"' | b'\\')) => {
                        self.at += 1;
                        out.push(n as char);
                    }
                    Some(_) => {
                        return Err(
                            self.err("a backslash before a character other than '\"' or '\\'")
                        )
                    }
                    None => return Err(self.err("a string ends in a backslash")),
                },
                b'"' => return Ok(out),
                0x00..=0x1f | 0x7f..=0xff => {
                    return Err(self.err("a control character in a string"));
                }
                _ => out.push(c as char),
            }
        }
        Err(self.err("a string without its closing '\"'"))
    }

    /// §4.2.6 Parsing a Token: tchar, ":" and "/" after the first character.
    fn token(&mut self) -> String {
        let start = self.at;
        self.at += 1;
        while self
            .peek()
            .is_some_and(|c| is_tchar(c) || c == b':' || c == b'/')
        {
            self.at += 1;
        }
        ascii(&self.s[start..self.at])
    }

    /// §4.2.7 Parsing a Byte Sequence: base64 between colons. Missing "="
    /// padding and non-zero pad bits are accepted (the RFC's SHOULD NOT
    /// fail).
    fn byte_sequence(&mut self) -> Result<Vec<u8>, SfError> {
        self.at += 1; // ':'
        let start = self.at;
        let Some(len) = self.s[start..].iter().position(|&c| c == b':') else {
            return Err(self.err("a byte sequence without its closing ':'"));
        };
        let b64 = &self.s[start..start + len];
        if !b64
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
        {
            return Err(self.err("a character outside base64 in a byte sequence"));
        }
        self.at = start + len + 1;
        base64_decode(b64).ok_or(SfError {
            at: start,
            what: "malformed base64 in a byte sequence",
        })
    }

    /// §4.2.8 Parsing a Boolean.
    fn boolean(&mut self) -> Result<bool, SfError> {
        self.at += 1; // '?'
        let v = match self.peek() {
            Some(b'1') => true,
            Some(b'0') => false,
            _ => return Err(self.err("a boolean must be ?0 or ?1")),
        };
        self.at += 1;
        Ok(v)
    }
}

/// Set `key` to `value`: a key seen before keeps its position and takes the
/// new value (§4.2.2, §4.2.3.2). False when a new key would pass `max`.
fn upsert<V>(map: &mut Vec<(String, V)>, key: String, value: V, max: usize) -> bool {
    if let Some(slot) = map.iter_mut().find(|(k, _)| *k == key) {
        slot.1 = value;
    } else if map.len() >= max {
        return false;
    } else {
        map.push((key, value));
    }
    true
}

fn ascii(b: &[u8]) -> String {
    b.iter().map(|&c| c as char).collect()
}

/// tchar of RFC 9110 §5.6.2.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Decode base64 (RFC 4648 §4). "=" only at the end (at most two, and not
/// needed); a lone final character (6 bits, not a byte) is malformed.
fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let body_len = s.len() - s.iter().rev().take_while(|&&c| c == b'=').count();
    let (body, pad) = s.split_at(body_len);
    if pad.len() > 2 || body.contains(&b'=') || body.len() % 4 == 1 {
        return None;
    }
    if !pad.is_empty() && (body.len() + pad.len()) % 4 != 0 {
        return None;
    }
    let val = |c: u8| B64.iter().position(|&b| b == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    Some(out)
}

fn base64_encode(b: &[u8], out: &mut String) {
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | u32::from(c) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
}

/// Why a value cannot be serialised (RFC 8941 §4.1: out of range or a
/// character the type does not allow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot serialise a structured field: {0}")]
pub struct SerializeError(pub &'static str);

/// Serialise a Dictionary (RFC 8941 §4.1.2).
pub fn serialize_dictionary(d: &Dictionary) -> Result<String, SerializeError> {
    let mut out = String::new();
    for (i, (key, member)) in d.0.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        serialize_key(key, &mut out)?;
        match member {
            Member::Item(Item {
                bare: BareItem::Boolean(true),
                params,
            }) => serialize_params(params, &mut out)?,
            Member::Item(item) => {
                out.push('=');
                serialize_item(item, &mut out)?;
            }
            Member::InnerList(items, params) => {
                out.push_str("=(");
                for (j, item) in items.iter().enumerate() {
                    if j > 0 {
                        out.push(' ');
                    }
                    serialize_item(item, &mut out)?;
                }
                out.push(')');
                serialize_params(params, &mut out)?;
            }
        }
    }
    Ok(out)
}

fn serialize_item(item: &Item, out: &mut String) -> Result<(), SerializeError> {
    serialize_bare(&item.bare, out)?;
    serialize_params(&item.params, out)
}

fn serialize_params(params: &Parameters, out: &mut String) -> Result<(), SerializeError> {
    for (key, value) in params {
        out.push(';');
        serialize_key(key, out)?;
        if *value != BareItem::Boolean(true) {
            out.push('=');
            serialize_bare(value, out)?;
        }
    }
    Ok(())
}

fn serialize_key(key: &str, out: &mut String) -> Result<(), SerializeError> {
    let b = key.as_bytes();
    let ok = matches!(b.first(), Some(b'a'..=b'z' | b'*'))
        && b.iter()
            .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'));
    if !ok {
        return Err(SerializeError("a key outside the key grammar"));
    }
    out.push_str(key);
    Ok(())
}

fn serialize_bare(b: &BareItem, out: &mut String) -> Result<(), SerializeError> {
    match b {
        BareItem::Integer(i) => {
            if !(-MAX_INTEGER..=MAX_INTEGER).contains(i) {
                return Err(SerializeError("an integer out of range"));
            }
            let _ = write!(out, "{i}");
        }
        BareItem::Decimal(d) => {
            let t = d.thousandths;
            if t.unsigned_abs() >= 1_000_000_000_000_000 {
                return Err(SerializeError("a decimal out of range"));
            }
            if t < 0 {
                out.push('-');
            }
            let (whole, frac) = (t.unsigned_abs() / 1000, t.unsigned_abs() % 1000);
            let mut f = format!("{frac:03}");
            while f.len() > 1 && f.ends_with('0') {
                f.pop();
            }
            let _ = write!(out, "{whole}.{f}");
        }
        BareItem::String(s) => {
            out.push('"');
            for c in s.chars() {
                if !(' '..='~').contains(&c) {
                    return Err(SerializeError(
                        "a string with a character outside printable ASCII",
                    ));
                }
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        }
        BareItem::Token(t) => {
            let b = t.as_bytes();
            let ok = matches!(b.first(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'*'))
                && b[1..]
                    .iter()
                    .all(|&c| is_tchar(c) || c == b':' || c == b'/');
            if !ok {
                return Err(SerializeError("a token outside the token grammar"));
            }
            out.push_str(t);
        }
        BareItem::ByteSequence(bytes) => {
            out.push(':');
            base64_encode(bytes, out);
            out.push(':');
        }
        BareItem::Boolean(v) => out.push_str(if *v { "?1" } else { "?0" }),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
