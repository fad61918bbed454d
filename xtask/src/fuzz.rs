//! `cargo xtask fuzz [--seconds N] [TARGET...]`: builds the cargo-fuzz targets in `fuzz/`
//! (libFuzzer, AddressSanitizer, the eBPF toolchain's nightly) and runs each for N seconds
//! from its checked-in seeds (`fuzz/seeds/<target>`). New inputs go to `target/fuzz/corpus`,
//! crashes to `target/fuzz/artifacts`; any crash, hang or leak fails the run.
use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};

use crate::{build, setup};

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds per target (docs/contributing.md gives the figures of a 600 s run).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Build without optimisation (`cargo fuzz --dev`): a third of the build time from
    /// scratch, fewer runs a second. `cargo xtask test` uses it for its short runs.
    #[arg(long)]
    pub dev: bool,
    /// Targets to run (default: all of `cargo fuzz list`).
    pub targets: Vec<String>,
}

/// An input slower than this is a hang: reported as a failure, not waited for.
const INPUT_TIMEOUT_S: u64 = 10;

struct Outcome {
    target: String,
    runs: Option<u64>,
    corpus: Option<u64>,
    coverage: Option<u64>,
    peak_rss_mb: Option<u64>,
}

pub fn run(args: FuzzArgs) -> Result<()> {
    setup::run()?;
    let root = build::root();
    let toolchain = setup::ebpf_toolchain();
    let targets = if args.targets.is_empty() {
        list(&root, &toolchain)?
    } else {
        args.targets.clone()
    };
    let work = build::target_dir().join("fuzz");
    let build_dir = work.join("build");
    println!(
        "fuzz: building {} target(s) with {toolchain}",
        targets.len()
    );
    let started = Instant::now();
    let ok = cargo_fuzz(&root, &toolchain, "build", &build_dir, args.dev)
        .status()
        .context("could not start cargo fuzz build")?
        .success();
    if !ok {
        bail!("fuzz: `cargo +{toolchain} fuzz build` failed");
    }
    println!("fuzz: built in {:.0} s", started.elapsed().as_secs_f64());

    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    for t in &targets {
        let corpus = work.join("corpus").join(t);
        let artifacts = work.join("artifacts").join(t);
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&artifacts)?;
        let seeds = root.join("fuzz").join("seeds").join(t);
        let mut cmd = cargo_fuzz(&root, &toolchain, "run", &build_dir, args.dev);
        cmd.arg(t).arg(&corpus);
        if seeds.is_dir() {
            cmd.arg(&seeds);
        }
        cmd.arg("--").args([
            format!("-max_total_time={}", args.seconds),
            format!("-timeout={INPUT_TIMEOUT_S}"),
            "-print_final_stats=1".to_owned(),
            // libFuzzer wants the trailing slash: the prefix is glued to the file name.
            format!("-artifact_prefix={}/", artifacts.display()),
        ]);
        println!("fuzz: {t}: {} s", args.seconds);
        let out = cmd
            .output()
            .with_context(|| format!("could not start cargo fuzz run {t}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let outcome = outcome(t, &log);
        if !out.status.success() {
            // The last lines say what broke (panic message, sanitizer report, input path).
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            for l in tail.iter().rev() {
                eprintln!("  {l}");
            }
            failures.push(format!(
                "{t} failed ({}); the input is in {}; reproduce: cargo +{toolchain} fuzz run --fuzz-dir fuzz {t} <input>",
                out.status,
                artifacts.display()
            ));
        }
        outcomes.push(outcome);
    }
    print_table(&outcomes, args.seconds);
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("fuzz: {f}");
        }
        bail!(
            "fuzz: {} of {} target(s) failed",
            failures.len(),
            targets.len()
        );
    }
    Ok(())
}

fn cargo_fuzz(root: &Path, toolchain: &str, sub: &str, target_dir: &Path, dev: bool) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{toolchain}"))
        .args(["fuzz", sub, if dev { "--dev" } else { "-O" }, "--fuzz-dir"])
        .arg(root.join("fuzz"))
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(root)
        // The workspace's target dir must not leak into the fuzz build's own.
        .env_remove("CARGO_TARGET_DIR");
    cmd
}

fn list(root: &Path, toolchain: &str) -> Result<Vec<String>> {
    let out = Command::new("cargo")
        .arg(format!("+{toolchain}"))
        .args(["fuzz", "list", "--fuzz-dir"])
        .arg(root.join("fuzz"))
        .current_dir(root)
        .output()
        .context("could not start cargo fuzz list (run: cargo xtask setup)")?;
    if !out.status.success() {
        bail!(
            "cargo fuzz list failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Figures from libFuzzer's log: `-print_final_stats` lines and the last status line.
fn outcome(target: &str, log: &str) -> Outcome {
    let stat = |name: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
    };
    // `#123456	DONE   cov: 1234 ft: 5678 corp: 90/12Kb ...`, or the last `pulse`/`NEW` line.
    let last = log.lines().rev().find(|l| l.contains(" cov: "));
    let after = |key: &str| {
        last.and_then(|l| l.split(key).nth(1))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|v| v.parse().ok())
    };
    Outcome {
        target: target.to_owned(),
        runs: stat("number_of_executed_units"),
        corpus: after(" corp: "),
        coverage: after(" cov: "),
        peak_rss_mb: stat("peak_rss_mb"),
    }
}

fn print_table(outcomes: &[Outcome], seconds: u64) {
    let show = |v: Option<u64>| v.map_or("?".to_owned(), |v| v.to_string());
    println!("\n| target | seconds | runs | runs/s | coverage (edges) | corpus | peak RSS MB |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for o in outcomes {
        let rate = o
            .runs
            .map_or("?".to_owned(), |r| (r / seconds.max(1)).to_string());
        println!(
            "| {} | {seconds} | {} | {rate} | {} | {} | {} |",
            o.target,
            show(o.runs),
            show(o.coverage),
            show(o.corpus),
            show(o.peak_rss_mb)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzers_figures() {
        let log = "INFO: seed corpus: files: 4\n#2\tINITED cov: 812 ft: 1900 corp: 4/10Kb exec/s: 0 rss: 40Mb\n#83666\tDONE   cov: 1504 ft: 5231 corp: 212/61Kb lim: 4096 exec/s: 3984 rss: 471Mb\nDone 83666 runs in 21 second(s)\nstat::number_of_executed_units: 83666\nstat::average_exec_per_sec:     3984\nstat::new_units_added:          208\nstat::slowest_unit_time_sec:    0\nstat::peak_rss_mb:              471\n";
        let o = outcome("api_snapshot", log);
        assert_eq!(o.runs, Some(83666));
        assert_eq!(o.coverage, Some(1504));
        assert_eq!(o.corpus, Some(212));
        assert_eq!(o.peak_rss_mb, Some(471));
        let none = outcome("x", "");
        assert_eq!(none.runs, None);
        assert_eq!(none.coverage, None);
    }
}
