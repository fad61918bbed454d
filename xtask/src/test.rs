//! `cargo xtask test`: every check CI runs, in order; the first failing step stops the run.
use crate::build::{self, cargo, display};
use anyhow::{bail, Context as _, Result};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip the integration tests (root, network namespaces) for quick local iteration.
    #[arg(long)]
    pub quick: bool,
}

/// The `test result:` lines of every cargo test run, in order.
#[derive(Default)]
struct Summaries {
    lines: Vec<String>,
}

impl Summaries {
    /// Sums (passed, failed, ignored) over the collected `test result:` lines.
    fn totals(&self) -> (u64, u64, u64) {
        let mut totals = (0, 0, 0);
        for line in &self.lines {
            totals.0 += count(line, "passed");
            totals.1 += count(line, "failed");
            totals.2 += count(line, "ignored");
        }
        totals
    }
}

/// The number before `word` in "test result: ok. 3 passed; 0 failed; 1 ignored; ...".
fn count(line: &str, word: &str) -> u64 {
    line.split([';', '.'])
        .filter_map(|part| part.trim().strip_suffix(word))
        .find_map(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

struct Step {
    name: &'static str,
    cmd: Command,
    /// cargo test: echo stdout line by line and keep its `test result:` lines.
    tests: bool,
}

fn step(name: &'static str, cmd: Command) -> Step {
    Step {
        name,
        cmd,
        tests: false,
    }
}

fn test_step(name: &'static str, cmd: Command) -> Step {
    Step {
        name,
        cmd,
        tests: true,
    }
}

fn cargo_with(args: &[&str]) -> Command {
    let mut cmd = cargo();
    cmd.args(args);
    cmd
}

/// The rule files under rules/: (rule files, promtool unit-test files).
fn rule_files() -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let dir = build::root().join("rules");
    let (mut rules, mut tests) = (Vec::new(), Vec::new());
    if !dir.is_dir() {
        return Ok((rules, tests));
    }
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !(name.ends_with(".yml") || name.ends_with(".yaml")) {
            continue;
        }
        if name.ends_with("_test.yml") || name.ends_with("_test.yaml") {
            tests.push(path);
        } else {
            rules.push(path);
        }
    }
    rules.sort();
    tests.sort();
    Ok((rules, tests))
}

fn promtool(sub: &[&str], files: &[PathBuf]) -> Command {
    let mut cmd = Command::new("promtool");
    cmd.current_dir(build::root()).args(sub);
    for f in files {
        // Relative paths keep the header short and promtool's messages readable.
        cmd.arg(f.strip_prefix(build::root()).unwrap_or(f));
    }
    cmd
}

/// Runs a cargo test command, echoing its stdout and collecting the `test result:` lines.
fn run_tests(cmd: &mut Command, summaries: &mut Summaries) -> Result<std::process::ExitStatus> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        writeln!(out, "{line}")?;
        out.flush()?;
        if line.trim_start().starts_with("test result:") {
            summaries.lines.push(line.trim().to_owned());
        }
    }
    Ok(child.wait()?)
}

/// Cargo commands that run clippy's lints, denying warnings, on the workspace's crates as
/// they compile (as `cargo clippy -- -D warnings` does), with the toolchain's clippy-driver
/// as the workspace's rustc wrapper. Every command gets the same wrapper: cargo keeps the
/// wrapper in its artifacts' hashes, so commands with and without it would build twice.
struct Lint {
    driver: PathBuf,
}

impl Lint {
    fn new() -> Result<Lint> {
        let driver = crate::setup::output("rustup", &["which", "clippy-driver"])
            .context("no clippy for the workspace's toolchain; run: rustup component add clippy")?;
        Ok(Lint {
            driver: PathBuf::from(driver.trim()),
        })
    }

    fn cargo(&self, args: &[&str]) -> Command {
        let mut cmd = cargo_with(args);
        self.wrap(&mut cmd);
        cmd
    }

    /// The environment of a command that runs cargo (itself or through a child).
    fn wrap(&self, cmd: &mut Command) {
        cmd.env("RUSTC_WORKSPACE_WRAPPER", &self.driver)
            // cargo-clippy's encoding of the arguments after `--`.
            .env(
                "CLIPPY_ARGS",
                "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
            );
    }
}

/// Seconds per fuzz target in `cargo xtask test`.
const FUZZ_SECONDS: u64 = 6;

pub fn run(args: TestArgs) -> Result<()> {
    let started = Instant::now();
    crate::setup::run()?;
    // Where CI's time goes, printed at the end (CI allows 90 minutes; keep well under 45).
    let mut times = vec![("setup".to_owned(), started.elapsed())];

    // The static binary and the package, as `cargo xtask dist` makes them but from a debug
    // build (minutes faster than a release): the package tests in the unit tests and the
    // static binary's integration tests use them.
    let lint = Lint::new()?;
    let mut dist = Command::new(std::env::current_exe()?);
    dist.args(["dist", "--debug"]);
    // With the lint's wrapper, as the package tests in the unit tests build it again.
    lint.wrap(&mut dist);
    let static_bin =
        crate::dist::default_out(true).join(crate::dist::binary_name(env!("CARGO_PKG_VERSION")));
    // One build of the workspace serves clippy, the unit tests, the integration tests and
    // the debug probe: every cargo command below selects the same packages, targets and
    // features, and lints as it compiles (clippy's driver as the workspace's rustc wrapper,
    // which is what `cargo clippy` runs, over `cargo check`). A separate `cargo clippy`
    // checked every dependency a second time: 400 s of a 50-minute CI run from scratch.
    // Every feature: `train` (LightGBM), which the built-in model rebuild and the
    // integration tests' `probe train` need, and `rdma-verbs`; the daemon's default build
    // is the static one.
    let probe = build::target_dir().join("debug").join("probe");
    let mut unit = lint.cargo(&[
        "test",
        "--workspace",
        "--exclude",
        "probe-tests",
        "--all-features",
        "--no-fail-fast",
    ]);
    // The lab tests run this probe rather than building one of their own.
    unit.env("PROBE_BIN", &probe);
    let mut steps = vec![
        step("format", cargo_with(&["fmt", "--all", "--check"])),
        step(
            "build and clippy",
            lint.cargo(&["build", "--workspace", "--all-targets", "--all-features"]),
        ),
        step("static build and package (debug)", dist),
        test_step("unit tests", unit),
        test_step(
            "eBPF ABI unit tests",
            lint.cargo(&["test", "-p", "probe-ebpf", "--lib"]),
        ),
    ];
    if !args.quick {
        // A short run of every fuzz target from its seeds: the seeds and what a few seconds
        // of mutation find must not crash (the long runs are in docs/contributing.md). Built
        // without optimisation: from scratch (CI) that took 219 s against 696 s with it.
        let mut fuzz = Command::new(std::env::current_exe()?);
        fuzz.args(["fuzz", "--dev", "--seconds", &FUZZ_SECONDS.to_string()]);
        steps.push(step("fuzz (short)", fuzz));
    }
    if !args.quick {
        // The repository's corpus rebuilds the built-in model and its evaluation byte for
        // byte (with the debug build, which has `train`: LightGBM is always optimised, and
        // the files are the same as a release build's).
        let mut model = Command::new(std::env::current_exe()?);
        model.args(["model", "--check", "--probe"]).arg(&probe);
        steps.push(step("built-in model rebuild", model));
        // And the job corpus the job's early-warning model.
        let mut job = Command::new(std::env::current_exe()?);
        job.args(["job-model", "--check", "--probe"]).arg(&probe);
        steps.push(step("job model rebuild", job));
    }
    if !args.quick {
        let mut cmd = lint.cargo(&[
            "test",
            "-p",
            "probe-tests",
            "--no-fail-fast",
            "--",
            "--test-threads=1",
        ]);
        cmd.env("PROBE_BIN", &probe);
        cmd.env("PROBE_STATIC_BIN", &static_bin);
        steps.push(test_step("integration tests", cmd));
        // The churn soak, 3 minutes, on the debug build just made (docs/contributing.md).
        let mut soak = Command::new(std::env::current_exe()?);
        soak.args(["soak", "--minutes", "3", "--probe"]).arg(&probe);
        steps.push(step("churn soak", soak));
    }
    let (rules, rule_tests) = rule_files()?;
    if !rule_tests.is_empty() {
        steps.push(step(
            "alerting rule unit tests",
            promtool(&["test", "rules"], &rule_tests),
        ));
    }
    if !rules.is_empty() {
        steps.push(step("rule syntax", promtool(&["check", "rules"], &rules)));
    }

    let mut summaries = Summaries::default();
    let total = steps.len();
    for (i, mut s) in steps.into_iter().enumerate() {
        let shown = display(&s.cmd);
        println!("\n==> xtask test [{}/{total}] {}: {shown}", i + 1, s.name);
        std::io::stdout().flush()?;
        let t0 = Instant::now();
        let status = if s.tests {
            run_tests(&mut s.cmd, &mut summaries)?
        } else {
            s.cmd
                .status()
                .with_context(|| format!("could not start `{shown}`"))?
        };
        times.push((s.name.to_owned(), t0.elapsed()));
        if !status.success() {
            print_times(&times, started);
            print_summaries(&summaries);
            if !summaries.lines.is_empty() {
                let (passed, failed, ignored) = summaries.totals();
                println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
            }
            bail!("xtask test: step `{}` failed ({status}): {shown}", s.name);
        }
    }
    if args.quick {
        println!("\nxtask test: --quick: integration tests skipped");
    }
    print_times(&times, started);
    print_summaries(&summaries);
    let (passed, failed, ignored) = summaries.totals();
    println!("xtask test: all steps passed");
    // The plain closing line that CI's log reader counts, after cargo's own lines.
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    Ok(())
}

fn print_times(times: &[(String, Duration)], started: Instant) {
    let steps: Vec<String> = times
        .iter()
        .map(|(name, d)| format!("{name} {:.0} s", d.as_secs_f64()))
        .collect();
    println!(
        "\n==> xtask test: {:.1} min in all: {}",
        started.elapsed().as_secs_f64() / 60.0,
        steps.join(", ")
    );
}

fn print_summaries(summaries: &Summaries) {
    if summaries.lines.is_empty() {
        return;
    }
    println!("\n==> xtask test: cargo test summaries");
    for line in &summaries.lines {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cargo_test_results() {
        let s = Summaries {
            lines: vec![
                "test result: ok. 12 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s".into(),
                "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.50s".into(),
            ],
        };
        assert_eq!(s.totals(), (15, 1, 2));
    }

    /// Every alert in rules/ is exercised by a promtool unit test (an `alertname:` in some
    /// `*_test.yml`), so a broken expression cannot ship unnoticed.
    #[test]
    fn every_alert_has_a_unit_test() {
        let (rules, tests) = rule_files().unwrap();
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap();
        let tested: String = tests.iter().map(read).collect();
        let mut alerts = Vec::new();
        for r in &rules {
            for line in read(r).lines() {
                if let Some(name) = line.trim().strip_prefix("- alert:") {
                    alerts.push(name.trim().to_string());
                }
            }
        }
        assert!(alerts.len() >= 5, "found only {alerts:?}");
        let untested: Vec<_> = alerts
            .iter()
            .filter(|a| !tested.contains(&format!("alertname: {a}\n")))
            .collect();
        assert!(
            untested.is_empty(),
            "alerts without a promtool unit test: {untested:?}"
        );
    }
}
