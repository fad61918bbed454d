//! Reads a Parquet file made by probe (recording, burst events, features) into JSON rows.
use std::{fs::File, path::Path};

use anyhow::{Context as _, Result};
use parquet::file::reader::{FileReader as _, SerializedFileReader};
use serde_json::{Map, Value};

pub fn rows(path: &Path) -> Result<Vec<Map<String, Value>>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let r = SerializedFileReader::new(f).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for row in r.get_row_iter(None)? {
        match row?.to_json_value() {
            Value::Object(m) => out.push(m),
            v => anyhow::bail!("a row of {} is not an object: {v}", path.display()),
        }
    }
    Ok(out)
}

/// A key of a Parquet file's key-value metadata.
pub fn meta(path: &Path, key: &str) -> Result<Option<String>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let r = SerializedFileReader::new(f).with_context(|| format!("reading {}", path.display()))?;
    Ok(r.metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == key))
        .and_then(|k| k.value.clone()))
}
