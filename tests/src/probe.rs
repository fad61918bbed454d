//! Starting the `probe` daemon inside a test namespace and talking to it.
use crate::http::{self, Response};
use crate::metrics::Metrics;
use crate::netns::Netns;
use crate::process::Child;
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long probe may take to attach everything and answer /healthz with 200.
pub const HEALTHY_TIMEOUT: Duration = Duration::from_secs(30);
/// Per-request timeout of scrapes.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The probe binary: `$PROBE_BIN`, else `<workspace>/target/debug/probe`.
pub fn probe_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PROBE_BIN") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target/debug/probe")
}

/// [`probe_bin`], checked to exist, as a string.
pub fn probe_bin_checked() -> String {
    let p = probe_bin();
    assert!(
        p.is_file(),
        "probe binary {} not found: build it (`cargo build -p probe-user --all-features`) or set PROBE_BIN",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

/// Arguments of `probe run`.
#[derive(Debug, Clone)]
pub struct ProbeOpts {
    /// The binary; [`probe_bin`] when None.
    pub bin: Option<PathBuf>,
    pub interfaces: Vec<String>,
    pub port: u16,
    pub tick: Option<String>,
    pub tc_attach: Option<String>,
    pub extra: Vec<String>,
}

impl ProbeOpts {
    /// Monitor `iface`, listen on 127.0.0.1:9464 of the namespace, default tick.
    pub fn iface(iface: &str) -> ProbeOpts {
        ProbeOpts {
            bin: None,
            interfaces: vec![iface.to_owned()],
            port: 9464,
            tick: None,
            tc_attach: None,
            extra: Vec::new(),
        }
    }

    pub fn tick(mut self, tick: &str) -> Self {
        self.tick = Some(tick.to_owned());
        self
    }

    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }

    pub fn tc_attach(mut self, mode: &str) -> Self {
        self.tc_attach = Some(mode.to_owned());
        self
    }

    /// The `probe run ...` argument list.
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["run".to_string()];
        for i in &self.interfaces {
            a.extend(["--interface".into(), i.clone()]);
        }
        a.extend(["--listen".into(), format!("127.0.0.1:{}", self.port)]);
        if let Some(t) = &self.tick {
            a.extend(["--tick".into(), t.clone()]);
        }
        if let Some(m) = &self.tc_attach {
            a.extend(["--tc-attach".into(), m.clone()]);
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    /// The tick as a Duration (default 1 s).
    pub fn tick_duration(&self) -> Duration {
        self.tick
            .as_deref()
            .and_then(parse_duration)
            .unwrap_or(Duration::from_secs(1))
    }
}

/// `1s`, `500ms`, `2m` (enough for the tests' own ticks).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

/// `nsenter --net=NS PROBE ARGS...` with the binary of [`probe_bin_checked`].
pub fn probe_command(ns: &Netns, args: &[String]) -> Command {
    probe_command_with(&probe_bin_checked(), ns, args)
}

/// `nsenter --net=NS BIN ARGS...`.
pub fn probe_command_with(bin: &str, ns: &Netns, args: &[String]) -> Command {
    let mut argv: Vec<&str> = vec![bin];
    argv.extend(args.iter().map(String::as_str));
    let mut c = ns.command(&argv);
    // nsenter execs probe (no --fork), so the child's pid is probe's and signals reach it.
    c.env("RUST_BACKTRACE", "1");
    c
}

/// A running probe daemon; SIGTERMed (then SIGKILLed) on drop.
pub struct Probe {
    pub child: Child,
    pub opts: ProbeOpts,
    ns_name: String,
    ns_path: String,
}

impl Probe {
    /// Starts probe in `ns` and waits (bounded) for /healthz to answer 200. On timeout or
    /// early exit, panics with probe's stderr.
    pub fn start(ns: &Netns, opts: ProbeOpts) -> Probe {
        Probe::try_start(ns, opts).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Probe::start`] that returns the failure (with probe's output) instead of panicking.
    pub fn try_start(ns: &Netns, opts: ProbeOpts) -> Result<Probe> {
        let bin = match &opts.bin {
            Some(b) => b.to_string_lossy().into_owned(),
            None => probe_bin_checked(),
        };
        let child = Child::spawn("probe", &mut probe_command_with(&bin, ns, &opts.args()))?;
        let mut p = Probe {
            child,
            opts,
            ns_name: ns.name().to_owned(),
            ns_path: ns.path(),
        };
        if let Err(e) = p.wait_healthy(ns, HEALTHY_TIMEOUT) {
            p.child.terminate(Duration::from_secs(5));
            bail!(
                "probe did not become healthy in netns {}: {e:#}\nargs: {:?}\n\
                 --- probe stderr ---\n{}\n--- probe stdout ---\n{}",
                p.ns_name,
                p.opts.args(),
                p.child.stderr(),
                p.child.stdout()
            );
        }
        Ok(p)
    }

    /// Scrapes and parses /metrics, as a Result.
    pub fn try_metrics(&self) -> Result<Metrics> {
        let r = self.get("/metrics")?;
        if r.status != 200 {
            bail!("/metrics answered {}: {}", r.status, r.body);
        }
        Metrics::parse(&r.body)
    }

    fn wait_healthy(&mut self, ns: &Netns, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait() {
                bail!("probe exited with {st} before it was healthy");
            }
            match http::get_in(ns, self.addr(), "/healthz", Duration::from_secs(2)) {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => last = format!("/healthz answered {}: {}", r.status, r.body.trim()),
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("timed out after {timeout:?}; last: {last}")
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.opts.port))
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// GET `path` from probe's HTTP server.
    pub fn get(&self, path: &str) -> Result<Response> {
        let addr = self.addr();
        crate::netns::enter_path(&self.ns_path, || http::get(addr, path, SCRAPE_TIMEOUT))?
            .with_context(|| format!("GET http://{addr}{path} in netns {}", self.ns_name))
    }

    /// Scrapes and parses /metrics.
    pub fn metrics(&self) -> Metrics {
        let r = self
            .get("/metrics")
            .unwrap_or_else(|e| panic!("scraping probe: {e:#}\n{}", self.child.stderr()));
        assert_eq!(r.status, 200, "/metrics answered {}: {}", r.status, r.body);
        Metrics::parse(&r.body).unwrap_or_else(|e| panic!("parsing /metrics: {e:#}\n{}", r.body))
    }

    /// The JSON snapshot (`/api/v1/snapshot`).
    pub fn snapshot(&self) -> serde_json::Value {
        let r = self
            .get("/api/v1/snapshot")
            .unwrap_or_else(|e| panic!("reading the snapshot: {e:#}\n{}", self.child.stderr()));
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("snapshot JSON: {e}\n{}", r.body))
    }

    /// The snapshot of the next tick at which probe walked its flow and connection maps
    /// (`flow_scan_age_ticks` 0; every `flow_scan`), returned as soon as it appears so that
    /// the kernel can be read right after it. Panics after `within`.
    pub fn next_walk(&self, within: Duration) -> serde_json::Value {
        let t0 = self.snapshot()["time_unix"].as_f64();
        let deadline = Instant::now() + within;
        loop {
            let s = self.snapshot();
            if s["time_unix"].as_f64() != t0 && s["flow_scan_age_ticks"].as_u64() == Some(0) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no walk of the maps within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sleeps `n` ticks plus a margin, so that the next scrape reflects everything that
    /// happened before the call.
    pub fn wait_ticks(&self, n: u32) {
        std::thread::sleep(self.opts.tick_duration() * n + Duration::from_millis(300));
    }

    /// SIGTERM; the exit status (None if it had to be SIGKILLed after `grace`).
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.child.terminate(grace)
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill(&mut self) {
        self.child.kill()
    }

    pub fn stderr(&self) -> String {
        self.child.stderr()
    }

    /// The last `n` lines of probe's stderr (its log), without colours: for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = strip_ansi(&self.child.stderr());
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// `probe record` in `ns` against `daemon`, into `out`, for `seconds`.
pub fn start_recorder(
    ns: &Netns,
    daemon: &Probe,
    out: &std::path::Path,
    seconds: u64,
) -> Result<Child> {
    let args: Vec<String> = [
        "record",
        "--url",
        &format!("http://{}", daemon.addr()),
        "--out",
        &out.display().to_string(),
        "--duration",
        &seconds.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Child::spawn("probe record", &mut probe_command(ns, &args))
}

/// Runs probe with `args` in `ns` to completion (bounded); for error-path tests.
pub fn run_to_exit(mut cmd: Command, timeout: Duration) -> Result<crate::cmd::Output> {
    let out = crate::cmd::output_within(&mut cmd, timeout);
    out.context("probe should have exited on its own")
}

/// `text` without ANSI escape sequences (tracing colours its output even into a pipe).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // CSI: parameters, then one final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Checks probe's contract for errors: a non-zero exit and exactly one line on stderr,
/// starting `error: ` and containing each of `needles` (case-insensitive). Returns the line,
/// or what is wrong.
pub fn check_cli_error(out: &crate::cmd::Output, needles: &[&str]) -> Result<String, String> {
    let stderr = strip_ansi(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let context = format!(
        "exit: {}\n--- stderr ---\n{}\n--- stdout ---\n{}",
        out.status, out.stderr, out.stdout
    );
    if out.status.success() || out.status.code().is_none() {
        return Err(format!(
            "probe should exit non-zero (not by a signal)\n{context}"
        ));
    }
    if lines.len() != 1 {
        return Err(format!(
            "expected exactly one stderr line, got {}\n{context}",
            lines.len()
        ));
    }
    let line = lines[0];
    if !line.starts_with("error: ") {
        return Err(format!("the line should start `error: `\n{context}"));
    }
    if let Some(n) = needles
        .iter()
        .find(|n| !line.to_lowercase().contains(&n.to_lowercase()))
    {
        return Err(format!("the error should name {n:?}\n{context}"));
    }
    Ok(line.to_owned())
}

/// [`check_cli_error`], panicking with the reason.
pub fn assert_cli_error(out: &crate::cmd::Output, needles: &[&str]) -> String {
    check_cli_error(out, needles).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_and_durations() {
        let o = ProbeOpts::iface("veth1a")
            .tick("500ms")
            .tc_attach("netlink");
        assert_eq!(
            o.args().join(" "),
            "run --interface veth1a --listen 127.0.0.1:9464 --tick 500ms --tc-attach netlink"
        );
        assert_eq!(o.tick_duration(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("banana"), None);
        assert_eq!(
            ProbeOpts::iface("x").tick_duration(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn bin_falls_back_to_workspace_target() {
        if std::env::var_os("PROBE_BIN").is_none() {
            assert!(probe_bin().ends_with("target/debug/probe"));
        }
    }

    #[test]
    fn ansi_is_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"),
            "2026  WARN x"
        );
        assert_eq!(strip_ansi("error: plain"), "error: plain");
    }

    #[test]
    fn cli_error_contract() {
        use std::os::unix::process::ExitStatusExt;
        let out = |code: i32, err: &str| crate::cmd::Output {
            status: ExitStatus::from_raw(code << 8),
            stdout: String::new(),
            stderr: err.to_owned(),
        };
        let line = check_cli_error(&out(1, "error: no interface eth9\n"), &["ETH9"]);
        assert_eq!(line.unwrap(), "error: no interface eth9");
        let two = check_cli_error(&out(1, "INFO starting\nerror: no interface eth9\n"), &[]);
        assert!(two.unwrap_err().contains("exactly one stderr line, got 2"));
        let ok_exit = check_cli_error(&out(0, "error: x\n"), &[]);
        assert!(ok_exit.unwrap_err().contains("non-zero"));
        let unnamed = check_cli_error(&out(2, "error: bad value\n"), &["tick"]);
        assert!(unnamed.unwrap_err().contains("should name \"tick\""));
        let prefix = check_cli_error(&out(2, "Error: x\n"), &[]);
        assert!(prefix.unwrap_err().contains("start `error: `"));
    }
}
