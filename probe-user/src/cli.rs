//! Command-line interface. Flag values are parsed here; merging with the config file and
//! defaults happens in `config`.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::parse_duration;

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
    Run(RunArgs),
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

#[derive(Args, Debug, Default, Clone)]
pub struct RunArgs {
    /// TOML config file; flags given on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Interface to monitor (repeatable; `*` and `?` wildcards allowed). Default: every
    /// non-loopback interface that is up.
    #[arg(long = "interface", short = 'i', value_name = "NAME")]
    pub interfaces: Vec<String>,

    /// Address of the HTTP server (/metrics, /healthz, /api/v1/snapshot).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,

    /// How often maps are read and metrics refreshed, e.g. `1s`, `500ms`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub tick: Option<Duration>,

    /// Idle gap that ends a flow's burst, e.g. `1ms`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub burst_gap: Option<Duration>,

    /// How TC programs attach: TCX links (kernel >= 6.6; nothing survives the process),
    /// netlink (clsact qdisc + filters, visible to `tc filter show`), or auto.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tc_attach: Option<TcAttach>,

    /// Forward the eBPF programs' own log messages (e.g. "map full") into this log.
    #[arg(long)]
    pub bpf_log: bool,

    /// TLS, mutual TLS and basic auth for the HTTP server: a YAML file with the keys of the
    /// Prometheus exporter-toolkit (tls_server_config, basic_auth_users), docs/operations.md.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config: Option<PathBuf>,

    /// Do not serve /api/v1/snapshot (it names peers, connections and flows); /metrics and
    /// /healthz stay. `probe top` and `probe record` need it.
    #[arg(long = "web.disable-snapshot")]
    pub disable_snapshot: bool,

    /// Check the host and exit: privileges, kernel (BTF, TCX), cgroup v2, tracefs and each
    /// tracepoint, the listen address, the interfaces and what would be attached. Loads and
    /// attaches nothing; exit status 1 if probe run would not start.
    #[arg(long)]
    pub check: bool,

    /// Spike model directory (`probe train --out`). Default: the built-in model. SIGHUP
    /// reloads it; a bad model is refused and the previous one keeps serving.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TcAttach {
    #[default]
    Auto,
    Tcx,
    Netlink,
}
