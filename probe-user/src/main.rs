//! `probe`: the command line over the library's stages (lib.rs).
use std::{io::IsTerminal as _, process::ExitCode};

use clap::Parser as _;
use probe_user::{analyze, cli, dataset, eval, record, run, top, train};

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
        cli::Command::Features(args) if args.job => dataset::job_main(args),
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
