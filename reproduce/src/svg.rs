//! A minimal SVG line chart (no plotting dependency): a few series on a
//! linear or log₁₀ x axis and a linear y axis, optional error bars, vertical
//! marker lines and a legend.

use std::fmt::Write;

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A solid line.
    Line,
    /// A dashed line.
    Dashed,
    /// Circles, with error bars when given.
    Points,
}

/// One curve.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// CSS colour.
    pub color: String,
    /// Line or points.
    pub style: Style,
    /// (x, y) points, in x order for lines.
    pub points: Vec<(f64, f64)>,
    /// Half-heights of error bars, one per point (points only).
    pub errors: Option<Vec<f64>>,
}

/// A chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Log₁₀ x axis.
    pub log_x: bool,
    /// X range.
    pub x_range: (f64, f64),
    /// Y range.
    pub y_range: (f64, f64),
    /// The curves.
    pub series: Vec<Series>,
    /// Vertical dotted lines: (x, label).
    pub markers: Vec<(f64, String)>,
}

const W: f64 = 760.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Round tick step for a span: 1, 2 or 5 × 10^k, about 6 ticks.
fn nice_step(span: f64) -> f64 {
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    mag * if r < 1.5 {
        1.0
    } else if r < 3.5 {
        2.0
    } else if r < 7.5 {
        5.0
    } else {
        10.0
    }
}

fn fmt_tick(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

impl Chart {
    fn tx(&self, x: f64) -> f64 {
        let (a, b) = self.x_range;
        let f = if self.log_x {
            (x.log10() - a.log10()) / (b.log10() - a.log10())
        } else {
            (x - a) / (b - a)
        };
        LEFT + f * (W - LEFT - RIGHT)
    }

    fn ty(&self, y: f64) -> f64 {
        let (a, b) = self.y_range;
        TOP + (1.0 - (y - a) / (b - a)) * (H - TOP - BOTTOM)
    }

    fn in_x(&self, x: f64) -> bool {
        x >= self.x_range.0 && x <= self.x_range.1 && (!self.log_x || x > 0.0)
    }

    /// The SVG document.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            W / 2.0,
            esc(&self.title)
        );
        let (x0, x1, y0, y1) = (LEFT, W - RIGHT, TOP, H - BOTTOM);
        // Grid and ticks.
        let mut xticks = Vec::new();
        if self.log_x {
            let (a, b) = (
                self.x_range.0.log10().floor() as i32,
                self.x_range.1.log10().ceil() as i32,
            );
            for e in a..=b {
                for m in [1.0, 2.0, 5.0] {
                    let v = m * 10f64.powi(e);
                    if self.in_x(v) {
                        xticks.push(v);
                    }
                }
            }
        } else {
            let step = nice_step(self.x_range.1 - self.x_range.0);
            let mut v = (self.x_range.0 / step).ceil() * step;
            while v <= self.x_range.1 + 1e-12 {
                xticks.push(v);
                v += step;
            }
        }
        for &v in &xticks {
            let x = self.tx(v);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="#e4e4e4"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
                y1 + 16.0,
                fmt_tick(v)
            );
        }
        let ystep = nice_step(self.y_range.1 - self.y_range.0);
        let mut v = (self.y_range.0 / ystep).ceil() * ystep;
        while v <= self.y_range.1 + 1e-12 {
            let y = self.ty(v);
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#e4e4e4"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                x0 - 6.0,
                y + 4.0,
                fmt_tick(v)
            );
            v += ystep;
        }
        let _ = writeln!(
            s,
            r#"<rect x="{x0}" y="{y0}" width="{}" height="{}" fill="none" stroke="black"/>"#,
            x1 - x0,
            y1 - y0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (x0 + x1) / 2.0,
            H - 18.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
            (y0 + y1) / 2.0,
            (y0 + y1) / 2.0,
            esc(&self.y_label)
        );
        for (i, (x, label)) in self.markers.iter().enumerate() {
            if self.in_x(*x) {
                let px = self.tx(*x);
                let _ = writeln!(
                    s,
                    r##"<line x1="{px:.1}" y1="{y0}" x2="{px:.1}" y2="{y1}" stroke="#888" stroke-dasharray="2,3"/>"##
                );
                let _ = writeln!(
                    s,
                    r##"<text x="{:.1}" y="{}" fill="#555" font-size="11">{}</text>"##,
                    px + 3.0,
                    y0 + 12.0 + 14.0 * i as f64,
                    esc(label)
                );
            }
        }
        // Series.
        for ser in &self.series {
            let pts: Vec<(usize, f64, f64)> = ser
                .points
                .iter()
                .enumerate()
                .filter(|(_, (x, y))| self.in_x(*x) && y.is_finite())
                .map(|(i, &(x, y))| (i, self.tx(x), self.ty(y)))
                .collect();
            match ser.style {
                Style::Line | Style::Dashed => {
                    let path: Vec<String> = pts
                        .iter()
                        .map(|(_, x, y)| format!("{x:.1},{y:.1}"))
                        .collect();
                    let dash = if ser.style == Style::Dashed {
                        r#" stroke-dasharray="6,4""#
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        s,
                        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                        path.join(" "),
                        ser.color
                    );
                }
                Style::Points => {
                    for &(i, x, y) in &pts {
                        if let Some(err) = ser.errors.as_ref().and_then(|e| e.get(i)) {
                            let y_val = ser.points[i].1;
                            let (ya, yb) = (self.ty(y_val - err), self.ty(y_val + err));
                            let _ = writeln!(
                                s,
                                r#"<line x1="{x:.1}" y1="{ya:.1}" x2="{x:.1}" y2="{yb:.1}" stroke="{}"/>"#,
                                ser.color
                            );
                        }
                        let _ = writeln!(
                            s,
                            r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="none" stroke="{}" stroke-width="1.5"/>"#,
                            ser.color
                        );
                    }
                }
            }
        }
        // Legend, bottom right.
        let lx = x1 - 260.0;
        let mut ly = y1 - 14.0 - 18.0 * (self.series.len() as f64 - 1.0);
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="252" height="{}" fill="white" fill-opacity="0.9" stroke="#bbb"/>"##,
            lx - 6.0,
            ly - 14.0,
            18.0 * self.series.len() as f64 + 6.0
        );
        for ser in &self.series {
            match ser.style {
                Style::Points => {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{}" cy="{}" r="3.5" fill="none" stroke="{}" stroke-width="1.5"/>"#,
                        lx + 12.0,
                        ly - 4.0,
                        ser.color
                    );
                }
                _ => {
                    let dash = if ser.style == Style::Dashed {
                        r#" stroke-dasharray="6,4""#
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        s,
                        r#"<line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"{dash}/>"#,
                        ly - 4.0,
                        lx + 24.0,
                        ly - 4.0,
                        ser.color
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{ly}">{}</text>"#,
                lx + 30.0,
                esc(&ser.name)
            );
            ly += 18.0;
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_well_formed_document() {
        let chart = Chart {
            title: "t <1>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: true,
            x_range: (1e-3, 1.0),
            y_range: (0.0, 0.6),
            series: vec![
                Series {
                    name: "line".into(),
                    color: "#1f77b4".into(),
                    style: Style::Line,
                    points: vec![(1e-3, 0.1), (0.1, 0.5), (1.0, 0.4)],
                    errors: None,
                },
                Series {
                    name: "pts".into(),
                    color: "red".into(),
                    style: Style::Points,
                    points: vec![(0.01, 0.3), (0.0, 0.2)],
                    errors: Some(vec![0.01, 0.01]),
                },
            ],
            markers: vec![(0.067, "δ1*".into())],
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;1&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 1);
        // x = 0 cannot sit on a log axis: one circle in the plot, one in the legend.
        assert_eq!(svg.matches("<circle").count(), 2);
        assert_eq!(nice_step(0.6), 0.1);
        assert_eq!(fmt_tick(0.5), "0.5");
        assert_eq!(fmt_tick(2.0), "2");
    }
}
