//! probe: eBPF network telemetry for distributed AI training hosts.
//!
//! Data flows one way: kernel maps -> collectors (`collect`) -> per-tick `snapshot` ->
//! `observe` -> `features` -> `fold` -> exporter (`export`), in the order `pipeline` lists.
//! `bpf` loads and attaches; `host` answers questions about the host. Beside the daemon:
//! `record` (to Parquet), `dataset` (`probe features`: replay + labels), `top`.
use std::{io::IsTerminal as _, process::ExitCode};

use clap::Parser as _;

mod analyze;
mod apiclient;
mod bpf;
mod check;
mod cli;
mod collect;
mod config;
mod dataset;
mod eval;
mod export;
mod features;
mod fold;
mod host;
mod lifecycle;
mod model;
mod observe;
mod pipeline;
mod record;
mod run;
mod snapshot;
mod top;
mod train;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line: clap's message without its "For more information" footer.
            let msg = e.to_string();
            eprintln!(
                "{}",
                msg.lines().next().unwrap_or("error: invalid arguments")
            );
            return ExitCode::from(2);
        }
    };
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| cli.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        cli::Command::Run(args) => run::main(args),
        cli::Command::Record(args) => record::main(args),
        cli::Command::Top(args) => top::main(args),
        cli::Command::Features(args) => dataset::main(args),
        cli::Command::Train(args) => train::main(args),
        cli::Command::Eval(args) => eval::main(args),
        cli::Command::Analyze(args) => analyze::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the context chain joined by ": ".
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
