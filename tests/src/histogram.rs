//! One histogram series of a scrape (`NAME_bucket{le}`, `NAME_sum`, `NAME_count`), its
//! OpenMetrics contract (cumulative buckets, a `+Inf` bucket equal to the count), and the
//! differences between two scrapes.
use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq)]
pub struct Hist {
    /// (upper bound, cumulative count), by bound; `+Inf` last when present.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Hist {
    /// The series of histogram `name` whose labels match `filter` (`le` aside). None if the
    /// scrape has no `_count` for it.
    pub fn from_metrics(m: &Metrics, name: &str, filter: &[(&str, &str)]) -> Option<Hist> {
        let count = m.get(&format!("{name}_count"), filter).ok()??;
        let sum = m.get(&format!("{name}_sum"), filter).ok()?.unwrap_or(0.0);
        let mut buckets: Vec<(f64, f64)> = m
            .select(&format!("{name}_bucket"), filter)
            .filter_map(|s| {
                let le = s.labels.get("le")?;
                let b = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((b, s.value))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Hist {
            buckets,
            sum,
            count,
        })
    }

    /// `self - earlier`, bucket by bucket (same bounds expected).
    pub fn minus(&self, earlier: &Hist) -> Hist {
        Hist {
            buckets: self
                .buckets
                .iter()
                .map(|(b, v)| {
                    let e = earlier
                        .buckets
                        .iter()
                        .find(|(eb, _)| eb == b)
                        .map_or(0.0, |x| x.1);
                    (*b, v - e)
                })
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// Mean observation (sum / count); NaN without observations.
    pub fn mean(&self) -> f64 {
        self.sum / self.count
    }

    /// Observations above `bound`: count minus the cumulative count of the largest bucket
    /// bound <= `bound`.
    pub fn count_above(&self, bound: f64) -> f64 {
        let below = self
            .buckets
            .iter()
            .filter(|(b, _)| *b <= bound)
            .map(|x| x.1)
            .next_back()
            .unwrap_or(0.0);
        self.count - below
    }

    /// Observations in `(lo, hi]`, for bucket bounds `lo` and `hi`.
    pub fn count_between(&self, lo: f64, hi: f64) -> f64 {
        let at = |x: f64| {
            self.buckets
                .iter()
                .find(|(b, _)| *b == x)
                .map_or(f64::NAN, |v| v.1)
        };
        at(hi) - at(lo)
    }

    /// The OpenMetrics histogram contract: buckets are cumulative (never decreasing), none
    /// exceeds the count, and a `+Inf` bucket equals the count. Returns what is violated.
    pub fn contract_violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        match self.buckets.last() {
            Some((b, c)) if b.is_infinite() => {
                if *c != self.count {
                    v.push(format!("+Inf bucket {c} != count {}", self.count));
                }
            }
            _ => v.push("no le=\"+Inf\" bucket".to_owned()),
        }
        if let Some(w) = self.buckets.windows(2).find(|w| w[1].1 < w[0].1) {
            v.push(format!(
                "buckets decrease: le={} {} then le={} {}",
                w[0].0, w[0].1, w[1].0, w[1].1
            ));
        }
        if let Some((b, c)) = self.buckets.iter().find(|(_, c)| *c > self.count) {
            v.push(format!(
                "bucket le={b} holds {c}, more than the count {}",
                self.count
            ));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "h_bucket{i=\"x\",le=\"1\"} 2\nh_bucket{i=\"x\",le=\"2\"} 5\n\
                        h_bucket{i=\"x\",le=\"4\"} 9\nh_bucket{i=\"x\",le=\"+Inf\"} 10\n\
                        h_sum{i=\"x\"} 25\nh_count{i=\"x\"} 10\n";

    #[test]
    fn parses_and_checks() {
        let m = Metrics::parse(GOOD).unwrap();
        let h = Hist::from_metrics(&m, "h", &[("i", "x")]).unwrap();
        assert_eq!(h.buckets.len(), 4);
        assert!(
            h.contract_violations().is_empty(),
            "{:?}",
            h.contract_violations()
        );
        assert_eq!(h.mean(), 2.5);
        assert_eq!(h.count_above(2.0), 5.0);
        assert_eq!(h.count_above(0.5), 10.0);
        assert_eq!(h.count_between(2.0, 4.0), 4.0);
        let d = h.minus(&Hist {
            buckets: vec![(1.0, 1.0), (2.0, 1.0), (4.0, 1.0), (f64::INFINITY, 1.0)],
            sum: 5.0,
            count: 1.0,
        });
        assert_eq!(d.count, 9.0);
        assert_eq!(d.buckets[1], (2.0, 4.0));
        assert!(Hist::from_metrics(&m, "h", &[("i", "y")]).is_none());
    }

    #[test]
    fn finds_violations() {
        // Buckets summed twice (cumulative counts accumulated again), no +Inf.
        let m = Metrics::parse(
            "h_bucket{le=\"1\"} 2\nh_bucket{le=\"2\"} 7\nh_bucket{le=\"4\"} 16\n\
             h_sum 25\nh_count 10\n",
        )
        .unwrap();
        let v = Hist::from_metrics(&m, "h", &[])
            .unwrap()
            .contract_violations();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("+Inf"));
        assert!(v[1].contains("more than the count"));
    }
}
