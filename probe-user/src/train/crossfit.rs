//! Cross-fitting of the spike classifiers: the training and validation recordings are dealt
//! into FOLDS folds; each fold is scored by a model fitted on the others, and those
//! out-of-fold scores stand for validation (calibration, threshold and hold), while the
//! model that ships is fitted on all of them. A validation split of two or three recordings
//! holds a few dozen onsets: thresholds chosen on it missed most held-out onsets.
use std::collections::BTreeMap;

use super::split::Part;
use crate::dataset::table::FeatureTable;

/// Folds of the cross-fit (also the fewest recordings it needs).
pub const FOLDS: usize = 4;

/// The fold of each training or validation recording, dealt in start order (so each fold
/// holds early and late runs alike); None with fewer than FOLDS such recordings.
pub fn folds(t: &FeatureTable, parts: &[Part]) -> Option<BTreeMap<String, usize>> {
    let mut start: BTreeMap<&str, f64> = BTreeMap::new();
    for ((rec, &time), part) in t.recording.iter().zip(&t.time_unix).zip(parts) {
        if matches!(part, Part::Train | Part::Valid) {
            let s = start.entry(rec.as_str()).or_insert(time);
            *s = s.min(time);
        }
    }
    if start.len() < FOLDS {
        return None;
    }
    let mut recs: Vec<(&str, f64)> = start.into_iter().collect();
    recs.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)));
    Some(
        recs.into_iter()
            .enumerate()
            .map(|(i, (r, _))| (r.to_owned(), i % FOLDS))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(recs: &[(&str, f64)]) -> FeatureTable {
        let mut t = FeatureTable::default();
        for (r, time) in recs {
            t.recording.push((*r).to_owned());
            t.time_unix.push(*time);
            t.entity_kind.push("peer".to_owned());
            t.entity.push("p".to_owned());
        }
        t
    }

    #[test]
    fn recordings_are_dealt_in_start_order_and_test_ones_left_out() {
        let t = table(&[
            ("e", 5.0),
            ("a", 1.0),
            ("b", 2.0),
            ("c", 3.0),
            ("d", 4.0),
            ("t", 6.0),
        ]);
        let mut parts = vec![Part::Train; 6];
        parts[5] = Part::Test;
        let f = folds(&t, &parts).unwrap();
        let got: Vec<(&str, usize)> = f.iter().map(|(r, i)| (r.as_str(), *i)).collect();
        assert_eq!(got, [("a", 0), ("b", 1), ("c", 2), ("d", 3), ("e", 0)]);
        // Three recordings are too few.
        assert!(folds(
            &t,
            &[
                Part::Train,
                Part::Train,
                Part::Valid,
                Part::Test,
                Part::Test,
                Part::Test
            ]
        )
        .is_none());
    }
}
