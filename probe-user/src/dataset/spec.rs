//! What the spike model predicts: one model per (entity kind, target, horizon), and how its
//! rows and labels come out of a `probe features` table. `probe train` and `probe eval`
//! both read the table through this file, so they agree on every row.
use crate::{
    dataset::table::FeatureTable,
    model::bundle::{base_now, Entry, Task},
    observe::{INTERFACE, PEER},
};

/// One kind of model.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub entity_kind: &'static str,
    pub target: &'static str,
    pub task: Task,
    /// The raw signal the baselines watch (a `{signal}_last` feature).
    pub signal: &'static str,
    /// Regressors: the features whose sum is "now", and the log offset.
    pub base: &'static [&'static str],
    pub eps: f64,
}

impl Spec {
    /// The label column for horizon `h` ("5s").
    pub fn label(&self, h: &str) -> String {
        match self.task {
            Task::Classifier => format!("{}_{h}", self.target),
            Task::Regressor => format!("{}_future_{h}", self.target),
        }
    }

    /// The state-now column of a classifier's target.
    pub fn now(&self) -> String {
        format!("{}_now", self.target)
    }

    /// The onset column of a classifier's target (1 at the tick an event starts).
    pub fn onset(&self) -> String {
        format!("{}_onset", self.target)
    }

    pub fn file(&self, h: &str) -> String {
        format!("{}-{}-{h}.txt", self.entity_kind, self.target)
    }

    /// "peer/rtt_spike_5s": names a (spec, horizon) in reports and the manifest.
    pub fn key(&self, h: &str) -> String {
        format!("{}/{}_{h}", self.entity_kind, self.target)
    }
}

/// Every model probe trains. Queue overflow is learned on interfaces (the qdisc rows of
/// the same queue say the same, and the model directory stays small).
pub const SPECS: &[Spec] = &[
    Spec {
        entity_kind: PEER,
        target: "rtt_spike",
        task: Task::Classifier,
        signal: "rtt_p99_last",
        base: &[],
        eps: 0.0,
    },
    Spec {
        entity_kind: PEER,
        target: "retrans_storm",
        task: Task::Classifier,
        signal: "retransmits_last",
        base: &[],
        eps: 0.0,
    },
    Spec {
        entity_kind: PEER,
        target: "iteration_slowdown",
        task: Task::Classifier,
        signal: "iteration_period_s",
        base: &[],
        eps: 0.0,
    },
    Spec {
        entity_kind: INTERFACE,
        target: "queue_overflow",
        task: Task::Classifier,
        signal: "sojourn_p99_last",
        base: &[],
        eps: 0.0,
    },
    Spec {
        entity_kind: PEER,
        target: "rtt_p99",
        task: Task::Regressor,
        signal: "rtt_p99_last",
        // 0.1 ms: RTTs below it are all "fast"; ratios of such tiny values are noise.
        base: &["rtt_p99_last"],
        eps: 1e-4,
    },
    Spec {
        entity_kind: PEER,
        target: "throughput",
        task: Task::Regressor,
        signal: "tx_bytes_last",
        base: &["tx_bytes_last", "rx_bytes_last"],
        // 1 kB/s: an idle peer's forecast is not a ratio of zeros.
        eps: 1e3,
    },
];

/// The spec an entry of a model directory was trained from.
pub fn of(e: &Entry) -> Option<&'static Spec> {
    SPECS
        .iter()
        .find(|s| s.entity_kind == e.entity_kind && s.target == e.target && s.task == e.task)
}

/// Rows of one entity's series: (recording, entity) in time order.
pub fn series(t: &FeatureTable, kind: &str) -> Vec<Vec<usize>> {
    let mut rows: Vec<usize> = (0..t.len()).filter(|&i| t.entity_kind[i] == kind).collect();
    rows.sort_by(|&a, &b| {
        (&t.recording[a], &t.entity[a])
            .cmp(&(&t.recording[b], &t.entity[b]))
            .then(t.time_unix[a].total_cmp(&t.time_unix[b]))
    });
    let mut out: Vec<Vec<usize>> = Vec::new();
    for r in rows {
        match out.last_mut() {
            Some(s) if t.recording[s[0]] == t.recording[r] && t.entity[s[0]] == t.entity[r] => {
                s.push(r)
            }
            _ => out.push(vec![r]),
        }
    }
    out
}

/// Row-major inputs of `rows` for the features `names` (NaN where the table has none).
pub fn matrix(t: &FeatureTable, names: &[String], rows: &[usize]) -> anyhow::Result<Vec<f64>> {
    let cols: Vec<&[f64]> = names
        .iter()
        .map(|n| t.column(n))
        .collect::<anyhow::Result<_>>()?;
    let mut x = Vec::with_capacity(rows.len() * names.len());
    for &r in rows {
        x.extend(cols.iter().map(|c| c[r]));
    }
    Ok(x)
}

/// A regressor's label and base columns in a table, looked up once.
pub struct RegressionColumns<'a> {
    label: &'a [f64],
    base: Vec<&'a [f64]>,
}

impl<'a> RegressionColumns<'a> {
    pub fn new(t: &'a FeatureTable, e: &Entry, label: &'a [f64]) -> anyhow::Result<Self> {
        let base = e
            .base
            .iter()
            .map(|b| t.column(b))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { label, base })
    }

    /// The base now at row r (the daemon's rule: `bundle::base_now`).
    pub fn base(&self, r: usize) -> Option<f64> {
        base_now(self.base.iter().map(|c| c[r]))
    }

    /// (regression target, base) of row r: None when either is unknown.
    pub fn target(&self, e: &Entry, r: usize) -> Option<(f64, f64)> {
        let base = self.base(r)?;
        let future = self.label[r];
        future
            .is_finite()
            .then(|| (e.target_of(future, base), base))
    }
}
