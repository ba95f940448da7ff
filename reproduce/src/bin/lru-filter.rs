//! Re-makes Fig. 5, Fig. 7's comparison, §V-A's hit rates and Tables I–II of
//! Desmouceaux et al. (IM 2019) with vcdn's model and LRU filter.
//!
//! ```text
//! cargo run --release -p vcdn-reproduce --bin lru-filter [-- --quick] [--n N]
//!     [--requests R] [--seed S] [--no-sim] [--no-testbed] [--out DIR]
//! ```
//! Markdown on stdout, progress on stderr, files in `reproduce/lru-filter/`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use vcdn_reproduce::lru_filter::{
    fig5, fig5_csv, fig5_markdown, fig5_svg, fig7_markdown, tables, tables_markdown, testbed,
    testbed_markdown, Config,
};

const USAGE: &str = "usage: lru-filter [--quick] [--n N] [--requests R] [--seed S] [--no-sim] [--no-testbed] [--out DIR]
  --quick       N = 10^5, 10^6 requests per point, fewer points, no testbed simulation
  --n N         catalogue of the finite model and the simulation (default 1000000)
  --requests R  measured requests per simulated point (default 4000000)
  --seed S      simulation seed (default 2019)
  --no-sim      models only
  --no-testbed  skip §V-A at N = 10^7
  --out DIR     output directory (default reproduce/lru-filter)";

fn parse_num(flag: &str, v: Option<String>) -> Result<f64, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.replace('_', "")
        .parse::<f64>()
        .map_err(|_| format!("{flag}: not a number: {v}"))
}

fn parse() -> Result<(Config, PathBuf), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cfg = if args.iter().any(|a| a == "--quick") {
        Config::quick()
    } else {
        Config::full()
    };
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lru-filter");
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => {}
            "--n" => {
                let n = parse_num("--n", it.next())?;
                if !(1000.0..=1e9).contains(&n) {
                    return Err("--n must be between 1000 and 10^9".into());
                }
                cfg.n = n as usize;
            }
            "--requests" => cfg.requests = parse_num("--requests", it.next())? as u64,
            "--seed" => cfg.seed = parse_num("--seed", it.next())? as u64,
            "--no-sim" => cfg.requests = 0,
            "--no-testbed" => cfg.testbed_n = 0,
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a value")?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    Ok((cfg, out))
}

fn main() -> ExitCode {
    let (cfg, out) = match parse() {
        Ok(x) => x,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("lru-filter: {e}");
            }
            eprintln!("{USAGE}");
            return if e.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    let start = Instant::now();
    let log = |m: &str| eprintln!("[{:6.1} s] {m}", start.elapsed().as_secs_f64());

    log("tables I and II: δ1* for 8 α × 9 δ2");
    let t = Instant::now();
    let tab = tables();
    let t_tables = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let f5 = fig5(&cfg, log);
    let t_fig5 = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let tb = testbed(&cfg, log);
    let t_testbed = t.elapsed().as_secs_f64();

    let mut md = String::from("## LRU filter (Desmouceaux et al., IM 2019) — paper vs vcdn\n\n");
    md.push_str(&fig5_markdown(&f5));
    md.push('\n');
    md.push_str(&fig7_markdown(&f5));
    md.push('\n');
    if let Some(tb) = &tb {
        md.push_str(&testbed_markdown(tb));
        md.push('\n');
    }
    md.push_str(&tables_markdown(&tab));
    md.push_str(&format!(
        "\nRun: N = {}, {} requests per simulated point, seed {}; tables {:.1} s, Fig. 5 {:.1} s, §V-A {:.1} s, total {:.1} s.\n",
        cfg.n,
        cfg.requests,
        cfg.seed,
        t_tables,
        t_fig5,
        t_testbed,
        start.elapsed().as_secs_f64()
    ));
    print!("{md}");

    let write =
        |name: &str, body: &str| -> std::io::Result<()> { std::fs::write(out.join(name), body) };
    let res = std::fs::create_dir_all(&out)
        .and_then(|_| write("fig5.csv", &fig5_csv(&f5)))
        .and_then(|_| write("fig5.svg", &fig5_svg(&f5)))
        .and_then(|_| write("tables.md", &md));
    match res {
        Ok(()) => {
            log(&format!(
                "wrote fig5.csv, fig5.svg, tables.md to {}",
                out.display()
            ));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lru-filter: writing to {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}
