//! Number formatting and the cells of each table, shared by the terminal UI and `--once`, so
//! that both show the same columns. A missing value is "-".
use super::frame::{IfaceRow, PeerRow, QdiscRow, RdmaRow};

pub const DASH: &str = "-";

/// `1.23M`-style SI scaling of `v` with `unit` appended.
pub fn si(v: Option<f64>, unit: &str) -> String {
    let Some(v) = v else {
        return DASH.to_string();
    };
    let a = v.abs();
    let (x, p) = if a >= 1e12 {
        (v / 1e12, "T")
    } else if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if p.is_empty() && x.fract() == 0.0 {
        format!("{x:.0}{unit}")
    } else {
        format!("{x:.1}{p}{unit}")
    }
}

pub fn bytes_rate(v: Option<f64>) -> String {
    si(v, "B/s")
}

/// A duration in seconds as `850us`, `12.3ms`, `1.20s`.
pub fn secs(v: Option<f64>) -> String {
    match v {
        None => DASH.to_string(),
        Some(s) if s < 1e-3 => format!("{:.0}us", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.1}ms", s * 1e3),
        Some(s) => format!("{s:.2}s"),
    }
}

pub fn rate(v: Option<f64>) -> String {
    match v {
        None => DASH.to_string(),
        Some(x) if x >= 1000.0 => si(Some(x), ""),
        Some(0.0) => "0".to_string(),
        Some(x) => format!("{x:.1}"),
    }
}

pub fn percent(v: Option<f64>) -> String {
    v.map_or(DASH.to_string(), |p| format!("{:.0}%", p * 100.0))
}

/// A sparkline of `v` in `width` cells (the most recent values), scaled to its own maximum.
pub fn sparkline(v: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let v = &v[v.len().saturating_sub(width)..];
    let max = v.iter().copied().fold(0.0, f64::max);
    v.iter()
        .map(|x| {
            if max <= 0.0 {
                BARS[0]
            } else {
                BARS[((x / max) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

/// Spike probabilities per horizon, `5s:9% 30s:62%!` (`!`: the model alarms, its
/// threshold held for its rule's ticks).
fn spike(p: &PeerRow) -> String {
    if p.spike.is_empty() {
        return DASH.to_string();
    }
    p.spike
        .iter()
        .map(|(h, v, alarm)| {
            let mark = if *alarm { "!" } else { "" };
            format!("{}:{}{mark}", secs(Some(*h)), percent(Some(*v)))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub const SPARK_WIDTH: usize = 12;

pub const PEER_HEADER: [&str; 13] = [
    "PEER", "SRTT", "P99", "RTT", "RETX/s", "TX", "RX", "BURST/s", "BURST", "ITER", "SPIKE",
    "RTT@", "!",
];

/// Minimum widths of the peer columns (the UI lays them out; `--once` pads to them).
pub const PEER_WIDTHS: [u16; 13] = [20, 7, 7, 12, 6, 9, 9, 7, 7, 7, 12, 7, 1];

pub fn peer_cells(p: &PeerRow, history: &[f64]) -> [String; 13] {
    [
        p.peer.clone(),
        secs(p.srtt),
        secs(p.rtt_p99),
        sparkline(history, SPARK_WIDTH),
        rate(p.retransmits_per_s),
        bytes_rate(p.tx_bytes_per_s),
        bytes_rate(p.rx_bytes_per_s),
        rate(p.bursts_per_s),
        si(p.burst_bytes, "B"),
        secs(p.iteration_period),
        spike(p),
        secs(p.rtt_forecast),
        if p.is_straggler() { "S" } else { "" }.to_string(),
    ]
}

pub const IFACE_HEADER: [&str; 5] = ["IFACE", "TX", "RX", "DROP/s", "ERR/s"];

pub fn iface_cells(i: &IfaceRow) -> [String; 5] {
    [
        i.iface.clone(),
        bytes_rate(i.tx_bytes_per_s),
        bytes_rate(i.rx_bytes_per_s),
        rate(i.dropped_per_s),
        rate(i.errors_per_s),
    ]
}

pub const QDISC_HEADER: [&str; 6] = ["QDISC", "SENT", "BACKLOG", "PKTS", "DROP/s", "SOJ p99"];

pub fn qdisc_cells(q: &QdiscRow) -> [String; 6] {
    [
        q.name.clone(),
        bytes_rate(q.tx_bytes_per_s),
        si(q.backlog_bytes, "B"),
        rate(q.backlog_packets),
        rate(q.drops_per_s),
        secs(q.sojourn_p99),
    ]
}

pub const RDMA_HEADER: [&str; 8] = [
    "PORT", "TX", "RX", "CNP TX/s", "CNP RX/s", "ECN/s", "WAIT/s", "ERR/s",
];

pub fn rdma_cells(r: &RdmaRow) -> [String; 8] {
    [
        r.port.clone(),
        bytes_rate(r.tx_bytes_per_s),
        bytes_rate(r.rx_bytes_per_s),
        rate(r.cnp_sent_per_s),
        rate(r.cnp_handled_per_s),
        rate(r.ecn_marked_per_s),
        rate(r.transmit_wait_per_s),
        rate(r.errors_per_s),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes_rate(Some(12_345_678.0)), "12.3MB/s");
        assert_eq!(bytes_rate(Some(0.0)), "0B/s");
        assert_eq!(bytes_rate(None), "-");
        assert_eq!(secs(Some(0.00085)), "850us");
        assert_eq!(secs(Some(0.0123)), "12.3ms");
        assert_eq!(rate(Some(2.5)), "2.5");
        assert_eq!(sparkline(&[0.0, 1.0, 2.0], 2), "▅█");
        assert_eq!(sparkline(&[], 5), "");
    }
}
