//! The Parquet file. Rows are buffered and written as one row group per flush; after every
//! row group a footer describing all row groups so far is written after it, so the file on
//! disk is always a complete Parquet file. A recorder killed between flushes leaves a file
//! that ends at its last flush; the next flush overwrites that footer, and `finish` writes
//! the final one (with page indexes).
//!
//! The Parquet writer writes into memory ([`Pending`]); each flush moves those bytes plus the
//! new footer into the file with one positional write at the end of the data already there.
use std::{fs::File, io::Write, os::unix::fs::FileExt as _, path::Path, sync::Arc};

use ::parquet::{
    basic::{Compression, ZstdLevel},
    data_type::{ByteArray, ByteArrayType, DataType, DoubleType, FloatType, Int64Type},
    file::{
        metadata::{FileMetaData, KeyValue, ParquetMetaData, ParquetMetaDataWriter},
        properties::WriterProperties,
        writer::{SerializedColumnWriter, SerializedFileWriter},
    },
    schema::{
        parser::parse_message_type,
        types::{ColumnPath, SchemaDescPtr, SchemaDescriptor},
    },
};
use anyhow::{Context as _, Result};

use super::columns::{Cell, Table, Type};

/// Bytes the Parquet writer produced since the last flush.
#[derive(Default)]
pub struct Pending(Vec<u8>);

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The Parquet schema text of a table.
pub fn schema_text<R>(table: &Table<R>) -> String {
    let mut s = format!("message {} {{\n", table.message);
    for c in &table.columns {
        let rep = if c.required { "required" } else { "optional" };
        let ty = match c.ty {
            Type::F64 => "double",
            Type::F32 => "float",
            Type::I64 => "int64",
            Type::Str => "binary",
        };
        let ann = if c.ty == Type::Str { " (STRING)" } else { "" };
        s.push_str(&format!("  {rep} {ty} {}{ann};\n", c.name));
    }
    s.push('}');
    s
}

pub struct RecordingWriter<R> {
    table: Table<R>,
    file: File,
    writer: SerializedFileWriter<Pending>,
    descr: SchemaDescPtr,
    kv: Vec<KeyValue>,
    /// File offset where the next data goes (the end of the last row group written).
    committed: u64,
    rows: Vec<R>,
    rows_written: u64,
    row_groups: usize,
}

/// Parquet's limit on row groups per file (an i16 ordinal).
pub const MAX_ROW_GROUPS: usize = i16::MAX as usize;

/// Zstd at `level` (1-22), for files that are written once and kept (a compact run in a
/// repository); the recorder, which flushes every minute, keeps snappy.
pub fn zstd(level: i32) -> anyhow::Result<Compression> {
    Ok(Compression::ZSTD(ZstdLevel::try_new(level)?))
}

/// A Parquet writer of `table` into `sink`, with the table's column encodings.
fn parquet_writer<R, W: Write + Send>(
    sink: W,
    table: &Table<R>,
    kv: Vec<KeyValue>,
    compression: Compression,
) -> Result<(SerializedFileWriter<W>, SchemaDescPtr)> {
    let schema = Arc::new(parse_message_type(&schema_text(table)).context("recording schema")?);
    let descr = Arc::new(SchemaDescriptor::new(schema.clone()));
    let mut props = WriterProperties::builder()
        .set_compression(compression)
        .set_key_value_metadata(Some(kv))
        .set_created_by(format!("probe {}", env!("CARGO_PKG_VERSION")));
    for c in &table.columns {
        if let Some(e) = c.encoding {
            let path = ColumnPath::new(vec![c.name.clone()]);
            props = props
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path, e);
        }
    }
    let writer = SerializedFileWriter::new(sink, schema, Arc::new(props.build()))?;
    Ok((writer, descr))
}

/// Writes `rows` as one row group.
fn write_rows<R, W: Write + Send>(
    writer: &mut SerializedFileWriter<W>,
    table: &Table<R>,
    rows: &[R],
) -> Result<()> {
    let mut rg = writer.next_row_group()?;
    let cell = table.cell;
    for (i, c) in table.columns.iter().enumerate() {
        let mut col = rg
            .next_column()?
            .expect("the schema has one column per table entry");
        match c.ty {
            Type::F64 => {
                write_numbers::<DoubleType, R>(&mut col, rows, c.required, |r| match cell(r, i) {
                    Cell::F64(v) => v,
                    _ => None,
                })?
            }
            Type::F32 => {
                write_numbers::<FloatType, R>(&mut col, rows, c.required, |r| match cell(r, i) {
                    Cell::F32(v) => v,
                    _ => None,
                })?
            }
            Type::I64 => {
                write_numbers::<Int64Type, R>(&mut col, rows, c.required, |r| match cell(r, i) {
                    Cell::I64(v) => v,
                    _ => None,
                })?
            }
            Type::Str => {
                let vals: Vec<ByteArray> = rows
                    .iter()
                    .filter_map(|r| match cell(r, i) {
                        Cell::Str(s) => Some(ByteArray::from(s)),
                        _ => None,
                    })
                    .collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&vals, None, None)?;
            }
        }
        col.close()?;
    }
    rg.close()?;
    Ok(())
}

/// One numeric column of `rows`: the values `get` gives, nulls where it gives none (a
/// required column has none).
fn write_numbers<T: DataType, R>(
    col: &mut SerializedColumnWriter<'_>,
    rows: &[R],
    required: bool,
    get: impl Fn(&R) -> Option<T::T>,
) -> Result<()> {
    let mut defs: Vec<i16> = Vec::with_capacity(rows.len());
    let mut vals = Vec::with_capacity(rows.len());
    for r in rows {
        let v = get(r);
        defs.push(i16::from(v.is_some()));
        vals.extend(v);
    }
    let defs = (!required).then_some(defs.as_slice());
    col.typed::<T>().write_batch(&vals, defs, None)?;
    Ok(())
}

impl<R> RecordingWriter<R> {
    /// Creates `path` (truncating it) and writes an empty but valid file of `table` into it,
    /// compressed with snappy.
    pub fn create(path: &Path, table: Table<R>, metadata: &[(&str, String)]) -> Result<Self> {
        Self::create_with(path, table, metadata, Compression::SNAPPY)
    }

    /// [`create`](Self::create) with another compression (e.g. [`zstd`]).
    pub fn create_with(
        path: &Path,
        table: Table<R>,
        metadata: &[(&str, String)],
        compression: Compression,
    ) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let kv: Vec<KeyValue> = metadata
            .iter()
            .map(|(k, v)| KeyValue::new(k.to_string(), v.clone()))
            .collect();
        let (writer, descr) = parquet_writer(Pending::default(), &table, kv.clone(), compression)?;
        let mut w = Self {
            table,
            file,
            writer,
            descr,
            kv,
            committed: 0,
            rows: Vec::new(),
            rows_written: 0,
            row_groups: 0,
        };
        w.checkpoint()
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(w)
    }

    pub fn push(&mut self, rows: impl IntoIterator<Item = R>) {
        self.rows.extend(rows);
    }

    /// Rows on disk (in row groups).
    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    pub fn row_groups(&self) -> usize {
        self.row_groups
    }

    /// Writes the buffered rows as one row group and makes the file complete up to them.
    pub fn flush(&mut self) -> Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        self.write_row_group()?;
        self.checkpoint()
    }

    /// Sets (or replaces) a key of the file's metadata, written with the next flush or
    /// finish: what is only known once recording has begun (the daemon's tick).
    pub fn set_meta(&mut self, key: &str, value: String) {
        match self.kv.iter_mut().find(|k| k.key == key) {
            Some(k) => k.value = Some(value),
            None => self.kv.push(KeyValue::new(key.to_string(), value)),
        }
    }

    /// Writes the last rows and the final footer (a flush's, with the metadata as it
    /// stands now); the file is complete.
    pub fn finish(mut self) -> Result<u64> {
        if !self.rows.is_empty() {
            self.write_row_group()?;
        }
        self.checkpoint()?;
        self.file.sync_all()?;
        Ok(self.rows_written)
    }

    fn write_row_group(&mut self) -> Result<()> {
        let rows = std::mem::take(&mut self.rows);
        write_rows(&mut self.writer, &self.table, &rows)?;
        self.rows_written += rows.len() as u64;
        self.row_groups += 1;
        Ok(())
    }

    /// Moves the pending bytes to the file followed by a footer listing every row group.
    fn checkpoint(&mut self) -> Result<()> {
        self.writer.flush()?;
        let data = std::mem::take(&mut self.writer.inner_mut().0);
        let groups = self.writer.flushed_row_groups().to_vec();
        let num_rows = groups.iter().map(|g| g.num_rows()).sum();
        let meta = ParquetMetaData::new(
            FileMetaData::new(
                self.writer.properties().writer_version().as_num(),
                num_rows,
                Some(self.writer.properties().created_by().to_string()),
                Some(self.kv.clone()),
                self.descr.clone(),
                None,
            ),
            groups,
        );
        let mut buf = data;
        let data_len = buf.len() as u64;
        ParquetMetaDataWriter::new(&mut buf, &meta).finish()?;
        // One write: the old footer is replaced by the new data and the new footer.
        self.file.write_all_at(&buf, self.committed)?;
        self.file.set_len(self.committed + buf.len() as u64)?;
        self.committed += data_len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::columns::{observations, Row, COLUMNS};
    use super::*;
    use crate::observe::{HOST, PEER};
    use ::parquet::file::reader::{FileReader as _, SerializedFileReader};
    use ::parquet::record::RowAccessor as _;

    fn row(t: f64, entity: &str, srtt: Option<f64>) -> Row {
        Row {
            time_unix: t,
            interval_s: 1.0,
            entity_kind: PEER.into(),
            entity: entity.into(),
            srtt_s: srtt,
            connections: Some(2),
            ..Row::default()
        }
    }

    fn read(path: &Path) -> Vec<(f64, String, Option<f64>)> {
        let r = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
        let schema = r.metadata().file_metadata().schema_descr();
        let idx = |n: &str| {
            (0..schema.num_columns())
                .find(|&i| schema.column(i).name() == n)
                .unwrap()
        };
        let (t, e, s) = (idx("time_unix"), idx("entity"), idx("srtt_s"));
        r.get_row_iter(None)
            .unwrap()
            .map(|row| {
                let row = row.unwrap();
                (
                    row.get_double(t).unwrap(),
                    row.get_string(e).unwrap().clone(),
                    row.get_double(s).ok(),
                )
            })
            .collect()
    }

    #[test]
    fn the_file_is_readable_after_every_flush_and_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.parquet");
        let mut w =
            RecordingWriter::create(&path, observations(), &[("probe.test", "1".into())]).unwrap();
        assert!(read(&path).is_empty(), "a new recording is an empty file");

        w.push([row(1.0, "a", Some(0.003)), row(1.0, "b", None)]);
        w.flush().unwrap();
        assert_eq!(read(&path).len(), 2);
        w.set_meta("probe.later", "2".into());
        w.set_meta("probe.test", "3".into());
        w.push([row(2.0, "a", Some(0.004))]);
        w.flush().unwrap();
        let rows = read(&path);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1], (1.0, "b".to_string(), None));
        assert_eq!(rows[2], (2.0, "a".to_string(), Some(0.004)));

        // Rows pushed but not flushed are not on disk; the file stays valid.
        w.push([Row {
            entity_kind: HOST.into(),
            entity: "host".into(),
            time_unix: 3.0,
            ..Row::default()
        }]);
        assert_eq!(read(&path).len(), 3);
        assert_eq!(w.finish().unwrap(), 4);
        let rows = read(&path);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[3].1, "host");

        let r = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let md = r.metadata();
        assert_eq!(md.num_row_groups(), 3);
        // Metadata set after create replaces or adds keys, once each, at the end too.
        let kv = crate::record::reader::metadata(&path).unwrap();
        let got = |key: &str| -> Vec<&str> {
            kv.iter()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(got("probe.test"), ["3"]);
        assert_eq!(got("probe.later"), ["2"]);
        assert_eq!(
            md.file_metadata().schema_descr().num_columns(),
            COLUMNS.len()
        );
    }
}
