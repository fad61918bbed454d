//! The command line: the subcommands and their arguments, each defined by the module of its
//! subcommand (`probe run`'s flags with the configuration they override, in `config`). No
//! module imports this one; `main.rs` does.
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "probe",
    version,
    about = "eBPF network telemetry for distributed AI training hosts",
    long_about = None
)]
pub struct Cli {
    /// Log filter (tracing syntax), e.g. `info`, `probe=debug`. Also read from RUST_LOG.
    #[arg(long, global = true, env = "PROBE_LOG", default_value = "info")]
    pub log: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Attach to the kernel, collect, and serve /metrics until SIGINT/SIGTERM.
    Run(crate::config::RunArgs),
    /// Record a running daemon's per-tick telemetry to a Parquet file (docs/recording.md).
    Record(crate::record::RecordArgs),
    /// Live terminal view of a running daemon (docs/top.md).
    Top(crate::top::TopArgs),
    /// Replay recordings through the feature stage and add training labels (docs/features.md).
    Features(crate::dataset::FeaturesArgs),
    /// Train the spike model (LightGBM) from `probe features` tables (docs/model.md).
    Train(crate::train::TrainArgs),
    /// Evaluate a model against the baselines on held-out tables (docs/model.md).
    Eval(crate::eval::EvalArgs),
    /// Analyse recordings: traffic matrix, pattern, timing, clusters, comparison (docs/analyze.md).
    Analyze(crate::analyze::AnalyzeArgs),
}
