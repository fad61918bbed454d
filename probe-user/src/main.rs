//! probe: eBPF network telemetry for distributed AI training hosts.
//!
//! Data flows one way: kernel maps -> collectors (`collect`) -> per-tick `snapshot` ->
//! exporter (`export`). `bpf` loads and attaches; `host` answers questions about the host.
use std::process::ExitCode;

use clap::Parser as _;

mod bpf;
mod cli;
mod collect;
mod config;
mod export;
mod fold;
mod host;
mod lifecycle;
mod run;
mod snapshot;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| cli.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        cli::Command::Run(args) => run::main(args),
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
