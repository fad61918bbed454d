//! What the kernel says about the lab's traffic: interface counters, TCP retransmits and
//! per-connection RTT from `ss`. This is the lab's own check that the traffic flowed and
//! that the episodes hurt; the probe's recording is judged against the ground truth.
use super::cmd;
use anyhow::{Context, Result};
use serde::Serialize;

/// Byte and packet counters of one interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
}

/// Counters of `dev` in `ns` (a rank's side of its veth), from `ip -s -j link`.
pub fn iface_counters(ns: &str, dev: &str) -> Result<Counters> {
    let out = cmd::run(&["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev])?;
    parse_ip_link_stats(&out).with_context(|| format!("{ns} {dev} counters"))
}

pub fn parse_ip_link_stats(json: &str) -> Result<Counters> {
    let v: serde_json::Value = serde_json::from_str(json).context("parsing ip -j output")?;
    let s = &v[0]["stats64"];
    let get = |dir: &str, what: &str| {
        s[dir][what]
            .as_u64()
            .with_context(|| format!("no stats64.{dir}.{what}"))
    };
    Ok(Counters {
        rx_bytes: get("rx", "bytes")?,
        rx_packets: get("rx", "packets")?,
        tx_bytes: get("tx", "bytes")?,
        tx_packets: get("tx", "packets")?,
    })
}

/// `Tcp: RetransSegs` of a namespace (from its /proc/net/snmp).
pub fn tcp_retrans_segs(ns: &str) -> Result<u64> {
    let out = cmd::run(&["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"])?;
    parse_snmp(&out, "Tcp", "RetransSegs").with_context(|| format!("{ns} /proc/net/snmp"))
}

/// One field of /proc/net/snmp (a header line of names, then a line of values).
pub fn parse_snmp(text: &str, proto: &str, field: &str) -> Result<u64> {
    let tag = format!("{proto}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&tag));
    let names = lines.next().context("no header line")?;
    let values = lines.next().context("no value line")?;
    let i = names
        .split_whitespace()
        .position(|n| n == field)
        .with_context(|| format!("no field {field}"))?;
    values
        .split_whitespace()
        .nth(i)
        .context("short value line")?
        .parse()
        .context("bad value")
}

/// What `tc -s -j qdisc show` says about a device's root qdisc.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QdiscStats {
    pub kind: String,
    /// The configured rate of a tbf, in Mbit/s.
    pub rate_mbit: Option<f64>,
    pub bytes: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub backlog: u64,
}

/// The root qdisc of `dev` in `ns`, with its counters and the raw JSON tc printed.
pub fn root_qdisc(ns: &str, dev: &str) -> Result<(QdiscStats, serde_json::Value)> {
    let out = cmd::run(&["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev])?;
    parse_root_qdisc(&out).with_context(|| format!("root qdisc of {dev} in {ns}"))
}

/// Parses `tc -s -j qdisc show dev DEV`: the root qdisc's entry (tc gives a tbf's rate in
/// bytes per second).
pub fn parse_root_qdisc(json: &str) -> Result<(QdiscStats, serde_json::Value)> {
    let v: serde_json::Value = serde_json::from_str(json).context("parsing tc -j output")?;
    let root = v
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["root"] == true))
        .context("no root qdisc")?
        .clone();
    let num = |k: &str| root[k].as_u64().unwrap_or(0);
    let stats = QdiscStats {
        kind: root["kind"].as_str().unwrap_or_default().to_string(),
        rate_mbit: root["options"]["rate"].as_f64().map(|r| r * 8.0 / 1e6),
        bytes: num("bytes"),
        drops: num("drops"),
        overlimits: num("overlimits"),
        backlog: num("backlog"),
    };
    Ok((stats, root))
}

/// One TCP connection as `ss -tin` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SsConn {
    pub local: String,
    pub peer: String,
    pub srtt_ms: Option<f64>,
    pub rttvar_ms: Option<f64>,
    pub cwnd: Option<u64>,
    /// Total retransmitted segments of the connection (the `b` of `retrans:a/b`).
    pub retrans: u64,
    pub bytes_acked: u64,
    pub bytes_received: u64,
}

/// The connections of a namespace to or from `port`.
pub fn ss_port(ns: &str, port: u16) -> Result<Vec<SsConn>> {
    let filter = format!("( sport = :{port} or dport = :{port} )");
    let out = cmd::run(&["ss", "-N", ns, "-H", "-t", "-i", "-n", &filter])?;
    Ok(parse_ss(&out))
}

/// Parses `ss -Htin`: a line per socket, then indented lines of details.
pub fn parse_ss(text: &str) -> Vec<SsConn> {
    let mut out: Vec<SsConn> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() >= 5 {
                out.push(SsConn {
                    local: cols[3].to_string(),
                    peer: cols[4].to_string(),
                    ..Default::default()
                });
            }
            continue;
        }
        let Some(c) = out.last_mut() else { continue };
        for tok in line.split_whitespace() {
            let Some((k, v)) = tok.split_once(':') else {
                continue;
            };
            match k {
                "rtt" => {
                    let (a, b) = v.split_once('/').unwrap_or((v, ""));
                    c.srtt_ms = a.parse().ok();
                    c.rttvar_ms = b.parse().ok();
                }
                "cwnd" => c.cwnd = v.parse().ok(),
                "retrans" => {
                    c.retrans = v
                        .split_once('/')
                        .and_then(|(_, t)| t.parse().ok())
                        .unwrap_or(0)
                }
                "bytes_acked" => c.bytes_acked = v.parse().unwrap_or(0),
                "bytes_received" => c.bytes_received = v.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_link_stats() {
        let j = r#"[{"ifindex":2,"ifname":"eth0","stats64":{"rx":{"bytes":10,"packets":2,"errors":0},"tx":{"bytes":30,"packets":4}}}]"#;
        assert_eq!(
            parse_ip_link_stats(j).unwrap(),
            Counters {
                rx_bytes: 10,
                rx_packets: 2,
                tx_bytes: 30,
                tx_packets: 4
            }
        );
        assert!(parse_ip_link_stats("[]").is_err());
    }

    #[test]
    fn tc_root_qdisc() {
        let j = r#"[{"kind":"tbf","handle":"8001:","root":true,"refcnt":3,"options":{"rate":7750000,"burst":131068,"lat":50000},"bytes":1000,"packets":2,"drops":3,"overlimits":4,"requeues":0,"backlog":1500,"qlen":1}]"#;
        let (q, raw) = parse_root_qdisc(j).unwrap();
        assert_eq!(q.kind, "tbf");
        assert_eq!(q.rate_mbit, Some(62.0));
        assert_eq!(
            (q.bytes, q.drops, q.overlimits, q.backlog),
            (1000, 3, 4, 1500)
        );
        assert_eq!(raw["handle"], "8001:");
        let noqueue = r#"[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{},"bytes":0,"packets":0,"drops":0,"overlimits":0,"requeues":0,"backlog":0,"qlen":0}]"#;
        assert_eq!(parse_root_qdisc(noqueue).unwrap().0.rate_mbit, None);
        assert!(parse_root_qdisc("[]").is_err());
    }

    #[test]
    fn snmp() {
        let t = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 17 0\nUdp: InDatagrams\nUdp: 5\n";
        assert_eq!(parse_snmp(t, "Tcp", "RetransSegs").unwrap(), 17);
        assert_eq!(parse_snmp(t, "Udp", "InDatagrams").unwrap(), 5);
        assert!(parse_snmp(t, "Tcp", "Nope").is_err());
    }

    #[test]
    fn ss_output() {
        let t = "ESTAB 0      2896   10.232.0.1:29500 10.232.0.4:45678\n\t cubic wscale:7,7 rto:204 rtt:3.5/0.25 ato:40 mss:1448 cwnd:10 bytes_sent:100 bytes_retrans:20 bytes_acked:80 bytes_received:5000 retrans:0/3 send 33Mbps\nESTAB 0 0 10.232.0.1:40000 10.232.0.2:29500\n\t cubic rtt:0.05/0.025 cwnd:64 bytes_acked:1\n";
        let c = parse_ss(t);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].local, "10.232.0.1:29500");
        assert_eq!(c[0].peer, "10.232.0.4:45678");
        assert_eq!(c[0].srtt_ms, Some(3.5));
        assert_eq!(c[0].rttvar_ms, Some(0.25));
        assert_eq!(c[0].cwnd, Some(10));
        assert_eq!(c[0].retrans, 3);
        assert_eq!(c[0].bytes_acked, 80);
        assert_eq!(c[0].bytes_received, 5000);
        assert_eq!(c[1].srtt_ms, Some(0.05));
        assert_eq!(c[1].retrans, 0);
    }
}
