//! The recording's columns: the one list that drives the Parquet schema, the writer and the
//! documentation test (docs/recording.md lists exactly these, in this order, with these
//! types). Adding a column: a field in [`Row`], an entry in [`COLUMNS`], a line in the docs.
//! A field without an entry is never read, which the compiler reports.

pub use crate::observe::{spans::Span, BurstEvent, Observation as Row};

/// Bumped whenever a column changes meaning or is removed (adding one keeps the version);
/// stored in the file's key-value metadata as `probe.recording.schema`.
pub const SCHEMA_VERSION: u32 = 1;

/// Physical type of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    /// DOUBLE.
    F64,
    /// FLOAT: for stored features, where a double's precision is wasted (dataset/store.rs).
    F32,
    /// INT64.
    I64,
    /// BYTE_ARRAY annotated STRING (UTF-8).
    Str,
}

#[cfg(test)]
impl Type {
    /// The name the docs use.
    pub fn name(self) -> &'static str {
        match self {
            Type::F64 => "f64",
            Type::F32 => "f32",
            Type::I64 => "i64",
            Type::Str => "string",
        }
    }
}

/// One value of a row, as the writer sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell<'a> {
    F64(Option<f64>),
    F32(Option<f32>),
    I64(Option<i64>),
    Str(&'a str),
}

/// One column of a static table over rows of type `R`.
pub struct Column<R: 'static> {
    pub name: &'static str,
    pub ty: Type,
    /// Never null.
    pub required: bool,
    pub get: fn(&R) -> Cell<'_>,
}

/// A table the writer can write: its Parquet message name, columns and cells. Static tables
/// (observations, burst events) and tables whose columns are known only at run time (feature
/// files, whose names follow the configured windows) share it.
pub struct Table<R> {
    pub message: &'static str,
    pub columns: Vec<ColumnDef>,
    pub cell: fn(&R, usize) -> Cell<'_>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub ty: Type,
    pub required: bool,
    /// The column's encoding, dictionary off; `None`: the writer's default (a dictionary,
    /// falling back to PLAIN when it grows too large). BYTE_STREAM_SPLIT suits floats that
    /// vary in their low bytes: the exponents and high mantissa bytes, grouped, compress.
    pub encoding: Option<::parquet::basic::Encoding>,
}

impl ColumnDef {
    /// A column with the writer's default encoding.
    pub fn new(name: impl Into<String>, ty: Type, required: bool) -> Self {
        Self {
            name: name.into(),
            ty,
            required,
            encoding: None,
        }
    }
}

fn defs<R>(cols: &[Column<R>]) -> Vec<ColumnDef> {
    cols.iter()
        .map(|c| ColumnDef::new(c.name, c.ty, c.required))
        .collect()
}

/// The observations table (`FILE`).
pub fn observations() -> Table<Row> {
    Table {
        message: "probe_recording",
        columns: defs(COLUMNS),
        cell: |r, i| (COLUMNS[i].get)(r),
    }
}

/// The burst events table (`FILE` with `.events.parquet` for `.parquet`).
pub fn burst_events() -> Table<BurstEvent> {
    Table {
        message: "probe_burst_events",
        columns: defs(EVENT_COLUMNS),
        cell: |r, i| (EVENT_COLUMNS[i].get)(r),
    }
}

/// The busy spans table of a job corpus run (`FILE` with `.spans.parquet`).
pub fn spans() -> Table<Span> {
    let mut columns = defs(SPAN_COLUMNS);
    // The starts of a tick's spans are close together: their differences, bit-packed, are
    // a fraction of the plain values (a quarter smaller once zstd has both; the other
    // integers compress better plain).
    for c in &mut columns {
        if c.name == "start_us" {
            c.encoding = Some(::parquet::basic::Encoding::DELTA_BINARY_PACKED);
        }
    }
    Table {
        message: "probe_busy_spans",
        columns,
        cell: |r, i| (SPAN_COLUMNS[i].get)(r),
    }
}

macro_rules! col {
    ($name:ident, F64, required) => {
        Column {
            name: stringify!($name),
            ty: Type::F64,
            required: true,
            get: |r| Cell::F64(Some(r.$name)),
        }
    };
    ($name:ident, Str, required) => {
        Column {
            name: stringify!($name),
            ty: Type::Str,
            required: true,
            get: |r| Cell::Str(&r.$name),
        }
    };
    ($name:ident, F64) => {
        Column {
            name: stringify!($name),
            ty: Type::F64,
            required: false,
            get: |r| Cell::F64(r.$name),
        }
    };
    ($name:ident, U64, required) => {
        Column {
            name: stringify!($name),
            ty: Type::I64,
            required: true,
            get: |r| Cell::I64(Some(i64::try_from(r.$name).unwrap_or(i64::MAX))),
        }
    };
    ($name:ident, I64) => {
        Column {
            name: stringify!($name),
            ty: Type::I64,
            required: false,
            get: |r| Cell::I64(r.$name),
        }
    };
}

/// The columns of the observations table, in file order.
pub const COLUMNS: &[Column<Row>] = &[
    col!(time_unix, F64, required),
    col!(interval_s, F64, required),
    col!(entity_kind, Str, required),
    col!(entity, Str, required),
    col!(tx_bytes_per_s, F64),
    col!(rx_bytes_per_s, F64),
    col!(tx_packets_per_s, F64),
    col!(rx_packets_per_s, F64),
    col!(ce_packets_per_s, F64),
    col!(srtt_s, F64),
    col!(min_rtt_s, F64),
    col!(rtt_samples, I64),
    col!(rtt_mean_s, F64),
    col!(rtt_p50_s, F64),
    col!(rtt_p90_s, F64),
    col!(rtt_p99_s, F64),
    col!(retransmits_per_s, F64),
    col!(connections, I64),
    col!(receive_queue_bytes, I64),
    col!(send_queue_bytes, I64),
    col!(socket_tx_bytes_per_s, F64),
    col!(socket_rx_bytes_per_s, F64),
    col!(bursts, I64),
    col!(burst_bytes, I64),
    col!(burst_seconds, F64),
    col!(tx_errors_per_s, F64),
    col!(rx_errors_per_s, F64),
    col!(tx_dropped_per_s, F64),
    col!(rx_dropped_per_s, F64),
    col!(sojourn_samples, I64),
    col!(sojourn_p50_s, F64),
    col!(sojourn_p99_s, F64),
    col!(qdisc_backlog_packets, I64),
    col!(qdisc_backlog_bytes, I64),
    col!(qdisc_drops_per_s, F64),
    col!(qdisc_overlimits_per_s, F64),
    col!(qdisc_requeues_per_s, F64),
    col!(rdma_transmit_wait_ticks_per_s, F64),
    col!(rdma_transmit_discards_per_s, F64),
    col!(rdma_cnp_sent_per_s, F64),
    col!(rdma_cnp_handled_per_s, F64),
    col!(rdma_ecn_marked_packets_per_s, F64),
    col!(rdma_out_of_sequence_packets_per_s, F64),
    col!(rdma_packet_sequence_errors_per_s, F64),
    col!(rdma_local_ack_timeout_errors_per_s, F64),
    col!(rdma_rnr_nak_retry_errors_per_s, F64),
    col!(rdma_link_downed_per_s, F64),
    col!(drops_per_s, F64),
    col!(flows_tracked, I64),
    col!(flow_evictions_per_s, F64),
    col!(peers_folded, I64),
];

/// The columns of the burst events table, in file order.
pub const SPAN_COLUMNS: &[Column<Span>] = &[
    col!(tick_unix, F64, required),
    col!(peer, Str, required),
    col!(start_us, U64, required),
    col!(duration_us, U64, required),
    col!(bursts, U64, required),
    col!(bytes, U64, required),
    col!(egress_bytes, U64, required),
    col!(max_burst_bytes, U64, required),
];

pub const EVENT_COLUMNS: &[Column<BurstEvent>] = &[
    col!(tick_unix, F64, required),
    col!(start_unix, F64, required),
    col!(duration_s, F64, required),
    col!(iface, Str, required),
    col!(direction, Str, required),
    col!(peer, Str, required),
    col!(bytes, U64, required),
    col!(packets, U64, required),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{ENTITY_KINDS, PEER};

    /// (name, type, required) of every column docs/recording.md lists under `section`: the
    /// rows of its column tables whose first cell is a `code` name.
    fn documented(section: &str) -> Vec<(String, String, bool)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/recording.md");
        let text = std::fs::read_to_string(path).expect("docs/recording.md exists");
        let mut out = Vec::new();
        let mut in_columns = false;
        for line in text.lines() {
            if line.starts_with("## ") {
                in_columns = line.trim() == section;
                continue;
            }
            if !in_columns || !line.starts_with("| `") {
                continue;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "", name, type, null, ...
            let name = cells[1].trim_matches('`').to_string();
            let ty = cells[2].trim_matches('`').to_string();
            let required = cells[3] == "no";
            out.push((name, ty, required));
        }
        out
    }

    #[test]
    fn docs_list_exactly_the_columns() {
        same_as_docs(&observations(), "## Columns");
        same_as_docs(&burst_events(), "## Burst events");
        same_as_docs(&spans(), "## Busy spans");
    }

    fn same_as_docs<R>(table: &Table<R>, section: &str) {
        let code: Vec<(String, String, bool)> = table
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.ty.name().to_string(), c.required))
            .collect();
        let docs = documented(section);
        for c in &code {
            assert!(
                docs.contains(c),
                "docs/recording.md lacks column {c:?} (name, type, never null)"
            );
        }
        for d in &docs {
            assert!(
                code.contains(d),
                "docs/recording.md lists {d:?}, the code does not"
            );
        }
        assert_eq!(
            code, docs,
            "docs/recording.md lists the columns in another order"
        );
    }

    #[test]
    fn docs_list_every_entity_kind() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/recording.md");
        let text = std::fs::read_to_string(path).unwrap();
        for k in ENTITY_KINDS {
            assert!(
                text.contains(&format!("| `{k}` |")),
                "docs/recording.md lacks entity kind {k}"
            );
        }
    }

    #[test]
    fn names_are_unique_and_accessors_match_types() {
        let row = Row {
            entity: "e".into(),
            entity_kind: PEER.into(),
            ..Row::default()
        };
        let mut seen = std::collections::HashSet::new();
        for c in COLUMNS {
            assert!(seen.insert(c.name), "duplicate column {}", c.name);
            let ok = matches!(
                ((c.get)(&row), c.ty),
                (Cell::F64(_), Type::F64) | (Cell::I64(_), Type::I64) | (Cell::Str(_), Type::Str)
            );
            assert!(ok, "{} accessor does not match its type", c.name);
            if !c.required {
                assert!(
                    matches!((c.get)(&row), Cell::F64(None) | Cell::I64(None)),
                    "{} should default to null",
                    c.name
                );
            }
        }
    }
}
