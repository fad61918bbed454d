//! `cargo xtask`: the developer's and CI's entry points.
//!
//! - `setup`: installs what a new Debian 12 machine lacks to build and test (idempotent).
//! - `run [-- PROBE_ARGS...]`: builds `probe` in release and starts `probe run` on this host.
//! - `test [--quick]`: everything CI checks (`.ci/run` is exactly `cargo xtask test`).
//! - `bench`: measures probe's overhead against a release build.
//! - `lab`: the distributed-training traffic lab.
//! - `model`: the built-in spike model from a lab corpus, trained and evaluated.
//! - `job-corpus`: the job's corpus (one probe per rank), recorded and packed.
//! - `dist`: the static binary (x86_64 musl), its checksum and the Debian package.
//! - `fuzz [--seconds N]`: the cargo-fuzz targets of probe's parsers (`fuzz/`).
//! - `soak`: the churn soak (the daemon under interface, peer, map, RDMA, scraper and
//!   signal churn; fails on leaks, missed ticks, kernel leftovers, backwards counters).
use anyhow::{anyhow, Result};
use clap::{Parser, Subcommand};
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

mod bench;
mod build;
mod dist;
mod fuzz;
mod job_corpus;
mod job_model;
mod lab;
mod model;
mod setup;
mod soak;
mod test;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "probe's developer and CI tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Installs what this Debian 12 machine lacks to build and test probe; a no-op when
    /// everything is present.
    Setup,
    /// Builds probe in release and starts `probe run` on this host (needs root).
    Run(RunArgs),
    /// Runs every check CI runs: fmt, clippy, unit tests, integration tests (root), promtool.
    Test(test::TestArgs),
    /// Measures probe's overhead (builds probe in release first unless --probe is given).
    Bench(bench::BenchArgs),
    /// Runs the traffic lab (see docs/lab.md).
    Lab(lab::LabArgs),
    /// Regenerates the built-in spike model from a lab corpus (needs root; hours).
    Model(model::ModelArgs),
    /// Records the job's corpus (one probe per rank, needs root; hours, resumable) and packs
    /// it into xtask/job-corpus/.
    JobCorpus(job_corpus::JobCorpusArgs),
    /// Rebuilds the shipped job early-warning model (probe-user/job-model/) from
    /// xtask/job-corpus/; --check compares the rebuild with it byte for byte.
    JobModel(job_model::JobModelArgs),
    /// Builds the static release binary (x86_64 musl, stripped, at most 15 MB), its sha256
    /// and the Debian package (that binary, hardened unit, default config) into target/dist.
    Dist(dist::DistArgs),
    /// Fuzzes probe's parsers (cargo-fuzz, libFuzzer) for --seconds per target.
    Fuzz(fuzz::FuzzArgs),
    /// Runs the daemon under churn for --minutes and checks it levels off (needs root).
    Soak(soak::SoakArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Arguments for `probe run`, after `--`: e.g. `cargo xtask run -- --interface eth0`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROBE_ARGS"
    )]
    args: Vec<String>,
}

fn main() -> ExitCode {
    build::prepare_env();
    let result = match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::Run(args) => run_probe(args),
        Command::Test(args) => test::run(args),
        Command::Bench(args) => bench(args),
        Command::Lab(args) => lab::run(args),
        Command::Model(args) => model::run(args),
        Command::JobCorpus(args) => job_corpus::run(args),
        Command::JobModel(args) => job_model::run(args),
        Command::Dist(args) => dist::run(args),
        Command::Fuzz(args) => fuzz::run(args),
        Command::Soak(args) => soak::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// setup, release build, then exec `probe run ARGS...` (its exit code becomes ours).
fn run_probe(args: RunArgs) -> Result<()> {
    setup::run()?;
    let probe = build::release_probe()?;
    println!("metrics: {}", metrics_url(&args.args));
    if !build::is_root() {
        eprintln!(
            "run: probe needs root (or CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON); try: sudo {} run",
            probe.display()
        );
    }
    let err = std::process::Command::new(&probe)
        .arg("run")
        .args(&args.args)
        .exec();
    Err(anyhow!("could not start {}: {err}", probe.display()))
}

/// The /metrics URL for `probe run` ARGS: from `--listen ADDR:PORT` if given, else the default.
fn metrics_url(args: &[String]) -> String {
    let mut listen = "127.0.0.1:9464".to_owned();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            break;
        } else if arg == "--listen" {
            if let Some(value) = it.next() {
                listen = value.clone();
            }
        } else if let Some(value) = arg.strip_prefix("--listen=") {
            listen = value.to_owned();
        }
    }
    // A wildcard address listens on every interface; loopback is one of them.
    if let Some(port) = listen.strip_prefix("0.0.0.0:") {
        listen = format!("127.0.0.1:{port}");
    } else if let Some(port) = listen.strip_prefix("[::]:") {
        listen = format!("[::1]:{port}");
    }
    format!("http://{listen}/metrics")
}

/// setup and a release build of probe (unless --probe names one), then the benchmark.
fn bench(mut args: bench::BenchArgs) -> Result<()> {
    setup::run()?;
    if args.probe.is_none() {
        args.probe = Some(build::release_probe()?);
    }
    bench::run(args)
}

#[cfg(test)]
mod tests {
    use super::metrics_url;

    fn url(args: &[&str]) -> String {
        metrics_url(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn metrics_url_follows_listen() {
        assert_eq!(url(&[]), "http://127.0.0.1:9464/metrics");
        assert_eq!(
            url(&["--interface", "eth0", "--listen", "10.0.0.1:9000"]),
            "http://10.0.0.1:9000/metrics"
        );
        assert_eq!(url(&["--listen=[::1]:9465"]), "http://[::1]:9465/metrics");
        assert_eq!(
            url(&["--listen", "0.0.0.0:9464"]),
            "http://127.0.0.1:9464/metrics"
        );
    }
}
