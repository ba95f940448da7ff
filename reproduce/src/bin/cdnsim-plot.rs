//! Plots the MiniCache paper's Figs 1 and 2 from `vcdn sim --json`
//! summaries (see reproduce/cdnsim/).
//!
//! ```text
//! cdnsim-plot fig1 OUTDIR LABEL=SUMMARY.json …
//! cdnsim-plot fig2 NAME OUTDIR LABEL=SUMMARY.json …
//! ```

use std::process::ExitCode;

use vcdn_reproduce::cdnsim::{fig1, fig2, Run};

const USAGE: &str = "usage: cdnsim-plot fig1 OUTDIR LABEL=FILE.json …
       cdnsim-plot fig2 NAME OUTDIR LABEL=FILE.json …";

fn runs(args: &[String]) -> Result<Vec<Run>, String> {
    args.iter()
        .map(|a| {
            let (label, path) = a.split_once('=').ok_or(format!("{a:?}: LABEL=FILE.json"))?;
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            let summary = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
            Ok(Run {
                label: label.into(),
                summary,
            })
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("fig1") if args.len() >= 3 => {
            runs(&args[2..]).and_then(|r| Ok((args[1].clone(), fig1(&r)?)))
        }
        Some("fig2") if args.len() >= 4 => {
            runs(&args[3..]).and_then(|r| Ok((args[2].clone(), fig2(&r, &args[1])?)))
        }
        _ => Err(USAGE.into()),
    };
    let written = result.and_then(|(dir, files)| {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{dir}: {e}"))?;
        for (name, svg) in files {
            let path = format!("{dir}/{name}");
            std::fs::write(&path, svg).map_err(|e| format!("{path}: {e}"))?;
            eprintln!("wrote {path}");
        }
        Ok(())
    });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cdnsim-plot: {e}");
            ExitCode::FAILURE
        }
    }
}
