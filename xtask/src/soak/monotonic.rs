//! Counters on /metrics must never go backwards within one daemon lifetime: the `_total`
//! samples of `# TYPE x counter` families, and a histogram's `_bucket` and `_count`.
use probe_tests::Metrics;
use std::collections::HashMap;

#[derive(Default)]
pub struct Monotonic {
    /// Values in the previous scrape of this lifetime.
    prev: HashMap<String, f64>,
    /// Highest value each series has had in this lifetime.
    high: HashMap<String, f64>,
    /// Counter samples compared.
    pub checked: u64,
    /// Decreases between two consecutive scrapes: (series, before, after).
    pub backwards: Vec<(String, f64, f64)>,
    /// Series that vanished and came back below their earlier value (a reset, to Prometheus).
    pub reappeared_lower: Vec<(String, f64, f64)>,
}

/// Whether `sample` is monotonic by its family's `# TYPE`.
fn monotonic(m: &Metrics, sample: &str) -> bool {
    let family_is = |suffix: &str, kind: &str| {
        sample
            .strip_suffix(suffix)
            .is_some_and(|f| m.types.get(f).is_some_and(|t| t == kind))
    };
    family_is("_total", "counter")
        || family_is("_bucket", "histogram")
        || family_is("_count", "histogram")
}

pub fn series_key(name: &str, labels: &std::collections::BTreeMap<String, String>) -> String {
    let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", l.join(","))
}

impl Monotonic {
    /// A new daemon lifetime: counters start again.
    pub fn restart(&mut self) {
        self.prev.clear();
        self.high.clear();
    }

    pub fn observe(&mut self, m: &Metrics) {
        let mut now = HashMap::with_capacity(self.prev.len());
        for s in &m.samples {
            if !monotonic(m, &s.name) {
                continue;
            }
            let key = series_key(&s.name, &s.labels);
            self.checked += 1;
            // Float counters (seconds) are sums of non-negative terms: any drop is real, but
            // leave room for the last digit of their text form.
            let lower = |before: f64| s.value < before - before.abs() * 1e-12;
            match self.prev.get(&key) {
                Some(&before) if lower(before) => {
                    self.backwards.push((key.clone(), before, s.value));
                }
                Some(_) => {}
                None => {
                    if let Some(&high) = self.high.get(&key) {
                        if lower(high) {
                            self.reappeared_lower.push((key.clone(), high, s.value));
                        }
                    }
                }
            }
            let h = self.high.entry(key.clone()).or_insert(s.value);
            *h = h.max(s.value);
            now.insert(key, s.value);
        }
        self.prev = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_only_and_backwards_found() {
        let scrape = |v: u32, g: u32| {
            Metrics::parse(&format!(
                "# TYPE a counter\na_total{{x=\"1\"}} {v}\n# TYPE g gauge\ng {g}\n\
                 # TYPE h histogram\nh_bucket{{le=\"1\"}} {v}\nh_count {v}\nh_sum 0.5\n"
            ))
            .unwrap()
        };
        let mut m = Monotonic::default();
        m.observe(&scrape(5, 9));
        m.observe(&scrape(7, 1));
        assert!(m.backwards.is_empty());
        assert_eq!(m.checked, 6);
        m.observe(&scrape(6, 1));
        assert_eq!(m.backwards.len(), 3, "{:?}", m.backwards);
        assert_eq!(m.backwards[0], ("a_total{x=\"1\"}".into(), 7.0, 6.0));
        m.restart();
        m.observe(&scrape(1, 1));
        assert_eq!(m.backwards.len(), 3);
        // Gone for a scrape, back lower.
        m.observe(&Metrics::parse("# TYPE a counter\n").unwrap());
        m.observe(&scrape(0, 1));
        assert_eq!(m.reappeared_lower.len(), 3);
    }
}
