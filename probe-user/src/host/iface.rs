//! Interface discovery over rtnetlink, and which of them to monitor.
use anyhow::{bail, Context as _, Result};
use futures::TryStreamExt as _;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkLayerType, LinkMessage};

use crate::config::{is_pattern, name_matches, Config};

/// How packets on a device start, which decides the TC program variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2 {
    /// A 14-byte Ethernet header (also loopback and bridges).
    Ethernet,
    /// Straight at the IP header (tun, wireguard, ipip, ...).
    RawIp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub index: u32,
    pub name: String,
    pub up: bool,
    pub loopback: bool,
    /// None for link types the TC programs cannot parse (e.g. InfiniBand, CAN).
    pub l2: Option<L2>,
}

impl Iface {
    fn from_message(m: &LinkMessage) -> Option<Self> {
        let name = m.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })?;
        let l2 = match m.header.link_layer_type {
            LinkLayerType::Ether | LinkLayerType::Loopback => Some(L2::Ethernet),
            LinkLayerType::None
            | LinkLayerType::Tunnel
            | LinkLayerType::Tunnel6
            | LinkLayerType::Ipgre
            | LinkLayerType::Ip6gre
            | LinkLayerType::Sit => Some(L2::RawIp),
            _ => None,
        };
        Some(Self {
            index: m.header.index,
            name,
            up: m.header.flags.contains(LinkFlags::Up),
            loopback: m.header.flags.contains(LinkFlags::Loopback),
            l2,
        })
    }
}

/// One rtnetlink dump of every link in this network namespace. Each tick makes one and
/// uses it twice: for interface lifecycle and for link statistics.
pub async fn dump(handle: &rtnetlink::Handle) -> Result<Vec<LinkMessage>> {
    handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .context("listing interfaces over rtnetlink")
}

/// The interfaces in a dump.
pub fn from_dump(msgs: &[LinkMessage]) -> Vec<Iface> {
    msgs.iter().filter_map(Iface::from_message).collect()
}

/// True when the config wants `iface` monitored (ignoring whether it can be).
pub fn wanted(cfg: &Config, iface: &Iface) -> bool {
    if cfg.exclude.iter().any(|p| name_matches(p, &iface.name)) {
        return false;
    }
    if cfg.include.is_empty() {
        return iface.up && !iface.loopback;
    }
    cfg.include.iter().any(|p| name_matches(p, &iface.name))
}

/// The interfaces to attach to at start. A name given without wildcards must exist.
pub fn select(cfg: &Config, all: &[Iface]) -> Result<Vec<Iface>> {
    for name in cfg.include.iter().filter(|p| !is_pattern(p)) {
        match all.iter().find(|i| &i.name == name) {
            None => bail!("interface {name} not found (see `ip link`)"),
            Some(i) if i.l2.is_none() => {
                bail!("interface {name} has a link type probe cannot parse (Ethernet and raw-IP devices are supported)")
            }
            Some(_) => {}
        }
    }
    Ok(all
        .iter()
        .filter(|i| wanted(cfg, i) && i.l2.is_some())
        .cloned()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, up: bool, loopback: bool) -> Iface {
        Iface {
            index: 1,
            name: name.into(),
            up,
            loopback,
            l2: Some(L2::Ethernet),
        }
    }

    #[test]
    fn defaults_take_up_non_loopback() {
        let all = [
            iface("lo", true, true),
            iface("eth0", true, false),
            iface("eth1", false, false),
        ];
        let got = select(&Config::default(), &all).unwrap();
        assert_eq!(
            got.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["eth0"]
        );
    }

    #[test]
    fn named_interface_must_exist() {
        let cfg = Config {
            include: vec!["nope0".into()],
            ..Config::default()
        };
        let e = select(&cfg, &[iface("eth0", true, false)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope0"), "{e}");
    }

    #[test]
    fn patterns_and_excludes() {
        let cfg = Config {
            include: vec!["eth*".into()],
            exclude: vec!["eth1".into()],
            ..Config::default()
        };
        let all = [
            iface("eth0", true, false),
            iface("eth1", true, false),
            iface("ib0", true, false),
        ];
        let got = select(&cfg, &all).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, "eth0");
    }
}
