//! Header fields: an ordered list of name/value byte strings and the small
//! lexical helpers (tokens, OWS, comma lists) shared by both parsers.

use bytes::Bytes;

/// Header fields in arrival order; names compare case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    fields: Vec<(Bytes, Bytes)>,
}

impl Headers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        Headers {
            fields: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, name: impl Into<Bytes>, value: impl Into<Bytes>) {
        self.fields.push((name.into(), value.into()));
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &Bytes)> {
        self.fields.iter().map(|(n, v)| (n, v))
    }

    /// The first value of `name` (lower-case ASCII expected).
    pub fn get(&self, name: &[u8]) -> Option<&Bytes> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    pub fn get_str(&self, name: &[u8]) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn get_all<'a>(&'a self, name: &'a [u8]) -> impl Iterator<Item = &'a Bytes> + 'a {
        self.fields
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.get(name).is_some()
    }

    /// Remove every field called `name`.
    pub fn remove(&mut self, name: &[u8]) {
        self.fields.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    /// Replace every field called `name` with one value.
    pub fn set(&mut self, name: &'static str, value: impl Into<Bytes>) {
        self.remove(name.as_bytes());
        self.fields
            .push((Bytes::from_static(name.as_bytes()), value.into()));
    }

    /// Whether the comma-separated list in any `name` field holds `token`.
    pub fn has_token(&self, name: &[u8], token: &[u8]) -> bool {
        self.get_all(name)
            .flat_map(|v| list_items(v))
            .any(|t| t.eq_ignore_ascii_case(token))
    }

    /// Append `name: value\r\n` for every field to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        for (n, v) in &self.fields {
            out.extend_from_slice(n);
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Items of a comma-separated list, trimmed, empty ones skipped.
pub fn list_items(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&c| c == b',').filter_map(|item| {
        let (s, e) = trim_ows(item);
        (s < e).then(|| &item[s..e])
    })
}

/// Fields that describe one connection and are never forwarded nor stored
/// (RFC 9110 §7.6.1), plus those named in `Connection`.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    const HOP: [&[u8]; 8] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authorization",
    ];
    HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

pub fn find_crlf(b: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'\r', &b[from..]) {
        let i = from + i;
        match b.get(i + 1) {
            Some(b'\n') => return Some(i),
            Some(_) => from = i + 1,
            None => return None,
        }
    }
    None
}

/// tchar of RFC 9110 §5.6.2.
pub fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

pub fn is_token(b: &[u8]) -> bool {
    !b.is_empty() && b.iter().all(|&c| is_tchar(c))
}

/// Start and end of `v` without leading and trailing spaces and tabs.
pub fn trim_ows(v: &[u8]) -> (usize, usize) {
    let s = v
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(s, |i| i + 1);
    (s, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_in_lists() {
        let mut h = Headers::new();
        h.push("Connection", "keep-alive, Upgrade");
        assert!(h.has_token(b"connection", b"upgrade"));
        assert!(!h.has_token(b"connection", b"close"));
        assert_eq!(
            list_items(b" a ,, b\t,").collect::<Vec<_>>(),
            vec![&b"a"[..], b"b"]
        );
    }

    #[test]
    fn crlf_search() {
        assert_eq!(find_crlf(b"ab\rc\r\n"), Some(4));
        assert_eq!(find_crlf(b"ab\r"), None);
    }
}
