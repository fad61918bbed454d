//! `cargo xtask lab --corpus DIR`: recorded runs to train the spike model on, and a disjoint
//! held-out set to evaluate it on.
//!
//! DIR/train/<run>/ and DIR/heldout/<run>/ are each a `--record` directory. Runs vary the
//! pattern, the compute period, the size and the seed. Held-out runs use seeds training
//! never used, and the first of them a (pattern, period) pair training never saw, so an
//! evaluation can tell forecasting congestion from remembering a job. DIR/corpus.json lists
//! every run with its parameters, split and status, rewritten after each run; a second
//! invocation with the same DIR skips the runs recorded already, so an interrupted corpus
//! resumes where it stopped, and a failed run is tried again.
use super::episodes::unix_now;
use super::record::RECORDING;
use super::schedule::{Kind, SplitMix64};
use super::{cmd, run_one, topo, LabArgs, Pattern};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::Instant;

/// Compute periods the corpus uses, in ms.
const PERIODS_MS: [u64; 3] = [200, 100, 400];
/// Bytes per iteration at 1000 Mbit/s; slower links get proportionally less, so that the
/// communication keeps a similar share of the iteration.
const SIZES: [u64; 3] = [1 << 20, 4 << 20, 8 << 20];
/// Base link rates, Mbit/s.
const LINKS_MBIT: [u32; 3] = [1000, 500, 200];
/// Ranks a run may have; more ranks only where `ranks * link` stays within what two cores
/// forward (`MAX_RANK_MBIT`).
const RANKS: [u16; 3] = [4, 6, 8];
/// Ranks of a corpus with one probe per rank (the job view's 4 and 8), with the same limit.
const RANKS_PER_RANK: [u16; 2] = [4, 8];
const MAX_RANK_MBIT: u32 = 4000;
/// Queue limits of the tbfs (their `latency`), ms.
const QUEUES_MS: [u32; 3] = [20, 50, 100];
/// The (pattern, link) pair only held-out runs use.
const HELDOUT_ONLY: (Pattern, u32) = (Pattern::Ps, 200);
pub const CORPUS_FILE: &str = "corpus.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Heldout,
}

impl Split {
    fn dir(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Heldout => "heldout",
        }
    }
}

/// One planned run of the corpus.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSpec {
    /// Unique within the corpus; also the run's directory under its split.
    pub name: String,
    pub split: Split,
    pub pattern: Pattern,
    pub period_ms: u64,
    pub size_bytes: u64,
    pub ranks: u16,
    pub link_mbit: u32,
    pub queue_ms: u32,
    pub seed: u64,
}

impl RunSpec {
    /// The run's directory, relative to the corpus directory.
    pub fn rel_dir(&self) -> String {
        format!("{}/{}", self.split.dir(), self.name)
    }
}

/// A run's job: pattern, compute period, base link rate.
type Shape = (Pattern, u64, u32);

/// Every shape once, in a fixed shuffled order (seeded, so a plan never changes).
fn shapes() -> Vec<Shape> {
    let mut all: Vec<Shape> = Pattern::ALL
        .iter()
        .flat_map(|&p| {
            PERIODS_MS
                .iter()
                .flat_map(move |&t| LINKS_MBIT.iter().map(move |&l| (p, t, l)))
        })
        .collect();
    SplitMix64::new(0x5eed).shuffle(&mut all);
    all
}

/// Whether only held-out runs use this shape.
pub fn heldout_only(shape: Shape) -> bool {
    (shape.0, shape.2) == HELDOUT_ONLY
}

/// About a third as many held-out runs as training runs, at least one.
pub fn heldout_count(train: usize) -> usize {
    train.div_ceil(3).max(1)
}

/// The runs of a corpus with `train` training runs, in the order they are recorded: a
/// held-out run after every three training runs, so that a corpus recorded in several
/// sittings has held-out runs from the start. Training seeds are `base_seed` + 0, 2, 4,
/// ...; held-out seeds `base_seed` + 1, 3, 5, ..., so the two never meet. Training runs
/// cycle through every shape but the held-out-only ones; held-out runs start with a
/// held-out-only shape, then take every shape in turn. Run i is the same whatever `train`
/// is, so a corpus can grow.
pub fn plan(train: usize, base_seed: u64, ranks: &[u16]) -> Vec<RunSpec> {
    let all = shapes();
    let seen: Vec<Shape> = all.iter().copied().filter(|&s| !heldout_only(s)).collect();
    let unseen: Vec<Shape> = all.iter().copied().filter(|&s| heldout_only(s)).collect();
    let train_run = |i: usize| {
        let seed = base_seed.wrapping_add(2 * i as u64);
        spec(Split::Train, i, seen[i % seen.len()], seed, ranks)
    };
    let heldout_run = |j: usize| {
        let shape = if j.is_multiple_of(4) {
            unseen[(j / 4) % unseen.len()]
        } else {
            all[(j * 7) % all.len()]
        };
        let seed = base_seed.wrapping_add(2 * j as u64 + 1);
        spec(Split::Heldout, j, shape, seed, ranks)
    };
    let held = heldout_count(train);
    let mut out = Vec::with_capacity(train + held);
    let (mut i, mut j) = (0, 0);
    while i < train || j < held {
        for _ in 0..3 {
            if i < train {
                out.push(train_run(i));
                i += 1;
            }
        }
        if j < held {
            out.push(heldout_run(j));
            j += 1;
        }
    }
    out
}

fn spec(
    split: Split,
    i: usize,
    (pattern, period_ms, link_mbit): Shape,
    seed: u64,
    ranks: &[u16],
) -> RunSpec {
    // The rest follows from the seed: deterministic, and mixed across the shapes.
    let mut rng = SplitMix64::new(seed ^ 0xC0FF_EE00);
    let size_at_gbit = rng.pick(&SIZES);
    // Rounded to 64 KiB.
    let size_bytes = (size_at_gbit * u64::from(link_mbit) / 1000).max(256 << 10) >> 16 << 16;
    let fits: Vec<u16> = ranks
        .iter()
        .copied()
        .filter(|&r| u32::from(r) * link_mbit <= MAX_RANK_MBIT)
        .collect();
    let ranks = rng.pick(&fits);
    let queue_ms = rng.pick(&QUEUES_MS);
    RunSpec {
        name: format!(
            "{i:03}-{}-{period_ms}ms-{}KiB-{ranks}r-{link_mbit}M-q{queue_ms}-seed{seed}",
            pattern.name(),
            size_bytes >> 10
        ),
        split,
        pattern,
        period_ms,
        size_bytes,
        ranks,
        link_mbit,
        queue_ms,
        seed,
    }
}

/// What every run of a corpus shares; resuming with other settings would mix two corpora.
#[derive(Debug, Serialize)]
struct Settings {
    seed: u64,
    duration_s: f64,
    kinds: Vec<Kind>,
    congestion: String,
    sample_ms: u64,
    calm_s: Option<(f64, f64)>,
    gradual_weight: u32,
    /// Absent when false, so that a corpus of one probe keeps the settings it had.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    probe_per_rank: bool,
}

impl Settings {
    fn of(args: &LabArgs) -> Self {
        Self {
            seed: args.seed,
            duration_s: args.duration_s(),
            kinds: args.kinds.clone(),
            congestion: args.congestion.clone(),
            sample_ms: args.sample_ms,
            calm_s: args.calm,
            gradual_weight: args.gradual_weight,
            probe_per_rank: args.probe_per_rank,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// Not recorded yet (or interrupted).
    Pending,
    Ok,
    Failed,
}

/// A run's line in corpus.json.
#[derive(Clone, Debug, Serialize)]
struct Entry {
    #[serde(flatten)]
    spec: RunSpec,
    /// Relative to the corpus directory.
    dir: String,
    status: Status,
    error: Option<String>,
    /// Unix time the run started, and how long it took with set-up and cleanup.
    t_start: Option<f64>,
    wall_s: Option<f64>,
}

#[derive(Serialize)]
struct Doc<'a> {
    settings: &'a Settings,
    train_runs: usize,
    heldout_runs: usize,
    /// The (pattern, link) pair training never sees.
    heldout_only: serde_json::Value,
    runs: &'a [Entry],
}

/// Records every run of the corpus that is not recorded yet, into `dir`.
pub fn run(args: &LabArgs, dir: &Path, traingen: &Path, probe: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let settings = Settings::of(args);
    let mut entries = resume(
        &dir,
        &settings,
        plan(args.corpus_runs as usize, args.seed, ranks_of(args)),
        args.corpus_packed.as_deref(),
    )?;
    let (train, heldout) = split_counts(&entries);
    let done = entries.iter().filter(|e| e.status == Status::Ok).count();
    eprintln!(
        "corpus: {train} training + {heldout} held-out runs of {} s into {} ({done} recorded already)",
        args.duration_s(),
        dir.display()
    );
    write_doc(&dir, &settings, &entries)?;
    let total = entries.len();
    for k in 0..total {
        let name = entries[k].dir.clone();
        if entries[k].status == Status::Ok {
            eprintln!("corpus: [{}/{total}] {name} recorded already", k + 1);
            continue;
        }
        eprintln!("corpus: [{}/{total}] recording {name}", k + 1);
        record(args, &dir, &mut entries[k], traingen, probe);
        if let (Status::Failed, Some(err)) = (entries[k].status, &entries[k].error) {
            eprintln!("corpus: {name} failed: {err}");
        }
        // Rewritten after every run: the file is right whenever the corpus stops.
        write_doc(&dir, &settings, &entries)?;
        if cmd::interrupted() {
            break;
        }
        ensure_clean(&name)?;
    }
    report(&dir, &entries)
}

/// The ranks a corpus's runs may have.
fn ranks_of(args: &LabArgs) -> &'static [u16] {
    if args.probe_per_rank {
        &RANKS_PER_RANK
    } else {
        &RANKS
    }
}

/// Training and held-out runs in a plan.
fn split_counts(entries: &[Entry]) -> (usize, usize) {
    let train = entries
        .iter()
        .filter(|e| e.spec.split == Split::Train)
        .count();
    (train, entries.len() - train)
}

/// Where a packed run keeps its features (`probe features --compact`), or a packed job
/// corpus run its busy spans (`--compact --spans`).
const PACKED: [&str; 2] = ["recording.features.parquet", "recording.spans.parquet"];

/// The plan's entries, with the runs an earlier invocation recorded marked done: its
/// corpus.json says ok and the recording is still there, or the run is packed under
/// `packed`.
fn resume(
    dir: &Path,
    settings: &Settings,
    plan: Vec<RunSpec>,
    packed: Option<&Path>,
) -> Result<Vec<Entry>> {
    let path = dir.join(CORPUS_FILE);
    let prev: serde_json::Value = match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not JSON; remove it to start over", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if !prev.is_null() && prev["settings"] != serde_json::to_value(settings)? {
        bail!(
            "{} holds a corpus made with other settings ({}); use them again or another directory",
            dir.display(),
            prev["settings"]
        );
    }
    let old: HashMap<&str, &serde_json::Value> = prev["runs"]
        .as_array()
        .map(|runs| {
            runs.iter()
                .filter_map(|r| Some((r["name"].as_str()?, r)))
                .collect()
        })
        .unwrap_or_default();
    Ok(plan
        .into_iter()
        .map(|spec| {
            let dir_rel = spec.rel_dir();
            let recorded = dir.join(&dir_rel).join(RECORDING).is_file();
            let mut e = Entry {
                dir: dir_rel,
                status: Status::Pending,
                error: None,
                t_start: None,
                wall_s: None,
                spec,
            };
            if let Some(r) = old.get(e.spec.name.as_str()) {
                if r["status"] == "ok" && recorded {
                    e.status = Status::Ok;
                    e.t_start = r["t_start"].as_f64();
                    e.wall_s = r["wall_s"].as_f64();
                }
            }
            if packed.is_some_and(|p| PACKED.iter().any(|f| p.join(&e.dir).join(f).is_file())) {
                e.status = Status::Ok;
            }
            e
        })
        .collect())
}

/// The lab arguments of one run: the corpus's settings with the run's own parameters.
fn run_args(args: &LabArgs, spec: &RunSpec, run_dir: &Path) -> LabArgs {
    LabArgs {
        pattern: spec.pattern,
        seed: spec.seed,
        period_ms: spec.period_ms,
        size: spec.size_bytes,
        ranks: spec.ranks,
        link_mbit: spec.link_mbit,
        queue_ms: spec.queue_ms,
        duration: Some(args.duration_s()),
        record: Some(run_dir.to_path_buf()),
        out: None,
        corpus: None,
        ..args.clone()
    }
}

/// Records one run into its directory and notes the outcome in `e`.
fn record(args: &LabArgs, dir: &Path, e: &mut Entry, traingen: &Path, probe: &Path) {
    let run_dir = dir.join(&e.dir);
    // An earlier failed or interrupted attempt left files this one must not mix with.
    if run_dir.exists() {
        if let Err(err) = fs::remove_dir_all(&run_dir) {
            e.status = Status::Failed;
            e.error = Some(format!("removing {}: {err}", run_dir.display()));
            return;
        }
    }
    let started = Instant::now();
    e.t_start = Some(unix_now());
    let result = run_one(
        &run_args(args, &e.spec, &run_dir),
        &run_dir,
        traingen,
        Some(probe),
    );
    e.wall_s = Some((started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    (e.status, e.error) = match result {
        Ok(()) => (Status::Ok, None),
        // Interrupted is not failed: the next invocation records it.
        Err(_) if cmd::interrupted() => (Status::Pending, Some("interrupted".into())),
        Err(err) => (Status::Failed, Some(format!("{err:#}"))),
    };
}

/// Every further run would fail if this one left its namespaces behind: stop instead.
fn ensure_clean(run: &str) -> Result<()> {
    let prefix = format!("lab{}-", std::process::id());
    let left: Vec<String> = topo::list_namespaces()?
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    if !left.is_empty() {
        bail!(
            "run {run} left namespaces behind ({}); stopping the corpus",
            left.join(" ")
        );
    }
    Ok(())
}

/// Writes corpus.json through a temporary file, so a stop mid-write never truncates it.
fn write_doc(dir: &Path, settings: &Settings, entries: &[Entry]) -> Result<()> {
    let (train, heldout) = split_counts(entries);
    let (pattern, link_mbit) = HELDOUT_ONLY;
    let doc = Doc {
        settings,
        train_runs: train,
        heldout_runs: heldout,
        heldout_only: serde_json::json!({"pattern": pattern, "link_mbit": link_mbit}),
        runs: entries,
    };
    let tmp = dir.join(format!("{CORPUS_FILE}.tmp"));
    fs::write(&tmp, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, dir.join(CORPUS_FILE)).context("replacing corpus.json")?;
    Ok(())
}

/// Prints what the corpus holds; an error if a run failed or the corpus was interrupted.
fn report(dir: &Path, entries: &[Entry]) -> Result<()> {
    let count = |s: Status| entries.iter().filter(|e| e.status == s).count();
    let (ok, failed, pending) = (
        count(Status::Ok),
        count(Status::Failed),
        count(Status::Pending),
    );
    println!(
        "\ncorpus {}: {ok} of {} runs recorded, {failed} failed, {pending} to do",
        dir.display(),
        entries.len()
    );
    for e in entries.iter().filter(|e| e.status == Status::Failed) {
        println!(
            "  failed: {} ({})",
            e.dir,
            e.error.as_deref().unwrap_or("?")
        );
    }
    if cmd::interrupted() {
        bail!("interrupted; run the same command again to resume");
    }
    if failed > 0 {
        bail!("{failed} corpus run(s) failed (see {}/{CORPUS_FILE}); run the same command again to retry them", dir.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn shapes_cover_every_combination_once() {
        let s = shapes();
        let set: HashSet<_> = s.iter().map(|&(p, t, l)| (p.name(), t, l)).collect();
        assert_eq!(set.len(), 27);
        assert_eq!(s.iter().filter(|&&x| heldout_only(x)).count(), 3);
    }

    #[test]
    fn train_and_heldout_are_disjoint() {
        for base in [0, 1, 7, u64::MAX - 3] {
            for n in [1, 2, 3, 8, 15, 24, 40, 100] {
                let p = plan(n, base, &RANKS);
                let train: Vec<&RunSpec> = p.iter().filter(|r| r.split == Split::Train).collect();
                let held: Vec<&RunSpec> = p.iter().filter(|r| r.split == Split::Heldout).collect();
                assert_eq!(train.len(), n);
                assert_eq!(held.len(), heldout_count(n));
                let seeds: HashSet<u64> = train.iter().map(|r| r.seed).collect();
                assert_eq!(seeds.len(), n, "training seeds repeat");
                assert!(
                    held.iter().all(|r| !seeds.contains(&r.seed)),
                    "base {base} n {n}"
                );
                // Training never sees the held-out-only (pattern, link) pair; held-out does.
                assert!(train
                    .iter()
                    .all(|r| (r.pattern, r.link_mbit) != HELDOUT_ONLY));
                assert!(held
                    .iter()
                    .any(|r| (r.pattern, r.link_mbit) == HELDOUT_ONLY));
                let names: HashSet<&str> = p.iter().map(|r| r.name.as_str()).collect();
                assert_eq!(names.len(), p.len(), "names are unique");
                let dirs: HashSet<String> = p.iter().map(RunSpec::rel_dir).collect();
                assert_eq!(dirs.len(), p.len());
            }
        }
    }

    #[test]
    fn heldout_runs_come_early() {
        let p = plan(24, 1, &RANKS);
        let splits: Vec<Split> = p.iter().take(8).map(|r| r.split).collect();
        use Split::{Heldout as H, Train as T};
        assert_eq!(splits, [T, T, T, H, T, T, T, H]);
    }

    #[test]
    fn plans_are_deterministic_and_grow_by_appending() {
        assert_eq!(plan(15, 1, &RANKS), plan(15, 1, &RANKS));
        assert_ne!(plan(15, 1, &RANKS), plan(15, 2, &RANKS));
        let small = plan(6, 1, &RANKS);
        let big = plan(30, 1, &RANKS);
        for r in &small {
            assert!(big.contains(r), "{r:?} is not in the bigger corpus");
        }
    }

    #[test]
    fn a_corpus_varies_its_jobs_and_links() {
        let p = plan(24, 1, &RANKS);
        let train: Vec<&RunSpec> = p.iter().filter(|r| r.split == Split::Train).collect();
        for pat in Pattern::ALL {
            assert!(train.iter().any(|r| r.pattern == pat), "{pat:?}");
        }
        for per in PERIODS_MS {
            assert!(train.iter().any(|r| r.period_ms == per), "{per}");
        }
        for link in LINKS_MBIT {
            assert!(train.iter().any(|r| r.link_mbit == link), "{link}");
        }
        let count = |f: &dyn Fn(&RunSpec) -> u64| {
            train.iter().map(|r| f(r)).collect::<HashSet<u64>>().len()
        };
        assert!(count(&|r| r.size_bytes) >= 4);
        assert!(count(&|r| u64::from(r.ranks)) >= 2);
        assert!(count(&|r| u64::from(r.queue_ms)) >= 2);
        for r in &p {
            assert!(u32::from(r.ranks) * r.link_mbit <= MAX_RANK_MBIT, "{r:?}");
            assert!(
                r.size_bytes >= 256 << 10 && r.size_bytes % (64 << 10) == 0,
                "{r:?}"
            );
        }
        assert!(p[0].name.starts_with("000-") && p[0].name.ends_with("-seed1"));
        assert_eq!(p[0].rel_dir(), format!("train/{}", p[0].name));
        let first_heldout = p.iter().find(|r| r.split == Split::Heldout).unwrap();
        assert_eq!(
            (first_heldout.pattern, first_heldout.link_mbit),
            HELDOUT_ONLY
        );
        assert!(first_heldout.rel_dir().starts_with("heldout/"));
    }

    #[test]
    fn a_small_corpus_has_one_heldout_run() {
        assert_eq!(heldout_count(1), 1);
        assert_eq!(heldout_count(2), 1);
        assert_eq!(heldout_count(3), 1);
        assert_eq!(heldout_count(15), 5);
        assert_eq!(plan(2, 1, &RANKS).len(), 3);
    }

    fn settings() -> Settings {
        Settings {
            seed: 1,
            duration_s: 25.0,
            kinds: Kind::ALL.to_vec(),
            congestion: "cubic".into(),
            sample_ms: 500,
            calm_s: Some((45.0, 150.0)),
            gradual_weight: 2,
            probe_per_rank: false,
        }
    }

    /// A corpus of one probe per rank has the job view's 4 and 8 ranks, each where it fits;
    /// its settings say so, and a corpus of one probe keeps the settings it always had.
    #[test]
    fn a_per_rank_corpus_has_4_and_8_ranks() {
        let p = plan(24, 1, &RANKS_PER_RANK);
        let ranks: HashSet<u16> = p.iter().map(|r| r.ranks).collect();
        assert_eq!(ranks, HashSet::from([4, 8]));
        assert!(p
            .iter()
            .all(|r| u32::from(r.ranks) * r.link_mbit <= MAX_RANK_MBIT));
        let one = serde_json::to_value(settings()).unwrap();
        assert!(one.get("probe_per_rank").is_none(), "{one}");
        let per_rank = Settings {
            probe_per_rank: true,
            ..settings()
        };
        assert_eq!(
            serde_json::to_value(per_rank).unwrap()["probe_per_rank"],
            true
        );
    }

    #[test]
    fn resume_skips_recorded_runs_only() {
        let dir = std::env::temp_dir().join(format!("corpus-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let s = settings();
        let mut entries = resume(&dir, &s, plan(2, 1, &RANKS), None).unwrap();
        assert!(entries.iter().all(|e| e.status == Status::Pending));
        // Run 0 recorded, run 1 failed, run 2 said ok but its recording is gone.
        entries[0].status = Status::Ok;
        entries[1].status = Status::Failed;
        entries[2].status = Status::Ok;
        fs::create_dir_all(dir.join(&entries[0].dir)).unwrap();
        fs::write(dir.join(&entries[0].dir).join(RECORDING), b"x").unwrap();
        write_doc(&dir, &s, &entries).unwrap();
        let again = resume(&dir, &s, plan(2, 1, &RANKS), None).unwrap();
        let st: Vec<Status> = again.iter().map(|e| e.status).collect();
        assert_eq!(st, [Status::Ok, Status::Pending, Status::Pending]);
        // Other settings: refused, not mixed.
        let other = Settings {
            duration_s: 60.0,
            ..settings()
        };
        let err = resume(&dir, &other, plan(2, 1, &RANKS), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("other settings"), "{err}");
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join(CORPUS_FILE)).unwrap()).unwrap();
        assert_eq!(doc["runs"][0]["split"], "train");
        assert_eq!(doc["runs"][2]["split"], "heldout");
        assert_eq!(doc["runs"][1]["status"], "failed");
        // A run packed elsewhere (the repository's corpus) counts as recorded.
        let packed = dir.join("packed");
        fs::create_dir_all(packed.join(&entries[1].dir)).unwrap();
        fs::write(packed.join(&entries[1].dir).join(PACKED[0]), b"x").unwrap();
        let again = resume(&dir, &s, plan(2, 1, &RANKS), Some(&packed)).unwrap();
        let st: Vec<Status> = again.iter().map(|e| e.status).collect();
        assert_eq!(st, [Status::Ok, Status::Ok, Status::Pending]);
        // So does a job corpus run packed as busy spans.
        fs::create_dir_all(packed.join(&entries[2].dir)).unwrap();
        fs::write(packed.join(&entries[2].dir).join(PACKED[1]), b"x").unwrap();
        let again = resume(&dir, &s, plan(2, 1, &RANKS), Some(&packed)).unwrap();
        assert!(again.iter().all(|e| e.status == Status::Ok));
        assert_eq!(doc["heldout_only"]["pattern"], "ps");
        let _ = fs::remove_dir_all(&dir);
    }
}
