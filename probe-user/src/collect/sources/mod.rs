//! The seam for the sources a tick reads beside the kernel maps (host counter files and the
//! like). A source is one file that reads its values and names the metrics they fill;
//! [`all`] registers it, the collect stage times it and exports whether it worked
//! (`probe_source_up`, `probe_source_duration_seconds`), and the exporter writes its samples
//! without knowing it. docs/architecture.md shows the diff of one.
use std::time::Instant;

use serde::{Serialize, Serializer};

use crate::config::Config;

/// One source of readings.
pub trait Source: Send {
    /// The `source` label of its health metrics.
    fn name(&self) -> &'static str;
    /// Every metric its samples may name (docs/metrics.md is checked against these).
    fn metrics(&self) -> &'static [&'static Metric];
    /// Appends this tick's values to `out`. On an error the source exports nothing this
    /// tick and `probe_source_up{source}` is 0.
    fn read(&mut self, out: &mut Vec<Sample>) -> anyhow::Result<()>;
}

// The sources: a new one is a file beside this one, its `mod` line here and its line in `all`.
mod identity;
mod softnet;

/// Every source, in the order they are read.
pub fn all(cfg: &Config) -> Vec<Box<dyn Source>> {
    vec![
        Box::new(softnet::Softnet::default()),
        Box::new(identity::Identity::new(cfg.training_job.as_deref())),
    ]
}

/// What a metric is; a source declares each as a `static`.
#[derive(Debug, PartialEq)]
pub struct Metric {
    /// The exported name (counters without `_total`: the encoder appends it).
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One value of one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    #[serde(serialize_with = "metric_name")]
    pub metric: &'static Metric,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

fn metric_name<S: Serializer>(m: &&'static Metric, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.name)
}

/// Whether a source worked this tick, and what reading it cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SourceStatus {
    pub source: &'static str,
    pub up: bool,
    pub seconds: f64,
}

/// Reads every source into `samples`, and each one's status into `status`. A failing source
/// is logged when it starts failing and when it recovers, not every tick.
pub fn read_all(
    sources: &mut [Box<dyn Source>],
    failing: &mut Vec<&'static str>,
    samples: &mut Vec<Sample>,
    status: &mut Vec<SourceStatus>,
) {
    for s in sources {
        let t = Instant::now();
        let before = samples.len();
        let result = s.read(samples);
        let name = s.name();
        let up = match result {
            Ok(()) => {
                if let Some(i) = failing.iter().position(|f| *f == name) {
                    failing.swap_remove(i);
                    tracing::info!("source {name} reads again");
                }
                true
            }
            Err(e) => {
                samples.truncate(before);
                if !failing.contains(&name) {
                    failing.push(name);
                    tracing::warn!("source {name} failed: {e:#}; its metrics are left out until it reads again");
                }
                false
            }
        };
        status.push(SourceStatus {
            source: name,
            up,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static GOOD: Metric = Metric {
        name: "probe_test_good",
        help: "a test metric",
        kind: Kind::Gauge,
    };

    struct Flaky(u32);

    impl Source for Flaky {
        fn name(&self) -> &'static str {
            "flaky"
        }

        fn metrics(&self) -> &'static [&'static Metric] {
            static ALL: [&Metric; 1] = [&GOOD];
            &ALL
        }

        fn read(&mut self, out: &mut Vec<Sample>) -> anyhow::Result<()> {
            self.0 += 1;
            out.push(Sample {
                metric: &GOOD,
                labels: vec![],
                value: f64::from(self.0),
            });
            anyhow::ensure!(self.0 % 2 == 1, "every second read fails");
            Ok(())
        }
    }

    #[test]
    fn a_failing_source_is_down_and_leaves_nothing_half_read() {
        let mut sources: Vec<Box<dyn Source>> = vec![Box::new(Flaky(0))];
        let mut failing = Vec::new();
        let (mut samples, mut status) = (Vec::new(), Vec::new());
        read_all(&mut sources, &mut failing, &mut samples, &mut status);
        assert!(status[0].up);
        assert_eq!(samples.len(), 1);
        let (mut samples, mut status) = (Vec::new(), Vec::new());
        read_all(&mut sources, &mut failing, &mut samples, &mut status);
        assert_eq!(status[0].source, "flaky");
        assert!(!status[0].up);
        assert!(samples.is_empty());
        assert_eq!(failing, ["flaky"]);
        read_all(&mut sources, &mut failing, &mut samples, &mut status);
        assert!(failing.is_empty());
    }

    #[test]
    fn every_sample_names_a_metric_its_source_declares() {
        for mut s in all(&Config::default()) {
            let mut samples = Vec::new();
            s.read(&mut samples).unwrap();
            assert!(!samples.is_empty(), "{}", s.name());
            for smp in &samples {
                assert!(
                    s.metrics().iter().any(|m| std::ptr::eq(*m, smp.metric)),
                    "{}: {} is not in its metrics()",
                    s.name(),
                    smp.metric.name
                );
            }
        }
    }
}
