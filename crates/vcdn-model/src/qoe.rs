//! Video QoE: a MOS (1–5) per 16-second window of a DASH session, and the
//! session's running MOS, by the rules of the CDNaaS paper (§IV-D1):
//!
//! - MOS is computed per 16 s window (the PSQA tool's unit);
//! - a window with a stall longer than 8 s scores 1.0;
//! - once playback fails (does not start, or stops for good), every later
//!   window scores 1.0;
//! - recency: `MOS_{i+1} = 0.3·MOS_i + 0.7·s_{i+1}`.
//!
//! The paper's per-window score came from PSQA, a neural network trained
//! on subjective tests that is not published. In its place a window's
//! score combines two published parametric models:
//!
//! - **stalling**: Hoßfeld, Schatz, Seufert, Hirth, Zinner, Tran-Gia,
//!   "Quantification of YouTube QoE via Crowdsourcing" (IEEE ISM 2011),
//!   `f(N, L) = 3.5·e^{−(0.15·L + 0.19)·N} + 1.5` for N stalls of mean
//!   length L seconds;
//! - **picture quality**: ITU-T G.1070's video quality for H.264
//!   (coefficients of its VGA table), `Vq(bitrate, frame rate)` without
//!   packet loss, taken *relative to the title's best representation*: the
//!   paper streamed one fixed quality and its uninterrupted windows scored
//!   about 4.9, so the best representation without stalls scores 5 here and
//!   lower ones score `1 + 4·(Vq(b) − 1)/(Vq(best) − 1)`.
//!
//! The window's score is `1 + (Q − 1)·(f − 1)/4`: the quality ceiling `Q`
//! scaled by what the stalls leave of it.

/// Seconds per window.
pub const WINDOW_S: f64 = 16.0;
/// A stall longer than this makes a window score 1.
pub const LONG_STALL_S: f64 = 8.0;

/// What happened in one window of playback.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Window {
    /// Stalls that started in the window (the initial buffering is not a
    /// stall).
    pub stalls: u32,
    /// Total and longest stall time in the window, seconds.
    pub stall_s: f64,
    pub longest_stall_s: f64,
    /// Mean bitrate of the video played in the window, kb/s (0 if nothing
    /// was played).
    pub bitrate_kbps: f64,
    /// Playback failed in or before this window.
    pub failed: bool,
    /// The session's start-up delay, seconds (its first window only).
    pub startup_delay_s: f64,
    /// Quality switches in the media played in the window.
    pub switches: u32,
}

/// Hoßfeld et al.'s stalling model: MOS for `n` stalls of mean length
/// `mean_s`.
pub fn stall_mos(n: u32, mean_s: f64) -> f64 {
    3.5 * (-(0.15 * mean_s.max(0.0) + 0.19) * n as f64).exp() + 1.5
}

/// ITU-T G.1070 video quality (H.264, VGA coefficients), no packet loss.
pub fn g1070_quality(bitrate_kbps: f64, frame_rate: f64) -> f64 {
    const V: [f64; 8] = [0.0, 5.517, 0.0129, 3.459, 178.53, 1.02, 1.15, 0.000355];
    let br = bitrate_kbps.max(1.0);
    let fr = frame_rate.clamp(1.0, 60.0);
    let o_fr = (V[1] + V[2] * br).clamp(1.0, 30.0);
    let i_ofr = (V[3] - V[3] / (1.0 + (br / V[4]).powf(V[5]))).clamp(0.0, 4.0);
    let d_frv = (V[6] + V[7] * br).max(1e-6);
    let i_coding = i_ofr * (-(fr.ln() - o_fr.ln()).powi(2) / (2.0 * d_frv * d_frv)).exp();
    1.0 + i_coding
}

/// Picture quality ceiling of a window, relative to the best
/// representation (`best_kbps`) at `frame_rate`.
pub fn quality_ceiling(bitrate_kbps: f64, best_kbps: f64, frame_rate: f64) -> f64 {
    if bitrate_kbps <= 0.0 {
        return 1.0;
    }
    let best = g1070_quality(best_kbps.max(bitrate_kbps), frame_rate);
    let this = g1070_quality(bitrate_kbps, frame_rate);
    if best <= 1.0 {
        return 5.0;
    }
    (1.0 + 4.0 * (this - 1.0) / (best - 1.0)).clamp(1.0, 5.0)
}

/// The score of one window.
pub fn window_score(w: &Window, best_kbps: f64, frame_rate: f64) -> f64 {
    if w.failed || w.longest_stall_s > LONG_STALL_S || w.bitrate_kbps <= 0.0 {
        return 1.0;
    }
    let q = quality_ceiling(w.bitrate_kbps, best_kbps, frame_rate);
    let mean = if w.stalls == 0 {
        0.0
    } else {
        w.stall_s / w.stalls as f64
    };
    let f = stall_mos(w.stalls, mean);
    (1.0 + (q - 1.0) * (f - 1.0) / 4.0).clamp(1.0, 5.0)
}

/// A session's MOS over its windows, with the paper's recency rule and
/// "failed stays failed".
#[derive(Debug, Clone, Default)]
pub struct SessionMos {
    mos: Option<f64>,
    failed: bool,
    /// Every window's score, in order.
    pub scores: Vec<f64>,
}

impl SessionMos {
    /// Adds a window; returns the running MOS.
    pub fn push(&mut self, w: &Window, best_kbps: f64, frame_rate: f64) -> f64 {
        self.failed |= w.failed;
        let s = if self.failed {
            1.0
        } else {
            window_score(w, best_kbps, frame_rate)
        };
        self.scores.push(s);
        let m = match self.mos {
            None => s,
            Some(prev) => 0.3 * prev + 0.7 * s,
        };
        self.mos = Some(m);
        m
    }

    /// The running MOS (None before the first window).
    pub fn mos(&self) -> Option<f64> {
        self.mos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(stalls: u32, stall_s: f64, longest: f64, kbps: f64) -> Window {
        Window {
            stalls,
            stall_s,
            longest_stall_s: longest,
            bitrate_kbps: kbps,
            failed: false,
            ..Window::default()
        }
    }

    #[test]
    fn the_stalling_model_is_hossfelds() {
        assert_eq!(stall_mos(0, 0.0), 5.0);
        assert!((stall_mos(1, 2.0) - (3.5 * (-0.49f64).exp() + 1.5)).abs() < 1e-12);
        assert!(stall_mos(3, 4.0) < stall_mos(1, 4.0));
        assert!(stall_mos(1, 6.0) < stall_mos(1, 1.0));
        assert!(stall_mos(100, 10.0) > 1.5 - 1e-9);
    }

    #[test]
    fn g1070_quality_grows_with_bitrate() {
        let low = g1070_quality(250.0, 25.0);
        let hd = g1070_quality(2500.0, 25.0);
        assert!(low > 1.5 && low < 3.0, "{low}");
        assert!(hd > 3.8 && hd < 4.5, "{hd}");
        assert!(g1070_quality(1000.0, 25.0) > low && g1070_quality(1000.0, 25.0) < hd);
    }

    #[test]
    fn window_scores() {
        // The best quality without stalls: 5.
        assert!((window_score(&w(0, 0.0, 0.0, 2500.0), 2500.0, 25.0) - 5.0).abs() < 1e-9);
        // One 2 s stall: the stalling model's value.
        let one = window_score(&w(1, 2.0, 2.0, 2500.0), 2500.0, 25.0);
        assert!((one - stall_mos(1, 2.0)).abs() < 1e-9, "{one}");
        // A lower representation scores lower, stalls or not.
        let low = window_score(&w(0, 0.0, 0.0, 250.0), 2500.0, 25.0);
        assert!(low < 3.5 && low > 1.0, "{low}");
        // Over 8 s of stall, or nothing played: 1.
        assert_eq!(window_score(&w(1, 8.5, 8.5, 2500.0), 2500.0, 25.0), 1.0);
        assert_eq!(window_score(&w(0, 0.0, 0.0, 0.0), 2500.0, 25.0), 1.0);
    }

    #[test]
    fn the_session_mos_follows_the_recency_rule_and_failure_sticks() {
        let mut s = SessionMos::default();
        assert_eq!(s.push(&w(0, 0.0, 0.0, 2500.0), 2500.0, 25.0), 5.0);
        let second = s.push(&w(1, 9.0, 9.0, 2500.0), 2500.0, 25.0);
        assert!((second - (0.3 * 5.0 + 0.7 * 1.0)).abs() < 1e-9);
        let failed = Window {
            failed: true,
            ..w(0, 0.0, 0.0, 2500.0)
        };
        s.push(&failed, 2500.0, 25.0);
        // After a failure, even a perfect-looking window scores 1.
        s.push(&w(0, 0.0, 0.0, 2500.0), 2500.0, 25.0);
        assert_eq!(s.scores, vec![5.0, 1.0, 1.0, 1.0]);
        assert!(s.mos().unwrap() < 1.2);
    }
}
