//! Splitting a path along a template, in time linear in the path's length.
//!
//! A template is literals and placeholders alternating: `lit₀ P₁ lit₁ … Pₖ litₖ`, where each
//! placeholder matches one or more bytes of its [`Class`]. The split is the one a backtracking
//! regex engine would find for `^lit₀(C₁+)lit₁…(Cₖ+)litₖ$` (leftmost-first, greedy), but found
//! without backtracking, because the path is untrusted and the router runs this per request:
//!
//! * [`split_simple`]: when no placeholder's class contains the first byte of the literal that
//!   follows it (`$Number$.m4s`, `$Video$/`), each placeholder simply takes the longest run of
//!   its class; there is exactly one possible split. One pass, no allocation. Most templates
//!   (all the ones in the DASH manifests we ship tests for) are of this kind.
//! * [`Program`]: otherwise (`$RepresentationID$-$Number$`, where a representation id may hold a
//!   `-`), a Pike VM: a Thompson NFA simulation that tracks every live alternative at once, in
//!   priority order, with its capture positions. O(path length × template length) time and
//!   O(template length) memory.

/// What a placeholder can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// ASCII digits (`$Number$`, `$Bandwidth$`).
    Digit,
    /// Any byte but `/`: one path segment's worth (`$Video$`, `$RepresentationID$`).
    Segment,
}

impl Class {
    pub(crate) fn matches(self, b: u8) -> bool {
        match self {
            Class::Digit => b.is_ascii_digit(),
            Class::Segment => b != b'/',
        }
    }
}

/// The most placeholders a template holds (video, quality key, number).
pub(crate) const MAX_SLOTS: usize = 3;

/// Byte ranges `(start, end)` of each placeholder's capture, in template order.
pub(crate) type Captures = [(usize, usize); MAX_SLOTS];

/// Whether [`split_simple`] finds the same split as the general engine for this template: no
/// placeholder's class contains the first byte of the literal after it.
pub(crate) fn is_simple(literals: &[&[u8]], classes: &[Class]) -> bool {
    classes
        .iter()
        .zip(&literals[1..])
        .all(|(class, lit)| !matches!(lit.first(), Some(&b) if class.matches(b)))
}

/// Splits `s` along a template for which [`is_simple`] holds.
pub(crate) fn split_simple(literals: &[&[u8]], classes: &[Class], s: &[u8]) -> Option<Captures> {
    let mut caps = Captures::default();
    let mut pos = literals[0].len();
    if !s.starts_with(literals[0]) {
        return None;
    }
    for (i, (class, lit)) in classes.iter().zip(&literals[1..]).enumerate() {
        let start = pos;
        while pos < s.len() && class.matches(s[pos]) {
            pos += 1;
        }
        if pos == start || !s[pos..].starts_with(lit) {
            return None;
        }
        caps[i] = (start, pos);
        pos += lit.len();
    }
    (pos == s.len()).then_some(caps)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inst {
    /// Consume this byte.
    Byte(u8),
    /// Consume one byte of the class.
    Class(Class),
    /// Continue at both, the first with higher priority.
    Split(usize, usize),
    /// Record the current position in save slot `n`.
    Save(usize),
    /// Accept if at the end of the input.
    Match,
}

/// A template compiled for the Pike VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Program {
    insts: Vec<Inst>,
}

type Saves = [usize; 2 * MAX_SLOTS];

impl Program {
    pub(crate) fn compile(literals: &[&[u8]], classes: &[Class]) -> Program {
        let mut insts: Vec<Inst> = literals[0].iter().map(|&b| Inst::Byte(b)).collect();
        for (i, (&class, lit)) in classes.iter().zip(&literals[1..]).enumerate() {
            insts.push(Inst::Save(2 * i));
            let l = insts.len();
            insts.push(Inst::Class(class));
            insts.push(Inst::Split(l, l + 2)); // greedy: one more byte first
            insts.push(Inst::Save(2 * i + 1));
            insts.extend(lit.iter().map(|&b| Inst::Byte(b)));
        }
        insts.push(Inst::Match);
        Program { insts }
    }

    /// Splits `s`, the whole of it, along the program.
    pub(crate) fn split(&self, s: &[u8]) -> Option<Captures> {
        let n = self.insts.len();
        let mut seen = vec![0u32; n];
        let mut generation = 1u32;
        let mut current: Vec<(usize, Saves)> = Vec::with_capacity(n);
        let mut next: Vec<(usize, Saves)> = Vec::with_capacity(n);
        self.add(&mut current, &mut seen, generation, 0, Saves::default(), 0);
        for (pos, &b) in s.iter().enumerate() {
            if current.is_empty() {
                return None;
            }
            generation += 1;
            next.clear();
            for &(pc, saves) in &current {
                let step = match self.insts[pc] {
                    Inst::Byte(x) => x == b,
                    Inst::Class(c) => c.matches(b),
                    // A Match before the end is a dead end: the whole path must match.
                    Inst::Match | Inst::Split(..) | Inst::Save(_) => false,
                };
                if step {
                    self.add(&mut next, &mut seen, generation, pc + 1, saves, pos + 1);
                }
            }
            std::mem::swap(&mut current, &mut next);
        }
        // The first thread (in priority order) that reached Match wins.
        let saves = current
            .iter()
            .find(|(pc, _)| self.insts[*pc] == Inst::Match)?
            .1;
        let mut caps = Captures::default();
        for (i, cap) in caps.iter_mut().enumerate() {
            *cap = (saves[2 * i], saves[2 * i + 1]);
        }
        Some(caps)
    }

    /// Adds the thread at `pc`, following Split and Save (at most three deep: Save, Split, Save).
    fn add(
        &self,
        list: &mut Vec<(usize, Saves)>,
        seen: &mut [u32],
        generation: u32,
        pc: usize,
        mut saves: Saves,
        pos: usize,
    ) {
        if seen[pc] == generation {
            return; // a higher-priority thread already holds this state
        }
        seen[pc] = generation;
        match self.insts[pc] {
            Inst::Split(a, b) => {
                self.add(list, seen, generation, a, saves, pos);
                self.add(list, seen, generation, b, saves, pos);
            }
            Inst::Save(slot) => {
                saves[slot] = pos;
                self.add(list, seen, generation, pc + 1, saves, pos);
            }
            Inst::Byte(_) | Inst::Class(_) | Inst::Match => list.push((pc, saves)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(literals: &[&str], classes: &[Class], s: &str) -> (Option<Captures>, Option<Captures>) {
        let lits: Vec<&[u8]> = literals.iter().map(|l| l.as_bytes()).collect();
        let vm = Program::compile(&lits, classes).split(s.as_bytes());
        let simple = is_simple(&lits, classes).then(|| split_simple(&lits, classes, s.as_bytes()));
        (vm, simple.flatten())
    }

    #[test]
    fn simple_and_vm_agree_on_a_simple_template() {
        let lits = ["/vod/", "/", "/seg-", ".m4s"];
        let classes = [Class::Segment, Class::Segment, Class::Digit];
        for s in [
            "/vod/42/250k/seg-7.m4s",
            "/vod/a/b/seg-.m4s",
            "/vod//b/seg-1.m4s",
            "/vod/a/b/c/seg-1.m4s",
            "/vod/a/b/seg-1.m4sx",
            "/vod/a/b/seg-12a.m4s",
        ] {
            let (vm, simple) = both(&lits, &classes, s);
            assert_eq!(vm, simple, "{s}");
        }
        let (vm, _) = both(&lits, &classes, "/vod/42/250k/seg-7.m4s");
        assert_eq!(&vm.unwrap()[..3], &[(5, 7), (8, 12), (17, 18)]);
    }

    #[test]
    fn vm_splits_greedily_like_a_backtracking_regex() {
        // ^/v/([^/]+)-([0-9]+)\.m4s$ on "/v/video-1080p-5.m4s": the id takes "video-1080p".
        let lits = ["/v/", "-", ".m4s"];
        let classes = [Class::Segment, Class::Digit];
        let (vm, simple) = both(&lits, &classes, "/v/video-1080p-5.m4s");
        assert_eq!(simple, None); // not a simple template
        assert_eq!(&vm.unwrap()[..2], &[(3, 14), (15, 16)]);
        let (vm, _) = both(&lits, &classes, "/v/a-1-2-3.m4s");
        assert_eq!(&vm.unwrap()[..2], &[(3, 8), (9, 10)]);
        assert_eq!(both(&lits, &classes, "/v/-1.m4s").0, None);
        assert_eq!(both(&lits, &classes, "/v/a-.m4s").0, None);
        assert_eq!(both(&lits, &classes, "/v/a/b-1.m4s").0, None);
    }

    #[test]
    fn vm_handles_a_trailing_placeholder() {
        let lits = ["", "_", ""];
        let classes = [Class::Segment, Class::Segment];
        let (vm, _) = both(&lits, &classes, "a_b_c");
        assert_eq!(&vm.unwrap()[..2], &[(0, 3), (4, 5)]);
        assert_eq!(both(&lits, &classes, "abc").0, None);
        assert_eq!(both(&lits, &classes, "abc_").0, None);
    }

    #[test]
    fn vm_time_stays_linear_on_a_worst_case_path() {
        // Many live alternatives at once; still one pass over the path.
        let lits = ["", "a", "a", ""];
        let classes = [Class::Segment, Class::Segment, Class::Digit];
        let s = "a".repeat(8192);
        assert_eq!(both(&lits, &classes, &s).0, None);
    }
}
