//! `lockside`: parses the command line and runs a subcommand (see `cli/`). Bad flags
//! exit 64 (EX_USAGE), so an orchestrator can tell them from crashes.

use std::process::ExitCode;

use clap::Parser;
use lockside::cli::{Cli, EX_USAGE};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match cli.worker_threads() {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(runtime) => runtime.block_on(cli.run()),
        Err(e) => {
            eprintln!("lockside: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
