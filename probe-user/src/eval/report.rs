//! The Markdown report of `probe eval`, and where its plots go.
use std::{fmt::Write as _, path::Path};

use anyhow::Result;

use super::{plots, ClassResult, Results, TimelineData};

pub fn pr_file(c: &ClassResult) -> String {
    format!("pr-{}-{}-{}.svg", c.entity_kind, c.target, c.horizon)
}

pub fn reliability_file(c: &ClassResult) -> String {
    format!(
        "reliability-{}-{}-{}.svg",
        c.entity_kind, c.target, c.horizon
    )
}

pub fn timeline(dir: &Path, tl: &TimelineData) -> Result<()> {
    plots::timeline(
        &dir.join("timeline.svg"),
        &plots::Timeline {
            title: tl.title.clone(),
            t: &tl.t,
            value: &tl.value,
            value_label: "RTT p99 (ms)".into(),
            events: &tl.events,
            score: &tl.score,
            threshold: tl.threshold,
            alarms: &tl.alarms,
        },
    )
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

fn ci(v: Option<(f64, f64)>, digits: usize) -> String {
    match v {
        Some((a, b)) => format!("[{a:.digits$}, {b:.digits$}]"),
        None => "-".into(),
    }
}

fn pct(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or("-".into(), |x| format!("{:.1}%", 100.0 * x))
}

pub fn markdown(r: &Results, with_plots: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# probe eval\n");
    let _ = writeln!(
        s,
        "Model: {} (trained on {}). Held-out data: {} recording(s) from {}.\n",
        r.model,
        r.trained_on,
        r.recordings,
        r.data.join(", ")
    );
    let _ = writeln!(
        s,
        "Rows are the ticks whose label is known: in a calm stretch at least the labels' quiet \
         time long, with the horizon inside the recording (docs/features.md, Labels). Each is \
         scored by the model and by baselines computed from the same features: an EWMA (5 s \
         half-life) and predict_linear over 30 s to the horizon of the label's own signals, \
         each as the label's severity against the same calm level and floors; a 30 s z-score \
         of the signals; the time since the event last ended (recent_event); and always \
         alarming (its PR-AUC is the prevalence). Thresholds were chosen on the training \
         validation split: the lowest that keeps the alarm on at most {:.0}% of the calm \
         rows. Intervals are {:.0}% percentile bootstraps over recordings ({} resamples); \
         `model - x` is the model's PR-AUC minus the scorer's on the same resamples, and a \
         win counts only when that interval is above 0. False alarms: alarm episodes that \
         start in a calm row (no onset within the horizon), per entity-hour of known rows. \
         Onsets: an event after at least the quiet time without it, counted once per lab \
         episode (its first); caught before if the alarm was up at the tick before (lead: \
         how long, at most the horizon), else the delay to the first alarm within the \
         horizon.\n",
        100.0 * super::ALARM_BUDGET,
        100.0 * super::CONFIDENCE,
        super::BOOTSTRAP_REPS
    );
    s.push_str(&summary(r));
    for c in &r.classifiers {
        classifier(&mut s, c, with_plots);
    }
    if !r.regressors.is_empty() {
        let _ = writeln!(
            s,
            "## Forecasts against persistence and mean reversion\n\nMAE in the target's unit \
             (s, bytes/s); weighted MAPE is sum |error| / sum |actual| (a per-row MAPE \
             explodes on idle rows). Persistence forecasts the value now; mean reversion its \
             EWMA (30 s half-life).\n"
        );
        let _ = writeln!(
            s,
            "| forecast | rows | MAE model | MAE persistence | MAE EWMA | wMAPE model % | wMAPE persistence % | wMAPE EWMA % |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for g in &r.regressors {
            let _ = writeln!(
                s,
                "| {} | {} | {:.4e} | {:.4e} | {:.4e} | {:.1} | {:.1} | {:.1} |",
                g.key,
                g.rows,
                g.mae_model,
                g.mae_persistence,
                g.mae_ewma,
                g.mape_model,
                g.mape_persistence,
                g.mape_ewma
            );
        }
        let _ = writeln!(s);
    }
    if with_plots {
        let _ = writeln!(s, "![timeline](timeline.svg)\n");
    }
    s
}

/// One line per model: the figures an operator decides on (docs/model.md quotes this
/// table as it is, and a test holds it to docs/model/results.json). Gradual onsets: caught
/// before, of how many; abrupt: caught before or within one tick.
pub fn summary(r: &Results) -> String {
    let mut s = String::from(
        "## Summary\n\n\
         | model | PR-AUC | interval | best baseline | model - best | ROC-AUC | time in alarm | false alarms/h | gradual caught before | abrupt within 1 tick | ECE |\n\
         |---|---:|---|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in &r.classifiers {
        let Some(m) = c.scorers.first() else { continue };
        let best = c.scorers[1..]
            .iter()
            .filter(|b| b.name != super::ALWAYS)
            .max_by(|a, b| a.pr_auc.unwrap_or(0.0).total_cmp(&b.pr_auc.unwrap_or(0.0)));
        let onsets = |k: &str, f: fn(&super::Onsets) -> f64| {
            m.onsets.get(k).map_or("-".into(), |o| {
                format!("{} of {}", pct(Some(f(o))), o.count)
            })
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} |",
            c.key,
            num(m.pr_auc, 3),
            ci(m.pr_auc_ci, 3),
            best.map_or("-".into(), |b| format!("{} {}", b.name, num(b.pr_auc, 3))),
            best.map_or("-".into(), |b| ci(b.model_minus_ci, 3)),
            num(m.roc_auc, 3),
            pct(m.time_in_alarm),
            m.false_alarms_per_hour,
            onsets("gradual", |o| o.caught_before),
            onsets("abrupt", |o| o.caught_within_1_tick),
            num(m.ece, 3),
        );
    }
    for g in &r.regressors {
        let _ = writeln!(
            s,
            "| {} (MAE) | {:.3e} | - | persistence {:.3e}, EWMA {:.3e} | - | - | - | - | - | - | - |",
            g.key, g.mae_model, g.mae_persistence, g.mae_ewma
        );
    }
    s.push('\n');
    s
}

/// Onsets by kind (lab ground truth): lead for gradual, delay for abrupt.
fn by_onset_kind(s: &mut String, c: &ClassResult) {
    let kinds: Vec<&String> = c
        .scorers
        .first()
        .map(|m| m.onsets.keys().filter(|k| *k != "all").collect())
        .unwrap_or_default();
    if !kinds.is_empty() {
        let _ = writeln!(
            s,
            "\nBy onset kind (caught before / within 1 tick / median lead s / median delay s):\n"
        );
        let _ = writeln!(
            s,
            "| scorer | {} |",
            kinds
                .iter()
                .map(|k| format!("{k} ({})", c.scorers[0].onsets[*k].count))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(s, "|---|{}", "---:|".repeat(kinds.len()));
        for sc in &c.scorers {
            let cells: Vec<String> = kinds
                .iter()
                .map(|k| {
                    let o = sc.onsets.get(*k).cloned().unwrap_or_default();
                    format!(
                        "{} / {} / {} / {}",
                        pct(Some(o.caught_before)),
                        pct(Some(o.caught_within_1_tick)),
                        num(o.median_lead_s, 1),
                        num(o.median_delay_s, 1)
                    )
                })
                .collect();
            let _ = writeln!(s, "| {} | {} |", sc.name, cells.join(" | "));
        }
    }
}

fn classifier(s: &mut String, c: &ClassResult, with_plots: bool) {
    let _ = writeln!(
        s,
        "## {}: {} within {}\n\n{} rows ({} positive, {}), {:.2} entity-hours.\n",
        c.key,
        c.target,
        c.horizon,
        c.rows,
        c.positives,
        pct(Some(c.positives as f64 / c.rows.max(1) as f64)),
        c.hours
    );
    let _ = writeln!(
        s,
        "| scorer | PR-AUC | interval | model - x | ROC-AUC | precision | recall | time in alarm | false alarms/h | onsets | caught before | interval | within 1 tick | median lead s | median delay s |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    );
    for sc in &c.scorers {
        let all = sc.onsets.get("all").cloned().unwrap_or_default();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            sc.name,
            num(sc.pr_auc, 3),
            ci(sc.pr_auc_ci, 3),
            ci(sc.model_minus_ci, 3),
            num(sc.roc_auc, 3),
            num(sc.precision, 3),
            num(sc.recall, 3),
            pct(sc.time_in_alarm),
            sc.false_alarms_per_hour,
            all.count,
            pct(Some(all.caught_before)),
            ci(all.caught_before_ci, 2),
            pct(Some(all.caught_within_1_tick)),
            num(all.median_lead_s, 1),
            num(all.median_delay_s, 1),
        );
    }
    by_onset_kind(s, c);
    if let Some(m) = c.scorers.first() {
        let _ = writeln!(
            s,
            "\nCalibration of the model's probability: expected calibration error {} over {} bins.",
            num(m.ece, 3),
            m.reliability.len()
        );
    }
    if c.does_not_beat.is_empty() {
        let _ = writeln!(
            s,
            "\nThe model beats every baseline on PR-AUC outside the interval."
        );
    } else {
        let _ = writeln!(
            s,
            "\n**The model does not beat, outside the interval:** {}.",
            c.does_not_beat.join(", ")
        );
    }
    if with_plots {
        let _ = writeln!(
            s,
            "\n![PR curves]({}) ![reliability]({})",
            pr_file(c),
            reliability_file(c)
        );
    }
    let _ = writeln!(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/model.md quotes the built-in model's held-out summary as `probe eval` wrote it:
    /// the card's figures are results.json's, not typed by hand.
    #[test]
    fn the_model_card_quotes_the_evaluation() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/");
        let json = std::fs::read_to_string(format!("{root}model/results.json")).unwrap();
        let r: Results = serde_json::from_str(&json).unwrap();
        let card = std::fs::read_to_string(format!("{root}model.md")).unwrap();
        let table = summary(&r);
        let table = table.trim_start_matches("## Summary\n\n");
        assert!(
            card.contains(table),
            "docs/model.md does not quote docs/model/results.json's summary; it should hold:\n{table}"
        );
    }
}
