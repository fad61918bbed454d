//! Exactness: every fixture model scored on every test row must match LightGBM's own
//! `predict(raw_score=True)` and `predict` outputs (recorded by gen_fixtures.py).

use super::common::*;
use crate::model::lgbm::{Booster, Objective};

fn check(name: &str, rows: &[Vec<f64>]) -> Booster {
    let booster = Booster::parse(&read_fixture(&format!("{name}.txt")))
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let want = expected(name);
    assert!(!want.is_empty() && want.len() <= rows.len());
    let (mut max_raw, mut max_pred, mut bit_exact) = (0.0f64, 0.0f64, 0usize);
    for (i, (row, &(raw, pred))) in rows.iter().zip(&want).enumerate() {
        let got_raw = booster.raw_score(row);
        let got_pred = booster.predict(row);
        let (d_raw, d_pred) = ((got_raw - raw).abs(), (got_pred - pred).abs());
        assert!(
            d_raw < 1e-9 && d_pred < 1e-9,
            "{name} row {i}: raw {got_raw:e} vs lightgbm {raw:e}, pred {got_pred:e} vs lightgbm {pred:e}"
        );
        max_raw = max_raw.max(d_raw);
        max_pred = max_pred.max(d_pred);
        bit_exact +=
            usize::from(got_raw.to_bits() == raw.to_bits() && got_pred.to_bits() == pred.to_bits());
    }
    // All rows at once (the model stage's way), with a row too short among them: each
    // score is the one of its row alone, to the bit, and the short row's is NaN.
    let short = vec![0.0; booster.num_features().saturating_sub(1)];
    let mut batch: Vec<&[f64]> = rows.iter().map(Vec::as_slice).collect();
    batch.insert(rows.len() / 2, &short);
    let mut got = vec![0.0; batch.len()];
    booster.predict_many(&batch, &mut got);
    for (i, (x, p)) in batch.iter().zip(&got).enumerate() {
        assert_eq!(
            p.to_bits(),
            booster.predict(x).to_bits(),
            "{name}: row {i} of {} scored together",
            batch.len()
        );
    }
    assert!(booster.num_features() == 0 || got[rows.len() / 2].is_nan());
    println!(
        "{name:<18} trees {:>3}  rows {:>4}  max|raw diff| {max_raw:e}  max|pred diff| {max_pred:e}  bit-identical rows {bit_exact}/{}",
        booster.num_trees(),
        want.len(),
        want.len()
    );
    booster
}

#[test]
fn generated_rows_match_python() {
    assert_eq!(fnv1a(&numeric_rows()), recorded_digest("rows"));
    assert_eq!(
        fnv1a(&categorical_rows()),
        recorded_digest("rows_categorical")
    );
}

#[test]
fn all_fixtures_match_lightgbm() {
    let rows = numeric_rows();
    assert_eq!(
        fnv1a(&rows),
        recorded_digest("rows"),
        "row generator diverged"
    );
    let a = check("a_binary", &rows);
    assert_eq!(a.num_features(), 60);
    assert_eq!(a.num_trees(), 50);
    assert_eq!(a.objective, Objective::Binary { sigmoid: 1.0 });
    assert_eq!(a.feature_names[59], "Column_59");
    let b = check("b_regression", &rows);
    assert_eq!(b.objective, Objective::Regression);
    check("c_zero_as_missing", &rows);
    check("d_single_leaf", &rows);
    let f = check("f_rf", &rows);
    assert!(f.average_output);
    assert_eq!(
        check("g_regression_sqrt", &rows).objective,
        Objective::RegressionSqrt
    );
    assert_eq!(check("h_poisson", &rows).objective, Objective::Exp);
    let cat_rows = categorical_rows();
    assert_eq!(fnv1a(&cat_rows), recorded_digest("rows_categorical"));
    check("e_categorical", &cat_rows);
}

/// Decision types present in a model file.
fn decision_types(text: &str) -> std::collections::BTreeSet<i32> {
    text.lines()
        .filter_map(|l| l.strip_prefix("decision_type="))
        .flat_map(|l| l.split(' ').filter(|t| !t.is_empty()))
        .map(|t| t.parse().unwrap())
        .collect()
}

/// Guard against regenerated fixtures silently losing coverage.
#[test]
fn fixtures_exercise_every_feature() {
    // missing type None (0) and NaN (2) with both default directions
    let a = decision_types(&read_fixture("a_binary.txt"));
    assert!(a.contains(&2) && a.contains(&8) && a.contains(&10), "{a:?}");
    // missing type Zero (1) with both default directions
    let c = decision_types(&read_fixture("c_zero_as_missing.txt"));
    assert!(c.contains(&4) && c.contains(&6), "{c:?}");
    // categorical splits
    let e = decision_types(&read_fixture("e_categorical.txt"));
    assert!(e.iter().any(|d| d & 1 == 1), "{e:?}");
    assert!(read_fixture("d_single_leaf.txt").contains("Tree=0\nnum_leaves=1\n"));
    assert!(read_fixture("f_rf.txt").contains("\naverage_output\n"));
}
