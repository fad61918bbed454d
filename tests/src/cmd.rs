//! Running short-lived commands with a bounded wait.
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long a helper command (ip, tc, ss, nstat, ...) may run before it is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A printable form of a command, for error messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion, killing it after `timeout`.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning `{what}`"))?;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_t = thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let err_t = thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{what}` did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Runs `cmd` (bounded by [`DEFAULT_TIMEOUT`]) and returns its stdout; a non-zero exit is an
/// error that carries the command line and its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = output_within(cmd, DEFAULT_TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            out.status,
            out.stderr.trim()
        );
    }
    Ok(out.stdout)
}

/// `Command::new(argv[0]).args(argv[1..])`.
pub fn command(argv: &[&str]) -> Command {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]);
    c
}

/// Whether an executable named `name` is on PATH.
pub fn have(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// Panics with a helpful message unless the test runs as root with the tools it needs.
pub fn require_root_and(tools: &[&str]) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these integration tests need root (network namespaces, eBPF); run them as root"
    );
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    assert!(
        missing.is_empty(),
        "missing tools {missing:?}: `cargo xtask setup` installs them \
         (apt-get install -y iproute2 iperf3 ethtool nftables bpftool util-linux)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_kills() {
        let t0 = Instant::now();
        let err = output_within(&mut command(&["sleep", "5"]), Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(err.contains("did not finish"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn run_reports_stderr() {
        let err = run(&mut command(&["sh", "-c", "echo boom >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("boom") && err.contains("sh -c"), "{err}");
        assert_eq!(run(&mut command(&["echo", "hi"])).unwrap(), "hi\n");
    }
}
