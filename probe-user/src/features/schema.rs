//! Feature names and their order, per entity kind, from the signal table and the configured
//! windows. A row's values are a vector in this order (the model's input order); the names
//! are stable: `{signal}_{stat}_{window}`, `{signal}_last`, `{signal}_z`, and the burst,
//! period and cross-entity features of peers. docs/features.md lists them (a test checks).
use std::collections::HashMap;

use super::{
    signals::{self, Signal},
    window::{HEAD, WINDOW_STATS},
};
use crate::observe as o;
pub use crate::{config::FeatureConfig, duration::label};

/// Burst statistics of a peer over one window, in layout order: (name, unit, definition).
pub const BURST_STATS: &[(&str, &str, &str)] = &[
    (
        "burst_rate",
        "1/s",
        "bursts that started in the window, per second",
    ),
    (
        "burst_bytes_mean",
        "B",
        "mean size of the bursts that started in the window",
    ),
    (
        "burst_bytes_max",
        "B",
        "largest burst that started in the window",
    ),
    (
        "burst_duty_cycle",
        "1",
        "share of the window during which any flow of the peer was inside a burst",
    ),
    (
        "burst_gap_mean",
        "s",
        "mean idle gap between the peer's bursts (bursts of all its flows merged)",
    ),
    (
        "burst_gap_cv",
        "1",
        "coefficient of variation of those gaps (std / mean): 0 is clockwork",
    ),
];

/// Features of a peer that are neither windows of a signal nor bursts.
pub const PEER_EXTRAS: &[(&str, &str, &str, &str)] = &[
    (
        "iteration_period_s",
        "s",
        "the training iteration period of the peer's traffic: the strongest repeat of its burst activity (autocorrelation of 10 ms occupancy bins over the period window); absent without a clear period",
        "a period that stretches is a job that is slowing down; bursts are when queues fill",
    ),
    (
        "iteration_period_confidence",
        "1",
        "autocorrelation at that period, 0 to 1: how regular the traffic is",
        "irregular iterations mean something interferes",
    ),
    (
        "rtt_straggler_ratio",
        "1",
        "the peer's srtt over the median srtt of all peers with one at the same tick",
        "one slow peer stalls every rank of a synchronous job",
    ),
    (
        "throughput_share",
        "1",
        "the peer's bytes per second (both directions) over all peers' at the same tick",
        "where the host's traffic goes",
    ),
    (
        "host_throughput_bytes",
        "B/s",
        "the host's bytes per second, both directions, all monitored interfaces",
        "host-wide load that every peer's traffic shares",
    ),
    (
        "host_backlog_bytes",
        "B",
        "bytes queued in all qdiscs of monitored interfaces",
        "host-wide queueing that every peer's traffic shares",
    ),
];

/// One feature's documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    pub kind: &'static str,
    pub name: String,
    pub unit: String,
    pub window: String,
    pub definition: String,
    /// Why it may predict a spike.
    pub why: String,
}

/// The feature layout of one entity kind.
#[derive(Debug)]
pub struct Schema {
    pub kind: &'static str,
    pub names: Vec<String>,
    index: HashMap<String, usize>,
    /// Number of signals; their features come first, `HEAD + 6 * windows` each.
    pub signals: usize,
    /// Where the burst features start (peers), then the extras.
    pub bursts_at: usize,
    pub extras_at: usize,
}

impl Schema {
    pub fn new(kind: &'static str, cfg: &FeatureConfig) -> Self {
        let docs = docs(kind, cfg);
        let names: Vec<String> = docs.into_iter().map(|d| d.name).collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let nsig = signals::of(kind).len();
        let nwin = cfg.windows.len();
        let bursts_at = nsig * per_signal(nwin);
        let extras_at = if kind == o::PEER {
            bursts_at + BURST_STATS.len() * nwin
        } else {
            bursts_at
        };
        Self {
            kind,
            names,
            index,
            signals: nsig,
            bursts_at,
            extras_at,
        }
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
}

/// Features per signal: last, z, rel, then the window statistics of each window.
pub fn per_signal(windows: usize) -> usize {
    HEAD + WINDOW_STATS.len() * windows
}

fn signal_docs(kind: &'static str, s: &Signal, cfg: &FeatureConfig, out: &mut Vec<Doc>) {
    let longest = label(*cfg.windows.last().expect("validated: a window"));
    out.push(Doc {
        kind,
        name: format!("{}_last", s.name),
        unit: s.unit.into(),
        window: "tick".into(),
        definition: format!("{} (absent if not known this tick)", s.what),
        why: s.why.into(),
    });
    out.push(Doc {
        kind,
        name: format!("{}_z", s.name),
        unit: "1".into(),
        window: longest.clone(),
        definition: format!(
            "z-score of this tick's {} against the longest window (0 if the window is flat)",
            s.name
        ),
        why: "how unusual this tick is for this entity: a sudden departure".into(),
    });
    let shortest = label(*cfg.windows.first().expect("validated: a window"));
    out.push(Doc {
        kind,
        name: format!("{}_rel", s.name),
        unit: "1".into(),
        window: format!("{shortest}/300s"),
        definition: format!(
            "EWMA of {} over the shortest window divided by its baseline: an EWMA with a 300 s time constant of the values clipped to 0.5x..2x the baseline, which a spike barely moves (absent if the baseline is not above 0)",
            s.name
        ),
        why: "scale-free \"how far above its usual level\": the same for links of any speed or RTT, the form the spike labels take".into(),
    });
    for w in &cfg.windows {
        for (stat, def) in WINDOW_STATS {
            let unit = if *stat == "slope" {
                format!("{}/s", s.unit)
            } else {
                s.unit.into()
            };
            out.push(Doc {
                kind,
                name: format!("{}_{stat}_{}", s.name, label(*w)),
                unit,
                window: label(*w),
                definition: format!("{def}, of {}", s.name),
                why: format!("{} ({stat_why})", s.why, stat_why = stat_why(stat)),
            });
        }
    }
}

/// Every feature of `kind`, in layout order.
pub fn docs(kind: &'static str, cfg: &FeatureConfig) -> Vec<Doc> {
    let mut out = Vec::new();
    for s in signals::of(kind) {
        signal_docs(kind, s, cfg, &mut out);
    }
    if kind == o::PEER {
        for w in &cfg.windows {
            for (name, unit, def) in BURST_STATS {
                out.push(Doc {
                    kind,
                    name: format!("{name}_{}", label(*w)),
                    unit: (*unit).into(),
                    window: label(*w),
                    definition: (*def).into(),
                    why: "training traffic is bursts; queues fill during them and a changed rhythm is a changed job or path".into(),
                });
            }
        }
        for (name, unit, def, why) in PEER_EXTRAS {
            out.push(Doc {
                kind,
                name: (*name).into(),
                unit: (*unit).into(),
                window: if name.starts_with("iteration") {
                    label(cfg.period_window)
                } else {
                    "tick".into()
                },
                definition: (*def).into(),
                why: (*why).into(),
            });
        }
    }
    out
}

/// What a window statistic adds to its signal.
fn stat_why(stat: &str) -> &'static str {
    match stat {
        "mean" | "ewma" => "its level",
        "std" => "its volatility",
        "min" => "its floor, e.g. the propagation part of RTT",
        "max" => "its worst recent value",
        "slope" => "where it is heading: a build-up before a spike",
        _ => "",
    }
}

/// The generated reference part of docs/features.md: per entity kind, the memory one
/// entity holds and every feature with its unit, window, definition and why.
#[cfg(test)]
pub fn reference(cfg: &FeatureConfig) -> String {
    let mut out = String::new();
    out.push_str("<!-- generated by `PROBE_UPDATE_DOCS=1 cargo test -p probe-user features::schema`; do not edit by hand -->\n");
    for kind in o::ENTITY_KINDS {
        let docs = docs(kind, cfg);
        let bytes = super::engine::Engine::entity_bytes(kind, cfg);
        out.push_str(&format!(
            "\n### `{kind}` ({} features, {:.1} KiB of state per entity)\n\n",
            docs.len(),
            bytes as f64 / 1024.0
        ));
        out.push_str("| feature | unit | window | definition | why it may predict a spike |\n|---|---|---|---|---|\n");
        for d in docs {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                d.name, d.unit, d.window, d.definition, d.why
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const BEGIN: &str = "<!-- feature-reference:begin -->\n";
    const END: &str = "<!-- feature-reference:end -->";

    /// docs/features.md lists exactly the features the code computes with the default
    /// config. `PROBE_UPDATE_DOCS=1` rewrites that part of the file instead of failing.
    #[test]
    fn docs_list_every_feature() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/features.md");
        let text = std::fs::read_to_string(path).expect("docs/features.md exists");
        let (a, b) = (
            text.find(BEGIN).expect("begin marker") + BEGIN.len(),
            text.find(END).expect("end marker"),
        );
        let want = reference(&FeatureConfig::default());
        if text[a..b] != want {
            if std::env::var_os("PROBE_UPDATE_DOCS").is_some() {
                std::fs::write(path, format!("{}{want}{}", &text[..a], &text[b..])).unwrap();
            } else {
                panic!("docs/features.md is out of date: run PROBE_UPDATE_DOCS=1 cargo test -p probe-user features::schema");
            }
        }
    }

    #[test]
    fn names_are_unique_and_laid_out_as_the_offsets_say() {
        let cfg = FeatureConfig::default();
        for kind in o::ENTITY_KINDS {
            let s = Schema::new(kind, &cfg);
            assert_eq!(s.index.len(), s.len(), "{kind}: duplicate names");
            assert_eq!(s.bursts_at, s.signals * per_signal(3));
            if *kind == o::PEER {
                assert_eq!(s.names[s.bursts_at], "burst_rate_5s");
                assert_eq!(s.names[s.extras_at], "iteration_period_s");
                assert_eq!(s.index("rtt_p99_max_30s"), Some(3 + 6 + 3));
                assert!(s.index("burst_duty_cycle_30s").is_some());
            }
        }
    }

    #[test]
    fn window_labels_and_validation() {
        assert_eq!(label(Duration::from_secs(120)), "120s");
        assert_eq!(label(Duration::from_millis(500)), "500ms");
        let mut c = FeatureConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.ring_capacity(), 152);
        c.windows = vec![Duration::from_secs(30), Duration::from_secs(5)];
        assert!(c.validate().unwrap_err().contains("ascending"));
        c.windows = vec![Duration::from_millis(500)];
        assert!(c.validate().unwrap_err().contains("shorter than the tick"));
    }
}
