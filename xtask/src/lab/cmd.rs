//! Running helper commands (ip, tc, nft, ss) with a time bound, and the interrupt flag.
use anyhow::{bail, Context, Result};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// How long any helper command may take.
const TIMEOUT: Duration = Duration::from_secs(15);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT, SIGTERM and SIGHUP into a flag the lab polls, so every exit path goes
/// through the cleanup.
pub fn install_signal_handlers() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error()).context("installing a signal handler");
            }
        }
    }
    Ok(())
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// A command that runs in its own process group, so a Ctrl-C at the terminal reaches only
/// the lab, which then stops its children in order.
pub fn command(argv: &[&str]) -> Command {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]).process_group(0);
    c
}

pub fn describe(argv: &[&str]) -> String {
    argv.join(" ")
}

/// Runs `argv` to completion within 15 s and returns its stdout; a failure names the
/// command and carries its stderr.
pub fn run(argv: &[&str]) -> Result<String> {
    let out = output(argv)?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(argv),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `argv` within 15 s and returns whatever it produced, successful or not.
pub fn output(argv: &[&str]) -> Result<Output> {
    let child = command(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running `{}`", describe(argv)))?;
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(TIMEOUT) {
        Ok(r) => r.with_context(|| format!("waiting for `{}`", describe(argv))),
        Err(_) => {
            // SAFETY: plain kill(2) of the child this function spawned and has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = rx.recv_timeout(Duration::from_secs(2));
            bail!("`{}` did not finish within {TIMEOUT:?}", describe(argv))
        }
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// True if a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence.
    let ok = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    let exists = ok || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !is_zombie_stat(&s))
            .unwrap_or(true)
}

/// True if a /proc/PID/stat line has state Z (zombie) or X (dead).
pub fn is_zombie_stat(stat: &str) -> bool {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|st| st == "Z" || st == "X")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zombies_and_the_living() {
        assert!(is_zombie_stat("123 (xtask) Z 1 123 123 0 -1"));
        assert!(is_zombie_stat("123 (a) b) Z 1"));
        assert!(!is_zombie_stat("123 (xtask) S 1 123 123 0 -1"));
        assert!(pid_alive(std::process::id()));
    }
}
