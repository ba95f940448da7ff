//! DNS wire format (RFC 1035, EDNS(0) RFC 6891, Client Subnet RFC 7871):
//! a strict parser for queries and a writer for the answers an
//! authoritative server gives. Pure functions over byte slices, no sockets,
//! so they are unit-tested and fuzzed alone (`fuzz/fuzz_targets/dns_query.rs`).
//!
//! Only what an authoritative server needs is parsed: the header, exactly
//! one question, and the OPT record with its Client Subnet option. Every
//! length is checked against the packet and every name against RFC 1035's
//! limits, so no input can panic or allocate more than one packet's worth.

use std::net::IpAddr;

/// Record types the router answers for.
pub const TYPE_A: u16 = 1;
pub const TYPE_NS: u16 = 2;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_SOA: u16 = 6;
pub const TYPE_HINFO: u16 = 13;
pub const TYPE_AAAA: u16 = 28;
pub const TYPE_OPT: u16 = 41;
pub const TYPE_IXFR: u16 = 251;
pub const TYPE_AXFR: u16 = 252;
pub const TYPE_ANY: u16 = 255;
/// Meta-types and question-only types (RFC 6895 §3.1): 128–255.
pub const META_TYPES: std::ops::RangeInclusive<u16> = 128..=255;
pub const CLASS_IN: u16 = 1;
const OPT_CLIENT_SUBNET: u16 = 8;

/// Response codes (the low 4 bits; BADVERS needs the OPT extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError = 0,
    FormErr = 1,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
    /// Extended rcode 16: an EDNS version we do not speak.
    BadVers = 16,
}

impl Rcode {
    pub fn as_str(self) -> &'static str {
        match self {
            Rcode::NoError => "NOERROR",
            Rcode::FormErr => "FORMERR",
            Rcode::NxDomain => "NXDOMAIN",
            Rcode::NotImp => "NOTIMP",
            Rcode::Refused => "REFUSED",
            Rcode::BadVers => "BADVERS",
        }
    }
}

/// Maximum encoded name length (RFC 1035 §2.3.4).
pub const MAX_NAME: usize = 255;

/// A domain name in wire form (length-prefixed labels, root label last),
/// lower-cased for lookups.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Name {
    wire: Vec<u8>,
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.wire.len() <= 1 {
            return f.write_str(".");
        }
        for label in self.labels() {
            for &b in label {
                if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                    write!(f, "{}", b as char)?;
                } else {
                    write!(f, "\\{:03}", b)?;
                }
            }
            f.write_str(".")?;
        }
        Ok(())
    }
}

/// Why a name given as text is not a valid domain name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty label in '{0}'")]
    EmptyLabel(String),
    #[error("label longer than 63 bytes in '{0}'")]
    LongLabel(String),
    #[error("name longer than 255 bytes: '{0}'")]
    LongName(String),
    #[error("invalid character in '{0}' (letters, digits, '-' and '_' only)")]
    BadChar(String),
}

impl Name {
    /// The root name `.`.
    pub fn root() -> Name {
        Name { wire: vec![0] }
    }

    /// Parses `video.demo.example` or `video.demo.example.` (hostnames:
    /// letters, digits, `-` and `_`), lower-cased.
    pub fn parse(text: &str) -> Result<Name, NameError> {
        let t = text.strip_suffix('.').unwrap_or(text);
        let mut wire = Vec::with_capacity(t.len() + 2);
        if !t.is_empty() {
            for label in t.split('.') {
                if label.is_empty() {
                    return Err(NameError::EmptyLabel(text.into()));
                }
                if label.len() > 63 {
                    return Err(NameError::LongLabel(text.into()));
                }
                if !label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(NameError::BadChar(text.into()));
                }
                wire.push(label.len() as u8);
                wire.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
            }
        }
        wire.push(0);
        if wire.len() > MAX_NAME {
            return Err(NameError::LongName(text.into()));
        }
        Ok(Name { wire })
    }

    /// Wraps wire bytes already validated and lower-cased.
    fn from_wire(wire: &[u8]) -> Name {
        Name {
            wire: wire.to_vec(),
        }
    }

    /// The encoded form.
    pub fn wire(&self) -> &[u8] {
        &self.wire
    }

    fn labels(&self) -> impl Iterator<Item = &[u8]> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let len = *self.wire.get(at)? as usize;
            if len == 0 {
                return None;
            }
            let l = &self.wire[at + 1..at + 1 + len];
            at += 1 + len;
            Some(l)
        })
    }

    /// The suffixes of this name from itself up to the root.
    pub fn ancestors(&self) -> impl Iterator<Item = &[u8]> {
        let mut at = Some(0usize);
        std::iter::from_fn(move || {
            let a = at?;
            let len = self.wire[a] as usize;
            at = if len == 0 { None } else { Some(a + 1 + len) };
            Some(&self.wire[a..])
        })
    }
}

/// EDNS Client Subnet option of a query (RFC 7871 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSubnet {
    pub address: IpAddr,
    pub source_prefix: u8,
}

/// The EDNS(0) OPT pseudo-record of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edns {
    /// Requester's UDP payload size (at least 512).
    pub udp_size: u16,
    pub version: u8,
    pub dnssec_ok: bool,
    pub client_subnet: Option<ClientSubnet>,
}

/// A parsed query: the one question plus what the answer depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    pub opcode: u8,
    pub recursion_desired: bool,
    pub checking_disabled: bool,
    /// The question name, lower-cased.
    pub qname: Name,
    pub qtype: u16,
    pub qclass: u16,
    /// End of the question section in the packet: the answer echoes
    /// `packet[12..question_end]` verbatim (keeps the asker's 0x20 case).
    pub question_end: usize,
    pub edns: Option<Edns>,
}

/// Why a packet is not an answerable query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// Too short for a header, or a response (QR set): drop without answer,
    /// never reflect at a spoofed source.
    Ignore,
    /// Answer with this rcode, echoing the header (and question if parsed).
    Reply {
        id: u16,
        rd: bool,
        rcode: Rcode,
        opcode: u8,
    },
}

struct Reader<'a> {
    p: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn u16(&mut self) -> Option<u16> {
        let b = self.p.get(self.at..self.at + 2)?;
        self.at += 2;
        Some(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.p.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.p.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(b)
    }

    /// Reads a name, following compression pointers (only backwards, at
    /// most 64 hops), into lower-cased wire form.
    fn name(&mut self, out: &mut Vec<u8>) -> Option<()> {
        out.clear();
        let mut at = self.at;
        let mut jumped = false;
        let mut hops = 0;
        loop {
            let len = *self.p.get(at)?;
            match len & 0xC0 {
                0x00 => {
                    let len = len as usize;
                    if out.len() + 1 + len > MAX_NAME {
                        return None;
                    }
                    out.push(len as u8);
                    if len == 0 {
                        if !jumped {
                            self.at = at + 1;
                        }
                        return Some(());
                    }
                    let label = self.p.get(at + 1..at + 1 + len)?;
                    out.extend(label.iter().map(|b| b.to_ascii_lowercase()));
                    at += 1 + len;
                }
                0xC0 => {
                    let ptr = (((len & 0x3F) as usize) << 8) | *self.p.get(at + 1)? as usize;
                    if ptr >= at || hops >= 64 {
                        return None;
                    }
                    hops += 1;
                    if !jumped {
                        self.at = at + 2;
                        jumped = true;
                    }
                    at = ptr;
                }
                _ => return None, // 0x40 / 0x80: obsolete label types
            }
        }
    }
}

/// Parses a query packet.
pub fn parse_query(p: &[u8]) -> Result<Query, QueryError> {
    if p.len() < 12 {
        return Err(QueryError::Ignore);
    }
    let id = u16::from_be_bytes([p[0], p[1]]);
    let flags = u16::from_be_bytes([p[2], p[3]]);
    if flags & 0x8000 != 0 {
        return Err(QueryError::Ignore);
    }
    let opcode = ((flags >> 11) & 0xF) as u8;
    let rd = flags & 0x0100 != 0;
    let cd = flags & 0x0010 != 0;
    let reply = |rcode| QueryError::Reply {
        id,
        rd,
        rcode,
        opcode,
    };
    if opcode != 0 {
        return Err(reply(Rcode::NotImp));
    }
    let qd = u16::from_be_bytes([p[4], p[5]]);
    let an = u16::from_be_bytes([p[6], p[7]]);
    let ns = u16::from_be_bytes([p[8], p[9]]);
    let ar = u16::from_be_bytes([p[10], p[11]]);
    if qd != 1 {
        return Err(reply(Rcode::FormErr));
    }
    let mut r = Reader { p, at: 12 };
    let mut name = Vec::with_capacity(64);
    r.name(&mut name).ok_or(reply(Rcode::FormErr))?;
    let qtype = r.u16().ok_or(reply(Rcode::FormErr))?;
    let qclass = r.u16().ok_or(reply(Rcode::FormErr))?;
    let question_end = r.at;
    let qname = Name::from_wire(&name);
    // Skip answer and authority records (normally none in a query).
    let mut scratch = Vec::with_capacity(64);
    for _ in 0..(an as u32 + ns as u32) {
        r.name(&mut scratch).ok_or(reply(Rcode::FormErr))?;
        r.bytes(8).ok_or(reply(Rcode::FormErr))?;
        let len = r.u16().ok_or(reply(Rcode::FormErr))? as usize;
        r.bytes(len).ok_or(reply(Rcode::FormErr))?;
    }
    let mut edns = None;
    for _ in 0..ar {
        r.name(&mut scratch).ok_or(reply(Rcode::FormErr))?;
        let rtype = r.u16().ok_or(reply(Rcode::FormErr))?;
        let class = r.u16().ok_or(reply(Rcode::FormErr))?;
        let ttl = r.u32().ok_or(reply(Rcode::FormErr))?;
        let len = r.u16().ok_or(reply(Rcode::FormErr))? as usize;
        let rdata = r.bytes(len).ok_or(reply(Rcode::FormErr))?;
        if rtype != TYPE_OPT {
            continue;
        }
        // One OPT, owned by the root (RFC 6891 §6.1.1).
        if edns.is_some() || scratch != [0] {
            return Err(reply(Rcode::FormErr));
        }
        let version = (ttl >> 16) as u8;
        let mut e = Edns {
            udp_size: class.max(512),
            version,
            dnssec_ok: ttl & 0x8000 != 0,
            client_subnet: None,
        };
        let mut o = Reader { p: rdata, at: 0 };
        while o.at < rdata.len() {
            let code = o.u16().ok_or(reply(Rcode::FormErr))?;
            let olen = o.u16().ok_or(reply(Rcode::FormErr))? as usize;
            let data = o.bytes(olen).ok_or(reply(Rcode::FormErr))?;
            if code == OPT_CLIENT_SUBNET {
                if e.client_subnet.is_some() {
                    return Err(reply(Rcode::FormErr));
                }
                e.client_subnet = Some(parse_client_subnet(data).ok_or(reply(Rcode::FormErr))?);
            }
        }
        edns = Some(e);
    }
    if r.at != p.len() {
        // Trailing garbage: tolerated by most servers; so are we, but it is
        // never interpreted.
    }
    Ok(Query {
        id,
        opcode,
        recursion_desired: rd,
        checking_disabled: cd,
        qname,
        qtype,
        qclass,
        question_end,
        edns,
    })
}

/// RFC 7871 §6: FAMILY, SOURCE PREFIX-LENGTH, SCOPE PREFIX-LENGTH (0 in
/// queries), ADDRESS truncated to the prefix, with no bits set past it.
fn parse_client_subnet(d: &[u8]) -> Option<ClientSubnet> {
    if d.len() < 4 {
        return None;
    }
    let family = u16::from_be_bytes([d[0], d[1]]);
    let source = d[2];
    let scope = d[3];
    let addr = &d[4..];
    let max = match family {
        1 => 32,
        2 => 128,
        _ => return None,
    };
    if source > max || scope != 0 || addr.len() != (source as usize).div_ceil(8) {
        return None;
    }
    if !source.is_multiple_of(8) {
        let last = *addr.last()?;
        if last & (0xFFu8 >> (source % 8)) != 0 {
            return None;
        }
    }
    let address = if family == 1 {
        let mut b = [0u8; 4];
        b[..addr.len()].copy_from_slice(addr);
        IpAddr::from(b)
    } else {
        let mut b = [0u8; 16];
        b[..addr.len()].copy_from_slice(addr);
        IpAddr::from(b)
    };
    Some(ClientSubnet {
        address,
        source_prefix: source,
    })
}

/// Writes a response into a caller-owned buffer (reused across queries).
pub struct ResponseWriter<'b> {
    buf: &'b mut Vec<u8>,
    counts: [u16; 3],
    section: usize,
}

/// Header fields of a response.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHeader {
    pub id: u16,
    pub opcode: u8,
    pub rd: bool,
    pub cd: bool,
    pub authoritative: bool,
    pub rcode: Rcode,
}

impl<'b> ResponseWriter<'b> {
    /// Starts a response echoing `question` (the raw question section, may
    /// be empty for errors before it was parsed).
    pub fn new(buf: &'b mut Vec<u8>, h: ResponseHeader, question: &[u8]) -> Self {
        buf.clear();
        let mut flags: u16 = 0x8000 | ((h.opcode as u16 & 0xF) << 11);
        if h.authoritative {
            flags |= 0x0400;
        }
        if h.rd {
            flags |= 0x0100;
        }
        if h.cd {
            flags |= 0x0010;
        }
        flags |= (h.rcode as u16) & 0xF;
        buf.extend_from_slice(&h.id.to_be_bytes());
        buf.extend_from_slice(&flags.to_be_bytes());
        buf.extend_from_slice(&[0, (!question.is_empty()) as u8, 0, 0, 0, 0, 0, 0]);
        buf.extend_from_slice(question);
        ResponseWriter {
            buf,
            counts: [0; 3],
            section: 0,
        }
    }

    /// Following records go to the authority section.
    pub fn authority(&mut self) {
        self.section = 1;
    }

    /// Following records go to the additional section.
    pub fn additional(&mut self) {
        self.section = 2;
    }

    fn record_head(&mut self, owner: Option<&Name>, rtype: u16, class: u16, ttl: u32) {
        match owner {
            // A pointer to the question name at offset 12.
            None => self.buf.extend_from_slice(&[0xC0, 0x0C]),
            Some(n) => self.buf.extend_from_slice(n.wire()),
        }
        self.buf.extend_from_slice(&rtype.to_be_bytes());
        self.buf.extend_from_slice(&class.to_be_bytes());
        self.buf.extend_from_slice(&ttl.to_be_bytes());
        self.counts[self.section] += 1;
    }

    /// An A or AAAA record (`owner` `None` = the question name).
    pub fn address(&mut self, owner: Option<&Name>, ip: IpAddr, ttl: u32) {
        match ip {
            IpAddr::V4(v4) => {
                self.record_head(owner, TYPE_A, CLASS_IN, ttl);
                self.buf.extend_from_slice(&4u16.to_be_bytes());
                self.buf.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                self.record_head(owner, TYPE_AAAA, CLASS_IN, ttl);
                self.buf.extend_from_slice(&16u16.to_be_bytes());
                self.buf.extend_from_slice(&v6.octets());
            }
        }
    }

    /// A record whose data is one name (NS, CNAME).
    pub fn name_record(&mut self, owner: Option<&Name>, rtype: u16, target: &Name, ttl: u32) {
        self.record_head(owner, rtype, CLASS_IN, ttl);
        self.buf
            .extend_from_slice(&(target.wire().len() as u16).to_be_bytes());
        self.buf.extend_from_slice(target.wire());
    }

    /// An SOA record.
    pub fn soa(&mut self, owner: Option<&Name>, soa: &Soa, ttl: u32) {
        self.record_head(owner, TYPE_SOA, CLASS_IN, ttl);
        let len = soa.mname.wire().len() + soa.rname.wire().len() + 20;
        self.buf.extend_from_slice(&(len as u16).to_be_bytes());
        self.buf.extend_from_slice(soa.mname.wire());
        self.buf.extend_from_slice(soa.rname.wire());
        for v in [soa.serial, soa.refresh, soa.retry, soa.expire, soa.minimum] {
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// RFC 8482's answer to ANY: one synthesized HINFO.
    pub fn hinfo_rfc8482(&mut self, ttl: u32) {
        self.record_head(None, TYPE_HINFO, CLASS_IN, ttl);
        self.buf.extend_from_slice(&9u16.to_be_bytes());
        self.buf.extend_from_slice(&[7]);
        self.buf.extend_from_slice(b"RFC8482");
        self.buf.push(0);
    }

    /// The OPT record of an EDNS answer, with the Client Subnet option
    /// echoed (RFC 7871 §7.2.1: same family, source prefix and address, plus
    /// the scope we answered for) when the query had one.
    pub fn opt(&mut self, udp_size: u16, ext_rcode: u8, subnet: Option<(ClientSubnet, u8)>) {
        self.buf.push(0);
        self.buf.extend_from_slice(&TYPE_OPT.to_be_bytes());
        self.buf.extend_from_slice(&udp_size.to_be_bytes());
        self.buf.extend_from_slice(&[ext_rcode, 0, 0, 0]);
        match subnet {
            None => self.buf.extend_from_slice(&0u16.to_be_bytes()),
            Some((cs, scope)) => {
                let n = (cs.source_prefix as usize).div_ceil(8);
                let (family, bytes): (u16, Vec<u8>) = match cs.address {
                    IpAddr::V4(a) => (1, a.octets()[..n].to_vec()),
                    IpAddr::V6(a) => (2, a.octets()[..n].to_vec()),
                };
                self.buf.extend_from_slice(&((8 + n) as u16).to_be_bytes());
                self.buf.extend_from_slice(&OPT_CLIENT_SUBNET.to_be_bytes());
                self.buf.extend_from_slice(&((4 + n) as u16).to_be_bytes());
                self.buf.extend_from_slice(&family.to_be_bytes());
                self.buf.extend_from_slice(&[cs.source_prefix, scope]);
                self.buf.extend_from_slice(&bytes);
            }
        }
        self.counts[2] += 1;
    }

    /// Drops every record and sets TC: the answer did not
    /// fit, the client retries over TCP (RFC 1035 §4.2.1, RFC 7766).
    pub fn truncate_to_question(&mut self, question_end: usize) {
        self.buf.truncate(question_end);
        self.counts = [0; 3];
        self.buf[2] |= 0x02;
    }

    /// Writes the section counts into the header.
    pub fn finish(self) {
        for (i, c) in self.counts.iter().enumerate() {
            let at = 6 + 2 * i;
            self.buf[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
    }
}

/// SOA fields of a zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Soa {
    pub mname: Name,
    pub rname: Name,
    pub serial: u32,
    pub refresh: u32,
    pub retry: u32,
    pub expire: u32,
    /// Negative-caching TTL (RFC 2308).
    pub minimum: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// A query as a resolver sends it, optionally with EDNS and ECS.
    pub(crate) fn query(name: &str, qtype: u16, ecs: Option<(&[u8], u16, u8)>) -> Vec<u8> {
        let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.trim_end_matches('.').split('.') {
            p.push(l.len() as u8);
            p.extend_from_slice(l.as_bytes());
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&CLASS_IN.to_be_bytes());
        if let Some((addr, family, prefix)) = ecs {
            p[11] = 1;
            p.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0]);
            let olen = 4 + addr.len();
            p.extend_from_slice(&((olen + 4) as u16).to_be_bytes());
            p.extend_from_slice(&8u16.to_be_bytes());
            p.extend_from_slice(&(olen as u16).to_be_bytes());
            p.extend_from_slice(&family.to_be_bytes());
            p.extend_from_slice(&[prefix, 0]);
            p.extend_from_slice(addr);
        }
        p
    }

    #[test]
    fn parses_a_plain_query() {
        let q = parse_query(&query("Video.Demo.Example", TYPE_A, None)).unwrap();
        assert_eq!(q.id, 0x1234);
        assert!(q.recursion_desired);
        assert_eq!(q.qname, Name::parse("video.demo.example").unwrap());
        assert_eq!(q.qtype, TYPE_A);
        assert_eq!(q.edns, None);
        assert_eq!(q.qname.to_string(), "video.demo.example.");
    }

    #[test]
    fn parses_client_subnet() {
        let q = parse_query(&query("a.example", TYPE_A, Some((&[127, 1, 0], 1, 24)))).unwrap();
        let e = q.edns.unwrap();
        assert_eq!(e.udp_size, 1232);
        assert_eq!(
            e.client_subnet,
            Some(ClientSubnet {
                address: IpAddr::V4(Ipv4Addr::new(127, 1, 0, 0)),
                source_prefix: 24
            })
        );
        // Address bytes longer than the prefix, bits past the prefix, a
        // non-zero scope, an unknown family: all FORMERR.
        for bad in [
            query("a.example", TYPE_A, Some((&[127, 1, 0, 0], 1, 24))),
            query("a.example", TYPE_A, Some((&[127, 1, 1], 1, 23))),
            query("a.example", TYPE_A, Some((&[127, 1, 0], 3, 24))),
            query("a.example", TYPE_A, Some((&[127], 1, 33))),
        ] {
            assert!(matches!(
                parse_query(&bad),
                Err(QueryError::Reply {
                    rcode: Rcode::FormErr,
                    ..
                })
            ));
        }
        let mut nonzero_scope = query("a.example", TYPE_A, Some((&[127, 1, 0], 1, 24)));
        let n = nonzero_scope.len();
        nonzero_scope[n - 4] = 8;
        assert!(parse_query(&nonzero_scope).is_err());
    }

    #[test]
    fn rejects_what_is_not_one_query() {
        assert_eq!(parse_query(&[0; 11]), Err(QueryError::Ignore));
        let mut resp = query("a.example", TYPE_A, None);
        resp[2] |= 0x80;
        assert_eq!(parse_query(&resp), Err(QueryError::Ignore));
        let mut two = query("a.example", TYPE_A, None);
        two[5] = 2;
        assert!(matches!(
            parse_query(&two),
            Err(QueryError::Reply {
                rcode: Rcode::FormErr,
                ..
            })
        ));
        let mut notify = query("a.example", TYPE_A, None);
        notify[2] = 0x20; // opcode 4
        assert!(matches!(
            parse_query(&notify),
            Err(QueryError::Reply {
                rcode: Rcode::NotImp,
                ..
            })
        ));
        // A name running off the end, a pointer loop, a forward pointer.
        let mut cut = query("abc.example", TYPE_A, None);
        cut.truncate(15);
        assert!(parse_query(&cut).is_err());
        let looped = [0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 12, 0, 1, 0, 1];
        assert!(parse_query(&looped).is_err());
        let forward = [0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xC0, 14, 0, 0, 1, 0, 1];
        assert!(parse_query(&forward).is_err());
    }

    #[test]
    fn rejects_names_over_255_bytes() {
        let long = vec!["a".repeat(63); 4].join(".");
        assert!(parse_query(&query(&long, TYPE_A, None)).is_err());
        assert!(Name::parse(&long).is_err());
        let ok = vec!["a".repeat(63); 3].join(".");
        assert!(parse_query(&query(&ok, TYPE_A, None)).is_ok());
    }

    #[test]
    fn writes_an_answer_with_counts_and_ecs() {
        let p = query("a.example", TYPE_A, Some((&[127, 1, 0], 1, 24)));
        let q = parse_query(&p).unwrap();
        let mut buf = Vec::new();
        let h = ResponseHeader {
            id: q.id,
            opcode: 0,
            rd: true,
            cd: false,
            authoritative: true,
            rcode: Rcode::NoError,
        };
        let mut w = ResponseWriter::new(&mut buf, h, &p[12..q.question_end]);
        w.address(None, "127.10.0.1".parse().unwrap(), 20);
        w.additional();
        w.opt(1232, 0, Some((q.edns.unwrap().client_subnet.unwrap(), 16)));
        w.finish();
        assert_eq!(&buf[..2], &[0x12, 0x34]);
        assert_eq!(buf[2], 0x85); // QR, AA, RD
        assert_eq!(&buf[4..12], &[0, 1, 0, 1, 0, 0, 0, 1]);
        assert_eq!(&buf[buf.len() - 5..], &[24, 16, 127, 1, 0]);
    }

    #[test]
    fn name_helpers() {
        let n = Name::parse("a.b.example.").unwrap();
        let anc: Vec<Name> = n.ancestors().map(Name::from_wire).collect();
        assert_eq!(anc.len(), 4);
        assert_eq!(anc[3], Name::root());
        assert!(Name::parse("a..b").is_err());
        assert!(Name::parse("a b").is_err());
        assert_eq!(Name::parse(".").unwrap(), Name::root());
    }
}
