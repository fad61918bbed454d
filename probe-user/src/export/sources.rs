//! The sources' health, and the samples of the sources behind the `collect::sources` seam,
//! which name their own metrics: a new source needs nothing here.
use prometheus_client::encoding::DescriptorEncoder;

use super::family::{counter, gauge, l, Series};
use crate::{
    collect::sources::{Kind, Metric},
    snapshot::Snapshot,
};

pub fn encode(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let r = &s.readings;
    gauge(
        enc,
        "probe_source_up",
        "1 when a source was read this tick, 0 when reading it failed (see the log)",
        r.sources
            .iter()
            .map(|st| (l(&[("source", st.source)]), f64::from(u8::from(st.up)))),
    )?;
    gauge(
        enc,
        "probe_source_duration_seconds",
        "How long reading a source took this tick",
        r.sources
            .iter()
            .map(|st| (l(&[("source", st.source)]), st.seconds)),
    )?;
    // One family per metric, in the order the sources first name them.
    let mut metrics: Vec<&'static Metric> = Vec::new();
    for smp in &r.samples {
        if !metrics.iter().any(|m| std::ptr::eq(*m, smp.metric)) {
            metrics.push(smp.metric);
        }
    }
    for m in metrics {
        let series = r
            .samples
            .iter()
            .filter(|smp| std::ptr::eq(smp.metric, m))
            .map(|smp| -> Series<f64> { (smp.labels.clone(), smp.value) });
        match m.kind {
            Kind::Counter => counter(enc, m.name, m.help, series)?,
            Kind::Gauge => gauge(enc, m.name, m.help, series)?,
        }
    }
    Ok(())
}
