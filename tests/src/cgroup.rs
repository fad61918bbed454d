//! cgroup v2 for tests and the lab: where it is mounted, and a command that starts inside one
//! cgroup (so that every socket it opens belongs to it, which is what `probe run --cgroup`
//! scopes by).
use std::{path::Path, path::PathBuf, process::Command, time::Duration};

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

/// A cgroup v2 directory of a test's, removed on drop (after killing what is left in it).
pub struct TestCgroup {
    pub dir: PathBuf,
}

impl TestCgroup {
    /// A new cgroup named after `what` and this process.
    pub fn new(what: &str) -> TestCgroup {
        let root = cgroup2_mount().expect("a cgroup v2 mount");
        let dir = root.join(format!("probe-test-{what}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        TestCgroup { dir }
    }

    /// `argv` run inside this cgroup.
    pub fn command(&self, argv: &[&str]) -> Command {
        command_in(&self.dir, argv)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// A path of nested cgroup v2 directories under the mount (`a/b/c`), made as `mkdir -p`
/// would; on drop, what is left in its leaf is killed and the directories it made are
/// removed, deepest first (those that were there before stay).
pub struct CgroupPath {
    pub leaf: PathBuf,
    made: Vec<PathBuf>,
}

impl CgroupPath {
    pub fn new(rel: &str) -> CgroupPath {
        let root = cgroup2_mount().expect("a cgroup v2 mount");
        let mut dir = root.clone();
        let mut made = Vec::new();
        for part in rel.split('/') {
            dir.push(part);
            if !dir.is_dir() {
                std::fs::create_dir(&dir).unwrap();
                made.push(dir.clone());
            }
        }
        CgroupPath { leaf: dir, made }
    }

    /// The leaf's path as `ss --cgroup` shows it: under the mount, with a leading `/`.
    pub fn shown(&self) -> String {
        let root = cgroup2_mount().expect("a cgroup v2 mount");
        format!("/{}", self.leaf.strip_prefix(root).unwrap().display())
    }

    /// The pids in the leaf (`cgroup.procs`).
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.leaf.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills what is in the leaf and removes the directories made (bounded wait).
    pub fn remove(&mut self) {
        let _ = std::fs::write(self.leaf.join("cgroup.kill"), "1");
        for dir in self.made.drain(..).rev() {
            for _ in 0..50 {
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if dir.exists() {
                eprintln!("could not remove {}", dir.display());
            }
        }
    }

    pub fn command(&self, argv: &[&str]) -> Command {
        command_in(&self.leaf, argv)
    }
}

impl Drop for CgroupPath {
    fn drop(&mut self) {
        self.remove();
    }
}
