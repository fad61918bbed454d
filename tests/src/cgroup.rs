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
