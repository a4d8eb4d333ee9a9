//! The benchmark (placeholder, filled in below).

use clap::Args;

/// Flags of `lockside bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Redis to measure against.
    #[arg(long, env = "LOCKSIDE_BENCH_REDIS")]
    pub redis: String,
}

/// Runs the benchmark.
pub async fn run(_args: BenchArgs) -> Result<(), String> {
    Err("not yet".into())
}
