//! Finds the cgroup v2 mount: sock_ops attaches to its root. Hosts mount it at
//! /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid), so read the mount table.
use std::path::PathBuf;

use anyhow::{anyhow, Result};

pub fn cgroup2_mount() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    find_cgroup2(&mounts).ok_or_else(|| {
        anyhow!("no cgroup v2 mount in /proc/self/mounts (mount one: mount -t cgroup2 none /sys/fs/cgroup/unified)")
    })
}

fn find_cgroup2(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, path, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(path)))
    })
}

/// /proc/self/mounts escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_and_unified() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        assert_eq!(
            find_cgroup2(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(find_cgroup2(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(find_cgroup2("proc /proc proc rw 0 0\n"), None);
    }
}
