//! What the collectors read at one tick: every source's readings in base units, counters
//! already monotonic, before any stage has looked at them. The observe stage derives its
//! rows from two consecutive `Readings`; the snapshot that `/metrics`, the JSON API and
//! `probe record` read carries them beside the stages' products.
use std::{net::IpAddr, sync::Arc};

use serde::Serialize;

use super::{
    netlink::{LinkStats, QdiscStats},
    rdma::RdmaSnapshot,
    sources::{Sample, SourceStatus},
    tick_bursts::TickBursts,
};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Readings {
    /// Tick sequence number since the daemon started (1, 2, ...): a gap means a missed tick.
    pub tick: u64,
    /// Wall-clock time of the tick (seconds since the Unix epoch).
    pub time_unix: f64,
    pub tick_seconds: f64,
    /// Interfaces with TC programs attached.
    pub interfaces: Vec<String>,
    pub flows: Vec<FlowSeries>,
    pub nonip: Vec<NonIpSeries>,
    pub peers: Vec<PeerSeries>,
    /// Ticks since probe last walked the kernel flow map (0: this tick; the walk runs every
    /// `flow_scan`): `flows_tracked`, `flow_evictions` and `top_flows` are that walk's, and
    /// `slow_connections` and `conn_evictions` those of the connection map's walk at the same
    /// tick.
    pub flow_scan_age_ticks: u64,
    /// Entries in the kernel flow map.
    pub flows_tracked: u64,
    /// Flows the kernel evicted from its full LRU map before probe read them again.
    pub flow_evictions: u64,
    /// Open TCP connections the kernel evicted from its full sock_ops connection map.
    pub conn_evictions: u64,
    pub programs: Vec<ProgramStats>,
    pub hooks: Vec<HookStatus>,
    pub bursts: Vec<BurstSeries>,
    pub qdiscs: Vec<QdiscSeries>,
    pub sojourn: Vec<SojournSeries>,
    pub drops: Vec<DropSeries>,
    pub links: Vec<LinkSeries>,
    /// Inserts a full kernel map refused, by map.
    pub map_full: Vec<MapFull>,
    /// Peers whose traffic is folded into peer="other" (beyond the top-K).
    pub peers_folded: u64,
    /// The training jobs whose connections the socket dump found (collect/jobs.rs), by name.
    pub jobs: Vec<JobSeries>,
    /// Jobs past `jobs.max_jobs` at the last dump: their sockets have no job.
    pub jobs_folded: u64,
    pub rdma: Option<Arc<RdmaSnapshot>>,
    /// The flows that moved the most bytes per tick between the last two walks of the flow
    /// map, with their burst state.
    pub top_flows: Vec<FlowDetail>,
    /// Open TCP connections with the largest smoothed RTT.
    pub slow_connections: Vec<ConnDetail>,
    /// The srtt below which sock_ops keeps no per-connection state, set by the walk of the
    /// connection map: 3/4 of the srtt of the last of a full `slow_connections`, 0 (every
    /// connection) otherwise.
    pub slow_connections_floor_seconds: f64,
    /// Bursts that ended since the previous tick, one event each, in start order.
    pub burst_events: TickBursts,
    /// Burst events lost, cumulative: the kernel could not hand them over (ring buffer
    /// full), or a tick read more than it could hold.
    pub events_lost: u64,
    /// Burst events of busy ticks not kept for the API and recordings, cumulative: past the
    /// tick's cap and older than the newest of their interface, direction and peer, which
    /// is all the features use (so their features are those of every burst).
    pub events_thinned: u64,
    /// Whether each source worked this tick and what reading it cost, in reading order.
    pub sources: Vec<SourceStatus>,
    /// The values of the sources behind the `collect::sources` seam (host counter files).
    pub samples: Vec<Sample>,
    /// Interfaces that went away this tick (later stages forget their state).
    #[serde(skip)]
    pub removed_interfaces: Vec<String>,
}

/// One flow (one direction on one interface), from the kernel's per-flow state. JSON only:
/// per-flow metric series would be unbounded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlowDetail {
    pub iface: String,
    pub direction: &'static str,
    pub proto: u8,
    pub src: String,
    pub dst: String,
    pub sport: u16,
    pub dport: u16,
    /// Bytes per tick between the last two walks of the flow map (every `flow_scan`), and
    /// since the flow was first seen.
    pub tick_bytes: u64,
    pub bytes: u64,
    pub packets: u64,
    /// Bursts ended so far, the one in progress, the last ended one and the largest.
    pub bursts: u64,
    pub burst_bytes: u64,
    pub last_burst_bytes: u64,
    pub last_burst_seconds: f64,
    pub max_burst_bytes: u64,
}

/// One TCP connection tracked by sock_ops, as its socket last reported it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConnDetail {
    pub local: String,
    pub peer: String,
    pub local_port: u16,
    pub peer_port: u16,
    pub srtt_seconds: f64,
    pub min_rtt_seconds: f64,
    pub snd_cwnd: u32,
    pub packets_in_flight: u32,
    pub retrans_in_flight: u32,
    pub total_retrans: u32,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub state: u32,
}

/// Ended bursts of one peer's traffic on one interface in one direction (cumulative).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BurstSeries {
    pub iface: String,
    pub direction: &'static str,
    pub peer: String,
    pub count: u64,
    /// Burst sizes in bytes.
    pub bytes: Histogram,
    /// Burst durations in seconds (first to last packet).
    pub duration: Histogram,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QdiscSeries {
    pub iface: String,
    #[serde(flatten)]
    pub stats: QdiscStats,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SojournSeries {
    pub iface: String,
    /// Time packets spent in the interface's qdiscs, in seconds.
    pub seconds: Histogram,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DropSeries {
    pub reason: String,
    pub packets: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LinkSeries {
    pub iface: String,
    #[serde(flatten)]
    pub stats: LinkStats,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MapFull {
    pub map: &'static str,
    pub inserts_refused: u64,
}

/// Traffic of one peer on one interface in one direction (cumulative).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlowSeries {
    pub iface: String,
    pub direction: &'static str,
    pub peer: String,
    pub bytes: u64,
    pub packets: u64,
    pub ce_packets: u64,
    pub ect_packets: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NonIpSeries {
    pub iface: String,
    pub direction: &'static str,
    pub bytes: u64,
    pub packets: u64,
}

/// TCP view of one peer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PeerSeries {
    pub peer: String,
    /// Smoothed RTT: the largest among the peer's connections that carried data in the last
    /// tick (else among its open connections). None without open tracked connections.
    pub srtt_seconds: Option<f64>,
    /// The smallest windowed minimum RTT among open connections.
    pub min_rtt_seconds: Option<f64>,
    /// Open connections sock_ops tracks.
    pub connections: u32,
    /// RTT samples, one per round trip per connection (sock_ops RTT callback).
    pub rtt: Histogram,
    /// Retransmitted segments (cumulative).
    pub retransmits: u64,
    /// Bytes received that the application has not read yet, over its established
    /// connections (`ss`'s Recv-Q) at the tick. None: the socket dump failed.
    pub receive_queue_bytes: Option<u64>,
    /// Bytes written that the peer has not acknowledged yet (Send-Q).
    pub send_queue_bytes: Option<u64>,
    /// Bytes probe's sockets (its cgroup's, when scoped) sent to the peer and had
    /// acknowledged, and received from it, since probe started reading them (cumulative:
    /// `tcpi_bytes_acked`, `tcpi_bytes_received`).
    pub socket_sent_bytes: u64,
    pub socket_received_bytes: u64,
}

/// One training job on this host: its ranks here, the addresses its sockets use, and the
/// peers they talk to, from the last socket dump.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct JobSeries {
    pub name: String,
    /// The ranks its cgroups name, sorted (empty: the layout gives none).
    pub ranks: Vec<String>,
    /// How the job was found: `kubernetes`, `slurm`, `pattern` or `flag`.
    pub source: &'static str,
    /// Local addresses of its established sockets: how other hosts' probes name it.
    pub addresses: Vec<String>,
    /// Its peers, sorted by label (after the fold: those without a series are "other").
    pub peers: Vec<JobPeer>,
}

/// What one job's established sockets to one peer hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JobPeer {
    pub peer: String,
    pub connections: u32,
    /// Unread (Recv-Q) and unacknowledged (Send-Q) bytes, summed over its sockets.
    pub receive_queue_bytes: u64,
    pub send_queue_bytes: u64,
}

/// A cumulative histogram: `buckets` holds (upper bound, count of samples <= bound).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// Adds another histogram with the same bounds (used to fold series together).
    pub fn merge(&mut self, other: &Histogram) {
        if self.buckets.is_empty() {
            *self = other.clone();
            return;
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            a.1 += b.1;
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    /// `self - before`, bucket by bucket: what a cumulative histogram gained since `before`.
    /// None if `before` is absent, has another shape, or `self` is not a continuation of it
    /// (the series restarted). The one histogram delta of the daemon: observations, the
    /// fold and the exporter use it.
    pub fn increase(&self, before: Option<&Histogram>) -> Option<Histogram> {
        let b = before?;
        if b.buckets.len() != self.buckets.len() || self.count < b.count {
            return None;
        }
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (n, p) in self.buckets.iter().zip(&b.buckets) {
            buckets.push((n.0, n.1.checked_sub(p.1)?));
        }
        Some(Histogram {
            buckets,
            sum: (self.sum - b.sum).max(0.0),
            count: self.count - b.count,
        })
    }

    /// The q-quantile, interpolated linearly inside its bucket (as Prometheus's
    /// histogram_quantile does). The lower bound of the first bucket is half its upper bound
    /// (log2 buckets). None without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || self.buckets.is_empty() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut prev_cum = 0u64;
        for (i, &(upper, cum)) in self.buckets.iter().enumerate() {
            if cum > prev_cum && cum as f64 >= rank {
                let lower = if i == 0 {
                    upper / 2.0
                } else {
                    self.buckets[i - 1].0
                };
                let frac = ((rank - prev_cum as f64) / (cum - prev_cum) as f64).clamp(0.0, 1.0);
                return Some(lower + (upper - lower) * frac);
            }
            prev_cum = cum;
        }
        // Samples above the last bound: the best known is that bound.
        self.buckets.last().map(|b| b.0)
    }

    /// From log2 buckets of a value in `unit` (e.g. 1e-6 for microseconds): bucket i holds
    /// values in [2^i, 2^(i+1)), so its upper bound is 2^(i+1) units.
    pub fn from_log2(buckets: &[u64], sum_units: u64, unit: f64) -> Self {
        let mut cumulative = 0;
        let mut out = Vec::with_capacity(buckets.len());
        for (i, n) in buckets.iter().enumerate() {
            cumulative += n;
            out.push(((1u64 << (i + 1)) as f64 * unit, cumulative));
        }
        Self {
            buckets: out,
            sum: sum_units as f64 * unit,
            count: cumulative,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProgramStats {
    pub program: String,
    pub run_seconds: f64,
    pub runs: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HookStatus {
    pub hook: &'static str,
    pub attached: bool,
}

/// The label form of an address: IPv4-mapped IPv6 shows as plain IPv4, so a dual-stack
/// socket and a TC-parsed IPv4 packet name the same peer.
pub fn peer_label(addr: IpAddr) -> String {
    addr.to_canonical().to_string()
}

/// Whether another host could name this address as a peer: not loopback, not link-local
/// (neither reaches beyond one link, and every host has the same ones).
pub fn is_peer_address(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// An address from the ABI's 16-byte form.
pub fn ip_from_abi(family: u8, addr: &probe_ebpf::Addr) -> Option<IpAddr> {
    let bytes = &probe_ebpf::addr_bytes(addr);
    match family {
        probe_ebpf::AF_INET => Some(IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])),
        probe_ebpf::AF_INET6 => Some(IpAddr::from(*bytes).to_canonical()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_histogram_is_cumulative_with_exponential_bounds() {
        let mut b = [0u64; 4];
        b[0] = 1; // [1, 2) us
        b[3] = 2; // [8, 16) us
        let h = Histogram::from_log2(&b, 25, 1e-6);
        assert_eq!(h.count, 3);
        assert_eq!(h.buckets[0], (2e-6, 1));
        assert_eq!(h.buckets[2], (8e-6, 1));
        assert_eq!(h.buckets[3], (16e-6, 3));
        assert!((h.sum - 25e-6).abs() < 1e-12);
    }

    #[test]
    fn mapped_addresses_fold_to_ipv4() {
        let word = |b: [u8; 4]| u32::from_ne_bytes(b);
        let mapped = [0, 0, word([0, 0, 0xff, 0xff]), word([10, 0, 0, 1])];
        assert_eq!(
            ip_from_abi(probe_ebpf::AF_INET6, &mapped)
                .unwrap()
                .to_string(),
            "10.0.0.1"
        );
        let v4 = [word([192, 0, 2, 7]), 0, 0, 0];
        assert_eq!(
            ip_from_abi(probe_ebpf::AF_INET, &v4).unwrap().to_string(),
            "192.0.2.7"
        );
    }
}
