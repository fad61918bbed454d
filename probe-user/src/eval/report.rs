//! The Markdown report of `probe eval`, and where its plots go.
use std::{fmt::Write as _, path::Path};

use anyhow::Result;

use super::{plots, ClassResult, Results, TimelineData, PERSISTENCE};

pub fn pr_file(c: &ClassResult) -> String {
    format!("pr-{}-{}-{}.svg", c.entity_kind, c.target, c.horizon)
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
        "Each row is scored by the model and by the baselines computed from the same \
         observations: persistence (the event is on now), an EWMA over 5 s against its \
         5-minute median, a 30 s z-score, and predict_linear over 30 s to the horizon against \
         the median. Thresholds: the model's and the baselines' were chosen on the training \
         validation split (best F1 among thresholds that alarm on at most twice as many rows as \
         are positive); persistence alarms when the event is on. False alarms: \
         alarm episodes with no onset during them or within the horizon after. Lead: how long \
         the alarm had been up when an onset came, at most the horizon; delay: from the onset to the first alarm \
         (within the horizon) for onsets not caught before.\n"
    );
    for c in &r.classifiers {
        let _ = writeln!(
            s,
            "## {}: {} within {}\n\n{} rows ({} positive), {:.2} entity-hours.\n",
            c.key, c.target, c.horizon, c.rows, c.positives, c.hours
        );
        let _ = writeln!(
            s,
            "| scorer | PR-AUC | ROC-AUC | precision | recall | F1 | false alarms/h | onsets | caught before | median lead s | median delay s |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for sc in &c.scorers {
            let all = sc.onsets.get("all").cloned().unwrap_or_default();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.0}% | {} | {} |",
                sc.name,
                num(sc.pr_auc, 3),
                num(sc.roc_auc, 3),
                num(sc.precision, 3),
                num(sc.recall, 3),
                num(sc.f1, 3),
                sc.false_alarms_per_hour,
                all.count,
                100.0 * all.caught_before,
                num(all.median_lead_s, 1),
                num(all.median_delay_s, 1),
            );
        }
        // Onsets by kind (lab ground truth): lead for gradual, delay for abrupt.
        let kinds: Vec<&String> = c
            .scorers
            .first()
            .map(|m| m.onsets.keys().filter(|k| *k != "all").collect())
            .unwrap_or_default();
        if !kinds.is_empty() {
            let _ = writeln!(
                s,
                "\nBy onset kind (caught before / median lead s / median delay s):\n"
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
                            "{:.0}% / {} / {}",
                            100.0 * o.caught_before,
                            num(o.median_lead_s, 1),
                            num(o.median_delay_s, 1)
                        )
                    })
                    .collect();
                let _ = writeln!(s, "| {} | {} |", sc.name, cells.join(" | "));
            }
        }
        // Say where the model loses.
        let model = &c.scorers[0];
        let mut losses = Vec::new();
        for b in &c.scorers[1..] {
            for (what, m, o) in [("PR-AUC", model.pr_auc, b.pr_auc), ("F1", model.f1, b.f1)] {
                if b.name == PERSISTENCE && what == "PR-AUC" {
                    continue;
                }
                if o.unwrap_or(0.0) >= m.unwrap_or(0.0) && o.is_some() {
                    losses.push(format!(
                        "{} on {what} ({} vs {})",
                        b.name,
                        num(o, 3),
                        num(m, 3)
                    ));
                }
            }
        }
        if losses.is_empty() {
            let _ = writeln!(s, "\nThe model is above every baseline on PR-AUC and F1.");
        } else {
            let _ = writeln!(s, "\n**The model does not beat:** {}.", losses.join("; "));
        }
        if with_plots {
            let _ = writeln!(s, "\n![PR curves]({})", pr_file(c));
        }
        let _ = writeln!(s);
    }
    if !r.regressors.is_empty() {
        let _ = writeln!(
            s,
            "## Forecasts against persistence\n\nMAE in the target's unit (s, bytes/s); weighted \
             MAPE is sum |error| / sum |actual| (a per-row MAPE explodes on idle rows). \
             Persistence forecasts the value now.\n"
        );
        let _ = writeln!(
            s,
            "| forecast | rows | MAE model | MAE persistence | weighted MAPE model % | weighted MAPE persistence % |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        for g in &r.regressors {
            let _ = writeln!(
                s,
                "| {} | {} | {:.4e} | {:.4e} | {:.1} | {:.1} |",
                g.key, g.rows, g.mae_model, g.mae_persistence, g.mape_model, g.mape_persistence
            );
        }
        let _ = writeln!(s);
    }
    if with_plots {
        let _ = writeln!(s, "![timeline](timeline.svg)\n");
    }
    s
}
