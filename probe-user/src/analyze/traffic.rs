//! Who talks to whom: bytes per peer and direction over the recording (the host's row of
//! the job's traffic matrix), which peers carry the job, and the matrix across hosts when
//! several hosts' recordings of one job are given.
use std::collections::BTreeMap;

use serde::Serialize;

use super::load::Recording;
use crate::{observe::PEER, stats::median};

#[derive(Clone, Debug, Serialize)]
pub struct PeerTraffic {
    pub peer: String,
    /// Bytes sent to the peer over the recording (TC counters of the monitored interfaces).
    pub tx_bytes: f64,
    pub rx_bytes: f64,
    /// Share of all the host's peer bytes, both directions.
    pub share: f64,
    /// Median bytes per second over the ticks the peer was seen: robust to cross traffic
    /// that only runs for part of the recording.
    pub tx_typical: f64,
    pub rx_typical: f64,
    /// "sends", "receives" or "both".
    pub direction: &'static str,
    /// Whether the peer carries the job's traffic: a candidate by its rate whose bursts repeat
    /// with a period (set by `mark_job`).
    pub job: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Matrix {
    /// By bytes, most first; peers that exchanged nothing are left out.
    pub peers: Vec<PeerTraffic>,
    pub total_bytes: f64,
}

/// A peer may carry the job if its typical rate is at least this share of the busiest peer's
/// (whether it does is decided by the periodicity of its bursts, in `timing`).
const JOB_SHARE: f64 = 0.02;
/// ... and at least this many bytes per second (ND, ARP and mDNS stay out).
const JOB_MIN_RATE: f64 = 10_000.0;

pub fn matrix(rec: &Recording) -> Matrix {
    #[derive(Default)]
    struct Acc {
        tx: f64,
        rx: f64,
        tx_rates: Vec<f64>,
        rx_rates: Vec<f64>,
    }
    let mut acc: BTreeMap<&str, Acc> = BTreeMap::new();
    for o in rec.obs.iter().filter(|o| o.entity_kind == PEER) {
        if o.entity == "other" {
            continue;
        }
        let (Some(tx), Some(rx)) = (o.tx_bytes_per_s, o.rx_bytes_per_s) else {
            continue;
        };
        let a = acc.entry(o.entity.as_str()).or_default();
        a.tx += tx * o.interval_s;
        a.rx += rx * o.interval_s;
        a.tx_rates.push(tx);
        a.rx_rates.push(rx);
    }
    let total: f64 = acc.values().map(|a| a.tx + a.rx).sum();
    let mut peers: Vec<PeerTraffic> = acc
        .into_iter()
        .filter(|(_, a)| a.tx + a.rx > 0.0)
        .map(|(p, mut a)| {
            let direction = if a.tx > 4.0 * a.rx {
                "sends"
            } else if a.rx > 4.0 * a.tx {
                "receives"
            } else {
                "both"
            };
            PeerTraffic {
                peer: p.to_owned(),
                tx_bytes: a.tx,
                rx_bytes: a.rx,
                share: if total > 0.0 {
                    (a.tx + a.rx) / total
                } else {
                    0.0
                },
                tx_typical: median(&mut a.tx_rates).unwrap_or(0.0),
                rx_typical: median(&mut a.rx_rates).unwrap_or(0.0),
                direction,
                job: false,
            }
        })
        .collect();
    let busiest = peers
        .iter()
        .map(|p| p.tx_typical + p.rx_typical)
        .fold(0.0, f64::max);
    for p in &mut peers {
        let typical = p.tx_typical + p.rx_typical;
        p.job = typical >= JOB_SHARE * busiest && typical >= JOB_MIN_RATE;
    }
    peers.sort_by(|a, b| (b.tx_bytes + b.rx_bytes).total_cmp(&(a.tx_bytes + a.rx_bytes)));
    Matrix {
        peers,
        total_bytes: total,
    }
}

impl Matrix {
    /// Peers busy enough to carry the job.
    pub fn candidates(&self) -> Vec<String> {
        self.peers
            .iter()
            .filter(|p| p.job)
            .map(|p| p.peer.clone())
            .collect()
    }

    /// Marks the peers that carry the job: `job` holds them.
    pub fn mark_job(&mut self, job: &[String]) {
        for p in &mut self.peers {
            p.job = job.contains(&p.peer);
        }
    }

    pub fn job_peers(&self) -> Vec<String> {
        self.peers
            .iter()
            .filter(|p| p.job)
            .map(|p| p.peer.clone())
            .collect()
    }
}

/// The job's matrix across the hosts whose recordings were given together: bytes each host
/// sent to each address. A host is named by its own address when that is known (a lab run)
/// or can be inferred: the one address every other host of the job talks to but this one
/// does not. Otherwise by its recording's name.
#[derive(Clone, Debug, Serialize)]
pub struct JobMatrix {
    pub hosts: Vec<String>,
    /// Every address any host exchanged job traffic with, sorted.
    pub addresses: Vec<String>,
    /// bytes[host][address]: bytes the host sent to the address.
    pub bytes: Vec<Vec<f64>>,
}

pub fn job_matrix(hosts: &[(String, Option<String>, &Matrix)]) -> JobMatrix {
    let mut addresses: Vec<String> = hosts
        .iter()
        .flat_map(|(_, _, m)| m.peers.iter().filter(|p| p.job).map(|p| p.peer.clone()))
        .collect();
    addresses.sort();
    addresses.dedup();
    let mut names = Vec::new();
    for (name, own, m) in hosts {
        let label = own.clone().or_else(|| {
            let mine: Vec<&str> = m
                .peers
                .iter()
                .filter(|p| p.job)
                .map(|p| p.peer.as_str())
                .collect();
            let missing: Vec<&String> = addresses
                .iter()
                .filter(|a| !mine.contains(&a.as_str()))
                .collect();
            // Exactly one address missing, and it is a peer of every other host: ours.
            (missing.len() == 1 && hosts.len() > 1).then(|| missing[0].clone())
        });
        names.push(label.unwrap_or_else(|| name.clone()));
    }
    let bytes = hosts
        .iter()
        .map(|(_, _, m)| {
            addresses
                .iter()
                .map(|a| {
                    m.peers
                        .iter()
                        .find(|p| &p.peer == a)
                        .map_or(0.0, |p| p.tx_bytes)
                })
                .collect()
        })
        .collect();
    JobMatrix {
        hosts: names,
        addresses,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(peers: &[(&str, f64)]) -> Matrix {
        Matrix {
            peers: peers
                .iter()
                .map(|(p, b)| PeerTraffic {
                    peer: (*p).into(),
                    tx_bytes: *b,
                    rx_bytes: *b,
                    share: 0.0,
                    tx_typical: *b,
                    rx_typical: *b,
                    direction: "both",
                    job: true,
                })
                .collect(),
            total_bytes: 0.0,
        }
    }

    #[test]
    fn a_host_without_its_own_address_is_named_by_the_one_its_peers_share() {
        // A 3-host ring seen from each host: each talks to the two others.
        let (a, b, c) = (
            m(&[("10.0.0.2", 5.0), ("10.0.0.3", 1.0)]),
            m(&[("10.0.0.1", 1.0), ("10.0.0.3", 5.0)]),
            m(&[("10.0.0.1", 5.0), ("10.0.0.2", 1.0)]),
        );
        let hosts = [
            ("a".to_string(), None, &a),
            ("b".to_string(), Some("10.0.0.2".to_string()), &b),
            ("c".to_string(), None, &c),
        ];
        let j = job_matrix(&hosts);
        assert_eq!(j.hosts, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!(j.addresses, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert_eq!(j.bytes[0], [0.0, 5.0, 1.0]);
        // One recording alone: nothing to infer from.
        let j = job_matrix(&hosts[..1]);
        assert_eq!(j.hosts, ["a"]);
    }
}
