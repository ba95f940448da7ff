//! The forwarder's routing between segments: a learning switch whose ports
//! are the segments' TAP devices, as SoftEther's layer-2 bridge is.
//!
//! A frame's source MAC is learned on the segment it came from; a frame
//! to a learned unicast MAC goes to that segment only, every other frame
//! (broadcast, multicast, unknown) to every other segment. With two
//! segments this changes little (each bridge already forwards to its TAP
//! only what is not local), with more it keeps unicast off the links it
//! has no business on. The table is bounded: at [`MAX_MACS`] it is
//! cleared and learned anew (frames flood meanwhile), so forged source
//! addresses cannot grow it.

use std::collections::HashMap;

use crate::forwarder::Router;

/// Learned addresses at most.
pub const MAX_MACS: usize = 4096;

/// The Ethernet header: destination, source, EtherType.
const HEADER: usize = 14;

pub(crate) struct LearningSwitch {
    segments: usize,
    table: HashMap<[u8; 6], usize>,
}

impl LearningSwitch {
    pub fn new(segments: usize) -> LearningSwitch {
        LearningSwitch {
            segments,
            table: HashMap::new(),
        }
    }
}

fn mac(b: &[u8]) -> [u8; 6] {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[..6]);
    m
}

/// Group (broadcast, multicast) addresses have the lowest bit of the first
/// octet set.
fn is_group(m: &[u8; 6]) -> bool {
    m[0] & 1 == 1
}

impl Router for LearningSwitch {
    fn route(&mut self, from: usize, frame: &[u8], to: &mut Vec<usize>) {
        if frame.len() < HEADER || from >= self.segments {
            return;
        }
        let (dst, src) = (mac(&frame[..6]), mac(&frame[6..12]));
        if !is_group(&src) {
            if self.table.len() >= MAX_MACS && !self.table.contains_key(&src) {
                self.table.clear();
            }
            self.table.insert(src, from);
        }
        match self.table.get(&dst) {
            Some(&s) if !is_group(&dst) => to.push(s),
            _ => to.extend((0..self.segments).filter(|&s| s != from)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&[0u8; 46]);
        f
    }

    const BCAST: [u8; 6] = [0xff; 6];
    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn route(sw: &mut LearningSwitch, from: usize, f: &[u8]) -> Vec<usize> {
        let mut to = Vec::new();
        sw.route(from, f, &mut to);
        to
    }

    #[test]
    fn floods_broadcast_and_unknown_then_learns() {
        let mut sw = LearningSwitch::new(3);
        assert_eq!(route(&mut sw, 0, &frame(BCAST, A)), [1, 2]);
        assert_eq!(route(&mut sw, 1, &frame(A, B)), [0], "A was learned on 0");
        assert_eq!(route(&mut sw, 0, &frame(B, A)), [1], "B was learned on 1");
        assert_eq!(
            route(&mut sw, 1, &frame([2, 0, 0, 0, 0, 0xc], B)),
            [0, 2],
            "unknown unicast floods"
        );
        // A moves to segment 2 (its source is seen there last).
        assert_eq!(route(&mut sw, 2, &frame(B, A)), [1]);
        assert_eq!(route(&mut sw, 1, &frame(A, B)), [2]);
    }

    #[test]
    fn runts_and_forged_sources_are_bounded() {
        let mut sw = LearningSwitch::new(2);
        assert!(route(&mut sw, 0, &[0u8; 13]).is_empty());
        assert!(route(&mut sw, 5, &frame(BCAST, A)).is_empty());
        for i in 0..3 * MAX_MACS as u32 {
            let b = i.to_be_bytes();
            route(&mut sw, 0, &frame(BCAST, [2, 0, b[0], b[1], b[2], b[3]]));
            assert!(sw.table.len() <= MAX_MACS);
        }
        // A group source is never learned.
        let mut sw = LearningSwitch::new(2);
        route(&mut sw, 0, &frame(A, BCAST));
        assert!(sw.table.is_empty());
    }
}
