//! Extra veth links between two test namespaces, set up like [`crate::Pair`]'s (IPv4 only,
//! IPv6 off, permanent neighbours, fixed MACs), optionally with chosen interface indexes.
//!
//! Interface indexes are per namespace: the first veth in every fresh namespace gets the
//! same index (2), so tests that run side by side have many devices with one index. A
//! chosen, unusual index keeps a test's device apart from the others wherever a host-wide
//! hook identifies devices by index alone.
use crate::cmd::{self, command};
use crate::netns::{Netns, Pair};
use anyhow::{Context, Result};
use std::net::Ipv4Addr;

/// One end of a veth link.
#[derive(Clone)]
pub struct End<'a> {
    pub ns: &'a Netns,
    pub name: String,
    /// The interface index to ask for (`ip link add ... index N`); the kernel picks when None.
    pub index: Option<u32>,
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
}

fn mac_text(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Creates a veth link between `a` and `b` (both ends straight in their namespaces), with
/// `/prefix` addresses, a permanent neighbour entry for the other end, IPv6 off, and up.
pub fn add_veth(a: &End, b: &End, prefix: u8) -> Result<()> {
    let (ma, mb) = (mac_text(&a.mac), mac_text(&b.mac));
    let (ia, ib) = (
        a.index.map(|i| i.to_string()),
        b.index.map(|i| i.to_string()),
    );
    let mut argv = vec!["ip", "link", "add", &a.name];
    if let Some(i) = &ia {
        argv.extend(["index", i]);
    }
    argv.extend(["address", &ma, "netns", a.ns.name(), "type", "veth", "peer"]);
    argv.extend(["name", &b.name]);
    if let Some(i) = &ib {
        argv.extend(["index", i]);
    }
    argv.extend(["address", &mb, "netns", b.ns.name()]);
    cmd::run(&mut command(&argv)).with_context(|| format!("creating veth {}", a.name))?;
    for (me, other, other_mac) in [(a, b, &mb), (b, a, &ma)] {
        me.ns
            .sysctl(&format!("net.ipv6.conf.{}.disable_ipv6", me.name), "1")?;
        me.ns.run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/{prefix}", me.ip),
            "dev",
            &me.name,
        ])?;
        me.ns.run(&[
            "ip",
            "neigh",
            "replace",
            &other.ip.to_string(),
            "lladdr",
            other_mac,
            "dev",
            &me.name,
            "nud",
            "permanent",
        ])?;
        me.ns.run(&["ip", "link", "set", &me.name, "up"])?;
    }
    Ok(())
}

/// Deletes `name` in `ns` (a veth takes its peer with it).
pub fn del_link(ns: &Netns, name: &str) -> Result<()> {
    ns.run(&["ip", "link", "del", name]).map(|_| ())
}

/// The interface index of `name` in `ns` (`ip -o link show dev NAME`: `7: name@...`).
pub fn ifindex(ns: &Netns, name: &str) -> Result<u32> {
    let line = ns.run(&["ip", "-o", "link", "show", "dev", name])?;
    line.split(':')
        .next()
        .context("no ifindex in ip link output")?
        .trim()
        .parse()
        .with_context(|| format!("bad ip link line {line:?}"))
}

/// Replaces `pair`'s veth with an identical one (names, addresses, MACs) whose two ends have
/// the interface indexes `index_a` and `index_b`.
pub fn reindex_pair(pair: &Pair, index_a: u32, index_b: u32) -> Result<()> {
    del_link(&pair.a, &pair.veth_a)?;
    add_veth(
        &End {
            ns: &pair.a,
            name: pair.veth_a.clone(),
            index: Some(index_a),
            ip: pair.ip_a,
            mac: pair.mac_a,
        },
        &End {
            ns: &pair.b,
            name: pair.veth_b.clone(),
            index: Some(index_b),
            ip: pair.ip_b,
            mac: pair.mac_b,
        },
        24,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_print_like_ip() {
        assert_eq!(mac_text(&[2, 0, 0x0a, 0xe7, 0x3d, 1]), "02:00:0a:e7:3d:01");
    }

    #[test]
    fn reindexed_pair_still_connects() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        use std::net::{SocketAddr, TcpListener, TcpStream};
        let p = Pair::new(69).unwrap();
        reindex_pair(&p, 6901, 6902).unwrap();
        assert_eq!(ifindex(&p.a, &p.veth_a).unwrap(), 6901);
        assert_eq!(ifindex(&p.b, &p.veth_b).unwrap(), 6902);
        let addr = SocketAddr::new(p.ip_b.into(), 7001);
        let _l = p.b.enter(|| TcpListener::bind(addr).unwrap()).unwrap();
        let ok = p
            .a
            .enter(|| TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(3)).is_ok())
            .unwrap();
        assert!(ok);
    }
}
