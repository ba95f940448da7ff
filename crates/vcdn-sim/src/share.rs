//! Bandwidth sharing between fluid flows: exact max-min fairness with a
//! cap per flow (the access line, or the codec rate once a player is live).
//!
//! Incremental, so that only saturated links cost work. A link whose flows'
//! caps sum to no more than its capacity never binds any of them (no flow
//! can get more than its cap), so the max-min allocation is found by water
//! filling over the saturated links alone; every flow that crosses none of
//! them simply runs at its cap. A change (a flow added, removed or re-capped)
//! only re-fills the group of saturated links it is connected to through
//! shared flows: in a CDN most flows are capped by their own line or codec
//! rate and most links are not saturated, so most changes cost O(path).
//!
//! [`Sharing::recompute`] may also be called once per epoch instead of
//! after every change (the simulator's `--epoch`), which bounds the work of
//! very large saturated groups at the price of rates that lag by up to one
//! epoch; [`Mode::LocalFairShare`] reproduces the original CDNSim's rule.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Index of a link.
pub type LinkId = u32;
/// Index of a flow (slots are reused after [`Sharing::remove`]).
pub type FlowId = u32;

/// Rates closer than this (bit/s) count as equal: a saturated link's flows
/// must not churn events over rounding.
const EPS: f64 = 1e-6;

/// How rates are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Exact max-min fairness with per-flow caps.
    #[default]
    MaxMin,
    /// The original CDNSim's approximation: a link's fair share is
    /// (C − Σ rates of its flows that are held below C/n elsewhere) / (n −
    /// their number), a flow gets the least fair share on its path, and a
    /// flow that gets faster only learns so at its next *expansion*, which
    /// the simulator schedules every second per flow (flows that must get
    /// slower are cut at once).
    LocalFairShare,
}

#[derive(Debug, Clone)]
struct Link {
    capacity: f64,
    /// Σ caps of the flows crossing it.
    demand: f64,
    flows: Vec<FlowId>,
    /// Set while the link is queued for a re-fill.
    dirty: bool,
    /// Whether it was saturated at the last settlement: only a link that
    /// stops being saturated frees its flows.
    was_saturated: bool,
    // Water-filling scratch.
    remaining: f64,
    unfixed: u32,
    mark: u32,
}

impl Link {
    fn saturated(&self) -> bool {
        self.demand > self.capacity * (1.0 + 1e-12) + EPS
    }
}

#[derive(Debug, Clone)]
struct Flow {
    path: Box<[LinkId]>,
    /// Position of this flow in each path link's `flows` (for O(1) removal).
    slots: Box<[u32]>,
    cap: f64,
    rate: f64,
    live: bool,
    /// Rate the local-fair-share mode would give now (may exceed `rate`
    /// until the flow's next expansion).
    offered: f64,
    mark: u32,
    fixed: bool,
}

/// The links, the flows over them and their current rates.
#[derive(Debug, Clone, Default)]
pub struct Sharing {
    mode: Mode,
    links: Vec<Link>,
    flows: Vec<Flow>,
    free: Vec<FlowId>,
    dirty: Vec<LinkId>,
    /// Flows whose rate changed in the last [`Sharing::recompute`].
    changed: Vec<FlowId>,
    /// Flows added or re-capped whose rate is not settled yet.
    touched: Vec<FlowId>,
    epoch: u32,
    /// Work done, for the simulator's statistics: flows visited by fills.
    pub filled_flows: u64,
}

#[derive(PartialEq)]
struct Share(f64, LinkId);
impl Eq for Share {}
impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Share {
    // A min-heap on the share, ties by link id (deterministic).
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

impl Sharing {
    /// Links of these capacities (bit/s), no flows.
    pub fn new(capacities: impl IntoIterator<Item = f64>, mode: Mode) -> Self {
        Sharing {
            mode,
            links: capacities
                .into_iter()
                .map(|capacity| Link {
                    capacity,
                    demand: 0.0,
                    flows: Vec::new(),
                    dirty: false,
                    was_saturated: false,
                    remaining: 0.0,
                    unfixed: 0,
                    mark: 0,
                })
                .collect(),
            ..Sharing::default()
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Σ rates of the flows crossing `link`.
    pub fn load(&self, link: LinkId) -> f64 {
        self.links[link as usize]
            .flows
            .iter()
            .map(|&f| self.flows[f as usize].rate)
            .sum()
    }

    /// A new flow over `path` (links may repeat only if the caller wants
    /// them counted twice) that never goes faster than `cap`. Its rate is
    /// settled by the next [`Sharing::recompute`].
    pub fn add(&mut self, path: &[LinkId], cap: f64) -> FlowId {
        assert!(cap >= 0.0, "a flow's cap is a rate");
        let id = self.free.pop().unwrap_or_else(|| {
            self.flows.push(Flow {
                path: Box::new([]),
                slots: Box::new([]),
                cap: 0.0,
                rate: 0.0,
                live: false,
                offered: 0.0,
                mark: 0,
                fixed: false,
            });
            (self.flows.len() - 1) as FlowId
        });
        let mut slots = Vec::with_capacity(path.len());
        for &l in path {
            let link = &mut self.links[l as usize];
            slots.push(link.flows.len() as u32);
            link.flows.push(id);
            link.demand += cap;
        }
        let f = &mut self.flows[id as usize];
        f.path = path.into();
        f.slots = slots.into();
        f.cap = cap;
        f.rate = 0.0;
        f.offered = 0.0;
        f.live = true;
        for &l in path {
            self.mark_dirty(l);
        }
        self.touched.push(id);
        id
    }

    /// Ends a flow; its capacity goes to the others at the next recompute.
    pub fn remove(&mut self, id: FlowId) {
        let f = &mut self.flows[id as usize];
        assert!(f.live, "flow {id} removed twice");
        f.live = false;
        let path = std::mem::take(&mut f.path);
        let slots = std::mem::take(&mut f.slots);
        let cap = f.cap;
        for (&l, &slot) in path.iter().zip(slots.iter()) {
            let link = &mut self.links[l as usize];
            link.demand -= cap;
            if link.flows.is_empty() || link.demand < EPS {
                link.demand = link.demand.max(0.0);
            }
            link.flows.swap_remove(slot as usize);
            // The last flow moved into the hole: its slot for this link was
            // the old last index, the new length.
            let old_last = link.flows.len() as u32;
            if let Some(&moved) = link.flows.get(slot as usize) {
                let m = &mut self.flows[moved as usize];
                for (ml, ms) in m.path.iter().zip(m.slots.iter_mut()) {
                    if *ml == l && *ms == old_last {
                        *ms = slot;
                        break;
                    }
                }
            }
            if self.links[l as usize].flows.is_empty() {
                self.links[l as usize].demand = 0.0;
            }
            self.mark_dirty(l);
        }
        self.free.push(id);
    }

    /// Changes a flow's cap (a player going live, an upstream slowing down).
    pub fn set_cap(&mut self, id: FlowId, cap: f64) {
        let f = &mut self.flows[id as usize];
        debug_assert!(f.live);
        if (f.cap - cap).abs() <= EPS {
            return;
        }
        let delta = cap - f.cap;
        f.cap = cap;
        let path = std::mem::take(&mut f.path);
        for &l in path.iter() {
            self.links[l as usize].demand += delta;
            self.mark_dirty(l);
        }
        self.flows[id as usize].path = path;
        self.touched.push(id);
    }

    /// Changes a link's capacity (a cache site gaining or losing an
    /// instance); its flows are re-filled at the next recompute.
    pub fn set_capacity(&mut self, l: LinkId, capacity: f64) {
        assert!(capacity >= 0.0, "a capacity is a rate");
        let link = &mut self.links[l as usize];
        if (link.capacity - capacity).abs() > EPS {
            link.capacity = capacity;
            self.mark_dirty(l);
        }
    }

    pub fn rate(&self, id: FlowId) -> f64 {
        self.flows[id as usize].rate
    }

    pub fn cap(&self, id: FlowId) -> f64 {
        self.flows[id as usize].cap
    }

    /// The rate the local-fair-share mode offers a flow now; the simulator
    /// raises the flow to it at the flow's next expansion.
    pub fn offered(&self, id: FlowId) -> f64 {
        self.flows[id as usize].offered
    }

    /// Raises a flow to its offered rate (local-fair-share mode's
    /// expansion). Returns whether the rate changed.
    pub fn expand(&mut self, id: FlowId) -> bool {
        let f = &mut self.flows[id as usize];
        if f.offered > f.rate + EPS {
            f.rate = f.offered;
            true
        } else {
            false
        }
    }

    fn mark_dirty(&mut self, l: LinkId) {
        let link = &mut self.links[l as usize];
        if !link.dirty {
            link.dirty = true;
            self.dirty.push(l);
        }
    }

    /// Whether changes wait for [`Sharing::recompute`].
    pub fn pending(&self) -> bool {
        !self.dirty.is_empty() || !self.touched.is_empty()
    }

    /// Settles every rate after the changes since the last call and
    /// returns the flows whose rate changed.
    pub fn recompute(&mut self) -> &[FlowId] {
        self.changed.clear();
        self.epoch = self.epoch.wrapping_add(1);
        match self.mode {
            Mode::MaxMin => self.recompute_max_min(),
            Mode::LocalFairShare => self.recompute_local(),
        }
        for &l in &self.dirty {
            let link = &mut self.links[l as usize];
            link.dirty = false;
            link.was_saturated = link.saturated();
        }
        self.dirty.clear();
        self.touched.clear();
        &self.changed
    }

    fn set_rate(&mut self, f: FlowId, rate: f64) {
        let flow = &mut self.flows[f as usize];
        flow.offered = rate;
        if (flow.rate - rate).abs() > EPS {
            flow.rate = rate;
            self.changed.push(f);
        }
    }

    fn recompute_max_min(&mut self) {
        let epoch = self.epoch;
        // The saturated links to re-fill: the dirty ones that are saturated,
        // and those reachable from a dirty link's flows (a link that just
        // stopped being saturated frees its flows, which may now be held by
        // another link), closed over flows that cross two saturated links.
        let mut group: Vec<LinkId> = Vec::new();
        let mut flows: Vec<FlowId> = Vec::new();
        let mut stack: Vec<LinkId> = Vec::new();
        let dirty = std::mem::take(&mut self.dirty);
        for &l in &dirty {
            let link = &self.links[l as usize];
            if link.saturated() {
                stack.push(l);
            } else if link.was_saturated {
                // It just stopped binding its flows: each now
                // runs at its cap unless another saturated link holds it.
                for i in 0..self.links[l as usize].flows.len() {
                    let f = self.links[l as usize].flows[i];
                    let mut held = false;
                    for &pl in self.flows[f as usize].path.iter() {
                        if self.links[pl as usize].saturated() {
                            held = true;
                            stack.push(pl);
                        }
                    }
                    if !held && self.flows[f as usize].mark != epoch {
                        self.flows[f as usize].mark = epoch;
                        let cap = self.flows[f as usize].cap;
                        self.set_rate(f, cap);
                    }
                }
            }
        }
        for i in 0..self.touched.len() {
            let f = self.touched[i];
            if !self.flows[f as usize].live || self.flows[f as usize].mark == epoch {
                continue;
            }
            if !self.flows[f as usize]
                .path
                .iter()
                .any(|&l| self.links[l as usize].saturated())
            {
                self.flows[f as usize].mark = epoch;
                let cap = self.flows[f as usize].cap;
                self.set_rate(f, cap);
            }
        }
        self.dirty = dirty;
        while let Some(l) = stack.pop() {
            if self.links[l as usize].mark == epoch {
                continue;
            }
            self.links[l as usize].mark = epoch;
            group.push(l);
            for i in 0..self.links[l as usize].flows.len() {
                let f = self.links[l as usize].flows[i];
                let flow = &mut self.flows[f as usize];
                if flow.mark == epoch {
                    continue;
                }
                flow.mark = epoch;
                flows.push(f);
                for &pl in self.flows[f as usize].path.iter() {
                    let pl_link = &self.links[pl as usize];
                    if pl_link.mark != epoch && pl_link.saturated() {
                        stack.push(pl);
                    }
                }
            }
        }
        if !group.is_empty() {
            self.fill(&group, &mut flows);
        }
    }

    /// Progressive filling over saturated `group` and the `flows` crossing
    /// it: raise every unfixed flow together; a flow stops at its cap, and
    /// all flows of a link stop when it is full.
    fn fill(&mut self, group: &[LinkId], flows: &mut [FlowId]) {
        self.filled_flows += flows.len() as u64;
        let epoch = self.epoch;
        for &l in group {
            let link = &mut self.links[l as usize];
            link.remaining = link.capacity;
            link.unfixed = link.flows.len() as u32;
        }
        for &f in flows.iter() {
            self.flows[f as usize].fixed = false;
        }
        // By cap, then id. Caps are ≥ 0, so their bit patterns sort as the
        // numbers do: plain integer keys sort several times faster than
        // float comparisons through the flow table.
        let mut keyed: Vec<(u64, FlowId)> = flows
            .iter()
            .map(|&f| (self.flows[f as usize].cap.to_bits(), f))
            .collect();
        keyed.sort_unstable();
        for (slot, (_, f)) in flows.iter_mut().zip(keyed) {
            *slot = f;
        }
        let mut heap: BinaryHeap<Share> = group
            .iter()
            .map(|&l| {
                let link = &self.links[l as usize];
                Share(link.remaining / link.unfixed as f64, l)
            })
            .collect();
        let mut next_capped = 0usize;
        let mut new_rates: Vec<(FlowId, f64)> = Vec::with_capacity(flows.len());
        loop {
            // The least fair share among links with unfixed flows. Entries
            // are not updated when a link's flows get fixed: a link's fair
            // share never falls during the filling (a flow fixed at r ≤ the
            // least share R/U leaves (R − r)/(U − 1) ≥ R/U), so a stale
            // entry is at most its link's share and is re-keyed when it
            // comes to the top. That keeps heap work to about one entry
            // per link instead of one per fixed flow and link.
            let top = loop {
                match heap.peek() {
                    None => break None,
                    Some(&Share(s, l)) => {
                        let link = &self.links[l as usize];
                        if link.unfixed == 0 {
                            heap.pop();
                            continue;
                        }
                        let actual = link.remaining / link.unfixed as f64;
                        if (actual - s).abs() > EPS {
                            heap.pop();
                            heap.push(Share(actual, l));
                        } else {
                            break Some((s, l));
                        }
                    }
                }
            };
            while next_capped < flows.len() && self.flows[flows[next_capped] as usize].fixed {
                next_capped += 1;
            }
            let capped = flows
                .get(next_capped)
                .map(|&f| (self.flows[f as usize].cap, f));
            match (top, capped) {
                (None, None) => break,
                (_, Some((cap, f))) if top.is_none_or(|(s, _)| cap <= s) => {
                    self.fix(f, cap, epoch);
                    new_rates.push((f, cap));
                }
                (Some((s, l)), _) => {
                    heap.pop();
                    let members = self.links[l as usize].flows.clone();
                    for f in members {
                        if !self.flows[f as usize].fixed {
                            self.fix(f, s, epoch);
                            new_rates.push((f, s));
                        }
                    }
                }
                (None, Some(_)) => unreachable!(),
            }
        }
        for (f, r) in new_rates {
            self.set_rate(f, r);
        }
    }

    fn fix(&mut self, f: FlowId, rate: f64, epoch: u32) {
        self.flows[f as usize].fixed = true;
        for i in 0..self.flows[f as usize].path.len() {
            let l = self.flows[f as usize].path[i];
            let link = &mut self.links[l as usize];
            if link.mark == epoch {
                link.remaining = (link.remaining - rate).max(0.0);
                link.unfixed -= 1;
            }
        }
    }

    /// The original's rule, on every flow of a dirty link.
    fn recompute_local(&mut self) {
        let epoch = self.epoch;
        let mut flows: Vec<FlowId> = Vec::new();
        let dirty = std::mem::take(&mut self.dirty);
        for &l in &dirty {
            for &f in &self.links[l as usize].flows {
                if self.flows[f as usize].mark != epoch {
                    self.flows[f as usize].mark = epoch;
                    flows.push(f);
                }
            }
        }
        for &f in &self.touched {
            if self.flows[f as usize].live && self.flows[f as usize].mark != epoch {
                self.flows[f as usize].mark = epoch;
                flows.push(f);
            }
        }
        self.dirty = dirty;
        flows.sort_unstable();
        for f in flows {
            let mut offer = self.flows[f as usize].cap;
            for &l in self.flows[f as usize].path.iter() {
                offer = offer.min(self.local_share(l));
            }
            let flow = &mut self.flows[f as usize];
            flow.offered = offer;
            // Slower at once; faster only at the next expansion, except a
            // new flow, which starts at its offer.
            if (offer < flow.rate - EPS || flow.rate == 0.0) && (flow.rate - offer).abs() > EPS {
                flow.rate = offer;
                self.changed.push(f);
            }
        }
    }

    /// (C − Σ rates of flows below C/n) / (n − their number).
    fn local_share(&self, l: LinkId) -> f64 {
        let link = &self.links[l as usize];
        let n = link.flows.len();
        if n == 0 {
            return link.capacity;
        }
        let even = link.capacity / n as f64;
        let (mut below, mut count) = (0.0, 0usize);
        for &f in &link.flows {
            let r = self.flows[f as usize].rate;
            if r > 0.0 && r < even - EPS {
                below += r;
                count += 1;
            }
        }
        if count == n {
            return even;
        }
        ((link.capacity - below) / (n - count) as f64).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn n_greedy_flows_on_one_link_get_c_over_n() {
        for n in [1usize, 2, 3, 7, 100] {
            let mut s = Sharing::new([10e9], Mode::MaxMin);
            let flows: Vec<FlowId> = (0..n).map(|_| s.add(&[0], 1e13)).collect();
            s.recompute();
            for &f in &flows {
                assert!(close(s.rate(f), 10e9 / n as f64), "n={n}: {}", s.rate(f));
            }
        }
    }

    #[test]
    fn a_link_that_gains_or_loses_capacity_refills_its_flows() {
        // A cache site of one instance (100) with three viewers capped at
        // 50, then a second instance, then back to one.
        let mut s = Sharing::new([100.0, 1e9], Mode::MaxMin);
        let fs: Vec<FlowId> = (0..3).map(|_| s.add(&[0, 1], 50.0)).collect();
        s.recompute();
        assert!(fs.iter().all(|&f| close(s.rate(f), 100.0 / 3.0)));
        s.set_capacity(0, 200.0);
        assert!(s.pending());
        s.recompute();
        assert!(
            fs.iter().all(|&f| close(s.rate(f), 50.0)),
            "now at their caps"
        );
        s.set_capacity(0, 60.0);
        s.recompute();
        assert!(fs.iter().all(|&f| close(s.rate(f), 20.0)));
    }

    #[test]
    fn capped_flows_keep_their_cap_and_leave_the_rest_to_others() {
        let mut s = Sharing::new([100.0], Mode::MaxMin);
        let small = s.add(&[0], 10.0);
        let a = s.add(&[0], 1e13);
        let b = s.add(&[0], 1e13);
        s.recompute();
        assert!(close(s.rate(small), 10.0));
        assert!(close(s.rate(a), 45.0) && close(s.rate(b), 45.0));
        // Under capacity: everyone at its cap, nothing to fill.
        let mut s = Sharing::new([100.0], Mode::MaxMin);
        let f: Vec<FlowId> = (0..4).map(|_| s.add(&[0], 25.0)).collect();
        s.recompute();
        assert!(f.iter().all(|&f| close(s.rate(f), 25.0)));
        assert_eq!(s.filled_flows, 0, "no saturated link, no fill");
    }

    #[test]
    fn parking_lot_is_max_min_fair() {
        // Links 0..3 of capacity 1; the long flow crosses all, one short
        // flow per link: everyone gets 1/2.
        let mut s = Sharing::new([1.0; 3], Mode::MaxMin);
        let long = s.add(&[0, 1, 2], 1e13);
        let short: Vec<FlowId> = (0..3).map(|l| s.add(&[l], 1e13)).collect();
        s.recompute();
        assert!(close(s.rate(long), 0.5));
        assert!(short.iter().all(|&f| close(s.rate(f), 0.5)));
        // The textbook example: link A (10) carries f1 and f2, link B (4)
        // carries f2 and f3. B binds first: f2 = f3 = 2; then f1 = 8.
        let mut s = Sharing::new([10.0, 4.0], Mode::MaxMin);
        let f1 = s.add(&[0], 1e13);
        let f2 = s.add(&[0, 1], 1e13);
        let f3 = s.add(&[1], 1e13);
        s.recompute();
        assert!(close(s.rate(f1), 8.0) && close(s.rate(f2), 2.0) && close(s.rate(f3), 2.0));
        // f3 leaves: B still holds f2, now at its whole 4; f1 takes the rest.
        s.remove(f3);
        let changed = s.recompute().to_vec();
        assert!(
            close(s.rate(f1), 6.0) && close(s.rate(f2), 4.0),
            "{} {}",
            s.rate(f1),
            s.rate(f2)
        );
        assert!(changed.contains(&f1) && changed.contains(&f2));
    }

    /// From-scratch progressive filling over every link, the reference.
    fn reference(caps: &[f64], flows: &[(Vec<LinkId>, f64)]) -> Vec<f64> {
        let mut rate = vec![0.0; flows.len()];
        let mut fixed = vec![false; flows.len()];
        let mut remaining = caps.to_vec();
        loop {
            let unfixed: Vec<usize> = (0..flows.len()).filter(|&i| !fixed[i]).collect();
            if unfixed.is_empty() {
                return rate;
            }
            // Smallest increment that fixes something.
            let mut inc = f64::INFINITY;
            for &i in &unfixed {
                inc = inc.min(flows[i].1 - rate[i]);
            }
            for (l, &r) in remaining.iter().enumerate() {
                let n = unfixed
                    .iter()
                    .filter(|&&i| flows[i].0.contains(&(l as LinkId)))
                    .count();
                if n > 0 {
                    inc = inc.min(r / n as f64);
                }
            }
            for &i in &unfixed {
                rate[i] += inc;
                for &l in &flows[i].0 {
                    remaining[l as usize] -= inc;
                }
            }
            for &i in &unfixed {
                let full = flows[i].0.iter().any(|&l| remaining[l as usize] <= 1e-9);
                if full || rate[i] >= flows[i].1 - 1e-9 {
                    fixed[i] = true;
                }
            }
        }
    }

    #[test]
    fn incremental_rates_equal_a_from_scratch_fill_after_every_change() {
        let mut rng = Rng::new(42);
        for round in 0..40 {
            let links = 2 + rng.below(6) as usize;
            let caps: Vec<f64> = (0..links).map(|_| 10.0 + rng.below(90) as f64).collect();
            let mut s = Sharing::new(caps.iter().copied(), Mode::MaxMin);
            let mut live: Vec<(FlowId, Vec<LinkId>, f64)> = Vec::new();
            for step in 0..60 {
                let op = rng.below(10);
                if op < 5 || live.is_empty() {
                    let len = 1 + rng.below(3) as usize;
                    let mut path: Vec<LinkId> = (0..len)
                        .map(|_| rng.below(links as u64) as LinkId)
                        .collect();
                    path.sort_unstable();
                    path.dedup();
                    let cap = if rng.below(3) == 0 {
                        1e13
                    } else {
                        1.0 + rng.below(40) as f64
                    };
                    let id = s.add(&path, cap);
                    live.push((id, path, cap));
                } else if op < 8 {
                    let i = rng.below(live.len() as u64) as usize;
                    let (id, _, _) = live.swap_remove(i);
                    s.remove(id);
                } else {
                    let i = rng.below(live.len() as u64) as usize;
                    let cap = 1.0 + rng.below(40) as f64;
                    live[i].2 = cap;
                    s.set_cap(live[i].0, cap);
                }
                s.recompute();
                let want = reference(
                    &caps,
                    &live
                        .iter()
                        .map(|(_, p, c)| (p.clone(), *c))
                        .collect::<Vec<_>>(),
                );
                for ((id, _, _), w) in live.iter().zip(want) {
                    assert!(
                        (s.rate(*id) - w).abs() < 1e-6 * w.max(1.0),
                        "round {round} step {step}: flow {id} has {} want {w}",
                        s.rate(*id)
                    );
                }
                for l in 0..links as LinkId {
                    assert!(
                        s.load(l) <= caps[l as usize] * (1.0 + 1e-9) + 1e-6,
                        "link {l} over capacity"
                    );
                }
            }
        }
    }

    /// Processor sharing on one link: Poisson arrivals of exponential
    /// sizes; the mean sojourn time of a job of size x is x / (C(1 − ρ)).
    #[test]
    fn one_link_is_processor_sharing() {
        let (c, lambda, mean_bits) = (1e6, 8.0, 1e5); // ρ = 0.8
        let mut s = Sharing::new([c], Mode::MaxMin);
        let mut rng = Rng::new(5);
        let mut t = 0.0f64;
        let mut next_arrival = crate::dist::exponential(&mut rng, 1.0 / lambda);
        // (flow, remaining bits, size, arrival)
        let mut jobs: Vec<(FlowId, f64, f64, f64)> = Vec::new();
        let (mut sum_ratio, mut done) = (0.0, 0u64);
        while done < 200_000 {
            // Next completion at current rates.
            let (mut first, mut at) = (usize::MAX, f64::INFINITY);
            for (i, j) in jobs.iter().enumerate() {
                let r = s.rate(j.0);
                if r > 0.0 && t + j.1 / r < at {
                    at = t + j.1 / r;
                    first = i;
                }
            }
            let until = at.min(next_arrival);
            for j in jobs.iter_mut() {
                j.1 -= s.rate(j.0) * (until - t);
            }
            t = until;
            if next_arrival <= at {
                let size = crate::dist::exponential(&mut rng, mean_bits);
                jobs.push((s.add(&[0], 1e13), size, size, t));
                next_arrival = t + crate::dist::exponential(&mut rng, 1.0 / lambda);
            } else {
                let j = jobs.swap_remove(first);
                s.remove(j.0);
                // Sojourn / size: its mean is 1 / (C(1 − ρ)) for every size.
                sum_ratio += (t - j.3) / j.2;
                done += 1;
            }
            s.recompute();
        }
        let rho = lambda * mean_bits / c;
        let want = 1.0 / (c * (1.0 - rho));
        let got = sum_ratio / done as f64;
        assert!((got / want - 1.0).abs() < 0.05, "E[T/x] {got} vs {want}");
    }

    #[test]
    fn local_fair_share_cuts_at_once_and_grows_only_on_expansion() {
        let mut s = Sharing::new([10.0], Mode::LocalFairShare);
        let a = s.add(&[0], 1e13);
        s.recompute();
        assert!(close(s.rate(a), 10.0));
        let b = s.add(&[0], 1e13);
        s.recompute();
        assert!(close(s.rate(a), 5.0) && close(s.rate(b), 5.0));
        s.remove(b);
        s.recompute();
        assert!(
            close(s.rate(a), 5.0),
            "freed capacity waits for the expansion"
        );
        assert!(close(s.offered(a), 10.0));
        assert!(s.expand(a));
        assert!(close(s.rate(a), 10.0));
    }
}
