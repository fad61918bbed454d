//! Train / validation / test by time: whole recordings in the order they started, or, for
//! a single recording, its timeline cut in three with a gap before each cut, so that no
//! row's label looks into the next part.
use std::collections::BTreeMap;

use crate::dataset::table::FeatureTable;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Train,
    Valid,
    Test,
    /// In none: within the longest label horizon before a cut of a single recording.
    Gap,
}

/// The part of every row of `t`, and a one-line description of the split. `gap_s`: the
/// longest label horizon (a single recording's rows that close to a cut are left out).
pub fn split(t: &FeatureTable, holdout: f64, gap_s: f64) -> (Vec<Part>, String) {
    let mut start: BTreeMap<&str, f64> = BTreeMap::new();
    for (r, &time) in t.recording.iter().zip(&t.time_unix) {
        let s = start.entry(r.as_str()).or_insert(time);
        *s = s.min(time);
    }
    let mut recs: Vec<(&str, f64)> = start.into_iter().collect();
    recs.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)));
    let n = recs.len();
    if n >= 3 {
        let k = ((n as f64 * holdout).round() as usize).clamp(1, (n - 1) / 2);
        let part_of: BTreeMap<&str, Part> = recs
            .iter()
            .enumerate()
            .map(|(i, (r, _))| {
                let p = if i < n - 2 * k {
                    Part::Train
                } else if i < n - k {
                    Part::Valid
                } else {
                    Part::Test
                };
                (*r, p)
            })
            .collect();
        let parts = t.recording.iter().map(|r| part_of[r.as_str()]).collect();
        let desc = format!(
            "by recording, in start order: {} train, {k} validation, {k} test",
            n - 2 * k
        );
        return (parts, desc);
    }
    // Too few recordings: cut the timeline.
    let (lo, hi) = t
        .time_unix
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let h = holdout.clamp(0.05, 0.4);
    let (v0, t0) = (lo + (hi - lo) * (1.0 - 2.0 * h), lo + (hi - lo) * (1.0 - h));
    let parts = t
        .time_unix
        .iter()
        .map(|&x| {
            if x < v0 - gap_s {
                Part::Train
            } else if x < v0 {
                Part::Gap
            } else if x < t0 - gap_s {
                Part::Valid
            } else if x < t0 {
                Part::Gap
            } else {
                Part::Test
            }
        })
        .collect();
    let desc = format!(
        "by time ({n} recording(s)): the first {:.0}% train, then {:.0}% validation, the last {:.0}% test, less {gap_s} s before each cut",
        100.0 * (1.0 - 2.0 * h),
        100.0 * h,
        100.0 * h
    );
    (parts, desc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(recs: &[(&str, f64)]) -> FeatureTable {
        FeatureTable {
            recording: recs.iter().map(|r| r.0.to_owned()).collect(),
            time_unix: recs.iter().map(|r| r.1).collect(),
            ..FeatureTable::default()
        }
    }

    #[test]
    fn recordings_split_in_start_order_never_shuffled() {
        // Names sort the other way round from start times: the split follows time.
        let t = table(&[
            ("e", 100.0),
            ("d", 200.0),
            ("c", 300.0),
            ("b", 400.0),
            ("a", 500.0),
            ("a", 501.0),
        ]);
        let (p, _) = split(&t, 0.2, 5.0);
        use Part::*;
        assert_eq!(p, vec![Train, Train, Train, Valid, Test, Test]);
    }

    #[test]
    fn one_recording_splits_by_time() {
        let t = table(&(0..100).map(|i| ("x", i as f64)).collect::<Vec<_>>());
        let (p, _) = split(&t, 0.15, 0.0);
        assert_eq!(p[0], Part::Train);
        assert_eq!(p[69], Part::Train);
        assert_eq!(p[72], Part::Valid);
        assert_eq!(p[99], Part::Test);
        // Monotone in time: train, then validation, then test.
        assert!(p.windows(2).all(|w| (w[0] as u8) <= (w[1] as u8)));
        // With a 5 s horizon, the 5 s before each cut (69.3 and 84.15) are in no part.
        let (p, _) = split(&t, 0.15, 5.0);
        assert_eq!(p[64], Part::Train);
        assert!((65..70).all(|i| p[i] == Part::Gap), "{:?}", &p[60..90]);
        assert_eq!(p[70], Part::Valid);
        assert_eq!(p[79], Part::Valid);
        assert!((80..85).all(|i| p[i] == Part::Gap));
        assert_eq!(p[85], Part::Test);
    }
}
