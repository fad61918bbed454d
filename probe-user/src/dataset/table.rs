//! Reading the table `probe features` writes, column by column: `probe train` and
//! `probe eval` need a few hundred thousand rows of a few hundred numbers, which the
//! row-as-JSON reader of recordings would take minutes over.
use std::{fs::File, path::Path};

use anyhow::{bail, Context as _, Result};
use parquet::{
    column::reader::ColumnReader,
    data_type::ByteArray,
    file::reader::{FileReader as _, SerializedFileReader},
};

/// A features table in memory: the key columns, and every numeric column (NaN for null).
#[derive(Debug, Default, Clone)]
pub struct FeatureTable {
    pub recording: Vec<String>,
    pub time_unix: Vec<f64>,
    pub entity_kind: Vec<String>,
    pub entity: Vec<String>,
    /// Numeric column names, in file order.
    pub names: Vec<String>,
    /// Column-major: `columns[c][row]`.
    pub columns: Vec<Vec<f64>>,
    /// The file's key-value metadata (`probe.features.windows`, `.horizons`, ...).
    pub meta: std::collections::BTreeMap<String, String>,
}

impl FeatureTable {
    pub fn len(&self) -> usize {
        self.time_unix.len()
    }

    pub fn is_empty(&self) -> bool {
        self.time_unix.is_empty()
    }

    /// Index of numeric column `name`.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The numeric column `name`, or a one-line error naming the file's kind.
    pub fn column(&self, name: &str) -> Result<&[f64]> {
        match self.col(name) {
            Some(c) => Ok(&self.columns[c]),
            None => bail!("the features table has no column {name} (made by another `probe features --horizons`?)"),
        }
    }

    /// The feature windows the table was made with.
    pub fn windows(&self) -> Result<Vec<std::time::Duration>> {
        self.list("probe.features.windows")?
            .iter()
            .map(|w| {
                crate::duration::parse_duration(w).map_err(|e| anyhow::anyhow!("window {w}: {e}"))
            })
            .collect()
    }

    /// The label horizons the table was made with ("5s", ...).
    pub fn horizons(&self) -> Result<Vec<String>> {
        self.list("probe.features.horizons")
    }

    /// The label settings the table was made with (the defaults for what it does not say:
    /// tables made before a setting existed), so that baselines share the labels' floors.
    pub fn label_config(&self) -> super::labels::LabelConfig {
        let mut c = super::labels::LabelConfig::default();
        let num = |k: &str| self.meta.get(k).and_then(|v| v.parse::<f64>().ok());
        let secs = |k: &str| {
            num(k)
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(std::time::Duration::from_secs_f64)
        };
        if let Some(v) = num("probe.features.spike_factor") {
            c.spike_factor = v;
        }
        if let Some(v) = num("probe.features.rtt_margin_s") {
            c.rtt_margin_s = v;
        }
        if let Some(v) = secs("probe.features.quiet_s") {
            c.quiet = v;
        }
        if let Some(v) = secs("probe.features.calm_min_s") {
            c.calm_min = v;
        }
        c
    }

    fn list(&self, key: &str) -> Result<Vec<String>> {
        match self.meta.get(key) {
            Some(v) => Ok(v.split(',').map(str::to_owned).collect()),
            None => {
                bail!("the features table lacks its {key} metadata (not made by `probe features`?)")
            }
        }
    }

    /// Reads and appends the tables at `paths` (their numeric columns must agree).
    pub fn read_all(paths: &[impl AsRef<Path>]) -> Result<FeatureTable> {
        let mut out: Option<FeatureTable> = None;
        for p in paths {
            let t = read(p.as_ref())?;
            match &mut out {
                None => out = Some(t),
                Some(o) => {
                    if o.names != t.names
                        || o.meta.get("probe.features.windows")
                            != t.meta.get("probe.features.windows")
                    {
                        bail!(
                            "{} has other columns than the tables before it: make every table with the same `probe features` options",
                            p.as_ref().display()
                        );
                    }
                    o.recording.extend(t.recording);
                    o.time_unix.extend(t.time_unix);
                    o.entity_kind.extend(t.entity_kind);
                    o.entity.extend(t.entity);
                    for (a, b) in o.columns.iter_mut().zip(t.columns) {
                        a.extend(b);
                    }
                }
            }
        }
        out.context("no features table given")
    }
}

const KEYS: [&str; 4] = ["recording", "time_unix", "entity_kind", "entity"];
const BATCH: usize = 8192;

/// One table written by `probe features`.
pub fn read(path: &Path) -> Result<FeatureTable> {
    let what = path.display();
    let file = File::open(path).with_context(|| format!("opening {what}"))?;
    let reader =
        SerializedFileReader::new(file).with_context(|| format!("{what} is not a Parquet file"))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let names: Vec<String> = schema
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    if names.len() < KEYS.len() || names[..KEYS.len()] != KEYS {
        bail!("{what} is not a `probe features` table (its first columns are not {KEYS:?})");
    }
    let meta = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter_map(|k| Some((k.key.clone(), k.value.clone()?)))
                .collect()
        })
        .unwrap_or_default();
    let mut t = FeatureTable {
        meta,
        names: names[KEYS.len()..].to_vec(),
        columns: vec![Vec::new(); names.len() - KEYS.len()],
        ..FeatureTable::default()
    };
    for g in 0..reader.num_row_groups() {
        let rg = reader.get_row_group(g)?;
        for (c, name) in names.iter().enumerate() {
            let col = rg
                .get_column_reader(c)
                .with_context(|| format!("{what}: column {name}"))?;
            let optional = schema.column(c).max_def_level() > 0;
            match (c, col) {
                (1, ColumnReader::DoubleColumnReader(r)) => {
                    t.time_unix.extend(doubles(r, optional)?)
                }
                (0 | 2 | 3, ColumnReader::ByteArrayColumnReader(mut r)) => {
                    let dst = match c {
                        0 => &mut t.recording,
                        2 => &mut t.entity_kind,
                        _ => &mut t.entity,
                    };
                    let mut vals: Vec<ByteArray> = Vec::new();
                    loop {
                        let (n, _, _) = r.read_records(BATCH, None, None, &mut vals)?;
                        if n == 0 {
                            break;
                        }
                    }
                    for v in vals {
                        dst.push(String::from_utf8_lossy(v.data()).into_owned());
                    }
                }
                (c, ColumnReader::DoubleColumnReader(r)) if c >= KEYS.len() => {
                    t.columns[c - KEYS.len()].extend(doubles(r, optional)?)
                }
                // A compact run's stored features (dataset/store.rs): FLOAT, exact in f64.
                (c, ColumnReader::FloatColumnReader(r)) if c >= KEYS.len() => {
                    t.columns[c - KEYS.len()].extend(doubles(r, optional)?)
                }
                _ => bail!("{what}: column {name} has an unexpected type"),
            }
        }
    }
    let n = t.time_unix.len();
    if [t.recording.len(), t.entity_kind.len(), t.entity.len()]
        .iter()
        .chain(t.columns.iter().map(Vec::len).collect::<Vec<_>>().iter())
        .any(|&l| l != n)
    {
        bail!("{what}: columns of unequal length (a damaged file)");
    }
    Ok(t)
}

/// A DOUBLE or FLOAT column, nulls as NaN.
fn doubles<T>(
    mut r: parquet::column::reader::ColumnReaderImpl<T>,
    optional: bool,
) -> Result<Vec<f64>>
where
    T: parquet::data_type::DataType,
    T::T: Copy + Into<f64>,
{
    let (mut vals, mut defs, mut out) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        vals.clear();
        defs.clear();
        let d = optional.then_some(&mut defs);
        let (n, _, _) = r.read_records(BATCH, d, None, &mut vals)?;
        if n == 0 {
            break;
        }
        if !optional {
            out.extend(vals.iter().map(|v| (*v).into()));
            continue;
        }
        let mut it = vals.iter();
        for d in &defs {
            out.push(if *d > 0 {
                (*it.next().context("fewer values than definition levels")?).into()
            } else {
                f64::NAN
            });
        }
    }
    Ok(out)
}
