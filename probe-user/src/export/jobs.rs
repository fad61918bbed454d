//! The training jobs whose connections this host's sockets carry (collect/jobs.rs): what
//! the job rules join each host's per-peer series to a job by (rules/job.rules.yml). One
//! series per job and rank, per address and per peer: bounded by `jobs.max_jobs` times the
//! peers with their own series (docs/metrics.md).
use prometheus_client::encoding::DescriptorEncoder;

use super::family::{gauge, l};
use crate::snapshot::{JobPeer, Snapshot};

pub fn encode(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let jobs = &s.readings.jobs;
    gauge(
        enc,
        "probe_job_info",
        "Always 1: a training job with established connections on this host, its rank here (empty if its layout names none) and how it was found (kubernetes, slurm, pattern, flag)",
        jobs.iter().flat_map(|j| {
            let ranks: Vec<&str> = if j.ranks.is_empty() {
                vec![""]
            } else {
                j.ranks.iter().map(String::as_str).collect()
            };
            ranks.into_iter().map(move |r| {
                (
                    l(&[("training_job", &j.name), ("rank", r), ("source", j.source)]),
                    1.0,
                )
            })
        }),
    )?;
    gauge(
        enc,
        "probe_job_address_info",
        "Always 1: a local address of a training job's established sockets, as other hosts' probes name it in their peer label",
        jobs.iter().flat_map(|j| {
            j.addresses
                .iter()
                .map(|a| (l(&[("training_job", &j.name), ("address", a)]), 1.0))
        }),
    )?;
    // One series per (job, peer), valued by `v`.
    let per_peer = |v: fn(&JobPeer) -> f64| {
        jobs.iter().flat_map(move |j| {
            j.peers
                .iter()
                .map(move |p| (l(&[("training_job", &j.name), ("peer", &p.peer)]), v(p)))
        })
    };
    for (name, help, v) in [
        (
            "probe_job_peer_info",
            "Always 1: a peer a training job's sockets have established connections with",
            (|_| 1.0) as fn(&JobPeer) -> f64,
        ),
        (
            "probe_job_connections",
            "Established TCP connections of a training job's sockets to a peer (sock_diag)",
            |p| f64::from(p.connections),
        ),
        (
            "probe_job_receive_queue_bytes",
            "Bytes a training job's sockets received from a peer and have not read yet (ss Recv-Q)",
            |p| p.receive_queue_bytes as f64,
        ),
        (
            "probe_job_send_queue_bytes",
            "Bytes a training job's sockets wrote to a peer that it has not acknowledged yet (ss Send-Q)",
            |p| p.send_queue_bytes as f64,
        ),
    ] {
        gauge(enc, name, help, per_peer(v))?;
    }
    gauge(
        enc,
        "probe_jobs_folded",
        "Training jobs past jobs.max_jobs at the last socket dump: their sockets are no job's",
        [(vec![], s.readings.jobs_folded as f64)],
    )
}
