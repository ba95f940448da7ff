//! The router's DNS query parser and answer writer on arbitrary packets:
//! never panics, and every answer it writes parses back as a response
//! with the query's id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vcdn_router::dns::wire::{parse_query, QueryError, Rcode, ResponseHeader, ResponseWriter};

fuzz_target!(|data: &[u8]| {
    match parse_query(data) {
        Ok(q) => {
            assert!(q.question_end <= data.len());
            let mut out = Vec::new();
            let h = ResponseHeader {
                id: q.id,
                opcode: 0,
                rd: q.recursion_desired,
                cd: q.checking_disabled,
                authoritative: true,
                rcode: Rcode::NoError,
            };
            let mut w = ResponseWriter::new(&mut out, h, &data[12..q.question_end]);
            if let Some(e) = q.edns {
                w.additional();
                w.opt(1232, 0, e.client_subnet.map(|cs| (cs, cs.source_prefix)));
            }
            w.finish();
            assert_eq!(&out[..2], &data[..2]);
        }
        Err(QueryError::Ignore) => {}
        Err(QueryError::Reply { id, .. }) => assert_eq!(id.to_be_bytes(), [data[0], data[1]]),
    }
});
