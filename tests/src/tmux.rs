//! A terminal program driven through tmux: keys in (`send-keys`), screen out
//! (`capture-pane`). Each session runs on its own tmux server socket, killed on drop, so a
//! failed test leaves no tmux server behind and never touches a user's sessions.
use crate::cmd::{self, command};
use anyhow::{bail, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub struct Tmux {
    socket: String,
    /// The server's socket file, removed on drop (kill-server leaves it behind).
    socket_path: Option<String>,
}

impl Tmux {
    /// Runs `shell_command` (a `sh -c` string) in a detached `width`x`height` session.
    pub fn start(shell_command: &str, width: u16, height: u16) -> Result<Tmux> {
        let socket = format!(
            "probe-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let mut t = Tmux {
            socket,
            socket_path: None,
        };
        let (w, h) = (width.to_string(), height.to_string());
        cmd::run(&mut t.tmux(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            &w,
            "-y",
            &h,
            shell_command,
        ]))?;
        // The pane stays after its program exits, so the exit status can be read.
        cmd::run(&mut t.tmux(&["set-option", "-g", "remain-on-exit", "on"]))?;
        t.socket_path = t.format("#{socket_path}").ok().filter(|p| !p.is_empty());
        Ok(t)
    }

    fn tmux(&self, args: &[&str]) -> std::process::Command {
        let mut argv = vec!["tmux", "-L", &self.socket];
        argv.extend(args);
        command(&argv)
    }

    /// `send-keys` with tmux key names (`Enter`, `Escape`, `Down`, `q`); `literal` text
    /// goes through [`Tmux::type_text`].
    pub fn keys(&self, keys: &[&str]) -> Result<()> {
        let mut a = vec!["send-keys", "-t", "t"];
        a.extend(keys);
        cmd::run(&mut self.tmux(&a)).map(|_| ())
    }

    pub fn type_text(&self, text: &str) -> Result<()> {
        cmd::run(&mut self.tmux(&["send-keys", "-t", "t", "-l", text])).map(|_| ())
    }

    /// The visible screen as plain text.
    pub fn capture(&self) -> Result<String> {
        cmd::run(&mut self.tmux(&["capture-pane", "-p", "-t", "t"]))
    }

    /// Captures until `pred` holds (bounded); the matching screen, or an error with the last.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.capture()?;
            if pred(&last) {
                return Ok(last);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("timed out after {timeout:?} waiting for {what}; screen:\n{last}")
    }

    pub fn resize(&self, width: u16, height: u16) -> Result<()> {
        let (w, h) = (width.to_string(), height.to_string());
        cmd::run(&mut self.tmux(&["resize-window", "-t", "t", "-x", &w, "-y", &h])).map(|_| ())
    }

    /// A tmux format of the pane, e.g. `#{pane_dead}`.
    pub fn format(&self, f: &str) -> Result<String> {
        Ok(
            cmd::run(&mut self.tmux(&["display-message", "-p", "-t", "t", f]))?
                .trim()
                .to_string(),
        )
    }

    /// The pane's program has exited.
    pub fn dead(&self) -> bool {
        self.format("#{pane_dead}").is_ok_and(|s| s == "1")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = cmd::output_within(&mut self.tmux(&["kill-server"]), Duration::from_secs(5));
        if let Some(p) = &self.socket_path {
            let _ = std::fs::remove_file(p);
        }
    }
}
