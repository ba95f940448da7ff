//! Adaptive bitrate: which representation a DASH player fetches next, and
//! how much media it keeps buffered, as the reference player does.
//!
//! The rule is dash.js's default strategy ("DYNAMIC"), described by its
//! authors in Spiteri, Sitaraman, Sparacio, "From Theory to Practice:
//! Improving Bitrate Adaptation in the DASH Reference Player", ACM MMSys
//! 2018 (§3–4):
//!
//! - **Throughput rule** while the buffer is short: the highest bitrate
//!   under `safety_factor` (0.9) × the throughput estimate. The estimate is
//!   the smaller of two exponentially weighted averages of per-segment
//!   throughput, with half-lives of 3 s and 8 s of download time (fast to
//!   fall, slow to rise). Throughput counts from a response's first byte
//!   to its last, so latency before the first byte does not lower it
//!   (dash.js's "dead time" rule): under added latency alone the rule keeps
//!   choosing high bitrates, as dash.js does.
//! - **BOLA** once the buffer is long: Spiteri, Urgaonkar, Sitaraman,
//!   "BOLA: Near-Optimal Bitrate Adaptation for Online Videos", IEEE
//!   INFOCOM 2016 (BOLA-BASIC, eq. (9)): choose the `m` maximising
//!   `(V·(υ_m + γ) − Q) / S_m`, with utilities `υ_m = ln(S_m/S_0) + 1`, `Q`
//!   the buffer level in seconds and `S_m` the bitrate. As in dash.js, `γ`
//!   and `V` are set so that the lowest bitrate is chosen at a buffer of
//!   10 s (`bola_min_buffer_s`) and the highest up to the target buffer
//!   `max(stable_buffer_s, 10 s + 2 s per representation)`; when no `m`
//!   scores above 0 the buffer is over BOLA's target and the player waits.
//! - **Switching** (DYNAMIC): to BOLA when the buffer reaches 10 s and
//!   BOLA's choice is at least the throughput rule's; back to the
//!   throughput rule when the buffer falls under 10 s and BOLA's choice is
//!   below the throughput rule's.
//! - **Insufficient buffer** (dash.js's `InsufficientBufferRule`): right
//!   after a stall the next segment is the lowest bitrate, and otherwise no
//!   higher than what `0.5 × throughput × buffer / segment duration` allows.
//! - **Abandonment** (dash.js's `AbandonRequestsRule`): a download that,
//!   at the throughput it gets, would take over 1.8 segment durations
//!   (checked from 0.5 s into its body) is given up and the same segment
//!   asked again at the highest bitrate under 0.9 × that throughput, if
//!   lower. Without it a player that starts at 1 Mbit/s on a narrow link
//!   would wait for a whole segment it cannot afford before playing.
//! - **Start**: the highest bitrate not over `initial_kbps` (dash.js starts
//!   video at 1,000 kbit/s when it has no estimate yet).
//! - **Buffer target** (when to ask for the next segment): the player
//!   requests the next segment while the buffer is under `stable_buffer_s`
//!   (12 s), or `top_quality_buffer_s` (30 s) while playing the highest
//!   representation, dash.js's `stableBufferTime` and
//!   `bufferTimeAtTopQuality`.
//!
//! Pure code: the caller gives the measurements and the buffer level.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AbrConfig {
    pub safety_factor: f64,
    /// Bitrate to start from, kbit/s.
    pub initial_kbps: f64,
    pub stable_buffer_s: f64,
    pub top_quality_buffer_s: f64,
    pub bola_min_buffer_s: f64,
    pub bola_buffer_per_level_s: f64,
    pub fast_half_life_s: f64,
    pub slow_half_life_s: f64,
    pub insufficient_buffer_factor: f64,
    /// Give up a download expected to take over this many segment
    /// durations...
    pub abandon_duration_multiplier: f64,
    /// ...judged no earlier than this far into its body.
    pub abandon_min_elapsed_s: f64,
}

impl Default for AbrConfig {
    fn default() -> Self {
        AbrConfig {
            safety_factor: 0.9,
            initial_kbps: 1000.0,
            stable_buffer_s: 12.0,
            top_quality_buffer_s: 30.0,
            bola_min_buffer_s: 10.0,
            bola_buffer_per_level_s: 2.0,
            fast_half_life_s: 3.0,
            slow_half_life_s: 8.0,
            insufficient_buffer_factor: 0.5,
            abandon_duration_multiplier: 1.8,
            abandon_min_elapsed_s: 0.5,
        }
    }
}

/// An exponentially weighted average whose weight decays with the seconds
/// of download time observed, corrected for its zero start.
#[derive(Debug, Clone, Copy)]
struct Ewma {
    alpha_per_s: f64,
    value: f64,
    weight: f64,
}

impl Ewma {
    fn new(half_life_s: f64) -> Ewma {
        Ewma {
            alpha_per_s: 0.5f64.powf(1.0 / half_life_s.max(1e-3)),
            value: 0.0,
            weight: 0.0,
        }
    }

    fn add(&mut self, seconds: f64, sample: f64) {
        let a = self.alpha_per_s.powf(seconds.max(1e-3));
        self.value = a * self.value + (1.0 - a) * sample;
        self.weight = a * self.weight + (1.0 - a);
    }

    fn get(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.value / self.weight)
    }
}

/// One player's bitrate adaptation over a representation ladder.
#[derive(Debug, Clone)]
pub struct Abr {
    cfg: AbrConfig,
    /// Bitrates in kbit/s, increasing.
    kbps: Vec<f64>,
    utilities: Vec<f64>,
    gamma: f64,
    v: f64,
    fast: Ewma,
    slow: Ewma,
    bola: bool,
    after_stall: bool,
}

impl Abr {
    /// `kbps`: the representations' bitrates in increasing order (at least
    /// one).
    pub fn new(kbps: &[f64], cfg: AbrConfig) -> Abr {
        let kbps: Vec<f64> = if kbps.is_empty() {
            vec![1.0]
        } else {
            kbps.iter().map(|k| k.max(1e-3)).collect()
        };
        let utilities: Vec<f64> = kbps.iter().map(|k| (k / kbps[0]).ln() + 1.0).collect();
        let target = cfg
            .stable_buffer_s
            .max(cfg.bola_min_buffer_s + cfg.bola_buffer_per_level_s * kbps.len() as f64);
        let top = utilities.last().copied().unwrap_or(1.0);
        // γ and V put the lowest bitrate's decision boundary at the
        // minimum buffer and the highest's at the target (dash.js).
        let gamma = if top > 1.0 {
            (top - 1.0) / (target / cfg.bola_min_buffer_s - 1.0)
        } else {
            1.0
        };
        let v = cfg.bola_min_buffer_s / gamma;
        Abr {
            cfg,
            kbps,
            utilities,
            gamma,
            v,
            fast: Ewma::new(cfg.fast_half_life_s),
            slow: Ewma::new(cfg.slow_half_life_s),
            bola: false,
            after_stall: false,
        }
    }

    /// A segment of `bytes` took `seconds` from its first byte to its last.
    pub fn observe(&mut self, bytes: u64, seconds: f64) {
        let seconds = seconds.max(1e-4);
        let kbps = bytes as f64 * 8.0 / 1000.0 / seconds;
        self.fast.add(seconds, kbps);
        self.slow.add(seconds, kbps);
    }

    /// The playout buffer ran empty: the next choice is the lowest.
    pub fn stalled(&mut self) {
        self.after_stall = true;
    }

    /// The throughput estimate, kbit/s.
    pub fn throughput_kbps(&self) -> Option<f64> {
        match (self.fast.get(), self.slow.get()) {
            (Some(f), Some(s)) => Some(f.min(s)),
            (f, s) => f.or(s),
        }
    }

    /// Whether BOLA decides at the moment (else the throughput rule).
    pub fn using_bola(&self) -> bool {
        self.bola
    }

    fn highest_under(&self, kbps: f64) -> usize {
        self.kbps.iter().rposition(|&b| b <= kbps).unwrap_or(0)
    }

    fn throughput_choice(&self) -> usize {
        match self.throughput_kbps() {
            Some(t) => self.highest_under(self.cfg.safety_factor * t),
            None => self.highest_under(self.cfg.initial_kbps),
        }
    }

    /// BOLA-BASIC's choice at a buffer of `buffer_s`, or None when the
    /// buffer is over its target (every score ≤ 0: wait).
    fn bola_choice(&self, buffer_s: f64) -> Option<usize> {
        let mut best = None;
        let mut best_score = 0.0;
        for (m, (&u, &s)) in self.utilities.iter().zip(&self.kbps).enumerate() {
            let score = (self.v * (u + self.gamma) - buffer_s) / s;
            if score > best_score || best.is_none() && score > 0.0 {
                best = Some(m);
                best_score = score;
            }
        }
        best
    }

    /// The representation (index into the ladder) of the next segment,
    /// with `buffer_s` of media buffered ahead of the playhead and segments
    /// of `segment_s`.
    pub fn choose(&mut self, buffer_s: f64, segment_s: f64) -> usize {
        let tput = self.throughput_choice();
        let bola = self.bola_choice(buffer_s).unwrap_or(self.kbps.len() - 1);
        let min = self.cfg.bola_min_buffer_s;
        if !self.bola && buffer_s >= min && bola >= tput {
            self.bola = true;
        } else if self.bola && buffer_s < min && bola < tput {
            self.bola = false;
        }
        let mut pick = if self.bola { bola } else { tput };
        if std::mem::take(&mut self.after_stall) {
            pick = 0;
        } else if let Some(t) = self.throughput_kbps() {
            let cap = self.cfg.insufficient_buffer_factor * t * buffer_s / segment_s.max(1e-3);
            pick = pick.min(self.highest_under(cap));
        }
        pick
    }

    /// A download of a segment of `segment_s` at representation `rep` has
    /// received `got` of `total` bytes in `elapsed_s` since its first byte:
    /// the lower representation to ask it again at, if it should be given
    /// up. The throughput it got counts in the estimate.
    pub fn abandon(
        &mut self,
        rep: usize,
        got: u64,
        total: u64,
        elapsed_s: f64,
        segment_s: f64,
    ) -> Option<usize> {
        if rep == 0 || total == 0 || got == 0 || got >= total {
            return None;
        }
        if elapsed_s < self.cfg.abandon_min_elapsed_s {
            return None;
        }
        let kbps = got as f64 * 8.0 / 1000.0 / elapsed_s;
        let expected_s = total as f64 * 8.0 / 1000.0 / kbps;
        if expected_s <= self.cfg.abandon_duration_multiplier * segment_s {
            return None;
        }
        let lower = self.highest_under(self.cfg.safety_factor * kbps);
        (lower < rep).then(|| {
            self.observe(got, elapsed_s);
            lower
        })
    }

    /// How much media to keep buffered while playing representation
    /// `index`: request the next segment while the buffer is under this.
    /// While BOLA decides, no more than the buffer past which it would
    /// choose nothing.
    pub fn buffer_target_s(&self, index: usize) -> f64 {
        let target = if index + 1 >= self.kbps.len() {
            self.cfg.top_quality_buffer_s
        } else {
            self.cfg.stable_buffer_s
        };
        if self.bola {
            let top = self.utilities.last().copied().unwrap_or(1.0);
            target.min(self.v * (top + self.gamma))
        } else {
            target
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LADDER: [f64; 3] = [300.0, 1000.0, 2500.0];

    #[test]
    fn starts_at_the_initial_bitrate_without_an_estimate() {
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        assert_eq!(a.choose(0.0, 2.0), 1);
        let mut a = Abr::new(&[100.0, 200.0], AbrConfig::default());
        assert_eq!(a.choose(0.0, 2.0), 1);
        let mut a = Abr::new(&[2000.0, 4000.0], AbrConfig::default());
        assert_eq!(a.choose(0.0, 2.0), 0, "nothing under 1 Mbit/s: the lowest");
    }

    #[test]
    fn the_throughput_rule_keeps_a_safety_margin() {
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        // 1.2 Mbit/s measured for a while: 0.9 × 1200 = 1080 → 1000 kbit/s.
        for _ in 0..10 {
            a.observe(300_000, 2.0);
        }
        assert!((a.throughput_kbps().unwrap() - 1200.0).abs() < 1.0);
        assert_eq!(a.choose(4.0, 2.0), 1);
        // 2.7 Mbit/s: 0.9 × 2700 = 2430 is under 2500, so still 1000.
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        for _ in 0..10 {
            a.observe(675_000, 2.0);
        }
        assert_eq!(a.choose(8.0, 2.0), 1);
        for _ in 0..10 {
            a.observe(1_000_000, 2.0);
        }
        assert_eq!(a.choose(8.0, 2.0), 2);
    }

    #[test]
    fn the_estimate_falls_fast_and_rises_slowly() {
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        for _ in 0..20 {
            a.observe(1_000_000, 1.0); // 8 Mbit/s
        }
        a.observe(100_000, 2.0); // one slow segment: 400 kbit/s
        let after_drop = a.throughput_kbps().unwrap();
        assert!(after_drop < 5500.0, "{after_drop}");
        let mut b = Abr::new(&LADDER, AbrConfig::default());
        for _ in 0..20 {
            b.observe(100_000, 2.0);
        }
        b.observe(1_000_000, 1.0);
        let after_rise = b.throughput_kbps().unwrap();
        assert!(after_rise < 1500.0, "{after_rise}");
    }

    #[test]
    fn latency_alone_does_not_lower_the_choice_but_a_stall_does() {
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        // Segments delivered fast once they start (the wait before the
        // first byte is not counted).
        for _ in 0..5 {
            a.observe(625_000, 0.05);
        }
        assert_eq!(a.choose(2.0, 2.0), 2);
        a.stalled();
        assert_eq!(a.choose(0.0, 2.0), 0);
        assert_eq!(a.choose(2.0, 2.0), 2, "only the segment after the stall");
    }

    #[test]
    fn an_empty_buffer_caps_the_bitrate_to_what_it_can_hide() {
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        for _ in 0..10 {
            a.observe(1_000_000, 2.0); // 4 Mbit/s
        }
        assert_eq!(a.choose(0.5, 2.0), 0, "0.5 × 4000 × 0.25 = 500");
        assert_eq!(a.choose(1.2, 2.0), 1, "0.5 × 4000 × 0.6 = 1200");
        assert_eq!(a.choose(4.0, 2.0), 2);
    }

    #[test]
    fn bola_takes_over_on_a_long_buffer_and_waits_past_its_target() {
        let cfg = AbrConfig::default();
        let mut a = Abr::new(&LADDER, cfg);
        for _ in 0..10 {
            a.observe(450_000, 2.0); // 1.8 Mbit/s: the throughput rule says 1000
        }
        assert_eq!(a.choose(6.0, 2.0), 1);
        assert!(!a.using_bola());
        // At 16 s of buffer (BOLA's target is max(12, 10 + 2·3) = 16 s)
        // BOLA chooses the top and takes over.
        let c = a.choose(15.9, 2.0);
        assert!(a.using_bola());
        assert_eq!(c, 2);
        // BOLA's choice grows with the buffer.
        let mut last = 0;
        for b in [10.5, 12.0, 14.0, 15.9] {
            let c = a.bola_choice(b).unwrap();
            assert!(c >= last, "{b}: {c} < {last}");
            last = c;
        }
        assert_eq!(a.bola_choice(10.0 + 1e-6), Some(0));
        // Past BOLA's target nothing scores: the player waits.
        assert_eq!(a.bola_choice(40.0), None);
        // Falling under 10 s with BOLA below the throughput rule: back.
        a.choose(9.0, 2.0);
        assert!(!a.using_bola());
    }

    #[test]
    fn a_download_too_slow_for_its_segment_is_given_up_for_a_lower_bitrate() {
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        // 1000 kbit/s segment of 2 s (250 kB) on a 500 kbit/s link: 4 s
        // expected, over 1.8 × 2 s.
        assert_eq!(a.abandon(1, 15_000, 250_000, 0.3, 2.0), None, "too early");
        assert_eq!(a.abandon(1, 37_500, 250_000, 0.6, 2.0), Some(0));
        assert!(a.throughput_kbps().unwrap() < 600.0);
        // At 900 kbit/s it would take 2.2 s: carry on.
        let mut a = Abr::new(&LADDER, AbrConfig::default());
        assert_eq!(a.abandon(1, 67_500, 250_000, 0.6, 2.0), None);
        // Nothing lower than the lowest.
        assert_eq!(a.abandon(0, 1_000, 75_000, 2.0, 2.0), None);
    }

    #[test]
    fn keeps_a_longer_buffer_at_the_top_quality() {
        let a = Abr::new(&LADDER, AbrConfig::default());
        assert_eq!(a.buffer_target_s(0), 12.0);
        assert_eq!(a.buffer_target_s(2), 30.0);
        let mut a = a;
        for _ in 0..10 {
            a.observe(1_000_000, 2.0);
        }
        a.choose(16.0, 2.0);
        assert!(a.using_bola());
        let t = a.buffer_target_s(2);
        assert!(t > 16.0 && t < 20.0, "BOLA's own target: {t}");
    }
}
