//! What `probe top` reads from `/api/v1/snapshot`: its own view of the JSON, not the daemon's
//! types, so that top works against older and newer daemons. Every field is optional or
//! defaulted, unknown fields are ignored, and a field whose shape changed decodes as absent
//! (shown as "-") instead of failing the whole snapshot.
use std::collections::BTreeMap;

use serde::{de::DeserializeOwned, Deserialize, Deserializer};
use serde_json::Value;

/// The API versions this view was written against (docs/api.md). A daemon that reports a
/// newer one still works; top says so in its header.
pub const KNOWN_API_VERSION: u64 = 1;

/// A field that decodes as `T`, or as `T::default()` when its JSON has another shape.
fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let v = Value::deserialize(d)?;
    Ok(T::deserialize(v).unwrap_or_default())
}

/// A list whose elements that do not decode are skipped (one odd row must not hide the rest).
fn lenient_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let v = Value::deserialize(d)?;
    Ok(match v {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|i| T::deserialize(i).ok())
            .collect(),
        _ => Vec::new(),
    })
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    #[serde(deserialize_with = "lenient")]
    pub api_version: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    pub tick: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    pub time_unix: f64,
    #[serde(deserialize_with = "lenient")]
    pub tick_seconds: Option<f64>,
    #[serde(deserialize_with = "lenient_vec")]
    pub interfaces: Vec<String>,
    #[serde(deserialize_with = "lenient_vec")]
    pub flows: Vec<Flow>,
    #[serde(deserialize_with = "lenient_vec")]
    pub peers: Vec<Peer>,
    #[serde(deserialize_with = "lenient")]
    pub flows_tracked: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    pub flow_evictions: Option<u64>,
    #[serde(deserialize_with = "lenient_vec")]
    pub programs: Vec<Program>,
    #[serde(deserialize_with = "lenient_vec")]
    pub hooks: Vec<Hook>,
    #[serde(deserialize_with = "lenient_vec")]
    pub bursts: Vec<Bursts>,
    #[serde(deserialize_with = "lenient_vec")]
    pub qdiscs: Vec<Qdisc>,
    #[serde(deserialize_with = "lenient_vec")]
    pub sojourn: Vec<Sojourn>,
    #[serde(deserialize_with = "lenient_vec")]
    pub drops: Vec<Drop>,
    #[serde(deserialize_with = "lenient_vec")]
    pub links: Vec<Link>,
    #[serde(deserialize_with = "lenient_vec")]
    pub map_full: Vec<MapFull>,
    #[serde(deserialize_with = "lenient")]
    pub peers_folded: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    pub rdma: Option<Rdma>,
    #[serde(deserialize_with = "lenient")]
    pub events_lost: Option<u64>,
    #[serde(deserialize_with = "lenient_vec")]
    pub observations: Vec<Row>,
    #[serde(deserialize_with = "lenient_vec")]
    pub features: Vec<Row>,
    #[serde(deserialize_with = "lenient_vec")]
    pub forecasts: Vec<Forecast>,
    /// How long each stage of the daemon's last tick took.
    #[serde(deserialize_with = "lenient_vec")]
    pub stages: Vec<Stage>,
    /// The daemon's own resource use (proposed; absent from today's daemons).
    #[serde(deserialize_with = "lenient")]
    pub process: Option<Process>,
    /// The host's view of its training job (`--job-model`); absent without job peers.
    #[serde(deserialize_with = "lenient")]
    pub job: Option<Job>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Job {
    pub peers: u64,
    pub warning_score: Option<f64>,
    pub warning_threshold: Option<f64>,
    /// (direction, score), as the API serializes the pairs.
    pub direction_score: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Flow {
    pub iface: String,
    pub direction: String,
    pub peer: String,
    pub bytes: u64,
    pub packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Peer {
    pub peer: String,
    pub srtt_seconds: Option<f64>,
    pub min_rtt_seconds: Option<f64>,
    pub connections: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    pub rtt: Histogram,
    pub retransmits: Option<u64>,
}

/// A cumulative histogram: (upper bound, samples <= bound).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// The samples added since `before`; None when the bounds differ or a count went back
    /// (the daemon restarted).
    pub fn since(&self, before: &Histogram) -> Option<Histogram> {
        if self.buckets.len() != before.buckets.len() || self.count < before.count {
            return None;
        }
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (a, b) in self.buckets.iter().zip(&before.buckets) {
            buckets.push((a.0, a.1.checked_sub(b.1)?));
        }
        Some(Histogram {
            buckets,
            sum: (self.sum - before.sum).max(0.0),
            count: self.count - before.count,
        })
    }

    /// The upper bound of the bucket holding quantile `q` (log2 buckets: within 2x).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q * self.count as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank)
            .map(|(le, _)| *le)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Program {
    pub program: String,
    pub run_seconds: f64,
    pub runs: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Hook {
    pub hook: String,
    pub attached: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Bursts {
    pub iface: String,
    pub direction: String,
    pub peer: String,
    pub count: u64,
    #[serde(deserialize_with = "lenient")]
    pub bytes: Histogram,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Qdisc {
    pub iface: String,
    pub kind: String,
    pub handle: String,
    pub parent: String,
    pub backlog_packets: u64,
    pub backlog_bytes: u64,
    pub drops: u64,
    pub sent_bytes: u64,
}

impl Qdisc {
    /// The entity name observations use for a qdisc.
    pub fn entity(&self) -> String {
        format!("{}/{}/{}", self.iface, self.kind, self.handle)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Sojourn {
    pub iface: String,
    #[serde(deserialize_with = "lenient")]
    pub seconds: Histogram,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Drop {
    pub reason: String,
    pub packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Link {
    pub iface: String,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MapFull {
    pub map: String,
    pub inserts_refused: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Rdma {
    #[serde(deserialize_with = "lenient_vec")]
    pub ports: Vec<RdmaPort>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    pub state: Option<String>,
    /// Per-second rates keyed by counter name (`transmit_bytes`, `cnp_sent`, ...).
    #[serde(deserialize_with = "lenient")]
    pub rates: BTreeMap<String, f64>,
}

/// One entity's row of `observations` or `features`: the kind and name, and every other
/// field by name. Kept as JSON values so that a field added by a newer daemon is readable
/// without a new release of top.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Row {
    pub entity_kind: String,
    pub entity: String,
    /// Features nest their values under `values`; observations have them at the top level.
    #[serde(deserialize_with = "lenient")]
    pub values: BTreeMap<String, Value>,
    #[serde(flatten)]
    pub fields: BTreeMap<String, Value>,
}

impl Row {
    /// A numeric field, looked up first among `values`, then at the top level; None for null,
    /// absent, or not a finite number.
    pub fn num(&self, name: &str) -> Option<f64> {
        self.values
            .get(name)
            .or_else(|| self.fields.get(name))
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite())
    }

    /// Every finite numeric value among `values` (a feature row's features).
    pub fn numbers(&self) -> impl Iterator<Item = (&str, f64)> {
        self.values
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_f64().filter(|x| x.is_finite())?)))
    }
}

/// One forecast of the spike model (proposed shape, docs/api.md): for an entity, the
/// probability of a spike of `target` within `horizon_s`, and the RTT it expects.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Forecast {
    pub entity_kind: String,
    pub entity: String,
    pub target: String,
    pub horizon_s: Option<f64>,
    #[serde(alias = "probability")]
    pub spike_probability: Option<f64>,
    /// The probability at and above which the model alarms.
    pub threshold: Option<f64>,
    /// Whether the model's alarm is up (its threshold held for its rule's ticks); absent
    /// from daemons before the alarm rule, which alarmed at the threshold.
    #[serde(default)]
    pub alarm: Option<bool>,
    pub rtt_forecast_s: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Stage {
    pub stage: String,
    pub seconds: f64,
}

/// The daemon's resource use, if it reports it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Process {
    pub cpu_seconds: Option<f64>,
    pub rss_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_object_is_a_snapshot() {
        let s: Snapshot = serde_json::from_str("{}").unwrap();
        assert!(s.tick.is_none() && s.peers.is_empty() && s.rdma.is_none());
    }

    /// An older daemon (no tick, observations, features) and a newer one (unknown fields, a
    /// field whose shape changed, an odd row) both decode.
    #[test]
    fn tolerant_of_missing_unknown_and_reshaped_fields() {
        let s: Snapshot = serde_json::from_value(serde_json::json!({
            "time_unix": 10.5,
            "peers": [
                {"peer": "10.0.0.2", "srtt_seconds": 0.002, "retransmits": 3, "new": [1]},
                {"peer": 7},
            ],
            "rdma": "not an object any more",
            "events_lost": {"total": 1},
            "whatever": true,
            "observations": [
                {"entity_kind": "peer", "entity": "10.0.0.2", "tx_bytes_per_s": 5.0,
                 "rtt_p99_s": null, "brand_new_per_s": 2.5}
            ],
            "features": [
                {"time_unix": 1.0, "entity_kind": "peer", "entity": "10.0.0.2",
                 "values": {"iteration_period_s": 0.25, "nan": null}}
            ]
        }))
        .unwrap();
        assert_eq!(s.time_unix, 10.5);
        assert_eq!(
            s.peers.len(),
            1,
            "the peer without a string name is skipped"
        );
        assert_eq!(s.peers[0].retransmits, Some(3));
        assert!(s.rdma.is_none() && s.events_lost.is_none());
        let o = &s.observations[0];
        assert_eq!(o.num("tx_bytes_per_s"), Some(5.0));
        assert_eq!(o.num("brand_new_per_s"), Some(2.5));
        assert_eq!(o.num("rtt_p99_s"), None);
        let f = &s.features[0];
        assert_eq!(f.num("iteration_period_s"), Some(0.25));
        assert_eq!(f.numbers().count(), 1);
    }

    #[test]
    fn histogram_deltas_and_quantiles() {
        let h = |b: [u64; 3]| Histogram {
            buckets: vec![(1.0, b[0]), (2.0, b[1]), (4.0, b[2])],
            sum: 0.0,
            count: b[2],
        };
        let d = h([1, 5, 10]).since(&h([1, 1, 2])).unwrap();
        assert_eq!(d.count, 8);
        assert_eq!(d.quantile(0.5), Some(2.0));
        assert_eq!(d.quantile(0.99), Some(4.0));
        assert!(h([0, 0, 1]).since(&h([1, 1, 2])).is_none(), "restart");
        assert_eq!(Histogram::default().quantile(0.5), None);
    }
}
