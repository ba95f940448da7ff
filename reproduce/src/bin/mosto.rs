//! Re-makes Fig. 3 and the runtime claim of MOSTO (Sciancalepore et al.,
//! JSAC 2017, §V-A) with `vcdn_policy::chains`.
//!
//! ```text
//! cargo run --release -p vcdn-reproduce --bin mosto -- --topologies DIR [--out DIR]
//!     [--min-nodes 7] [--max-nodes 115]
//! ```
//! Markdown on stdout, progress on stderr, files in `reproduce/mosto/`.

use std::path::PathBuf;
use std::process::ExitCode;

use vcdn_reproduce::mosto::{self, compare, random_mesh};

const USAGE: &str = "usage: mosto --topologies DIR [--out DIR] [--min-nodes N] [--max-nodes N]
  --topologies DIR  the *.edges.csv files (shared/data/topologies)
  --out DIR         output directory (default reproduce/mosto)
  --min-nodes N     smallest graph (default 7, as the paper)
  --max-nodes N     largest graph (default 115, as the paper)";

struct Args {
    topologies: PathBuf,
    out: PathBuf,
    min_nodes: usize,
    max_nodes: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        topologies: PathBuf::new(),
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mosto"),
        min_nodes: 7,
        max_nodes: 115,
    };
    let mut it = std::env::args().skip(1);
    let num = |flag: &str, v: Option<String>| -> Result<usize, String> {
        v.ok_or(format!("{flag} needs a value"))?
            .parse()
            .map_err(|_| format!("{flag}: not a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--topologies" => a.topologies = it.next().ok_or("--topologies needs a value")?.into(),
            "--out" => a.out = it.next().ok_or("--out needs a value")?.into(),
            "--min-nodes" => a.min_nodes = num("--min-nodes", it.next())?,
            "--max-nodes" => a.max_nodes = num("--max-nodes", it.next())?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    if a.topologies.as_os_str().is_empty() {
        return Err("--topologies is required".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("mosto: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let t0 = std::time::Instant::now();
    let (res, rocketfuel) = match mosto::run(&args.topologies, "", args.min_nodes, args.max_nodes)
        .and_then(|all| {
            let rf = mosto::run(
                &args.topologies,
                "rocketfuel",
                args.min_nodes,
                args.max_nodes,
            )?;
            Ok((all, rf))
        }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mosto: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "{} graphs in {:.1} s",
        res.graphs.len(),
        t0.elapsed().as_secs_f64()
    );
    // Random 115-node meshes beside the topologies: a metric one (RTT =
    // distance between random points) and one without triangle inequality.
    let extra = vec![
        compare(
            "random metric mesh (seed 1)",
            &random_mesh(115, true, 1),
            None,
        ),
        compare(
            "random uniform mesh (seed 1)",
            &random_mesh(115, false, 1),
            None,
        ),
    ];
    let md = format!(
        "## All graphs\n\n{}\n## Rocketfuel only (the paper's source)\n\n{}",
        mosto::markdown(&res, &extra),
        mosto::markdown_fig3(&rocketfuel)
    );
    print!("{md}");
    let write = |name: &str, text: &str| {
        let p = args.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut files = vec![("results.md".to_string(), md.clone())];
    for c in &res.classes {
        files.push((format!("fig3-{}-rounds.svg", c.rounds), mosto::fig3_svg(c)));
    }
    files.push((
        "runtime.svg".into(),
        mosto::runtime_svg(&res.graphs, &extra),
    ));
    if let Err(e) = std::fs::create_dir_all(&args.out)
        .map_err(|e| e.to_string())
        .and_then(|_| files.iter().try_for_each(|(n, t)| write(n, t)))
    {
        eprintln!("mosto: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
