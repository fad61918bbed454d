//! A long-running child process that is always stopped: SIGTERM, then SIGKILL after a bounded
//! wait, when the guard is dropped (also while a failed test unwinds).
use anyhow::{Context, Result};
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a child gets to exit after SIGTERM before it is killed.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

pub struct Child {
    name: String,
    inner: std::process::Child,
    status: Option<ExitStatus>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

fn collect(mut r: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => into.lock().unwrap().extend_from_slice(&buf[..n]),
            }
        }
    })
}

impl Child {
    /// Spawns `cmd` with stdout and stderr captured in memory. `name` appears in messages.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Child> {
        let what = crate::cmd::describe(cmd);
        let mut inner = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {name}: `{what}`"))?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(inner.stdout.take().expect("piped"), stdout.clone()),
            collect(inner.stderr.take().expect("piped"), stderr.clone()),
        ];
        Ok(Child {
            name: name.to_owned(),
            inner,
            status: None,
            stdout,
            stderr,
            readers,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.inner.id()
    }

    /// What the child printed on stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    /// What the child printed on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Its exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.inner.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits at most `timeout` for the child to exit. Once it has exited, its output readers
    /// are joined, so `stdout()`/`stderr()` are complete.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                // The pipes close when the process and anything that inherited them exit; a
                // grandchild may hold them longer, so the readers get a bounded wait.
                let until = Instant::now() + Duration::from_secs(2);
                while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
                    thread::sleep(Duration::from_millis(5));
                }
                for r in self.readers.drain(..) {
                    if r.is_finished() {
                        let _ = r.join();
                    }
                }
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` to the child (if it has not exited yet).
    pub fn signal(&mut self, sig: libc::c_int) {
        if self.try_wait().is_none() {
            // SAFETY: plain kill(2) on our own child's pid, which is not reaped yet.
            unsafe {
                libc::kill(self.pid() as libc::pid_t, sig);
            }
        }
    }

    /// SIGTERM, then waits up to `grace`; returns the exit status, or None if it had to be
    /// SIGKILLed.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        if let Some(st) = self.wait_timeout(grace) {
            return Some(st);
        }
        self.kill();
        None
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_timeout(Duration::from_secs(10));
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            self.terminate(TERM_GRACE);
        }
    }
}

/// Process CPU time (utime + stime) and memory high-water mark, read from /proc.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcUsage {
    /// utime + stime, seconds.
    pub cpu_seconds: f64,
    /// VmHWM, bytes.
    pub peak_rss_bytes: u64,
}

/// Reads [`ProcUsage`] of `pid`.
pub fn proc_usage(pid: u32) -> Result<ProcUsage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ProcUsage {
        cpu_seconds: parse_stat_cpu_ticks(&stat)? as f64 / hz,
        peak_rss_bytes: parse_status_kib(&status, "VmHWM")? * 1024,
    })
}

/// utime + stime (clock ticks) from a /proc/PID/stat line.
pub fn parse_stat_cpu_ticks(stat: &str) -> Result<u64> {
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')').context("no ')' in /proc/PID/stat")? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = f.get(11).context("short stat")?.parse()?;
    let stime: u64 = f.get(12).context("short stat")?.parse()?;
    Ok(utime + stime)
}

/// A `Key:   N kB` line of /proc/PID/status, in KiB.
pub fn parse_status_kib(status: &str, key: &str) -> Result<u64> {
    let line = status
        .lines()
        .find(|l| l.split(':').next() == Some(key))
        .with_context(|| format!("no {key} in /proc/PID/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("no value")?
        .parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::command;

    #[test]
    fn drop_stops_the_child() {
        let c = Child::spawn("sleep", &mut command(&["sleep", "30"])).unwrap();
        let pid = c.pid();
        let t0 = Instant::now();
        drop(c);
        assert!(t0.elapsed() < Duration::from_secs(3));
        // Reaped: the pid no longer names our child.
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!st.contains("(sleep)"), "{st}");
    }

    #[test]
    fn sigkill_after_grace() {
        let mut c = Child::spawn(
            "stubborn",
            &mut command(&["sh", "-c", "trap '' TERM; echo ready; sleep 30"]),
        )
        .unwrap();
        let t0 = Instant::now();
        while !c.stdout().contains("ready") && t0.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(c.terminate(Duration::from_millis(300)), None);
        assert!(c.try_wait().is_some());
        // The orphaned `sleep` still holds the pipes: the wait for them is bounded.
        assert!(t0.elapsed() < Duration::from_secs(8));
    }

    #[test]
    fn captures_output_and_status() {
        let mut c = Child::spawn(
            "sh",
            &mut command(&["sh", "-c", "echo out; echo err >&2; exit 4"]),
        )
        .unwrap();
        let st = c.wait_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(st.code(), Some(4));
        assert_eq!(c.stdout(), "out\n");
        assert_eq!(c.stderr(), "err\n");
    }

    #[test]
    fn proc_parsers() {
        let stat = "1234 (my prog) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 4 0 \
                    100 1000000 500 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat).unwrap(), 280);
        let status = "Name:\tprobe\nVmPeak:\t  10000 kB\nVmHWM:\t    5120 kB\nVmRSS:\t 4000 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM").unwrap(), 5120);
        let me = proc_usage(std::process::id()).unwrap();
        assert!(me.peak_rss_bytes > 0);
    }
}
