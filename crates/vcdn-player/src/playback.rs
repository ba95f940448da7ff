//! The playout buffer of one session, as pure code: segments arrive, the
//! playhead moves in real time, stalls happen when it catches up with the
//! buffer. Times are seconds since the session started.

use vcdn_model::qoe::{Window, WINDOW_S};

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Filling the buffer before the first frame.
    Starting,
    Playing,
    /// Waiting for data since this time.
    Stalled(f64),
    Failed,
}

/// One stall: when it began and how long it lasted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stall {
    pub at: f64,
    pub duration: f64,
}

#[derive(Debug, Clone)]
pub struct Playback {
    state: State,
    /// Media seconds needed before playback starts.
    start_buffer_s: f64,
    /// Media time buffered (contiguous from 0) and played.
    buffered_s: f64,
    position_s: f64,
    /// Wall time of the last update.
    now: f64,
    pub play_start: Option<f64>,
    pub stalls: Vec<Stall>,
    pub failed_at: Option<f64>,
    /// (media start, media end, bitrate kb/s) of each buffered segment.
    played: Vec<(f64, f64, f64)>,
}

impl Playback {
    pub fn new(start_buffer_s: f64) -> Playback {
        Playback {
            state: State::Starting,
            start_buffer_s,
            buffered_s: 0.0,
            position_s: 0.0,
            now: 0.0,
            play_start: None,
            stalls: Vec::new(),
            failed_at: None,
            played: Vec::new(),
        }
    }

    /// Moves wall time to `t`: the playhead advances while playing and a
    /// stall begins where it reaches the end of the buffer.
    pub fn advance(&mut self, t: f64) {
        if t <= self.now {
            return;
        }
        if self.state == State::Playing {
            let left = self.buffered_s - self.position_s;
            let dt = t - self.now;
            if dt >= left {
                self.position_s = self.buffered_s;
                self.state = State::Stalled(self.now + left.max(0.0));
            } else {
                self.position_s += dt;
            }
        }
        self.now = t;
    }

    /// The next contiguous segment (`duration_s` of media at `kbps`) is in
    /// the buffer at `t`.
    pub fn arrive(&mut self, t: f64, duration_s: f64, kbps: f64) {
        self.advance(t);
        if self.state == State::Failed {
            return;
        }
        self.played
            .push((self.buffered_s, self.buffered_s + duration_s, kbps));
        self.buffered_s += duration_s;
        match self.state {
            State::Starting if self.buffered_s >= self.start_buffer_s - 1e-9 => {
                self.play_start = Some(t);
                self.state = State::Playing;
            }
            State::Stalled(since) => {
                self.stalls.push(Stall {
                    at: since,
                    duration: t - since,
                });
                self.state = State::Playing;
            }
            _ => {}
        }
    }

    /// Playback cannot go on (a segment failed for good).
    pub fn fail(&mut self, t: f64) {
        self.advance(t);
        if let State::Stalled(since) = self.state {
            self.stalls.push(Stall {
                at: since,
                duration: t - since,
            });
        }
        self.state = State::Failed;
        self.failed_at.get_or_insert(t);
    }

    /// Media seconds buffered ahead of the playhead at `t`.
    pub fn level(&mut self, t: f64) -> f64 {
        self.advance(t);
        (self.buffered_s - self.position_s).max(0.0)
    }

    /// Media seconds in the buffer (played or not), from the first segment.
    pub fn buffered(&self) -> f64 {
        self.buffered_s
    }

    /// Where the playhead is, in media seconds from the first segment.
    pub fn position(&self) -> f64 {
        self.position_s
    }

    /// Quality switches in the media buffered so far (a change of bitrate
    /// from one segment to the next).
    pub fn switches(&self) -> usize {
        self.played.windows(2).filter(|p| p[0].2 != p[1].2).count()
    }

    /// All media is buffered: no stall can follow.
    pub fn complete(&self) -> bool {
        self.state == State::Playing && self.position_s >= self.buffered_s
    }

    pub fn is_stalled(&self) -> bool {
        matches!(self.state, State::Stalled(_))
    }

    pub fn is_playing(&self) -> bool {
        self.state == State::Playing
    }

    /// Ends the session at `t` and cuts it into 16 s windows from the
    /// first frame (a last partial window counts if at least 4 s long). A
    /// session that never started is one failed window.
    pub fn windows(&mut self, t: f64) -> Vec<Window> {
        self.advance(t);
        if let State::Stalled(since) = self.state {
            if t > since {
                self.stalls.push(Stall {
                    at: since,
                    duration: t - since,
                });
            }
            self.state = State::Stalled(t);
        }
        let Some(start) = self.play_start else {
            return vec![Window {
                failed: true,
                ..Window::default()
            }];
        };
        let span = (t - start).max(0.0);
        let mut n = (span / WINDOW_S).floor() as usize;
        if span - n as f64 * WINDOW_S >= 4.0 || n == 0 {
            n += 1;
        }
        let mut out = vec![Window::default(); n];
        out[0].startup_delay_s = start;
        for s in &self.stalls {
            let i = (((s.at - start) / WINDOW_S).floor().max(0.0) as usize).min(n - 1);
            out[i].stalls += 1;
            out[i].stall_s += s.duration;
            out[i].longest_stall_s = out[i].longest_stall_s.max(s.duration);
        }
        // Bitrate of the media played in each window: media time maps to
        // wall time shifted by the stalls before it.
        for (i, w) in out.iter_mut().enumerate() {
            let (from, to) = (i as f64 * WINDOW_S, (i + 1) as f64 * WINDOW_S);
            let stalled_before = |x: f64| -> f64 {
                self.stalls
                    .iter()
                    .filter(|s| s.at - start < x)
                    .map(|s| s.duration)
                    .sum()
            };
            let (m0, m1) = (
                (from - stalled_before(from)).max(0.0),
                (to - stalled_before(to)).max(0.0),
            );
            let mut weight = 0.0;
            let mut sum = 0.0;
            for &(a, b, kbps) in &self.played {
                let overlap = (b.min(m1) - a.max(m0)).max(0.0);
                weight += overlap;
                sum += overlap * kbps;
            }
            w.bitrate_kbps = if weight > 0.0 { sum / weight } else { 0.0 };
            // A switch counts in the window where its media plays.
            w.switches = self
                .played
                .windows(2)
                .filter(|p| p[0].2 != p[1].2 && p[1].0 >= m0 && p[1].0 < m1)
                .count() as u32;
            if let Some(f) = self.failed_at {
                w.failed = f - start < to;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_when_the_start_buffer_is_full_and_plays_without_stalls() {
        let mut p = Playback::new(4.0);
        p.arrive(0.3, 2.0, 2500.0);
        assert_eq!(p.play_start, None);
        p.arrive(0.5, 2.0, 2500.0);
        assert_eq!(p.play_start, Some(0.5));
        for k in 2..20 {
            p.arrive(0.5 + k as f64 * 2.0 - 1.0, 2.0, 2500.0);
        }
        let w = p.windows(30.5);
        assert!(p.stalls.is_empty());
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].bitrate_kbps, 2500.0);
    }

    #[test]
    fn a_late_segment_makes_a_stall_as_long_as_it_is_late() {
        let mut p = Playback::new(2.0);
        p.arrive(1.0, 2.0, 250.0); // plays 1..3
        p.arrive(5.5, 2.0, 250.0); // 2.5 s late
        assert_eq!(
            p.stalls,
            vec![Stall {
                at: 3.0,
                duration: 2.5
            }]
        );
        let w = p.windows(7.5);
        assert_eq!((w[0].stalls, w[0].longest_stall_s), (1, 2.5));
    }

    #[test]
    fn windows_carry_the_start_up_delay_and_the_switches_where_they_play() {
        let mut p = Playback::new(2.0);
        p.arrive(1.5, 2.0, 1000.0); // starts at 1.5
        for (k, kbps) in [2500.0, 2500.0, 2500.0, 2500.0, 2500.0, 2500.0, 2500.0]
            .into_iter()
            .enumerate()
        {
            p.arrive(2.0 + k as f64, 2.0, kbps);
        }
        for k in 0..8 {
            p.arrive(10.0 + k as f64, 2.0, if k < 4 { 2500.0 } else { 1000.0 });
        }
        // Media 0–2 at 1000, 2–24 at 2500 (a switch at 2 s), 24–32 at 1000
        // (a switch at 24 s: the second window).
        assert_eq!(p.switches(), 2);
        let w = p.windows(1.5 + 30.0);
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].startup_delay_s, w[1].startup_delay_s), (1.5, 0.0));
        assert_eq!((w[0].switches, w[1].switches), (1, 1));
        assert_eq!(p.level(1.5 + 30.0), 2.0);
    }

    #[test]
    fn never_starting_or_failing_scores_failed_windows() {
        let mut p = Playback::new(4.0);
        p.arrive(1.0, 2.0, 250.0);
        let w = p.windows(20.0);
        assert_eq!(w.len(), 1);
        assert!(w[0].failed);
        let mut p = Playback::new(2.0);
        p.arrive(0.5, 2.0, 250.0);
        p.fail(20.0);
        let w = p.windows(40.0);
        assert!(!w[0].failed && w[1].failed, "{w:?}");
        assert_eq!(w[0].longest_stall_s, 17.5);
    }
}
