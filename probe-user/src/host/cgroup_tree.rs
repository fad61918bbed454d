//! Walks of the cgroup v2 tree, and the cgroups a scoped probe watches: the one it was given
//! (`--cgroup`) and every cgroup below it, as sock_ops sees them (a program attached to a
//! cgroup runs for its descendants too). A socket names its cgroup by id (the directory's
//! inode number); which ids lie below the scope is learnt by walking it, again only when a
//! socket names an id no walk saw, at most once per read.
use std::{
    os::unix::fs::{DirEntryExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use rustc_hash::{FxHashMap, FxHashSet};

/// The deepest a walk goes, and the most directories it reads: a host's cgroup tree is a
/// few levels and a few thousand directories; a runaway tree stops the walk, not the daemon.
const MAX_DEPTH: usize = 32;
const MAX_DIRS: usize = 200_000;
/// How long an id no walk found is not looked for again: a socket in a cgroup made just
/// after a walk read its parent is seen at most this late.
pub const MISS_RETRY: Duration = Duration::from_secs(10);

/// Calls `visit` with every cgroup below `root` (not `root` itself): its id and its path's
/// components under `root`, parents before their children.
pub fn walk(root: &Path, mut visit: impl FnMut(u64, &[String])) {
    let mut stack: Vec<(PathBuf, Vec<String>)> = vec![(root.to_path_buf(), Vec::new())];
    let mut dirs = 0;
    while let Some((dir, rel)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue; // gone since its parent was read
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            dirs += 1;
            let mut path = rel.clone();
            path.push(e.file_name().to_string_lossy().into_owned());
            visit(e.ino(), &path);
            if path.len() < MAX_DEPTH && dirs < MAX_DIRS {
                stack.push((e.path(), path));
            }
        }
    }
}

/// The id of a cgroup directory: its inode number.
pub fn id_of(dir: &Path) -> Result<u64> {
    Ok(std::fs::metadata(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .ino())
}

/// A scoped probe's cgroups: the scope and everything below it.
pub struct Subtree {
    dir: PathBuf,
    inside: FxHashSet<u64>,
    /// Ids a walk did not find, and when: not looked for again for [`MISS_RETRY`].
    missed: FxHashMap<u64, Instant>,
    walked_this_read: bool,
    walk_s: f64,
}

impl Subtree {
    /// The scope `dir` and the cgroups below it now.
    pub fn new(dir: &Path) -> Result<Self> {
        let mut s = Self {
            dir: dir.to_path_buf(),
            inside: FxHashSet::default(),
            missed: FxHashMap::default(),
            walked_this_read: false,
            walk_s: 0.0,
        };
        s.inside.insert(id_of(dir)?);
        s.walk();
        Ok(s)
    }

    /// A new read of the sockets starts: it may walk the scope again.
    pub fn begin_read(&mut self) {
        self.walked_this_read = false;
        self.walk_s = 0.0;
    }

    /// How long this read's walk took (0 without one), in seconds.
    pub fn walk_seconds(&self) -> f64 {
        self.walk_s
    }

    /// Whether the cgroup with this id is the scope or below it.
    pub fn contains(&mut self, id: u64) -> bool {
        if self.inside.contains(&id) {
            return true;
        }
        if self.walked_this_read
            || self
                .missed
                .get(&id)
                .is_some_and(|t| t.elapsed() < MISS_RETRY)
        {
            return false;
        }
        self.walk();
        if self.inside.contains(&id) {
            return true;
        }
        // Outside the scope (a host's other cgroups: the common case), or made after the
        // walk read its parent.
        self.missed.insert(id, Instant::now());
        false
    }

    fn walk(&mut self) {
        let t = Instant::now();
        self.walked_this_read = true;
        self.missed.retain(|_, t| t.elapsed() < MISS_RETRY);
        // Cgroups that went are dropped: ids are not reused, but the set should not grow.
        let mut inside = FxHashSet::default();
        if let Ok(root) = id_of(&self.dir) {
            inside.insert(root);
        }
        walk(&self.dir, |id, _| {
            inside.insert(id);
        });
        self.inside = inside;
        self.walk_s = t.elapsed().as_secs_f64();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scope holds itself and what is below it at any depth, learnt when a socket names
    /// an id: a cgroup made after the scope was opened is found by the next walk.
    #[test]
    fn a_scope_holds_its_descendants() {
        let root = std::env::temp_dir().join(format!("subtree-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let scope = root.join("host");
        std::fs::create_dir_all(scope.join("job-a/rank0")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        let mut s = Subtree::new(&scope).unwrap();
        for d in [&scope, &scope.join("job-a"), &scope.join("job-a/rank0")] {
            assert!(s.contains(id_of(d).unwrap()), "{}", d.display());
        }
        s.begin_read();
        assert!(!s.contains(id_of(&root.join("other")).unwrap()));
        assert!(!s.contains(id_of(&root).unwrap()));

        std::fs::create_dir_all(scope.join("job-b/rank1")).unwrap();
        let new = id_of(&scope.join("job-b/rank1")).unwrap();
        // This read walked already (for "other"); the next one walks for the new id.
        assert!(!s.contains(new));
        s.begin_read();
        assert!(s.contains(new));
        // An id a walk missed waits for MISS_RETRY, however many reads come.
        s.begin_read();
        assert!(!s.contains(id_of(&root.join("other")).unwrap()));
        assert!(s.walk_seconds() == 0.0, "no walk for a recent miss");
        let _ = std::fs::remove_dir_all(&root);
    }
}
