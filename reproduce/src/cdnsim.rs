//! Plots of the MiniCache paper's Figs 1 and 2 (CDNSim, §3) from the JSON
//! summaries `vcdn sim --json` writes: each carries, under `cdfs`, the
//! values at the shares 0, 0.01, …, 1 of every distribution it reports.

use serde_json::Value;

use crate::svg::{Chart, Series, Style};

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One run: a legend label and its summary.
pub struct Run {
    pub label: String,
    pub summary: Value,
}

/// The (value, share) points of `cdfs[key]`; on a log axis values ≤ 0
/// are dropped (the CDF's jump at zero is where its line starts).
fn points(run: &Run, key: &str, log_x: bool) -> Result<Vec<(f64, f64)>, String> {
    let xs = run.summary["cdfs"][key].as_array().ok_or_else(|| {
        format!(
            "{}: no cdfs.{key} (a summary from an older vcdn sim?)",
            run.label
        )
    })?;
    let n = xs.len().saturating_sub(1).max(1) as f64;
    Ok(xs
        .iter()
        .enumerate()
        .filter_map(|(i, x)| x.as_f64().map(|x| (x, i as f64 / n)))
        .filter(|&(x, _)| !log_x || x > 0.0)
        .collect())
}

/// A CDF chart of `cdfs[key]` with one line per run.
pub fn cdf_chart(
    runs: &[Run],
    key: &str,
    title: &str,
    x_label: &str,
    log_x: bool,
) -> Result<String, String> {
    let mut series = Vec::new();
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for (i, r) in runs.iter().enumerate() {
        let pts = points(r, key, log_x)?;
        for &(x, _) in &pts {
            lo = lo.min(x);
            hi = hi.max(x);
        }
        series.push(Series {
            name: r.label.clone(),
            color: COLORS[i % COLORS.len()].into(),
            style: if i < COLORS.len() {
                Style::Line
            } else {
                Style::Dashed
            },
            points: pts,
            errors: None,
        });
    }
    if !lo.is_finite() {
        (lo, hi) = (1.0, 10.0);
    }
    let x_range = if log_x {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    } else {
        (lo.min(0.0), if hi > lo { hi } else { lo + 1.0 })
    };
    Ok(Chart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: "CDF".into(),
        log_x,
        x_range,
        y_range: (0.0, 1.0),
        series,
        markers: vec![],
    }
    .render())
}

/// Fig 1 (a–e): (file name, SVG).
pub fn fig1(runs: &[Run]) -> Result<Vec<(String, String)>, String> {
    let panels = [
        (
            "fig1a",
            "vm_peak_mbps",
            "Fig 1a: peak throughput per VM",
            "Mb/s",
        ),
        (
            "fig1b",
            "vm_peak_connections",
            "Fig 1b: peak connections per VM",
            "connections",
        ),
        (
            "fig1c",
            "as_peak_gbps",
            "Fig 1c: peak throughput per access AS",
            "Gb/s",
        ),
        (
            "fig1d",
            "as_peak_connections",
            "Fig 1d: peak connections per access AS",
            "connections",
        ),
        (
            "fig1e",
            "as_peak_vms",
            "Fig 1e: peak concurrent VMs per access AS",
            "VMs",
        ),
    ];
    panels
        .iter()
        .map(|(file, key, title, x)| {
            Ok((format!("{file}.svg"), cdf_chart(runs, key, title, x, true)?))
        })
        .collect()
}

/// Fig 2: QoE CDFs, one chart per metric, one line per run.
pub fn fig2(runs: &[Run], what: &str) -> Result<Vec<(String, String)>, String> {
    let panels = [
        ("start", "start_s", "start time (s)", true),
        (
            "buffering-ratio",
            "buffering_ratio",
            "buffering ratio",
            true,
        ),
        (
            "buffering-events",
            "buffering_events",
            "buffering events per session",
            false,
        ),
        (
            "playback-ratio",
            "playback_ratio",
            "playback ratio (mean download rate / bitrate)",
            false,
        ),
    ];
    panels
        .iter()
        .map(|(file, key, x, log)| {
            Ok((
                format!("fig2-{what}-{file}.svg"),
                cdf_chart(runs, key, &format!("Fig 2 ({what}): {x}"), x, *log)?,
            ))
        })
        .collect()
}
