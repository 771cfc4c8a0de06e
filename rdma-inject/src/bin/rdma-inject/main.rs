//! `rdma-inject`: argument parsing ([`cli`]), log setup, and how a failure is worded and
//! exits ([`failure`]); the work is in the library.

mod cli;
mod failure;
mod memory_cli;

use std::io::{self, BufWriter};
use std::process::ExitCode;

use clap::Parser;
use cli::Cli;
use rdma_cli::logging;
use rdma_inject::report::Reporter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format, "info");
    let plan = match cli.plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rdma-inject: {e}");
            return ExitCode::from(2);
        }
    };
    let mut rep =
        Reporter::new(BufWriter::new(io::stdout().lock()), cli.json).with_timeout_name("--timeout");
    match rdma_inject::run::run(&plan, &mut rep) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // What was reported so far still reaches stdout.
            let _ = rep.flush();
            eprintln!("rdma-inject: {}", failure::message(&e));
            ExitCode::from(failure::exit_code(&e))
        }
    }
}
