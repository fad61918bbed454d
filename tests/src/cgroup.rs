//! cgroup v2 for tests and the lab: where it is mounted, and a command that starts inside one
//! cgroup (so that every socket it opens belongs to it, which is what `probe run --cgroup`
//! scopes by).
use std::{path::Path, path::PathBuf, process::Command};

/// The cgroup v2 mount: /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
    })
}

/// `argv` started inside cgroup `dir`: a shell moves itself in, then execs `argv` (same pid).
pub fn command_in(dir: &Path, argv: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(dir.join("cgroup.procs"))
        .args(argv);
    c
}
