//! Finds the cgroup sock_ops attaches to: the cgroup v2 mount's root, or the cgroup a
//! scoped probe was given (`--cgroup`). Hosts mount cgroup v2 at /sys/fs/cgroup (unified) or
//! /sys/fs/cgroup/unified (hybrid), so read the mount table.
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};

/// statfs(2)'s f_type of a cgroup v2 file system.
const CGROUP2_SUPER_MAGIC: libc::c_long = 0x6367_7270;

/// Where sock_ops attaches: `scope` when given (checked to be a cgroup v2 directory), else
/// the root of the cgroup v2 mount.
pub fn sock_ops_cgroup(scope: Option<&Path>) -> Result<PathBuf> {
    let Some(dir) = scope else {
        return cgroup2_mount();
    };
    if !dir.join("cgroup.procs").is_file() {
        bail!(
            "--cgroup {}: not a cgroup directory (no cgroup.procs in it)",
            dir.display()
        );
    }
    if !is_cgroup2(dir) {
        bail!(
            "--cgroup {}: not on a cgroup v2 file system (sock_ops needs cgroup v2)",
            dir.display()
        );
    }
    Ok(dir.to_path_buf())
}

fn is_cgroup2(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is valid; statfs writes it for a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between libcs
    let magic = st.f_type as libc::c_long;
    rc == 0 && magic == CGROUP2_SUPER_MAGIC
}

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
    fn a_scope_must_be_a_cgroup_v2_directory() {
        let e = sock_ops_cgroup(Some(Path::new("/proc"))).unwrap_err();
        assert!(e.to_string().contains("not a cgroup directory"), "{e}");
        assert_eq!(
            sock_ops_cgroup(None).ok(),
            cgroup2_mount().ok(),
            "without a scope: the mount's root"
        );
        if let Ok(root) = cgroup2_mount() {
            assert_eq!(sock_ops_cgroup(Some(&root)).unwrap(), root);
        }
    }

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
