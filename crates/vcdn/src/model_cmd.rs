//! `vcdn model`: the analytical models, from the command line.

use clap::Subcommand;
use vcdn_model::filter;

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Optimal LRU filter size δ1* for a Zipf exponent and a cache size
    /// (fractions of the catalogue), by the content-aware data-plane
    /// paper's model (eq. 10) and its guideline (eq. 11).
    FilterSize {
        /// Zipf exponent α of content popularity.
        #[arg(long)]
        alpha: f64,
        /// Cache size as a fraction of the catalogue, δ2 = C2/N.
        #[arg(long)]
        cache_ratio: f64,
        /// Catalogue size N, for the hit rates printed alongside.
        #[arg(long, default_value_t = 1e7)]
        catalogue: f64,
    },
}

pub fn run(cmd: ModelCmd) -> Result<(), String> {
    match cmd {
        ModelCmd::FilterSize {
            alpha,
            cache_ratio: d2,
            catalogue: n,
        } => {
            if !(alpha.is_finite() && alpha > 0.0) {
                return Err(format!("--alpha must be a positive number (got {alpha})"));
            }
            if !(d2 > 0.0 && d2 < 1.0) {
                return Err(format!(
                    "--cache-ratio must be between 0 and 1, exclusive (got {d2})"
                ));
            }
            if !(n.is_finite() && n >= 1.0) {
                return Err(format!("--catalogue must be at least 1 (got {n})"));
            }
            let d1 = filter::optimal_filter_size(alpha, d2);
            let g = filter::guideline(alpha, d2);
            println!("{d1:.4}");
            let pct = |x: f64| 100.0 * x;
            eprintln!("alpha {alpha}, cache ratio δ2 = {d2}, catalogue N = {n:.0}");
            eprintln!(
                "  optimal filter size δ1* (eq. 10): {d1:.4}  = {:.0} ids",
                d1 * n
            );
            eprintln!("  guideline δ1*g (eq. 11, Table II): {g:.4}");
            eprintln!(
                "  global hit rate: optimal filter {:.1} %, blind filter (δ1 = δ2) {:.1} %, no filter {:.1} %",
                pct(filter::hit_rate_normalised(alpha, d1, d2, n)),
                pct(filter::hit_rate_normalised(alpha, d2, d2, n)),
                pct(filter::hit_rate_normalised(alpha, 1.0, d2, n)),
            );
            Ok(())
        }
    }
}
