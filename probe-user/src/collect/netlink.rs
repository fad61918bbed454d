//! Interface and qdisc statistics over rtnetlink: the kernel's own counters, read each tick.
use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use netlink_packet_route::{
    link::{LinkAttribute, LinkMessage},
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
};
use serde::Serialize;

/// An interface's stats64 (cumulative, as `ip -s link` shows them).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LinkStats {
    pub ifindex: u32,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

/// One qdisc's queue statistics, as `tc -s qdisc` shows them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QdiscStats {
    pub ifindex: u32,
    pub kind: String,
    pub handle: String,
    pub parent: String,
    pub backlog_packets: u64,
    pub backlog_bytes: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
    pub sent_bytes: u64,
    pub sent_packets: u64,
}

fn link_stats(m: &LinkMessage) -> Option<LinkStats> {
    m.attributes.iter().find_map(|a| match a {
        LinkAttribute::Stats64(s) => Some(LinkStats {
            ifindex: m.header.index,
            rx_bytes: s.rx_bytes,
            tx_bytes: s.tx_bytes,
            rx_packets: s.rx_packets,
            tx_packets: s.tx_packets,
            rx_errors: s.rx_errors,
            tx_errors: s.tx_errors,
            rx_dropped: s.rx_dropped,
            tx_dropped: s.tx_dropped,
        }),
        _ => None,
    })
}

/// Link statistics from a link dump (see host::iface::dump).
pub fn links(msgs: &[LinkMessage]) -> Vec<LinkStats> {
    msgs.iter().filter_map(link_stats).collect()
}

/// `tc`'s notation for a handle: `8001:` for a qdisc, `1:10` for a class, `root`.
fn handle_text(h: TcHandle) -> String {
    if h == TcHandle::ROOT {
        "root".into()
    } else if h.minor == 0 {
        format!("{:x}:", h.major)
    } else {
        format!("{:x}:{:x}", h.major, h.minor)
    }
}

fn qdisc_stats(m: &TcMessage) -> Option<QdiscStats> {
    let mut q = QdiscStats {
        ifindex: u32::try_from(m.header.index).ok()?,
        handle: handle_text(m.header.handle),
        parent: handle_text(m.header.parent),
        ..QdiscStats::default()
    };
    for a in &m.attributes {
        match a {
            TcAttribute::Kind(k) => q.kind = k.clone(),
            TcAttribute::Stats2(s) => {
                for s in s {
                    match s {
                        TcStats2::Queue(x) => {
                            q.backlog_packets = x.qlen.into();
                            q.backlog_bytes = x.backlog.into();
                            q.drops = x.drops.into();
                            q.overlimits = x.overlimits.into();
                            q.requeues = x.requeues.into();
                        }
                        TcStats2::Basic(b) => {
                            q.sent_bytes = b.bytes;
                            q.sent_packets = b.packets.into();
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    // clsact/ingress hold filters, not packets.
    (!q.kind.is_empty() && q.kind != "clsact" && q.kind != "ingress").then_some(q)
}

pub async fn qdiscs(handle: &rtnetlink::Handle) -> Result<Vec<QdiscStats>> {
    let msgs: Vec<TcMessage> = handle
        .qdisc()
        .get()
        .execute()
        .try_collect()
        .await
        .context("reading qdisc statistics")?;
    Ok(msgs.iter().filter_map(qdisc_stats).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_read_like_tc() {
        assert_eq!(handle_text(TcHandle::ROOT), "root");
        assert_eq!(
            handle_text(TcHandle {
                major: 0x8001,
                minor: 0
            }),
            "8001:"
        );
        assert_eq!(
            handle_text(TcHandle {
                major: 1,
                minor: 0x10
            }),
            "1:10"
        );
    }
}
