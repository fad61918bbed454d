//! `probe features`: replays recordings through the daemon's own feature engine, tick by
//! tick with the same observations and burst events it saw, adds the training labels, and
//! writes one wide Parquet table (a row per entity per tick) for `probe train` or
//! pandas/polars. Each recording starts from fresh state, as the daemon did. A recording
//! without its burst events but with stored features beside it (a compact run, `store`)
//! takes its features from those.
pub mod job;
pub mod labels;
pub mod spec;
pub mod store;
pub mod table;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::{
    features::{schema, Engine, FeatureConfig, FeatureRow},
    observe::{BurstEvent, Observation, TickBursts, ENTITY_KINDS},
    record::{
        columns::{Cell, ColumnDef, Table, Type},
        events_path, reader,
        writer::RecordingWriter,
    },
};
use labels::LabelConfig;

#[derive(clap::Args, Debug, Clone)]
pub struct FeaturesArgs {
    /// Recordings made by `probe record` (their burst events are read from beside each).
    #[arg(long, value_name = "REC", num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,

    /// The Parquet file to write (optional with --compact).
    #[arg(
        long,
        short = 'o',
        value_name = "FILE",
        required_unless_present = "compact"
    )]
    pub out: Option<PathBuf>,

    /// Feature windows; must be the daemon's (`[features] windows`) for identical values.
    #[arg(long, value_name = "DURATIONS", value_delimiter = ',',
          value_parser = crate::duration::parse_duration, default_values = ["5s", "30s", "120s"])]
    pub windows: Vec<Duration>,

    /// Label horizons.
    #[arg(long, value_name = "DURATIONS", value_delimiter = ',',
          value_parser = crate::duration::parse_duration, default_values = ["5s", "15s", "30s"])]
    pub horizons: Vec<Duration>,

    /// An RTT spike is the RTT p99 at least this many times its calm level (and a
    /// retransmit storm the same of retransmits)...
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    pub spike_factor: f64,

    /// ...and at least this much above it.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration, default_value = "1ms")]
    pub rtt_margin: Duration,

    /// Calm time an onset needs before it; rows this long after an event are masked.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration, default_value = "30s")]
    pub quiet: Duration,

    /// History the calm level needs before events are called.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration, default_value = "60s")]
    pub calm_min: Duration,

    /// Keep only the peers whose address starts with one of these prefixes (e.g. the lab's
    /// `10.232.`); other entity kinds are all kept. Features are computed over every peer
    /// first, as the daemon did, so cross-peer features stay the same.
    #[arg(long, value_name = "PREFIX", value_delimiter = ',')]
    pub peers: Vec<String>,

    /// Keep only the rows of these entity kinds (e.g. `peer,interface`, the kinds the
    /// spike model learns on); default all. Features are computed over every entity first.
    #[arg(long, value_name = "KINDS", value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(ENTITY_KINDS))]
    pub kinds: Vec<String>,

    /// Also write a compact copy of each recording, for a repository: its features (f32,
    /// 14 mantissa bits, no labels) and the observations of the rows kept (see --peers),
    /// in DIR/NAME/recording.features.parquet and DIR/NAME/recording.parquet (NAME: the
    /// lab run's directory name, or the file's stem), and the lab's job log, ground truth
    /// and lab.json beside them. `--data DIR/NAME/recording.parquet` reads it back.
    #[arg(long, value_name = "DIR")]
    pub compact: Option<PathBuf>,

    /// With --compact: keep each recording as a job corpus run does, its peers' busy spans
    /// (DIR/NAME/recording.spans.parquet, docs/recording.md) instead of its features, so
    /// that features can be computed from it again. Writes no features (no --out).
    #[arg(long, requires = "compact", conflicts_with = "out")]
    pub spans: bool,

    /// Each --data is a per-rank lab run (its directory, or its recording.parquet): write
    /// the job rows of every rank (the host's view of its training job, the early
    /// warning's features) with the job's slowdown and culprit labels (docs/job.md).
    #[arg(long, conflicts_with_all = ["compact", "peers", "kinds"], requires = "out")]
    pub job: bool,

    /// Overwrite FILE (and the files of --compact) if they exist.
    #[arg(long)]
    pub force: bool,
}

/// One output row: the key columns, then features (every kind's names, one column each),
/// then labels. NaN is written as null.
struct Row {
    recording: String,
    time_unix: f64,
    entity_kind: &'static str,
    entity: String,
    values: Vec<f64>,
}

const KEYS: [(&str, Type); 4] = [
    ("recording", Type::Str),
    ("time_unix", Type::F64),
    ("entity_kind", Type::Str),
    ("entity", Type::Str),
];

fn cell(r: &Row, i: usize) -> Cell<'_> {
    match i {
        0 => Cell::Str(&r.recording),
        1 => Cell::F64(Some(r.time_unix)),
        2 => Cell::Str(r.entity_kind),
        3 => Cell::Str(&r.entity),
        _ => Cell::F64(Some(r.values[i - KEYS.len()]).filter(|v| v.is_finite())),
    }
}

/// The output's numeric columns: every kind's features (first seen order), then labels.
fn columns(fcfg: &FeatureConfig, lcfg: &LabelConfig) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for kind in ENTITY_KINDS {
        for d in schema::docs(kind, fcfg) {
            if seen.insert(d.name.clone()) {
                names.push(d.name);
            }
        }
    }
    names.extend(labels::names(lcfg));
    names
}

fn table(numeric: &[String]) -> Table<Row> {
    let mut cols: Vec<ColumnDef> = KEYS
        .iter()
        .map(|(n, ty)| ColumnDef::new(*n, *ty, true))
        .collect();
    cols.extend(
        numeric
            .iter()
            .map(|n| ColumnDef::new(n.clone(), Type::F64, false)),
    );
    Table {
        message: "probe_features",
        columns: cols,
        cell,
    }
}

/// The tick the daemon ran at for the recording at `path`: as the recorder stored it, or
/// for a recording from before it did, [`tick_of`] its observations.
pub fn recording_tick(path: &Path, obs: &[Observation]) -> Duration {
    reader::metadata(path)
        .ok()
        .and_then(|kv| {
            let (_, v) = kv.into_iter().find(|(k, _)| k == crate::record::TICK_KEY)?;
            Duration::try_from_secs_f64(v.parse().ok()?).ok()
        })
        .filter(|t| !t.is_zero())
        .unwrap_or_else(|| tick_of(obs))
}

/// The recording's tick: the median observation interval, to the millisecond.
pub fn tick_of(obs: &[Observation]) -> Duration {
    let mut v: Vec<f64> = obs
        .iter()
        .map(|o| o.interval_s)
        .filter(|v| *v > 0.0)
        .collect();
    if v.is_empty() {
        return Duration::from_secs(1);
    }
    v.sort_by(f64::total_cmp);
    Duration::from_millis((v[v.len() / 2] * 1000.0).round().max(1.0) as u64)
}

/// Features of every tick of one recording: the daemon's feature stage, replayed. The
/// recorder writes a tick's observations and its burst events together, tick after tick,
/// so both files are in tick order and each tick is a slice of each.
pub fn replay(obs: &[Observation], events: &[BurstEvent], cfg: FeatureConfig) -> Vec<FeatureRow> {
    let mut engine = Engine::new(cfg);
    let mut out = Vec::new();
    let (mut i, mut e) = (0, 0);
    while i < obs.len() {
        let t = obs[i].time_unix;
        let j = i + obs[i..].iter().take_while(|o| o.time_unix == t).count();
        e += events[e..].iter().take_while(|ev| ev.tick_unix < t).count();
        let f = e + events[e..]
            .iter()
            .take_while(|ev| ev.tick_unix == t)
            .count();
        let bursts = TickBursts::from_events(&events[e..f]);
        out.extend(engine.tick(t, &obs[i..j], &bursts));
        (i, e) = (j, f);
    }
    out
}

/// The training job's iteration log beside a recording, if there is one: a lab run's
/// `rank0.jsonl` (every rank of a synchronous job keeps the same pace).
pub const JOB_LOG: &str = "rank0.jsonl";

fn job_log(recording: &Path) -> Result<Option<labels::JobLog>> {
    let Some(p) = recording.parent().map(|d| d.join(JOB_LOG)) else {
        return Ok(None);
    };
    match std::fs::read_to_string(&p) {
        Ok(text) => Ok(Some(labels::JobLog::parse(&text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

fn recording_name(p: &Path) -> String {
    let n = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = n.strip_suffix(".parquet").unwrap_or(&n);
    // lab recordings are DIR/recording.parquet: the directory names the run.
    if n == "recording" {
        if let Some(dir) = p.parent().and_then(Path::file_name) {
            return dir.to_string_lossy().into_owned();
        }
    }
    n.to_owned()
}

/// The rows `probe features` keeps (`--kinds`, `--peers`).
#[derive(Debug, Clone, Default)]
pub struct Keep {
    /// Entity kinds kept; all if empty.
    pub kinds: Vec<String>,
    /// Address prefixes of the peers kept; all if empty.
    pub peers: Vec<String>,
}

impl Keep {
    /// Whether the rows of an entity are kept: its kind is, and a peer's address starts
    /// with a prefix.
    fn keeps(&self, kind: &str, entity: &str) -> bool {
        (self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind))
            && (kind != crate::observe::PEER
                || self.peers.is_empty()
                || self.peers.iter().any(|p| entity.starts_with(p.as_str())))
    }
}

/// Where a recording's features came from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// Replayed from its observations and burst events.
    Replayed,
    /// Replayed from its observations alone: the burst events are missing.
    NoEvents,
    /// Taken from the stored features beside it (a compact run).
    Stored(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Replayed => write!(
                f,
                "features replayed from the observations and burst events"
            ),
            Source::NoEvents => write!(f, "features replayed without burst events"),
            Source::Stored(p) => write!(f, "features stored in {}", p.display()),
        }
    }
}

/// One recording, featurized.
struct Featurized {
    /// The recording's name (`recording` column).
    name: String,
    /// Features and labels of the rows kept.
    rows: Vec<Row>,
    /// Every observation of the recording.
    obs: Vec<Observation>,
    /// The tick the features were computed at.
    tick: Duration,
    source: Source,
}

/// The rows of one recording: features and labels. The features are replayed from the
/// observations and burst events; without burst events but with stored features beside
/// the recording (a compact run), they are those. `numeric` is the features, then `labels`.
fn featurize(
    path: &Path,
    fcfg: &FeatureConfig,
    lcfg: &LabelConfig,
    numeric: &[String],
    keep: &Keep,
) -> Result<Featurized> {
    let obs: Vec<Observation> = reader::read(path)?;
    if obs.is_empty() {
        bail!("{} holds no observations", path.display());
    }
    if obs.windows(2).any(|w| w[1].time_unix < w[0].time_unix) {
        bail!("{}: observations are not in time order", path.display());
    }
    let name = recording_name(path);
    let index: BTreeMap<&str, usize> = numeric
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let label_names = labels::names(lcfg);
    let label_at: Vec<usize> = label_names.iter().map(|n| index[n.as_str()]).collect();
    let features = &numeric[..numeric.len() - label_names.len()];

    let ev_path = events_path(path);
    let stored = store::features_path(path);
    if !ev_path.exists() && !stored.exists() && store::spans_path(path).exists() {
        bail!(
            "{} is a job corpus run: it keeps busy spans, not the burst events today's burst features are computed from",
            path.display()
        );
    }
    let (mut rows, tick, source) = if !ev_path.exists() && stored.exists() {
        let (rows, tick) = store::read_features(
            path,
            &obs,
            &name,
            &label_list(&fcfg.windows),
            features,
            numeric.len(),
            keep,
        )?;
        (
            rows,
            tick.unwrap_or_else(|| recording_tick(path, &obs)),
            Source::Stored(stored),
        )
    } else {
        let (events, source): (Vec<BurstEvent>, _) = if ev_path.exists() {
            (reader::read(&ev_path)?, Source::Replayed)
        } else {
            tracing::warn!(
                "{} is missing: burst features stay empty",
                ev_path.display()
            );
            (Vec::new(), Source::NoEvents)
        };
        if events.windows(2).any(|w| w[1].tick_unix < w[0].tick_unix) {
            bail!("{}: burst events are not in tick order", ev_path.display());
        }
        let tick = recording_tick(path, &obs);
        let cfg = FeatureConfig {
            tick,
            ..fcfg.clone()
        };
        let rows = replay(&obs, &events, cfg)
            .into_iter()
            .filter(|f| keep.keeps(f.entity_kind, &f.entity))
            .map(|f| {
                let mut values = vec![f64::NAN; numeric.len()];
                for (n, v) in f.schema.names.iter().zip(&f.values) {
                    values[index[n.as_str()]] = *v;
                }
                Row {
                    recording: name.clone(),
                    time_unix: f.time_unix,
                    entity_kind: f.entity_kind,
                    entity: f.entity,
                    values,
                }
            })
            .collect();
        (rows, tick, source)
    };

    add_labels(path, &obs, &mut rows, lcfg, tick, &label_at)?;
    Ok(Featurized {
        name,
        rows,
        obs,
        tick,
        source,
    })
}

/// Labels per entity, over its observations in time order, into the rows' label columns
/// (`label_at`).
fn add_labels(
    path: &Path,
    obs: &[Observation],
    rows: &mut [Row],
    lcfg: &LabelConfig,
    tick: Duration,
    label_at: &[usize],
) -> Result<()> {
    let job = job_log(path)?;
    let mut by_entity: BTreeMap<(&str, &str), Vec<&Observation>> = BTreeMap::new();
    for o in obs {
        by_entity
            .entry((o.entity_kind.as_str(), o.entity.as_str()))
            .or_default()
            .push(o);
    }
    let mut label_rows: BTreeMap<((&str, &str), u64), Vec<f64>> = BTreeMap::new();
    for (key, rows) in &by_entity {
        for (o, l) in rows
            .iter()
            .zip(labels::label(rows, lcfg, tick.as_secs_f64(), job.as_ref()))
        {
            label_rows.insert((*key, o.time_unix.to_bits()), l);
        }
    }
    for r in rows.iter_mut() {
        if let Some(l) =
            label_rows.get(&((r.entity_kind, r.entity.as_str()), r.time_unix.to_bits()))
        {
            for (at, v) in label_at.iter().zip(l) {
                r.values[*at] = *v;
            }
        }
    }
    Ok(())
}

/// The feature and label settings of the command line, checked.
fn configs(args: &FeaturesArgs) -> Result<(FeatureConfig, LabelConfig)> {
    let fcfg = FeatureConfig {
        windows: args.windows.clone(),
        ..FeatureConfig::default()
    };
    fcfg.validate()
        .map_err(|e| anyhow::anyhow!("--windows: {e}"))?;
    if !(args.spike_factor > 1.0 && args.spike_factor.is_finite()) {
        bail!("--spike-factor must be a number above 1 (e.g. 2)");
    }
    let lcfg = LabelConfig {
        horizons: args.horizons.clone(),
        spike_factor: args.spike_factor,
        rtt_margin_s: args.rtt_margin.as_secs_f64(),
        quiet: args.quiet,
        calm_min: args.calm_min,
        ..LabelConfig::default()
    };
    Ok((fcfg, lcfg))
}

pub fn main(args: FeaturesArgs) -> Result<()> {
    if let Some(out) = args.out.as_ref().filter(|o| o.exists() && !args.force) {
        bail!(
            "{} exists; choose another --out or pass --force to overwrite it",
            out.display()
        );
    }
    if args.compact.is_some() {
        let mut seen = std::collections::HashSet::new();
        for p in &args.data {
            if !seen.insert(recording_name(p)) {
                bail!(
                    "two recordings are named {} (their directory or stem): --compact would store both in one place",
                    recording_name(p)
                );
            }
        }
    }
    let (fcfg, lcfg) = configs(&args)?;
    let numeric = columns(&fcfg, &lcfg);
    let keep = Keep {
        kinds: args.kinds.clone(),
        peers: args.peers.clone(),
    };
    let meta = [
        ("probe.features.windows", label_list(&fcfg.windows)),
        ("probe.features.horizons", label_list(&lcfg.horizons)),
        ("probe.features.spike_factor", lcfg.spike_factor.to_string()),
        ("probe.features.rtt_margin_s", lcfg.rtt_margin_s.to_string()),
        (
            "probe.features.quiet_s",
            lcfg.quiet.as_secs_f64().to_string(),
        ),
        (
            "probe.features.calm_min_s",
            lcfg.calm_min.as_secs_f64().to_string(),
        ),
        ("probe.version", env!("CARGO_PKG_VERSION").to_string()),
    ];
    let mut w = match &args.out {
        Some(out) => Some(RecordingWriter::create(out, table(&numeric), &meta)?),
        None => None,
    };
    let features = &numeric[..numeric.len() - labels::names(&lcfg).len()];
    let mut total = 0;
    for path in &args.data {
        if let Some(dir) = &args.compact {
            store::check(dir, &recording_name(path), path, args.force)?;
        }
        if let (Some(dir), true) = (&args.compact, args.spans) {
            let obs: Vec<Observation> = reader::read(path)?;
            let s = store::write_spans(dir, path, &recording_name(path), &obs, &keep)
                .with_context(|| format!("storing {} compactly", path.display()))?;
            let kib = |b: u64| b as f64 / 1024.0;
            eprintln!(
                "features: {} -> {}: recording.parquet {:.1} KiB, recording.spans.parquet {:.1} KiB, {:.1} KiB of lab files",
                path.display(),
                s.dir.display(),
                kib(s.observations),
                kib(s.data),
                kib(s.beside)
            );
            continue;
        }
        let f = featurize(path, &fcfg, &lcfg, &numeric, &keep)
            .with_context(|| format!("featurizing {}", path.display()))?;
        total += f.rows.len();
        eprintln!(
            "features: {} -> {} rows ({})",
            path.display(),
            f.rows.len(),
            f.source
        );
        if let Some(dir) = &args.compact {
            let windows = label_list(&fcfg.windows);
            let s = store::write(dir, path, &f, features, &windows, &keep)
                .with_context(|| format!("storing {} compactly", path.display()))?;
            let kib = |b: u64| b as f64 / 1024.0;
            eprintln!(
                "features: {} -> {}: recording.parquet {:.1} KiB, recording.features.parquet {:.1} KiB, {:.1} KiB of lab files",
                path.display(),
                s.dir.display(),
                kib(s.observations),
                kib(s.data),
                kib(s.beside)
            );
        }
        if let Some(w) = &mut w {
            w.push(f.rows);
            w.flush()?;
        }
    }
    if let (Some(w), Some(out)) = (w, &args.out) {
        w.finish()?;
        eprintln!(
            "features: {total} rows, {} columns -> {}",
            numeric.len() + KEYS.len(),
            out.display()
        );
    }
    Ok(())
}

/// `probe features --job` (per-rank lab runs into a job table).
pub fn job_main(args: FeaturesArgs) -> Result<()> {
    if let Some(out) = args.out.as_ref().filter(|o| o.exists() && !args.force) {
        bail!(
            "{} exists; choose another --out or pass --force to overwrite it",
            out.display()
        );
    }
    let (_, lcfg) = configs(&args)?;
    let out = args
        .out
        .as_deref()
        .context("--job writes a table: give --out")?;
    job::main(&args.data, out, &lcfg.horizons)
}

fn label_list(d: &[Duration]) -> String {
    d.iter()
        .map(|d| schema::label(*d))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_filters_kinds_and_peers() {
        let all = Keep::default();
        assert!(all.keeps("peer", "127.0.0.1") && all.keeps("qdisc", "eth0/tbf/1:"));
        let lab = Keep {
            kinds: vec!["peer".into(), "interface".into()],
            peers: vec!["10.232.".into()],
        };
        assert!(lab.keeps("peer", "10.232.0.2") && lab.keeps("interface", "eth0"));
        assert!(!lab.keeps("peer", "127.0.0.1") && !lab.keeps("qdisc", "eth0/tbf/1:"));
    }
}
