//! Which training job a cgroup belongs to, from its path under the cgroup v2 mount: the
//! operator's templates (`job_from_cgroup`) first, then the two layouts training runs under.
//!
//! - **Kubernetes**: `kubepods*/…/…pod<UID>.slice` (systemd driver; the UID's dashes as
//!   underscores) or `kubepods/…/pod<UID>` (cgroupfs driver). The pod's namespace and name
//!   come from the kubelet's pod log directory `<namespace>_<name>_<UID>` (no API token);
//!   a pod without one is no job. The job is `<namespace>/<name>` without the rank suffix
//!   the training operators give their pods ([`pod_job`]).
//! - **Slurm**: `…slurm…/job_<ID>/…` (slurmstepd's cgroup v2 tree): job `slurm/<ID>`, rank
//!   the `task_<N>` below it (the task's index on this node).
//!
//! A socket's cgroup id is its directory's inode number; the tree is walked again only when
//! a socket names an id the last walk did not see (a cgroup made since), at most once per
//! read, so a host whose jobs do not change walks it once.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use rustc_hash::FxHashMap;

use super::cgroup_tree::{self, MISS_RETRY};
use crate::{config::JobSettings, pathpattern::PathPattern};

/// The longest job name kept (a label value).
const MAX_NAME: usize = 128;

/// A training job, as a cgroup's path names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Job {
    pub name: String,
    /// The rank where the layout gives it (a pod name's suffix, a Slurm task).
    pub rank: Option<String>,
    /// `kubernetes`, `slurm`, `pattern`, or `flag` (`--training-job`).
    pub source: &'static str,
}

pub struct JobFinder {
    root: PathBuf,
    patterns: Vec<PathPattern>,
    builtin: bool,
    pod_logs: PathBuf,
    /// Every cgroup of the last walk, with its job.
    by_id: FxHashMap<u64, Option<Arc<Job>>>,
    /// Ids a walk did not find, and when: not looked for again for [`MISS_RETRY`].
    missed: FxHashMap<u64, Instant>,
    walked_this_read: bool,
    walks: u64,
    /// How long this read's walk took (s).
    walk_s: f64,
}

impl JobFinder {
    pub fn new(root: PathBuf, s: &JobSettings) -> Self {
        Self {
            root,
            patterns: s.from_cgroup.clone(),
            builtin: s.builtin,
            pod_logs: s.pod_logs.clone(),
            by_id: FxHashMap::default(),
            missed: FxHashMap::default(),
            walked_this_read: false,
            walks: 0,
            walk_s: 0.0,
        }
    }

    /// A new read of the sockets starts: it may walk the tree again.
    pub fn begin_read(&mut self) {
        self.walked_this_read = false;
        self.walk_s = 0.0;
    }

    /// How long this read's walk of the tree took (0 without one), in seconds.
    pub fn walk_seconds(&self) -> f64 {
        self.walk_s
    }

    /// Walks of the cgroup tree so far.
    pub fn walks(&self) -> u64 {
        self.walks
    }

    /// The job of the cgroup with this id, if it names one.
    pub fn job(&mut self, id: u64) -> Option<Arc<Job>> {
        if let Some(j) = self.by_id.get(&id) {
            return j.clone();
        }
        if self.walked_this_read
            || self
                .missed
                .get(&id)
                .is_some_and(|t| t.elapsed() < MISS_RETRY)
        {
            return None;
        }
        self.walk();
        let found = self.by_id.get(&id).cloned();
        if found.is_none() {
            // Outside probe's view of the tree, or made after the walk read its parent.
            self.missed.insert(id, Instant::now());
        }
        found.flatten()
    }

    fn walk(&mut self) {
        let t = Instant::now();
        self.walked_this_read = true;
        self.walks += 1;
        let pods = pod_names(&self.pod_logs);
        let mut by_id = FxHashMap::default();
        // The root's sockets (a host's own services, on many hosts) are no job's.
        if let Ok(m) = std::fs::metadata(&self.root) {
            by_id.insert(std::os::unix::fs::MetadataExt::ino(&m), None);
        }
        self.missed.retain(|_, t| t.elapsed() < MISS_RETRY);
        cgroup_tree::walk(&self.root, |id, path| {
            let parts: Vec<&str> = path.iter().map(String::as_str).collect();
            by_id.insert(id, self.job_of(&parts, &pods).map(Arc::new));
        });
        self.by_id = by_id;
        self.walk_s = t.elapsed().as_secs_f64();
    }

    /// The job a cgroup path (its components under the mount) names, if any.
    pub fn job_of(&self, path: &[&str], pods: &FxHashMap<String, (String, String)>) -> Option<Job> {
        let job = self
            .patterns
            .iter()
            .find_map(|p| p.matches(path))
            .map(|c| Job {
                name: c.job,
                rank: c.rank,
                source: "pattern",
            })
            .or_else(|| {
                self.builtin
                    .then(|| kubernetes(path, pods).or_else(|| slurm(path)))
                    .flatten()
            })?;
        (!job.name.is_empty()).then(|| Job {
            name: job.name.chars().take(MAX_NAME).collect(),
            ..job
        })
    }
}

/// The kubelet's pod log directories: pod UID -> (namespace, name). Names and namespaces
/// are DNS labels, so `_` only separates.
pub fn pod_names(dir: &Path) -> FxHashMap<String, (String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return FxHashMap::default();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let mut f = name.splitn(3, '_');
            let (ns, pod, uid) = (f.next()?, f.next()?, f.next()?);
            Some((uid.to_owned(), (ns.to_owned(), pod.to_owned())))
        })
        .collect()
}

fn kubernetes(path: &[&str], pods: &FxHashMap<String, (String, String)>) -> Option<Job> {
    if !path.first()?.starts_with("kubepods") {
        return None;
    }
    let uid = path.iter().find_map(|c| pod_uid(c))?;
    let (ns, pod) = pods.get(&uid)?;
    let (job, rank) = pod_job(pod);
    Some(Job {
        name: format!("{ns}/{job}"),
        rank,
        source: "kubernetes",
    })
}

/// A pod's UID from its cgroup's name: `…-pod<uid with _>.slice` or `pod<uid>`.
fn pod_uid(c: &str) -> Option<String> {
    let raw = match c.strip_suffix(".slice") {
        Some(s) => &s[s.rfind("-pod")? + 4..],
        None => c.strip_prefix("pod")?,
    };
    let uid = raw.replace('_', "-");
    let shape = uid.len() == 36
        && uid.char_indices().all(|(i, ch)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                ch == '-'
            } else {
                ch.is_ascii_hexdigit()
            }
        });
    shape.then_some(uid)
}

/// The roles the training operators put before a pod's index (Kubeflow's PyTorchJob,
/// TFJob, MPIJob; LeaderWorkerSet).
const ROLES: &[&str] = &[
    "master",
    "worker",
    "launcher",
    "chief",
    "ps",
    "evaluator",
    "leader",
];

/// A pod name's job and rank: the generated 5-character suffix after an index dropped
/// (an Indexed Job's or JobSet's `<name>-<index>-<xxxxx>`), the trailing index is the rank,
/// and a role before it (`<job>-worker-3`) stays with the rank so that every role of one
/// job shares its name. A name with no index is its own job, with no rank.
pub fn pod_job(pod: &str) -> (String, Option<String>) {
    let mut parts: Vec<&str> = pod.split('-').collect();
    let n = parts.len();
    if n >= 3 && is_generated(parts[n - 1]) && is_index(parts[n - 2]) {
        parts.pop();
    }
    let n = parts.len();
    if n < 2 || !is_index(parts[n - 1]) {
        return (pod.to_owned(), None);
    }
    let index = parts.pop().unwrap_or_default();
    let rank = match parts.last() {
        Some(role) if parts.len() >= 2 && ROLES.contains(role) => {
            let r = format!("{role}-{index}");
            parts.pop();
            r
        }
        _ => index.to_owned(),
    };
    (parts.join("-"), Some(rank))
}

fn is_index(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Kubernetes' generated name suffix: 5 characters of its consonant-and-digit alphabet.
fn is_generated(s: &str) -> bool {
    s.len() == 5
        && s.bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
}

fn slurm(path: &[&str]) -> Option<Job> {
    let at = path
        .iter()
        .position(|c| c.strip_prefix("job_").is_some_and(is_index))?;
    if !path[..at].iter().any(|c| c.contains("slurm")) {
        return None;
    }
    let id = &path[at][4..];
    let rank = path[at + 1..]
        .iter()
        .find_map(|c| c.strip_prefix("task_").filter(|t| is_index(t)))
        .map(str::to_owned);
    Some(Job {
        name: format!("slurm/{id}"),
        rank,
        source: "slurm",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finder(patterns: &[&str]) -> JobFinder {
        let s = JobSettings {
            from_cgroup: patterns
                .iter()
                .map(|p| PathPattern::parse(p).unwrap())
                .collect(),
            ..JobSettings::default()
        };
        JobFinder::new(PathBuf::from("/nonexistent"), &s)
    }

    fn job(f: &JobFinder, path: &str, pods: &FxHashMap<String, (String, String)>) -> Option<Job> {
        let parts: Vec<&str> = path.split('/').collect();
        f.job_of(&parts, pods)
    }

    /// A cgroup's id is its directory's inode: a new one walks the tree once per read, an
    /// id the tree does not have is asked once, and a directory that went is forgotten.
    #[test]
    fn ids_are_found_by_walking_the_tree_once_per_read() {
        let root = std::env::temp_dir().join(format!("probe-jobfinder-{}", std::process::id()));
        let job_dir = root.join("training.slice/llm-rank2.scope");
        std::fs::create_dir_all(job_dir.join("leaf")).unwrap();
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let (job_id, leaf_id) = (ino(&job_dir), ino(&job_dir.join("leaf")));
        let s = JobSettings {
            from_cgroup: vec![PathPattern::parse("training.slice/{job}-rank{rank}.scope").unwrap()],
            ..JobSettings::default()
        };
        let mut f = JobFinder::new(root.clone(), &s);
        f.begin_read();
        let want = Job {
            name: "llm".into(),
            rank: Some("2".into()),
            source: "pattern",
        };
        assert_eq!(
            f.job(leaf_id).as_deref(),
            Some(&want),
            "a leaf below the job's directory"
        );
        assert_eq!(f.job(job_id).as_deref(), Some(&want));
        assert_eq!(f.job(u64::MAX), None);
        assert_eq!(f.walks(), 1, "one walk for the read");
        // The next read looks for it (a cgroup made after the walk read its parent)...
        f.begin_read();
        assert_eq!(f.job(u64::MAX), None);
        assert_eq!(f.walks(), 2);
        // ...and the one after does not, for a while.
        f.begin_read();
        assert_eq!(f.job(u64::MAX), None);
        assert_eq!(f.job(ino(&root)), None, "the root is no job");
        assert_eq!(
            f.walks(),
            2,
            "an id the tree lacks is not looked for again soon"
        );
        // The job's directories go; the next walk (for an id never seen) forgets them.
        std::fs::remove_dir_all(root.join("training.slice")).unwrap();
        f.begin_read();
        assert_eq!(f.job(u64::MAX - 1), None);
        assert_eq!(f.walks(), 3);
        assert_eq!(f.job(leaf_id), None, "gone with its directory");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn pod_names_give_job_and_rank() {
        for (pod, job, rank) in [
            ("llama-70b-worker-3", "llama-70b", Some("worker-3")),
            ("llama-70b-master-0", "llama-70b", Some("master-0")),
            ("bert-2-x7k2q", "bert", Some("2")),
            ("ring-7", "ring", Some("7")),
            ("trainer", "trainer", None),
            ("web-5d8f9b6c4d-x7k2q", "web-5d8f9b6c4d-x7k2q", None),
            ("worker-1", "worker", Some("1")),
        ] {
            assert_eq!(
                pod_job(pod),
                (job.to_owned(), rank.map(str::to_owned)),
                "{pod}"
            );
        }
    }

    #[test]
    fn the_two_layouts_and_the_templates() {
        let uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
        let mut pods = FxHashMap::default();
        pods.insert(
            uid.to_owned(),
            ("ml".to_owned(), "llama-worker-2".to_owned()),
        );
        let f = finder(&["training.slice/{job}-rank{rank}.scope"]);
        let systemd = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-abc.scope",
            uid.replace('-', "_")
        );
        let want = Job {
            name: "ml/llama".into(),
            rank: Some("worker-2".into()),
            source: "kubernetes",
        };
        assert_eq!(job(&f, &systemd, &pods), Some(want.clone()));
        assert_eq!(
            job(&f, &format!("kubepods/besteffort/pod{uid}/abc"), &pods),
            Some(want)
        );
        // A pod with no log directory is no job.
        assert_eq!(job(&f, &systemd, &FxHashMap::default()), None);
        // Not under kubepods: not a pod.
        assert_eq!(job(&f, &format!("system.slice/pod{uid}"), &pods), None);
        assert_eq!(
            job(
                &f,
                "system.slice/slurmstepd.scope/job_4242/step_0/user/task_3",
                &pods
            ),
            Some(Job {
                name: "slurm/4242".into(),
                rank: Some("3".into()),
                source: "slurm"
            })
        );
        assert_eq!(
            job(&f, "system.slice/job_4242", &pods),
            None,
            "no slurm above it"
        );
        assert_eq!(
            job(&f, "training.slice/llm-rank1.scope", &pods),
            Some(Job {
                name: "llm".into(),
                rank: Some("1".into()),
                source: "pattern"
            })
        );
        assert_eq!(
            job(&f, "user.slice/user-0.slice/session-1.scope", &pods),
            None
        );
        // Templates come first; without the built-ins only they name jobs.
        let mut only = finder(&["kubepods.slice/{job}.slice"]);
        assert_eq!(job(&only, &systemd, &pods).unwrap().source, "pattern");
        only.builtin = false;
        assert_eq!(
            job(&only, "system.slice/slurmstepd.scope/job_1", &pods),
            None
        );
    }
}
