//! The authoritative answer to one query: geolocated A/AAAA for service
//! hostnames, SOA and NS at zone apexes, NXDOMAIN / NODATA / REFUSED where
//! they belong, EDNS Client Subnet echoed with the scope the answer used,
//! truncation when the answer does not fit the requester's UDP size.

use std::net::IpAddr;

use vcdn_policy::hashing;
use xxhash_rust::xxh3::xxh3_64;

use super::wire::{
    parse_query, ClientSubnet, Name, Query, QueryError, Rcode, ResponseHeader, ResponseWriter,
    CLASS_IN, META_TYPES, TYPE_A, TYPE_AAAA, TYPE_ANY, TYPE_AXFR, TYPE_CNAME, TYPE_IXFR, TYPE_NS,
    TYPE_SOA,
};
use crate::metrics::Metrics;
use crate::routing::Choice;
use crate::state::{Service, Snapshot};

/// Our largest UDP answer: the DNS Flag Day 2020 size, which avoids IP
/// fragmentation on every common path.
pub const MAX_UDP: usize = 1232;

/// The transport a query came over (TCP answers are not truncated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Answers `packet` from `src` into `out`. Returns `false` when nothing
/// must be sent (not a query).
pub fn answer(
    snap: &Snapshot,
    metrics: &Metrics,
    packet: &[u8],
    src: IpAddr,
    transport: Transport,
    out: &mut Vec<u8>,
) -> bool {
    let q = match parse_query(packet) {
        Ok(q) => q,
        Err(QueryError::Ignore) => {
            metrics
                .dns_dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        Err(QueryError::Reply {
            id,
            rd,
            rcode,
            opcode,
        }) => {
            let h = ResponseHeader {
                id,
                opcode,
                rd,
                cd: false,
                authoritative: false,
                rcode,
            };
            ResponseWriter::new(out, h, &[]).finish();
            metrics.count_rcode(rcode);
            return true;
        }
    };
    let question = &packet[12..q.question_end];
    let limit = match (transport, q.edns) {
        (Transport::Tcp, _) => 65535,
        (Transport::Udp, Some(e)) => (e.udp_size as usize).clamp(512, MAX_UDP),
        (Transport::Udp, None) => 512,
    };
    let rcode = build(snap, metrics, &q, question, src, out, false);
    if out.len() > limit {
        metrics
            .dns_truncated
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        build(snap, metrics, &q, question, src, out, true);
    }
    metrics.count_rcode(rcode);
    true
}

/// What the answer section holds.
enum Outcome<'a> {
    Addresses(Vec<IpAddr>),
    Cname(&'a Name),
    Soa,
    Ns,
    Any,
    NoData,
    NxDomain,
    Refused,
    /// A meta-type this server does not implement (MAILA, MAILB, TKEY, …).
    NotImp,
}

fn build(
    snap: &Snapshot,
    metrics: &Metrics,
    q: &Query,
    question: &[u8],
    src: IpAddr,
    out: &mut Vec<u8>,
    truncated: bool,
) -> Rcode {
    let mut scope = 0u8;
    let ecs = q.edns.and_then(|e| e.client_subnet);
    let bad_version = q.edns.is_some_and(|e| e.version > 0);
    let zone = if bad_version || q.qclass != CLASS_IN {
        None
    } else {
        snap.zone_of(&q.qname)
    };
    let outcome = match zone {
        _ if bad_version => Outcome::Refused,
        None => Outcome::Refused,
        // Zone transfers are not offered: the zones are generated from the
        // router's state, and a transfer would hand out every service's
        // caches at once.
        Some(_) if matches!(q.qtype, TYPE_AXFR | TYPE_IXFR) => Outcome::Refused,
        Some(_) if q.qtype != TYPE_ANY && META_TYPES.contains(&q.qtype) => Outcome::NotImp,
        Some(zone) => {
            let at_apex = zone.apex == q.qname;
            if let Some(svc) = snap.service_by_host(q.qname.wire()) {
                match q.qtype {
                    TYPE_A | TYPE_AAAA => {
                        let client = match ecs {
                            Some(cs) if cs.source_prefix > 0 => {
                                metrics
                                    .dns_ecs
                                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                cs.address
                            }
                            _ => src,
                        };
                        let (o, s) = service_addresses(snap, svc, client, q.qtype);
                        scope = s;
                        o
                    }
                    TYPE_SOA if at_apex => Outcome::Soa,
                    TYPE_NS if at_apex && !snap.ns_names.is_empty() => Outcome::Ns,
                    TYPE_ANY => Outcome::Any,
                    _ => Outcome::NoData,
                }
            } else if at_apex {
                match q.qtype {
                    TYPE_SOA => Outcome::Soa,
                    TYPE_NS if !snap.ns_names.is_empty() => Outcome::Ns,
                    TYPE_ANY => Outcome::Any,
                    _ => Outcome::NoData,
                }
            } else if let Some(addrs) = snap.glue.get(q.qname.wire()) {
                let want_v4 = q.qtype == TYPE_A;
                match q.qtype {
                    TYPE_A | TYPE_AAAA => {
                        let a: Vec<IpAddr> = addrs
                            .iter()
                            .copied()
                            .filter(|ip| ip.is_ipv4() == want_v4)
                            .collect();
                        if a.is_empty() {
                            Outcome::NoData
                        } else {
                            Outcome::Addresses(a)
                        }
                    }
                    _ => Outcome::NoData,
                }
            } else {
                Outcome::NxDomain
            }
        }
    };
    let rcode = match outcome {
        Outcome::Refused => Rcode::Refused,
        Outcome::NotImp => Rcode::NotImp,
        Outcome::NxDomain => Rcode::NxDomain,
        _ => Rcode::NoError,
    };
    let rcode = if bad_version { Rcode::BadVers } else { rcode };
    let h = ResponseHeader {
        id: q.id,
        opcode: 0,
        rd: q.recursion_desired,
        cd: q.checking_disabled,
        authoritative: zone.is_some() && !matches!(outcome, Outcome::Refused | Outcome::NotImp),
        rcode: if rcode == Rcode::BadVers {
            Rcode::NoError
        } else {
            rcode
        },
    };
    let mut w = ResponseWriter::new(out, h, question);
    if truncated {
        w.truncate_to_question(12 + question.len());
    } else if let Some(zone) = zone {
        match &outcome {
            Outcome::Addresses(ips) => {
                for ip in ips {
                    w.address(None, *ip, snap.ttl);
                }
            }
            Outcome::Cname(target) => w.name_record(None, TYPE_CNAME, target, snap.ttl),
            Outcome::Soa => w.soa(None, &zone.soa, zone.soa.minimum),
            Outcome::Ns => {
                for ns in &snap.ns_names {
                    w.name_record(None, TYPE_NS, ns, 3600);
                }
                w.additional();
                for ns in &snap.ns_names {
                    if let Some(addrs) = snap.glue.get(ns.wire()) {
                        for ip in addrs {
                            w.address(Some(ns), *ip, 3600);
                        }
                    }
                }
            }
            Outcome::Any => w.hinfo_rfc8482(snap.ttl),
            Outcome::NoData | Outcome::NxDomain => {
                w.authority();
                w.soa(Some(&zone.apex), &zone.soa, zone.soa.minimum);
            }
            Outcome::Refused | Outcome::NotImp => {}
        }
    }
    if let Some(e) = q.edns {
        w.additional();
        let ext = if rcode == Rcode::BadVers { 1 } else { 0 };
        let echo: Option<(ClientSubnet, u8)> = e.client_subnet.map(|cs| (cs, scope));
        w.opt(MAX_UDP as u16, ext, if bad_version { None } else { echo });
    }
    w.finish();
    rcode
}

/// The addresses for a service hostname as seen from `client`, with the
/// prefix length the choice depended on.
fn service_addresses<'a>(
    snap: &Snapshot,
    svc: &'a Service,
    client: IpAddr,
    qtype: u16,
) -> (Outcome<'a>, u8) {
    let loc = snap.locate(client);
    let want_v4 = qtype == TYPE_A;
    match snap.choose(svc, loc.region) {
        Choice::Caches { caches, .. } => {
            // Spread clients over the region's caches, the same client
            // subnet always getting the same ones (rendezvous on a /24 or
            // /56 of the client).
            let subnet = match client {
                IpAddr::V4(v4) => xxh3_64(&(u32::from(v4) & 0xFFFF_FF00).to_be_bytes()),
                IpAddr::V6(v6) => xxh3_64(&(u128::from(v6) & !((1u128 << 72) - 1)).to_be_bytes()),
            };
            let fam: Vec<_> = caches
                .iter()
                .filter(|c| c.state.endpoint.address.ip().is_ipv4() == want_v4)
                .collect();
            if fam.is_empty() {
                return (Outcome::NoData, loc.scope);
            }
            let keys: Vec<&str> = fam.iter().map(|c| c.key.as_str()).collect();
            let ips = hashing::ranking(&keys, subnet)
                .into_iter()
                .take(snap.answers)
                .map(|i| fam[i].state.endpoint.address.ip())
                .collect();
            (Outcome::Addresses(ips), loc.scope)
        }
        Choice::Origin => match (svc.origin.ip, &svc.origin_name) {
            (Some(ip), _) if ip.is_ipv4() == want_v4 => (Outcome::Addresses(vec![ip]), loc.scope),
            (Some(_), _) => (Outcome::NoData, loc.scope),
            (None, Some(name)) => (Outcome::Cname(name), loc.scope),
            (None, None) => (Outcome::NoData, loc.scope),
        },
    }
}
