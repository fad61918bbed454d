//! Reading a table back: each Parquet row becomes a JSON object and then the row type, so a
//! file with fewer columns (an older recording) still reads, missing values as null.
use std::{fs::File, path::Path};

use ::parquet::file::reader::{FileReader as _, SerializedFileReader};
use anyhow::{Context as _, Result};
use serde::de::DeserializeOwned;

/// Every row of the Parquet file at `path`, in file order.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let what = || path.display().to_string();
    let file = File::open(path).with_context(|| format!("opening {}", what()))?;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{} is not a Parquet file", what()))?;
    let mut out = Vec::with_capacity(reader.metadata().file_metadata().num_rows().max(0) as usize);
    for row in reader.get_row_iter(None)? {
        let row = row.with_context(|| format!("reading {}", what()))?;
        let v = serde_json::from_value(row.to_json_value())
            .with_context(|| format!("a row of {} does not fit", what()))?;
        out.push(v);
    }
    Ok(out)
}

/// The key-value metadata of the Parquet file at `path` (keys without a value left out).
pub fn metadata(path: &Path) -> Result<Vec<(String, String)>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{} is not a Parquet file", path.display()))?;
    Ok(reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .filter_map(|k| Some((k.key.clone(), k.value.clone()?)))
        .collect())
}
