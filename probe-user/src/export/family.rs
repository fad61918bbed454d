//! Metric families from (labels, value) series: the one way export/ writes a counter or a
//! gauge (metrics, features, model all use it).
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeCounterValue, MetricEncoder, NoLabelSet},
    metrics::MetricType,
};

pub type Series<V> = (Vec<(&'static str, String)>, V);

/// A metric family from (labels, value) pairs. A series without labels is written bare
/// (`name 1`, not `name{} 1`).
fn family<V>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    series: impl IntoIterator<Item = Series<V>>,
    mut write: impl FnMut(&mut MetricEncoder<'_>, &V) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, metric_type)?;
    for (labels, v) in series {
        if labels.is_empty() {
            write(&mut m, &v)?;
        } else {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            write(&mut m.encode_family(&labels)?, &v)?;
        }
    }
    Ok(())
}

pub fn counter<V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = Series<V>>,
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Counter, series, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

pub fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = Series<f64>>,
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Gauge, series, |m, v| {
        m.encode_gauge(v)
    })
}

pub fn l(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}
