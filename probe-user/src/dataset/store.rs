//! Compact runs: what the spike model's training corpus keeps in the repository instead of
//! the raw recordings. A lab run's burst events are most of its size (13 MB of 1.6 M events
//! for 15 minutes), and only the feature engine reads them; so `probe features --compact
//! OUTDIR` keeps, per recording, its replayed features (no labels) and the observations of
//! the rows it keeps:
//!
//! - `OUTDIR/NAME/recording.features.parquet`: the key columns (`recording`, `time_unix`
//!   exact, `entity_kind`, `entity`) and every feature as FLOAT with its mantissa rounded to
//!   [`MANTISSA_BITS`], BYTE_STREAM_SPLIT, no dictionary, zstd at a high level;
//! - `OUTDIR/NAME/recording.parquet`: the observations of the entities kept (`--peers`),
//!   which the labels are computed from, as from any recording;
//! - the lab's files beside the recording ([`BESIDE`]): the job log that the
//!   `iteration_slowdown` labels come from (each iteration's start and end only, what the
//!   labels read: a quarter of the lab's log), the ground truth and the run's settings.
//!
//! `probe features --data OUTDIR/NAME/recording.parquet` finds no burst events there and
//! takes the stored features instead of replaying; a recording with its burst events is
//! always replayed (the replay is the truth).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use parquet::basic::Encoding;

use super::{table, Featurized, Keep, Row, JOB_LOG, KEYS};
use crate::{
    observe::{spans, BurstEvent, Observation, TickBursts, ENTITY_KINDS, PEER},
    record::{
        columns::{self, Cell, ColumnDef, Table, Type},
        events_path, reader,
        writer::{zstd, RecordingWriter},
    },
};

/// Mantissa bits a stored feature keeps, of an f32's 23. The model bins every feature into
/// at most 63 bins (`max_bin` in train/fit.rs); 14 bits move a value by at most 2^-15
/// (3e-5) of itself, half a step of 6e-5, far inside any bin, and zero the low 9 bits of
/// every value, which BYTE_STREAM_SPLIT then hands to zstd as a stream of zero bytes: the
/// peer and interface features of a 15-minute lab run shrink from 1.7 MB as full f32 to
/// 1.1 MB (zstd 19).
pub const MANTISSA_BITS: u32 = 14;

/// The zstd level of a compact run's files: written once, read often.
const ZSTD_LEVEL: i32 = 19;

/// The lab's files copied beside a compact run's recording, when they are beside the
/// original: the job log (labels), the ground truth and the run's settings.
pub const BESIDE: [&str; 3] = [JOB_LOG, "ground_truth.jsonl", "lab.json"];

/// lab.json without this machine's paths (the binaries the run used): a top-level string
/// that is an absolute path keeps its file name. Anything that is not a JSON object is kept
/// as it is.
fn portable(text: &[u8]) -> Vec<u8> {
    let Ok(serde_json::Value::Object(mut m)) = serde_json::from_slice(text) else {
        return text.to_vec();
    };
    for v in m.values_mut() {
        if let Some(p) = v.as_str().filter(|p| p.starts_with('/')) {
            let name = Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            *v = serde_json::Value::String(name);
        }
    }
    let mut out = serde_json::to_vec_pretty(&m).unwrap_or_else(|_| text.to_vec());
    out.push(b'\n');
    out
}

/// The job log as the labels read it (`labels::JobLog::parse`): each iteration's `t_start`
/// and `t_end`, exact (serde_json writes the shortest decimal that reads back as the same
/// f64), without the lab's other fields; lines without both are left out, as the parser
/// skips them.
fn iteration_times(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4);
    for line in text.split(|&b| b == b'\n') {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        if let (Some(s), Some(e)) = (v["t_start"].as_f64(), v["t_end"].as_f64()) {
            // Spelled out: the same bytes whether or not serde_json keeps key order.
            let num = |x: f64| serde_json::Value::from(x).to_string();
            out.extend_from_slice(
                format!("{{\"t_start\":{},\"t_end\":{}}}\n", num(s), num(e)).as_bytes(),
            );
        }
    }
    out
}

/// A feature value as stored: rounded to [`MANTISSA_BITS`] bits of mantissa, half up (on
/// the magnitude), from the f64 in one step, then made an f32 (exact, the value having so
/// few bits). Null for NaN and infinities, and for values beyond an f32's range (3.4e38,
/// which no feature nears); values below its normal range (1.2e-38) lose bits as f32
/// subnormals do.
pub fn round_feature(v: f64) -> Option<f32> {
    round_observation(v)
        .map(|x| x as f32)
        .filter(|f| f.is_finite())
}

/// Where the stored features of recording `rec` are: `run.parquet` ->
/// `run.features.parquet`.
pub fn features_path(rec: &Path) -> PathBuf {
    crate::record::sibling_path(rec, "features")
}

/// The stored features table: the keys, then the first `features` numeric columns of the
/// output (the features; the labels follow them there and are not stored).
fn stored_table(features: &[String]) -> Table<&Row> {
    let mut cols: Vec<ColumnDef> = KEYS
        .iter()
        .map(|(n, ty)| ColumnDef::new(*n, *ty, true))
        .collect();
    cols.extend(features.iter().map(|n| ColumnDef {
        encoding: Some(Encoding::BYTE_STREAM_SPLIT),
        ..ColumnDef::new(n.clone(), Type::F32, false)
    }));
    Table {
        message: "probe_stored_features",
        columns: cols,
        cell: stored_cell,
    }
}

fn stored_cell<'a>(r: &'a &Row, i: usize) -> Cell<'a> {
    match i {
        0 => Cell::Str(&r.recording),
        1 => Cell::F64(Some(r.time_unix)),
        2 => Cell::Str(r.entity_kind),
        3 => Cell::Str(&r.entity),
        _ => Cell::F32(round_feature(r.values[i - KEYS.len()])),
    }
}

/// The features of recording `path` stored beside it (`path` has no burst events), as
/// rows of the output with the features filled in (`numeric` long, the first
/// `features.len()` of them the features), for the entities `peers` keeps, in the order a
/// replay gives them (tick by tick, in the order of the tick's observations `obs`), and the
/// tick the replay ran at.
pub(super) fn read_features(
    path: &Path,
    obs: &[Observation],
    name: &str,
    windows: &str,
    features: &[String],
    numeric: usize,
    keep: &Keep,
) -> Result<(Vec<Row>, Option<Duration>)> {
    let stored = features_path(path);
    let what = stored.display();
    let t = table::read(&stored)?;
    match t.meta.get("probe.features.windows") {
        Some(w) if w == windows => {}
        Some(w) => bail!(
            "{what} holds the features of windows {w}: pass `--windows {w}` (features of other windows need the raw recording)"
        ),
        None => bail!("{what} lacks its probe.features.windows metadata (not made by `probe features --compact`?)"),
    }
    let mut missing = Vec::new();
    let at: Vec<(usize, usize)> = features
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match t.col(n) {
            Some(c) => Some((i, c)),
            None => {
                missing.push(n.as_str());
                None
            }
        })
        .collect();
    if !missing.is_empty() {
        bail!(
            "{what} lacks {} of today's features ({}{}): it was stored by an older probe; store it again from the raw recording",
            missing.len(),
            missing[..missing.len().min(5)].join(", "),
            if missing.len() > 5 { ", ..." } else { "" }
        );
    }
    let tick = t
        .meta
        .get("probe.features.tick_ms")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    // The file holds an entity's rows together (they compress better than a tick's); a
    // replay gives a tick's rows together, in the order of its observations.
    let at_obs: HashMap<(u64, &str, &str), usize> = obs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let key = (
                o.time_unix.to_bits(),
                o.entity_kind.as_str(),
                o.entity.as_str(),
            );
            (key, i)
        })
        .collect();
    let mut rows = Vec::with_capacity(t.len());
    for r in 0..t.len() {
        let kind = t.entity_kind[r].as_str();
        let Some(kind) = ENTITY_KINDS.iter().copied().find(|k| *k == kind) else {
            bail!("{what}: unknown entity kind {kind:?}");
        };
        if !keep.keeps(kind, &t.entity[r]) {
            continue;
        }
        let key = (t.time_unix[r].to_bits(), kind, t.entity[r].as_str());
        let Some(&order) = at_obs.get(&key) else {
            bail!(
                "{what} holds a row of {kind} {} at {} that {} has no observation of: they are not one compact run",
                t.entity[r],
                t.time_unix[r],
                path.display()
            );
        };
        let mut values = vec![f64::NAN; numeric];
        for &(i, c) in &at {
            values[i] = t.columns[c][r];
        }
        let row = Row {
            recording: name.to_owned(),
            time_unix: t.time_unix[r],
            entity_kind: kind,
            entity: t.entity[r].clone(),
            values,
        };
        rows.push((order, row));
    }
    rows.sort_by_key(|(order, _)| *order);
    Ok((rows.into_iter().map(|(_, r)| r).collect(), tick))
}

/// The recording a compact copy of `path` goes to.
pub(super) fn compact_path(outdir: &Path, name: &str) -> PathBuf {
    outdir.join(name).join("recording.parquet")
}

/// Refuses to overwrite the compact copy of `path` unless `force`, and ever to overwrite
/// `path` itself or to leave burst events beside the copy.
pub(super) fn check(outdir: &Path, name: &str, path: &Path, force: bool) -> Result<()> {
    let dst = compact_path(outdir, name);
    if let (Ok(a), Ok(b)) = (dst.canonicalize(), path.canonicalize()) {
        if a == b {
            bail!(
                "{} would overwrite the recording itself: choose another --compact directory",
                dst.display()
            );
        }
    }
    let ev = events_path(&dst);
    if ev.exists() {
        bail!(
            "{} exists: a compact run has no burst events (they would be replayed against its fewer observations); remove it",
            ev.display()
        );
    }
    if force {
        return Ok(());
    }
    let dir = dst.parent().unwrap_or(outdir);
    for p in [dst.clone(), features_path(&dst), spans_path(&dst)]
        .into_iter()
        .chain(BESIDE.iter().map(|f| dir.join(f)))
    {
        if p.exists() {
            bail!(
                "{} exists; choose another --compact directory or pass --force to overwrite it",
                p.display()
            );
        }
    }
    Ok(())
}

/// Sizes of a compact run's files, for the log line.
pub(super) struct Written {
    pub dir: PathBuf,
    pub observations: u64,
    /// The features file, or the spans file of a job corpus run.
    pub data: u64,
    pub beside: u64,
}

/// Writes the compact copy of recording `path` (featurized as `f`) under `outdir`.
pub(super) fn write(
    outdir: &Path,
    path: &Path,
    f: &Featurized,
    features: &[String],
    windows: &str,
    keep: &Keep,
) -> Result<Written> {
    let dst = compact_path(outdir, &f.name);
    let dir = dst.parent().unwrap_or(outdir).to_path_buf();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let compression = zstd(ZSTD_LEVEL)?;
    let peers_meta = ("probe.compact.peers".to_string(), keep.peers.join(","));
    let kinds_meta = ("probe.compact.kinds".to_string(), keep.kinds.join(","));

    // The observations of the rows kept, with the recording's own metadata.
    let mut meta = recording_meta(path)?;
    meta.push(peers_meta.clone());
    meta.push(kinds_meta.clone());
    let meta: Vec<(&str, String)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let mut w = RecordingWriter::create_with(&dst, columns::observations(), &meta, compression)?;
    w.push(
        f.obs
            .iter()
            .filter(|o| keep.keeps(&o.entity_kind, &o.entity))
            .cloned(),
    );
    w.finish()
        .with_context(|| format!("writing {}", dst.display()))?;

    let fpath = features_path(&dst);
    let meta = [
        ("probe.features.windows", windows.to_owned()),
        ("probe.features.tick_ms", f.tick.as_millis().to_string()),
        ("probe.features.mantissa_bits", MANTISSA_BITS.to_string()),
        (peers_meta.0.as_str(), peers_meta.1.clone()),
        (kinds_meta.0.as_str(), kinds_meta.1.clone()),
        ("probe.version", env!("CARGO_PKG_VERSION").to_string()),
    ];
    // An entity's rows together, in time order: its series vary smoothly from row to row,
    // which compresses 12% better than a tick's rows of many entities together.
    let kind_at = |k: &str| ENTITY_KINDS.iter().position(|x| *x == k);
    let mut rows: Vec<&Row> = f.rows.iter().collect();
    rows.sort_by(|a, b| {
        (kind_at(a.entity_kind), &a.entity)
            .cmp(&(kind_at(b.entity_kind), &b.entity))
            .then(a.time_unix.total_cmp(&b.time_unix))
    });
    let mut w = RecordingWriter::create_with(&fpath, stored_table(features), &meta, compression)?;
    w.push(rows);
    w.finish()
        .with_context(|| format!("writing {}", fpath.display()))?;

    let beside = copy_beside(path, &dir)?;
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    Ok(Written {
        observations: size(&dst),
        data: size(&fpath),
        beside,
        dir,
    })
}

/// Copies the lab's files from beside recording `path` into `dir` ([`BESIDE`], made
/// portable and reduced), returning their bytes.
fn copy_beside(path: &Path, dir: &Path) -> Result<u64> {
    let mut beside = 0;
    if let Some(src) = path.parent() {
        for name in BESIDE {
            let from = src.join(name);
            if !from.exists() {
                continue;
            }
            let mut text =
                std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
            if name == "lab.json" {
                text = portable(&text);
            } else if name == JOB_LOG {
                text = iteration_times(&text);
            }
            std::fs::write(dir.join(name), &text)
                .with_context(|| format!("writing {}", dir.join(name).display()))?;
            beside += text.len() as u64;
        }
    }
    Ok(beside)
}

/// Writes the compact copy of recording `path` as a job corpus run keeps it under `outdir`:
/// the observations of the rows `keep` keeps, the busy spans of its peers that `keep` keeps
/// (from every event of each tick, as the merge reads them) and the lab's files. No
/// features: they are computed again from the spans.
pub(super) fn write_spans(
    outdir: &Path,
    path: &Path,
    name: &str,
    obs: &[Observation],
    keep: &Keep,
) -> Result<Written> {
    let dst = compact_path(outdir, name);
    let dir = dst.parent().unwrap_or(outdir).to_path_buf();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let compression = zstd(ZSTD_LEVEL)?;
    let ev_path = events_path(path);
    let events: Vec<BurstEvent> = if ev_path.exists() {
        reader::read(&ev_path)?
    } else {
        bail!(
            "{} is missing: a job corpus run keeps the busy spans of the burst events",
            ev_path.display()
        );
    };
    if events.windows(2).any(|w| w[1].tick_unix < w[0].tick_unix) {
        bail!("{}: burst events are not in tick order", ev_path.display());
    }
    let mut spans = Vec::new();
    for tick in events.chunk_by(|a, b| a.tick_unix == b.tick_unix) {
        spans.extend(
            spans::spans(&TickBursts::from_events(tick))
                .into_iter()
                .filter(|s| keep.keeps(PEER, &s.peer)),
        );
    }

    let mut meta = recording_meta(path)?;
    meta.push(("probe.compact.peers".to_string(), keep.peers.join(",")));
    meta.push(("probe.compact.kinds".to_string(), keep.kinds.join(",")));
    let meta: Vec<(&str, String)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let mut w = RecordingWriter::create_with(&dst, rounded_observations(), &meta, compression)?;
    w.push(
        obs.iter()
            .filter(|o| keep.keeps(&o.entity_kind, &o.entity))
            .cloned(),
    );
    w.finish()
        .with_context(|| format!("writing {}", dst.display()))?;

    let spath = spans_path(&dst);
    let smeta = [
        ("probe.spans.merge_gap_us", spans::MERGE_GAP_US.to_string()),
        ("probe.version", env!("CARGO_PKG_VERSION").to_string()),
    ];
    let compression = zstd(ZSTD_LEVEL)?;
    let mut w = RecordingWriter::create_with(&spath, columns::spans(), &smeta, compression)?;
    w.push(spans);
    w.finish()
        .with_context(|| format!("writing {}", spath.display()))?;
    let beside = copy_beside(path, &dir)?;
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    Ok(Written {
        observations: size(&dst),
        data: size(&spath),
        beside,
        dir,
    })
}

/// The observations table as a job corpus run stores it: every measured value (the
/// doubles after the two keys, `time_unix` and `interval_s`, which stay exact) rounded to
/// [`MANTISSA_BITS`] bits of mantissa as stored features are, BYTE_STREAM_SPLIT. A
/// rate such as `tx_bytes_per_s` is a counter's delta over the interval, all 52 bits busy:
/// rounded, a 15-minute rank's peer, interface and host rows shrink to about half.
fn rounded_observations() -> Table<Observation> {
    let mut t = columns::observations();
    for c in t.columns.iter_mut().skip(2) {
        if c.ty == Type::F64 {
            c.encoding = Some(Encoding::BYTE_STREAM_SPLIT);
        }
    }
    t.cell = |r, i| match (columns::COLUMNS[i].get)(r) {
        Cell::F64(v) if i >= 2 => Cell::F64(v.and_then(round_observation)),
        c => c,
    };
    t
}

/// An observed value as a job corpus run stores it: rounded to [`MANTISSA_BITS`] bits of
/// mantissa, half up (on the magnitude), kept a double (its low bits zero cost nothing
/// once split into byte streams); null for NaN and infinities. [`round_feature`] is this,
/// made an f32.
pub fn round_observation(v: f64) -> Option<f64> {
    if !v.is_finite() {
        return None;
    }
    const DROP: u32 = f64::MANTISSA_DIGITS - 1 - MANTISSA_BITS;
    let bits = (v.to_bits() + (1 << (DROP - 1))) & !((1u64 << DROP) - 1);
    Some(f64::from_bits(bits)).filter(|x| x.is_finite())
}

/// The busy spans of compact run `rec`: `run.parquet` -> `run.spans.parquet`.
pub fn spans_path(rec: &Path) -> PathBuf {
    crate::record::sibling_path(rec, "spans")
}

/// The key-value metadata of the recording at `path`.
fn recording_meta(path: &Path) -> Result<Vec<(String, String)>> {
    use parquet::file::reader::{FileReader as _, SerializedFileReader};
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let r = SerializedFileReader::new(file)
        .with_context(|| format!("{} is not a Parquet file", path.display()))?;
    Ok(r.metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter(|k| !k.key.starts_with("probe.compact."))
                .filter_map(|k| Some((k.key.clone(), k.value.clone()?)))
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        dataset::{labels, labels::LabelConfig, table::FeatureTable, FeaturesArgs},
        observe::{BurstEvent, HOST, INTERFACE, PEER, QDISC},
        record::columns::{burst_events, observations},
    };
    use clap::Parser as _;
    use parquet::{
        basic::Type as Physical,
        file::reader::{FileReader as _, SerializedFileReader},
    };

    #[test]
    fn a_stored_value_keeps_14_bits_of_mantissa_rounded_half_up() {
        let r = |v: f64| round_feature(v).map(f64::from);
        assert_eq!(r(1.0), Some(1.0));
        assert_eq!(r(-1.5), Some(-1.5));
        assert_eq!(r(0.0), Some(0.0));
        let step = 2f64.powi(-14);
        assert_eq!(r(1.0 + step), Some(1.0 + step), "14 bits are kept");
        assert_eq!(r(1.0 + step / 2.0), Some(1.0 + step), "a tie rounds up");
        assert_eq!(r(-1.0 - step / 2.0), Some(-1.0 - step), "on the magnitude");
        assert_eq!(r(1.0 + step / 2.0 - 1e-12), Some(1.0));
        assert_eq!(
            r(2.0 - step / 4.0),
            Some(2.0),
            "a carry reaches the exponent"
        );
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e39, -1e39] {
            assert_eq!(round_feature(v), None, "{v}");
        }
        let mut x = 0.1234567f64;
        for _ in 0..10_000 {
            x = (x * 7919.0 + 0.377).fract() * 10f64.powi((x * 1e6) as i32 % 30 - 15);
            let s = round_feature(x).unwrap();
            assert!(
                (f64::from(s) - x).abs() <= x.abs() * 2f64.powi(-15),
                "{x} -> {s}"
            );
            assert_eq!(s.to_bits() & 0x1ff, 0, "the low 9 bits are zero");
            assert_eq!(round_feature(f64::from(s)), Some(s), "idempotent");
        }
    }

    #[test]
    fn features_path_is_beside_the_recording() {
        assert_eq!(
            features_path(Path::new("d/recording.parquet")),
            Path::new("d/recording.features.parquet")
        );
        assert_eq!(
            features_path(Path::new("run1.parquet")),
            Path::new("run1.features.parquet")
        );
    }

    const T0: f64 = 1_800_000_000.0;
    const TICKS: usize = 200;
    const PEERS: [&str; 3] = ["10.232.0.2", "10.232.0.3", "127.0.0.1"];

    /// A 200-tick lab run in `dir`: three peers (one outside the lab's prefix) sending bursts
    /// every 250 ms, an RTT spike on one of them, an interface, a qdisc, the host, and a job
    /// log whose iterations slow down for a while.
    fn lab_run(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let rec = dir.join("recording.parquet");
        let meta = [("probe.recording.schema", "1".to_string())];
        let mut obs = RecordingWriter::create(&rec, observations(), &meta).unwrap();
        let mut ev = RecordingWriter::create(&events_path(&rec), burst_events(), &meta).unwrap();
        let wiggle = |i: usize, k: usize| 1.0 + 0.37 * ((i * 7 + k * 13) as f64 * 0.61).sin();
        for i in 0..TICKS {
            let t = T0 + i as f64;
            let mut rows = Vec::new();
            for (k, p) in PEERS.iter().enumerate() {
                let spike = k == 0 && (120..135).contains(&i);
                let rtt = if spike { 0.012 } else { 0.002 } * wiggle(i, k);
                rows.push(Observation {
                    time_unix: t,
                    interval_s: 1.0,
                    entity_kind: PEER.into(),
                    entity: (*p).into(),
                    tx_bytes_per_s: Some(1.234e8 * wiggle(i, k + 3)),
                    rx_bytes_per_s: Some(3.21e6 * wiggle(i, k + 5)),
                    srtt_s: Some(rtt * 0.8),
                    rtt_samples: Some(400 + i as i64),
                    rtt_mean_s: Some(rtt * 0.7),
                    rtt_p50_s: Some(rtt * 0.6),
                    rtt_p90_s: Some(rtt * 0.9),
                    rtt_p99_s: Some(rtt),
                    retransmits_per_s: Some(if i % 17 == 0 { 3.0 } else { 0.0 }),
                    connections: Some(2),
                    bursts: Some(4),
                    burst_bytes: Some(4 << 20),
                    burst_seconds: Some(0.2 * wiggle(i, k)),
                    ..Observation::default()
                });
                let events: Vec<BurstEvent> = (0..4)
                    .map(|b| BurstEvent {
                        iface: "eth0".into(),
                        direction: "egress".into(),
                        peer: (*p).into(),
                        start_unix: t - 1.0 + 0.25 * b as f64 + 0.01 * k as f64,
                        duration_s: 0.05 * wiggle(i, b),
                        bytes: 1 << 20,
                        packets: 700,
                        tick_unix: t,
                    })
                    .collect();
                ev.push(events);
            }
            rows.push(Observation {
                time_unix: t,
                interval_s: 1.0,
                entity_kind: INTERFACE.into(),
                entity: "eth0".into(),
                tx_bytes_per_s: Some(2.5e8 * wiggle(i, 9)),
                rx_bytes_per_s: Some(1e7 * wiggle(i, 10)),
                sojourn_samples: Some(1000),
                sojourn_p50_s: Some(0.001 * wiggle(i, 11)),
                sojourn_p99_s: Some(if (60..70).contains(&i) { 0.05 } else { 0.004 }),
                ..Observation::default()
            });
            rows.push(Observation {
                time_unix: t,
                interval_s: 1.0,
                entity_kind: QDISC.into(),
                entity: "eth0/tbf/8001:".into(),
                qdisc_backlog_bytes: Some(10_000 + 37 * i as i64),
                qdisc_drops_per_s: Some(if i % 29 == 0 { 2.0 } else { 0.0 }),
                ..Observation::default()
            });
            rows.push(Observation {
                time_unix: t,
                interval_s: 1.0,
                entity_kind: HOST.into(),
                entity: "host".into(),
                tx_bytes_per_s: Some(2.5e8 * wiggle(i, 9)),
                flows_tracked: Some(12),
                ..Observation::default()
            });
            obs.push(rows);
            if i % 60 == 59 {
                obs.flush().unwrap();
                ev.flush().unwrap();
            }
        }
        obs.finish().unwrap();
        ev.finish().unwrap();
        let mut log = String::new();
        let mut t = T0 - 10.0;
        while t < T0 + TICKS as f64 {
            let d = if (T0 + 90.0..T0 + 110.0).contains(&t) {
                0.5
            } else {
                0.25
            };
            // The lab's other fields, which the compact run leaves out.
            log.push_str(&format!(
                "{{\"iter\":{},\"rank\":0,\"comm_s\":{d},\"t_start\":{t},\"t_end\":{}}}\n",
                (t / d) as u64,
                t + d
            ));
            t += d;
        }
        std::fs::write(dir.join(JOB_LOG), log).unwrap();
        std::fs::write(
            dir.join("lab.json"),
            r#"{"seed": 1, "probe": "/somewhere/target/release/probe"}"#,
        )
        .unwrap();
        rec
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: FeaturesArgs,
    }

    fn features(args: &[&Path]) -> Result<()> {
        let mut argv = vec!["probe".to_string()];
        argv.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
        super::super::main(Cli::try_parse_from(argv)?.args)
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn same_bits(a: f64, b: f64) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// A job corpus run (`--compact --spans`): the kept rows' observations with every
    /// measured value rounded and the keys exact, the kept peers' busy spans equal to the
    /// merge of each tick's events, no features; `probe features` refuses to read it.
    #[test]
    fn a_job_corpus_run_keeps_rounded_observations_and_the_spans_of_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let raw = lab_run(&d.join("raw/run7"));
        let compact = d.join("compact");
        features(&[
            p("--data"),
            &raw,
            p("--compact"),
            &compact,
            p("--spans"),
            p("--peers"),
            p("10.232."),
            p("--kinds"),
            p("peer,interface,host"),
        ])
        .unwrap();
        let run = compact.join("run7");
        assert!(run.join("recording.spans.parquet").exists());
        assert!(!run.join("recording.features.parquet").exists());
        assert!(run.join(JOB_LOG).exists());

        let all: Vec<Observation> = reader::read(&raw).unwrap();
        let kept: Vec<Observation> = reader::read(&run.join("recording.parquet")).unwrap();
        let want: Vec<&Observation> = all
            .iter()
            .filter(|o| o.entity_kind != QDISC && o.entity != "127.0.0.1")
            .collect();
        assert_eq!(kept.len(), want.len());
        assert_eq!(kept.len(), TICKS * 4, "two peers, the interface, the host");
        let mut rounded = 0;
        for (k, o) in kept.iter().zip(&want) {
            assert_eq!(k.time_unix.to_bits(), o.time_unix.to_bits());
            assert_eq!(k.interval_s.to_bits(), o.interval_s.to_bits());
            assert_eq!((&k.entity_kind, &k.entity), (&o.entity_kind, &o.entity));
            assert_eq!(k.rtt_samples, o.rtt_samples, "integers stay exact");
            let r = |v: Option<f64>| v.and_then(round_observation);
            assert_eq!(k.tx_bytes_per_s, r(o.tx_bytes_per_s));
            assert_eq!(k.srtt_s, r(o.srtt_s));
            assert_eq!(k.sojourn_p99_s, r(o.sojourn_p99_s));
            rounded += usize::from(k.tx_bytes_per_s != o.tx_bytes_per_s);
        }
        assert!(rounded > 100, "{rounded} values moved by the rounding");

        let events: Vec<BurstEvent> = reader::read(&events_path(&raw)).unwrap();
        let mut expected = Vec::new();
        for tick in events.chunk_by(|a, b| a.tick_unix == b.tick_unix) {
            expected.extend(
                spans::spans(&TickBursts::from_events(tick))
                    .into_iter()
                    .filter(|s| s.peer.starts_with("10.232.")),
            );
        }
        let stored: Vec<spans::Span> =
            reader::read(&spans_path(&run.join("recording.parquet"))).unwrap();
        assert_eq!(stored, expected);
        assert_eq!(
            stored.len(),
            TICKS * 2 * 4,
            "4 bursts 250 ms apart, 2 peers kept"
        );
        let bytes: u64 = events
            .iter()
            .filter(|e| e.peer.starts_with("10.232."))
            .map(|e| e.bytes)
            .sum();
        assert_eq!(stored.iter().map(|s| s.bytes).sum::<u64>(), bytes);

        let err = features(&[
            p("--data"),
            &run.join("recording.parquet"),
            p("--out"),
            &d.join("x.parquet"),
        ])
        .unwrap_err();
        assert!(format!("{err:#}").contains("job corpus run"), "{err:#}");
        // --spans without --compact, or with --out, is refused by the parser.
        assert!(features(&[
            p("--data"),
            &raw,
            p("--spans"),
            p("--out"),
            &d.join("y.parquet")
        ])
        .is_err());
    }

    /// A compact run reads back into the table a replay of the raw recording gives: the same
    /// rows in the same order, the same labels, every feature the replayed one rounded.
    #[test]
    fn a_compact_run_gives_the_replays_labels_and_its_features_rounded() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let raw = lab_run(&d.join("raw/run7"));
        let compact = d.join("compact");
        let (a, b) = (d.join("a.parquet"), d.join("b.parquet"));
        let peers = [p("--peers"), p("10.232.")];
        features(
            &[p("--data"), &raw, p("--out"), &a, p("--compact"), &compact]
                .into_iter()
                .chain(peers)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let run = compact.join("run7");
        for f in [
            "recording.parquet",
            "recording.features.parquet",
            JOB_LOG,
            "lab.json",
        ] {
            assert!(run.join(f).exists(), "{f} is in the compact run");
        }
        assert!(!run.join("recording.events.parquet").exists());
        assert!(
            !run.join("ground_truth.jsonl").exists(),
            "absent beside the raw run"
        );
        // The run's settings without this machine's paths.
        let lab: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("lab.json")).unwrap()).unwrap();
        assert_eq!(lab, serde_json::json!({"seed": 1, "probe": "probe"}));
        // The job log: each iteration's times only.
        let log = std::fs::read_to_string(run.join(JOB_LOG)).unwrap();
        let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
        assert_eq!(first.as_object().unwrap().len(), 2, "{first}");
        let slim: Vec<Observation> =
            crate::record::reader::read(&run.join("recording.parquet")).unwrap();
        assert_eq!(slim.len(), TICKS * 5, "every kind, the lab's two peers");
        assert!(slim.iter().all(|o| o.entity != "127.0.0.1"));

        let stored = run.join("recording.parquet");
        features(
            &[p("--data"), &stored, p("--out"), &b]
                .into_iter()
                .chain(peers)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let (ta, tb) = (table::read(&a).unwrap(), table::read(&b).unwrap());
        assert_eq!(ta.names, tb.names);
        assert_eq!(ta.recording, tb.recording);
        assert!(ta.recording.iter().all(|r| r == "run7"));
        assert_eq!(ta.entity_kind, tb.entity_kind);
        assert_eq!(ta.entity, tb.entity);
        let bits = |t: &FeatureTable| t.time_unix.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ta), bits(&tb));
        assert_eq!(ta.len(), TICKS * 5, "a row per entity kept per tick");
        for k in [PEER, INTERFACE, QDISC, HOST] {
            assert!(ta.entity_kind.iter().any(|x| x == k), "{k} rows are kept");
        }

        let label_names = labels::names(&LabelConfig::default());
        let (mut known_labels, mut onsets, mut values) = (0, 0, 0);
        for (c, name) in ta.names.iter().enumerate() {
            let (x, y) = (&ta.columns[c], &tb.columns[c]);
            if label_names.contains(name) {
                for r in 0..ta.len() {
                    assert!(
                        same_bits(x[r], y[r]),
                        "label {name} row {r}: {} vs {}",
                        x[r],
                        y[r]
                    );
                }
                known_labels += x.iter().filter(|v| !v.is_nan()).count();
                if name.ends_with("_onset") {
                    onsets += x.iter().filter(|v| **v == 1.0).count();
                }
                continue;
            }
            for r in 0..ta.len() {
                let want = round_feature(x[r]).map_or(f64::NAN, f64::from);
                assert!(
                    same_bits(want, y[r]),
                    "feature {name} row {r}: replayed {}, stored {}, rounded {want}",
                    x[r],
                    y[r]
                );
                values += usize::from(!y[r].is_nan());
            }
        }
        assert!(
            known_labels > 1000 && onsets >= 3,
            "{known_labels} labels, {onsets} onsets"
        );
        assert!(values > 10_000, "{values} feature values");

        // The stored file: FLOAT features, BYTE_STREAM_SPLIT, no dictionary.
        let file = std::fs::File::open(features_path(&stored)).unwrap();
        let r = SerializedFileReader::new(file).unwrap();
        let md = r.metadata();
        let schema = md.file_metadata().schema_descr();
        assert_eq!(schema.column(1).name(), "time_unix");
        assert_eq!(schema.column(1).physical_type(), Physical::DOUBLE);
        assert!(schema.num_columns() > 100);
        for g in md.row_groups() {
            for c in g.columns().iter().skip(KEYS.len()) {
                assert_eq!(c.column_type(), Physical::FLOAT, "{}", c.column_path());
                assert!(c.encodings().any(|e| e == Encoding::BYTE_STREAM_SPLIT));
                assert!(c.dictionary_page_offset().is_none());
                assert!(c
                    .encodings()
                    .all(|e| e != Encoding::PLAIN_DICTIONARY && e != Encoding::RLE_DICTIONARY));
                assert!(
                    matches!(c.compression(), ::parquet::basic::Compression::ZSTD(_)),
                    "{:?}",
                    c.compression()
                );
            }
        }
        let kv = md.file_metadata().key_value_metadata().unwrap();
        let get = |k: &str| kv.iter().find(|x| x.key == k).and_then(|x| x.value.clone());
        assert_eq!(get("probe.features.mantissa_bits").as_deref(), Some("14"));
        assert_eq!(get("probe.features.tick_ms").as_deref(), Some("1000"));

        // With its burst events beside it, a recording is replayed: stored features are
        // ignored.
        std::fs::copy(features_path(&stored), features_path(&raw)).unwrap();
        let a2 = d.join("a2.parquet");
        features(
            &[p("--data"), &raw, p("--out"), &a2]
                .into_iter()
                .chain(peers)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let ta2 = table::read(&a2).unwrap();
        for (x, y) in ta.columns.iter().zip(&ta2.columns) {
            assert!(x.iter().zip(y).all(|(x, y)| same_bits(*x, *y)));
        }

        // Narrower --peers on a compact run keeps fewer of its rows.
        let b2 = d.join("b2.parquet");
        features(&[
            p("--data"),
            &stored,
            p("--out"),
            &b2,
            p("--peers"),
            p("10.232.0.3"),
        ])
        .unwrap();
        let tb2 = table::read(&b2).unwrap();
        assert_eq!(tb2.len(), TICKS * 4);

        // Features of other windows are not in the compact run.
        let err = features(&[
            p("--data"),
            &stored,
            p("--out"),
            &d.join("c.parquet"),
            p("--windows"),
            p("5s,60s"),
        ])
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("--windows 5s,30s,120s"),
            "{err:#}"
        );
        // A compact run is not overwritten without --force, and --out is optional.
        let err = features(&[p("--data"), &raw, p("--compact"), &compact]).unwrap_err();
        assert!(format!("{err:#}").contains("--force"), "{err:#}");
        features(&[p("--data"), &raw, p("--compact"), &compact, p("--force")]).unwrap();
        // Nor is the recording itself.
        let err =
            features(&[p("--data"), &stored, p("--compact"), &compact, p("--force")]).unwrap_err();
        assert!(
            format!("{err:#}").contains("the recording itself"),
            "{err:#}"
        );
    }
}
