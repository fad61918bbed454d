//! The kernel's own view, the source of truth the tests compare probe against: interface
//! counters, `ss -tin`, `nstat`, `tc`, `bpftool`, and a direct TCX query.
use crate::netns::Netns;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

// ---------------------------------------------------------------------------------------------
// Interface counters

/// Bytes and packets received and sent: an interface's counters, or probe's sum of them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    pub rx_bytes: f64,
    pub rx_packets: f64,
    pub tx_bytes: f64,
    pub tx_packets: f64,
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;
    fn sub(self, o: Traffic) -> Traffic {
        Traffic {
            rx_bytes: self.rx_bytes - o.rx_bytes,
            rx_packets: self.rx_packets - o.rx_packets,
            tx_bytes: self.tx_bytes - o.tx_bytes,
            tx_packets: self.tx_packets - o.tx_packets,
        }
    }
}

/// `/proc/net/dev`: interface name -> its counters (rx = ingress, tx = egress).
pub fn parse_proc_net_dev(text: &str) -> Result<BTreeMap<String, Traffic>> {
    let mut m = BTreeMap::new();
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let f: Vec<f64> = rest
            .split_whitespace()
            .map(|v| v.parse::<f64>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad /proc/net/dev line {line:?}"))?;
        if f.len() < 16 {
            bail!("short /proc/net/dev line {line:?}");
        }
        m.insert(
            name.trim().to_owned(),
            Traffic {
                rx_bytes: f[0],
                rx_packets: f[1],
                tx_bytes: f[8],
                tx_packets: f[9],
            },
        );
    }
    Ok(m)
}

/// The counters of `dev` in `ns` (the same numbers as /sys/class/net/DEV/statistics, read
/// from the namespace's own /proc/net/dev).
pub fn iface_counters(ns: &Netns, dev: &str) -> Result<Traffic> {
    let text = ns.enter(|| std::fs::read_to_string("/proc/thread-self/net/dev"))??;
    parse_proc_net_dev(&text)?
        .remove(dev)
        .with_context(|| format!("no {dev} in netns {}", ns.name()))
}

// ---------------------------------------------------------------------------------------------
// ss -tin

/// One TCP socket of `ss -tin`.
#[derive(Debug, Clone, PartialEq)]
pub struct SsConn {
    pub state: String,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// Smoothed RTT and its variance (`rtt:SRTT/RTTVAR`), milliseconds.
    pub rtt_ms: Option<f64>,
    pub rttvar_ms: Option<f64>,
    /// Total retransmitted segments of the connection (`retrans:CUR/TOTAL`).
    pub retrans_total: u64,
    pub bytes_acked: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Every `key:value` field of the info line.
    pub fields: BTreeMap<String, String>,
}

impl SsConn {
    /// Bytes moved in either direction: picks the busiest (data) connection.
    pub fn volume(&self) -> u64 {
        self.bytes_acked.max(self.bytes_sent) + self.bytes_received
    }
}

/// An `ss` address: `10.0.0.1:80`, `[fd00::1]:80`, `[::ffff:10.0.0.1]:80` (a v4-mapped
/// address is returned as IPv4), `[fe80::1]%eth0:80`.
pub fn parse_ss_addr(s: &str) -> Result<SocketAddr> {
    let (host, port) = s
        .rsplit_once(':')
        .with_context(|| format!("no port in {s:?}"))?;
    let port: u16 = port.parse().with_context(|| format!("bad port in {s:?}"))?;
    let host = host.split('%').next().unwrap_or(host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = host.parse().with_context(|| format!("bad address {s:?}"))?;
    Ok(SocketAddr::new(ip.to_canonical(), port))
}

/// Parses `ss -tin` (with or without its header line).
pub fn parse_ss_tin(text: &str) -> Result<Vec<SsConn>> {
    let mut conns: Vec<SsConn> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with("State") {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let Some(c) = conns.last_mut() else {
                continue;
            };
            for tok in line.split_whitespace() {
                if let Some((k, v)) = tok.split_once(':') {
                    c.fields.insert(k.to_owned(), v.to_owned());
                }
            }
            let num = |k: &str| c.fields.get(k).and_then(|v| v.parse::<u64>().ok());
            c.bytes_acked = num("bytes_acked").unwrap_or(0);
            c.bytes_sent = num("bytes_sent").unwrap_or(0);
            c.bytes_received = num("bytes_received").unwrap_or(0);
            if let Some(rtt) = c.fields.get("rtt") {
                let (s, v) = rtt.split_once('/').unwrap_or((rtt, ""));
                c.rtt_ms = s.parse().ok();
                c.rttvar_ms = v.parse().ok();
            }
            c.retrans_total = c
                .fields
                .get("retrans")
                .and_then(|r| r.split('/').nth(1))
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 {
            bail!("unexpected ss line {line:?}");
        }
        conns.push(SsConn {
            state: f[0].to_owned(),
            local: parse_ss_addr(f[3])?,
            peer: parse_ss_addr(f[4])?,
            rtt_ms: None,
            rttvar_ms: None,
            retrans_total: 0,
            bytes_acked: 0,
            bytes_sent: 0,
            bytes_received: 0,
            fields: BTreeMap::new(),
        });
    }
    Ok(conns)
}

/// The TCP sockets in `ns` (`ss -tinH`).
pub fn ss_tcp(ns: &Netns) -> Result<Vec<SsConn>> {
    parse_ss_tin(&ns.run(&["ss", "-tinH"])?)
}

/// `ss -tnH state established dst DST` in `ns`: a line per established TCP connection to
/// `dst`, `Recv-Q Send-Q Local Peer` (a state filter leaves the State column out).
pub fn ss_established_to(ns: &Netns, dst: IpAddr) -> Result<String> {
    ns.run(&[
        "ss",
        "-tnH",
        "state",
        "established",
        "dst",
        &dst.to_string(),
    ])
}

/// The established connection to `peer` (any port when `port` is None) that moved the most
/// data: iperf3's data connection rather than its idle control connection.
pub fn busiest_conn(conns: &[SsConn], peer: IpAddr, port: Option<u16>) -> Option<&SsConn> {
    conns
        .iter()
        .filter(|c| c.state == "ESTAB" && c.peer.ip() == peer.to_canonical())
        .filter(|c| port.is_none_or(|p| c.peer.port() == p))
        .max_by_key(|c| c.volume())
}

// ---------------------------------------------------------------------------------------------
// nstat

/// `nstat -asz` output: counter name -> value.
pub fn parse_nstat(text: &str) -> Result<BTreeMap<String, u64>> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut f = line.split_whitespace();
        let (Some(k), Some(v)) = (f.next(), f.next()) else {
            bail!("unexpected nstat line {line:?}");
        };
        m.insert(
            k.to_owned(),
            v.parse()
                .with_context(|| format!("bad nstat line {line:?}"))?,
        );
    }
    Ok(m)
}

/// One SNMP/netstat counter of `ns` (absolute value, history untouched).
pub fn nstat(ns: &Netns, counter: &str) -> Result<u64> {
    parse_nstat(&ns.run(&["nstat", "-asz", counter])?)?
        .remove(counter)
        .with_context(|| format!("nstat has no {counter}"))
}

// ---------------------------------------------------------------------------------------------
// tc

/// One qdisc of `tc -s qdisc show`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Qdisc {
    pub kind: String,
    pub handle: String,
    /// Present when listing all devices.
    pub dev: Option<String>,
    /// `root`, or the parent handle (`ffff:fff1` for clsact/ingress).
    pub parent: String,
    pub sent_bytes: u64,
    pub sent_packets: u64,
    pub dropped: u64,
    pub overlimits: u64,
    pub requeues: u64,
    pub backlog_bytes: u64,
    pub backlog_packets: u64,
}

/// tc's sizes: `1514b`, `32Kb`, `2Mb` (binary multiples).
pub fn parse_tc_size(s: &str) -> Result<u64> {
    let (num, mult) = if let Some(n) = s.strip_suffix("Mb") {
        (n, 1024 * 1024)
    } else if let Some(n) = s.strip_suffix("Kb") {
        (n, 1024)
    } else if let Some(n) = s.strip_suffix('b') {
        (n, 1)
    } else {
        (s, 1)
    };
    let v: f64 = num.parse().with_context(|| format!("bad tc size {s:?}"))?;
    Ok((v * mult as f64).round() as u64)
}

/// Parses `tc [-s] qdisc show [dev DEV]`.
pub fn parse_tc_qdiscs(text: &str) -> Result<Vec<Qdisc>> {
    let mut out: Vec<Qdisc> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.first().copied() {
            Some("qdisc") => {
                if f.len() < 3 {
                    bail!("unexpected qdisc line {line:?}");
                }
                let mut q = Qdisc {
                    kind: f[1].to_owned(),
                    handle: f[2].to_owned(),
                    ..Default::default()
                };
                let mut i = 3;
                while i < f.len() {
                    match f[i] {
                        "dev" => q.dev = f.get(i + 1).map(|s| s.to_string()),
                        "root" => q.parent = "root".into(),
                        "parent" => q.parent = f.get(i + 1).unwrap_or(&"").to_string(),
                        "refcnt" => break,
                        _ => {}
                    }
                    i += 1;
                }
                out.push(q);
            }
            Some("Sent") => {
                let q = out.last_mut().context("Sent before qdisc")?;
                // Sent 12781035 bytes 8457 pkt (dropped 0, overlimits 3062 requeues 0)
                let num = |i: usize| -> Result<u64> {
                    let t = f.get(i).context("short Sent line")?;
                    t.trim_matches(|c| c == ',' || c == ')' || c == '(')
                        .parse()
                        .with_context(|| format!("bad Sent line {line:?}"))
                };
                q.sent_bytes = num(1)?;
                q.sent_packets = num(3)?;
                q.dropped = num(6)?;
                q.overlimits = num(8)?;
                q.requeues = num(10)?;
            }
            Some("backlog") => {
                let q = out.last_mut().context("backlog before qdisc")?;
                q.backlog_bytes = parse_tc_size(f.get(1).context("short backlog")?)?;
                q.backlog_packets = f
                    .get(2)
                    .and_then(|p| p.strip_suffix('p'))
                    .context("short backlog")?
                    .parse()?;
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The qdiscs of `dev` in `ns`.
pub fn qdiscs(ns: &Netns, dev: &str) -> Result<Vec<Qdisc>> {
    parse_tc_qdiscs(&ns.run(&["tc", "-s", "qdisc", "show", "dev", dev])?)
}

/// Puts a root pfifo that never drops (limit 100,000) on `dev` in `ns`, for its `Sent`
/// counters: they count a GSO packet as its segments, each with its headers, as probe does.
pub fn add_counting_pfifo(ns: &Netns, dev: &str) -> Result<()> {
    ns.run(&[
        "tc", "qdisc", "add", "dev", dev, "root", "pfifo", "limit", "100000",
    ])?;
    Ok(())
}

/// The statistics of the pfifo [`add_counting_pfifo`] put on `dev`.
pub fn counting_pfifo(ns: &Netns, dev: &str) -> Result<Qdisc> {
    qdiscs(ns, dev)?
        .into_iter()
        .find(|q| q.kind == "pfifo" && q.parent == "root")
        .with_context(|| format!("no root pfifo on {dev}"))
}

/// Whether `dev` has a clsact (or legacy ingress) qdisc, the one that holds tc filters.
pub fn has_clsact(ns: &Netns, dev: &str) -> Result<bool> {
    Ok(qdiscs(ns, dev)?
        .iter()
        .any(|q| q.kind == "clsact" || q.kind == "ingress"))
}

/// One line of `tc filter show dev DEV ingress|egress`.
#[derive(Debug, Clone, PartialEq)]
pub struct TcFilter {
    pub protocol: String,
    pub pref: u32,
    pub kind: String,
    /// None on the per-preference header line, Some on the filter itself.
    pub handle: Option<String>,
    /// What follows the handle: for bpf, `NAME direct-action not_in_hw id N tag T jited`.
    pub rest: String,
}

/// Parses `tc filter show`.
pub fn parse_tc_filters(text: &str) -> Result<Vec<TcFilter>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() != Some(&"filter") {
            continue;
        }
        let get = |k: &str| f.iter().position(|t| *t == k).and_then(|i| f.get(i + 1));
        let pref = get("pref")
            .context("no pref")?
            .parse()
            .with_context(|| format!("bad filter line {line:?}"))?;
        let kind_i = f
            .iter()
            .position(|t| *t == "pref")
            .map(|i| i + 2)
            .context("no kind")?;
        let handle_i = f.iter().position(|t| *t == "handle");
        out.push(TcFilter {
            protocol: get("protocol").unwrap_or(&"").to_string(),
            pref,
            kind: f.get(kind_i).unwrap_or(&"").to_string(),
            handle: handle_i.and_then(|i| f.get(i + 1)).map(|s| s.to_string()),
            rest: handle_i
                .map(|i| f[(i + 2).min(f.len())..].join(" "))
                .unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Direction of a TC hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    pub const BOTH: [Hook; 2] = [Hook::Ingress, Hook::Egress];
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Ingress => "ingress",
            Hook::Egress => "egress",
        }
    }
}

/// The tc filters on `dev`'s ingress or egress hook (empty without a clsact qdisc).
pub fn tc_filters(ns: &Netns, dev: &str, hook: Hook) -> Result<Vec<TcFilter>> {
    parse_tc_filters(&ns.run(&["tc", "filter", "show", "dev", dev, hook.as_str()])?)
}

// ---------------------------------------------------------------------------------------------
// bpftool net show

/// One entry of the `tc:` section of `bpftool net show`.
#[derive(Debug, Clone, PartialEq)]
pub struct BpfTcAttachment {
    pub dev: String,
    pub ifindex: u32,
    /// `clsact` (a tc filter) or `tcx` (a TCX link, listed by bpftool >= 7.3 only).
    pub kind: String,
    pub hook: String,
    /// Program name and id as bpftool prints them (empty for classic BPF).
    pub prog: String,
}

/// `bpftool net show`: section name (`xdp`, `tc`, `flow_dissector`, `netfilter`) -> lines;
/// and the tc section parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BpftoolNet {
    pub sections: BTreeMap<String, Vec<String>>,
    pub tc: Vec<BpfTcAttachment>,
}

pub fn parse_bpftool_net(text: &str) -> Result<BpftoolNet> {
    let mut out = BpftoolNet::default();
    let mut section: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(name) = t.strip_suffix(':').filter(|n| !n.contains(' ')) {
            section = Some(name.to_owned());
            out.sections.entry(name.to_owned()).or_default();
            continue;
        }
        let sec = section.clone().context("bpftool line outside a section")?;
        out.sections
            .entry(sec.clone())
            .or_default()
            .push(t.to_owned());
        if sec == "tc" {
            // vethA(5) clsact/ingress tc_ingress_eth:[42] id 42
            // vethA(5) tcx/ingress tc_ingress_eth prog_id 42 link_id 7
            let mut f = t.splitn(3, ' ');
            let devf = f.next().unwrap_or_default();
            let hookf = f.next().context("short bpftool tc line")?;
            let (dev, ifindex) = devf
                .strip_suffix(')')
                .and_then(|d| d.split_once('('))
                .with_context(|| format!("bad bpftool tc line {t:?}"))?;
            let (kind, hook) = hookf
                .split_once('/')
                .with_context(|| format!("bad bpftool tc line {t:?}"))?;
            out.tc.push(BpfTcAttachment {
                dev: dev.to_owned(),
                ifindex: ifindex.parse()?,
                kind: kind.to_owned(),
                hook: hook.to_owned(),
                prog: f.next().unwrap_or_default().trim().to_owned(),
            });
        }
    }
    Ok(out)
}

/// `bpftool net show dev DEV` in `ns`.
pub fn bpftool_net(ns: &Netns, dev: &str) -> Result<BpftoolNet> {
    parse_bpftool_net(&ns.run(&["bpftool", "net", "show", "dev", dev])?)
}

// ---------------------------------------------------------------------------------------------
// TCX, asked of the kernel directly

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// `union bpf_attr`, the BPF_PROG_QUERY member (see include/uapi/linux/bpf.h).
#[repr(C, align(8))]
#[derive(Default)]
struct ProgQuery {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the programs attached through TCX to `dev`'s `hook` in `ns`, from
/// BPF_PROG_QUERY (bpftool 7.1, Debian 12's, does not list TCX links).
pub fn tcx_prog_ids(ns: &Netns, dev: &str, hook: Hook) -> Result<Vec<u32>> {
    let dev = std::ffi::CString::new(dev)?;
    ns.enter(move || -> Result<Vec<u32>> {
        // SAFETY: a valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
        if ifindex == 0 {
            bail!("no interface {dev:?}: {}", std::io::Error::last_os_error());
        }
        let mut ids = vec![0u32; 64];
        let mut attr = ProgQuery {
            target_ifindex: ifindex,
            attach_type: match hook {
                Hook::Ingress => BPF_TCX_INGRESS,
                Hook::Egress => BPF_TCX_EGRESS,
            },
            prog_ids: ids.as_mut_ptr() as u64,
            count: ids.len() as u32,
            ..Default::default()
        };
        // SAFETY: bpf(2) with a correctly laid out attr whose prog_ids buffer holds `count`
        // u32s and outlives the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_QUERY,
                &mut attr as *mut ProgQuery,
                std::mem::size_of::<ProgQuery>(),
            )
        };
        if rc != 0 {
            bail!("BPF_PROG_QUERY: {}", std::io::Error::last_os_error());
        }
        ids.truncate(attr.count as usize);
        Ok(ids)
    })?
}

/// Everything BPF that is hooked to `dev`'s TC path, from three independent views: TCX
/// programs (kernel query), tc filters (netlink, `tc filter show`), and `bpftool net show`.
#[derive(Debug, Clone, Default)]
pub struct TcAttachments {
    pub tcx_ingress: Vec<u32>,
    pub tcx_egress: Vec<u32>,
    pub filters_ingress: Vec<TcFilter>,
    pub filters_egress: Vec<TcFilter>,
    pub bpftool_tc: Vec<BpfTcAttachment>,
    pub clsact: bool,
}

impl TcAttachments {
    /// Nothing attached and no clsact qdisc.
    pub fn is_clean(&self) -> bool {
        self.is_clean_except_qdisc() && !self.clsact
    }

    /// No program or filter attached (a clsact qdisc may remain).
    pub fn is_clean_except_qdisc(&self) -> bool {
        self.tcx_ingress.is_empty()
            && self.tcx_egress.is_empty()
            && self.filters_ingress.is_empty()
            && self.filters_egress.is_empty()
            && self.bpftool_tc.is_empty()
    }

    /// Programs on each hook, whichever way they are attached.
    pub fn programs(&self, hook: Hook) -> usize {
        let (tcx, filters) = match hook {
            Hook::Ingress => (&self.tcx_ingress, &self.filters_ingress),
            Hook::Egress => (&self.tcx_egress, &self.filters_egress),
        };
        tcx.len() + filters.iter().filter(|f| f.handle.is_some()).count()
    }
}

pub fn tc_attachments(ns: &Netns, dev: &str) -> Result<TcAttachments> {
    let has_clsact = has_clsact(ns, dev)?;
    Ok(TcAttachments {
        tcx_ingress: tcx_prog_ids(ns, dev, Hook::Ingress)?,
        tcx_egress: tcx_prog_ids(ns, dev, Hook::Egress)?,
        filters_ingress: tc_filters(ns, dev, Hook::Ingress)?,
        filters_egress: tc_filters(ns, dev, Hook::Egress)?,
        bpftool_tc: bpftool_net(ns, dev)?.tc,
        clsact: has_clsact,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SS_A: &str = include_str!("fixtures/ss_A.txt");
    const SS_A_HDR: &str = include_str!("fixtures/ss_A_hdr.txt");
    const SS_B: &str = include_str!("fixtures/ss_B.txt");

    #[test]
    fn ss_client_side() {
        let c = parse_ss_tin(SS_A).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].state, "ESTAB");
        assert_eq!(c[0].local, "10.231.250.1:33076".parse().unwrap());
        assert_eq!(c[0].peer, "10.231.250.2:5201".parse().unwrap());
        assert_eq!(c[0].rtt_ms, Some(0.129));
        assert_eq!(c[0].rttvar_ms, Some(0.083));
        assert_eq!(c[1].rtt_ms, Some(7.432));
        assert_eq!(c[1].bytes_acked, 11964862);
        assert_eq!(c[1].retrans_total, 0);
        let peer = "10.231.250.2".parse().unwrap();
        let data = busiest_conn(&c, peer, Some(5201)).unwrap();
        assert_eq!(data.local.port(), 33086);
        assert!(busiest_conn(&c, peer, Some(80)).is_none());
        // The header line is skipped.
        let h = parse_ss_tin(SS_A_HDR).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].rtt_ms, Some(14.924));
    }

    #[test]
    fn ss_server_side_v4_mapped() {
        let c = parse_ss_tin(SS_B).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].local, "10.231.250.2:5201".parse().unwrap());
        assert_eq!(c[1].peer, "10.231.250.1:33086".parse().unwrap());
        assert_eq!(c[1].bytes_received, 12121245);
        let data = busiest_conn(&c, "10.231.250.1".parse().unwrap(), None).unwrap();
        assert_eq!(data.peer.port(), 33086);
    }

    #[test]
    fn ss_retrans_and_v6() {
        let text = "ESTAB 0 0 [fd00:231:1::1]:40000 [fd00:231:1::2]:5201\n\
                    \t cubic wscale:7,7 rto:208 rtt:3.5/1.25 mss:1428 bytes_acked:1000 \
                    retrans:0/37 lost:0 reordering:5\n\
                    ESTAB 0 0 [fe80::1]%veth1a:22 [fe80::2]%veth1a:50000\n";
        let c = parse_ss_tin(text).unwrap();
        assert_eq!(c[0].retrans_total, 37);
        assert_eq!(c[0].rtt_ms, Some(3.5));
        assert_eq!(c[0].peer.ip(), "fd00:231:1::2".parse::<IpAddr>().unwrap());
        assert_eq!(c[1].local.port(), 22);
        assert_eq!(c[1].rtt_ms, None);
    }

    #[test]
    fn nstat_fixture() {
        let m = parse_nstat(include_str!("fixtures/nstat.txt")).unwrap();
        assert_eq!(m["TcpRetransSegs"], 0);
        assert_eq!(m["IpInReceives"], 2308);
        assert_eq!(m["TcpActiveOpens"], 2);
        let one = parse_nstat("#kernel\nTcpRetransSegs                  1234               0.0\n")
            .unwrap();
        assert_eq!(one["TcpRetransSegs"], 1234);
    }

    #[test]
    fn proc_net_dev_fixture() {
        let m = parse_proc_net_dev(include_str!("fixtures/proc_net_dev.txt")).unwrap();
        assert_eq!(
            m["vcapA"],
            Traffic {
                rx_bytes: 153392.0,
                rx_packets: 2316.0,
                tx_bytes: 24165247.0,
                tx_packets: 3647.0
            }
        );
        assert_eq!(m["lo"], Traffic::default());
        let d = m["vcapA"] - m["lo"];
        assert_eq!(d.tx_packets, 3647.0);
    }

    #[test]
    fn tc_qdisc_fixtures() {
        let q = parse_tc_qdiscs(include_str!("fixtures/tc_qdisc_tbf.txt")).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].kind, "tbf");
        assert_eq!(q[0].handle, "8001:");
        assert_eq!(q[0].parent, "root");
        assert_eq!(q[0].sent_bytes, 12781035);
        assert_eq!(q[0].sent_packets, 8457);
        assert_eq!(q[0].overlimits, 3062);
        assert_eq!(q[0].backlog_bytes, 140802);
        assert_eq!(q[0].backlog_packets, 93);

        let q = parse_tc_qdiscs(include_str!("fixtures/tc_qdisc_clsact.txt")).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[1].kind, "clsact");
        assert_eq!(q[1].parent, "ffff:fff1");

        let q = parse_tc_qdiscs(include_str!("fixtures/tc_qdisc_B.txt")).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].dev.as_deref(), Some("lo"));
        assert_eq!(q[1].dev.as_deref(), Some("vcapB"));
        assert!(q.iter().all(|q| q.kind == "noqueue"));

        assert_eq!(parse_tc_size("32Kb").unwrap(), 32768);
        assert_eq!(parse_tc_size("2Mb").unwrap(), 2 * 1024 * 1024);
        assert_eq!(parse_tc_size("0b").unwrap(), 0);
    }

    #[test]
    fn tc_filter_fixtures() {
        let f = parse_tc_filters(include_str!("fixtures/tcf_cbpf.txt")).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].handle, None);
        assert_eq!(f[1].handle.as_deref(), Some("0x1"));
        assert_eq!(f[1].kind, "bpf");
        assert_eq!(f[1].pref, 49152);
        assert_eq!(f[1].protocol, "all");
        assert!(f[1].rest.contains("bytecode"));
        assert!(parse_tc_filters("").unwrap().is_empty());
        // Probe's own filter, in netlink mode.
        let f = parse_tc_filters(include_str!("fixtures/tcf_ebpf.txt")).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[1].handle.as_deref(), Some("0x1"));
        assert_eq!(f[1].rest.split(' ').next(), Some("tc_ingress_eth"));
    }

    #[test]
    fn bpftool_net_fixture() {
        let n = parse_bpftool_net(include_str!("fixtures/bpftool_net.txt")).unwrap();
        assert_eq!(n.tc.len(), 1);
        assert_eq!(n.tc[0].dev, "vcapA");
        assert_eq!(n.tc[0].ifindex, 2);
        assert_eq!(n.tc[0].kind, "clsact");
        assert_eq!(n.tc[0].hook, "ingress");
        assert!(n.sections["xdp"].is_empty());
        assert!(n.sections.contains_key("flow_dissector"));
        let n = parse_bpftool_net(include_str!("fixtures/bpftool_net_ebpf.txt")).unwrap();
        assert_eq!(n.tc.len(), 2);
        assert_eq!(n.tc[1].hook, "egress");
        assert_eq!(n.tc[1].prog, "tc_egress_eth id 275");
        let empty = parse_bpftool_net("xdp:\n\ntc:\n\nflow_dissector:\n\n").unwrap();
        assert!(empty.tc.is_empty());
        let tcx = parse_bpftool_net(
            "xdp:\n\ntc:\nveth1a(7) tcx/egress tc_egress_eth prog_id 55 link_id 9 \n\n",
        )
        .unwrap();
        assert_eq!(tcx.tc[0].kind, "tcx");
        assert_eq!(tcx.tc[0].hook, "egress");
        assert_eq!(tcx.tc[0].prog, "tc_egress_eth prog_id 55 link_id 9");
    }

    #[test]
    fn prog_query_layout() {
        // struct bpf_attr's query member as of Linux 6.6+.
        assert_eq!(std::mem::size_of::<ProgQuery>(), 64);
        assert_eq!(std::mem::offset_of!(ProgQuery, prog_ids), 16);
        assert_eq!(std::mem::offset_of!(ProgQuery, count), 24);
        assert_eq!(std::mem::offset_of!(ProgQuery, revision), 56);
    }
}
