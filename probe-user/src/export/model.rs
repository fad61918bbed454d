//! The spike model's output as series: spike probabilities and forecasts per peer and
//! interface, what model is loaded, and what scoring costs. Peers follow the top-K fold
//! like every other peer series (folded peers are scored; their scores stay in the JSON).
use std::collections::HashSet;

use prometheus_client::encoding::DescriptorEncoder;

use super::family::{gauge, l};
use crate::{
    model::score::Forecast,
    observe::{INTERFACE, PEER},
    snapshot::Snapshot,
};

/// The entity label of a scored entity, None for a peer without its own series.
fn entity<'a>(f: &'a Forecast, members: &HashSet<&str>) -> Option<(&'static str, &'a str)> {
    match f.entity_kind {
        PEER if members.contains(&*f.entity) => Some(("peer", &f.entity)),
        INTERFACE => Some(("iface", &f.entity)),
        _ => None,
    }
}

fn horizon(f: &Forecast) -> String {
    crate::features::schema::label(std::time::Duration::from_secs_f64(f.horizon_s))
}

pub fn encode(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    gauge(
        enc,
        "probe_model_info",
        "The spike model that scores (always 1): its name, what it was trained on, how many features it reads",
        s.model.iter().map(|m| {
            let n = m.features.to_string();
            (
                l(&[
                    ("model", &m.model),
                    ("trained_on", &m.trained_on),
                    ("features", &n),
                ]),
                1.0,
            )
        }),
    )?;
    gauge(
        enc,
        "probe_model_scored_entities",
        "Entities the spike model scored at the last tick (its cost is probe_tick_stage_seconds_total{stage=\"model\"})",
        s.model.iter().map(|_| (vec![], s.model_entities as f64)),
    )?;
    let members = super::features::members(s);
    let series = |pick: fn(&Forecast) -> Option<f64>, with_target: bool| {
        let members = &members;
        s.forecasts.iter().filter_map(move |f| {
            let v = pick(f)?;
            let (k, e) = entity(f, members)?;
            let h = horizon(f);
            let mut labels = l(&[(k, e), ("horizon", &h)]);
            if with_target {
                labels.push(("target", f.target.to_string()));
            }
            Some((labels, v))
        })
    };
    gauge(
        enc,
        "probe_spike_probability",
        "The model's probability that the target's event (rtt_spike, retrans_storm, iteration_slowdown, queue_overflow) starts within the horizon",
        series(|f| f.spike_probability, true),
    )?;
    gauge(
        enc,
        "probe_spike_threshold",
        "The probability the model alarms at, once held for its rule's ticks (chosen on validation under the alarm budget)",
        series(|f| f.threshold, true),
    )?;
    gauge(
        enc,
        "probe_spike_alarm",
        "1 while the model alarms: its probability at or above its threshold for its rule's ticks in a row",
        series(|f| f.alarm.map(|a| f64::from(u8::from(a))), true),
    )?;
    gauge(
        enc,
        "probe_rtt_forecast_seconds",
        "The RTT p99 the model expects toward the peer at the horizon",
        series(|f| f.rtt_forecast_s, false),
    )?;
    gauge(
        enc,
        "probe_throughput_forecast_bytes_per_second",
        "The bytes per second (both directions) the model expects at the horizon",
        series(|f| f.throughput_forecast_bytes_per_s, false),
    )?;
    job(s, enc)
}

/// The job's early warning (`--job-model`): this host's score, its threshold, and the
/// job's slowdown probability per horizon; nothing while the host has no job peer.
fn job(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let j = s.job.as_ref();
    gauge(
        enc,
        "probe_job_warning_score",
        "The job warning's score of this host: how likely an episode that slows the training job is building here (ProbeJobSlowdownForecast fires when one host's stands out)",
        j.and_then(|j| j.warning_score).map(|v| (vec![], v)),
    )?;
    gauge(
        enc,
        "probe_job_warning_threshold",
        "The score the warning holds a host against (chosen in training for 1 false warning per calm job-hour)",
        j.and_then(|j| j.warning_threshold).map(|v| (vec![], v)),
    )?;
    gauge(
        enc,
        "probe_job_warning_direction_score",
        "Per direction (egress, ingress, compute), how likely an episode building on this host has it; the warning is named with the highest",
        j.into_iter().flat_map(|j| {
            j.direction_score
                .iter()
                .map(|(d, p)| (l(&[("direction", d)]), *p))
        }),
    )?;
    gauge(
        enc,
        "probe_job_slowdown_probability",
        "The model's probability that the training job's iteration slows >= 1.2x within the horizon, from this host's view",
        j.into_iter().flat_map(|j| {
            j.slowdown_probability
                .iter()
                .map(|(h, p)| (l(&[("horizon", h)]), *p))
        }),
    )?;
    gauge(
        enc,
        "probe_job_peers",
        "Peers this host exchanges the job's traffic with this tick (those with one of its sockets)",
        j.map(|j| (vec![], j.peers as f64)),
    )
}
