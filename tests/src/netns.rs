//! Network namespaces and veth pairs that a test creates and always removes.
use crate::cmd::{self, command};
use anyhow::{bail, Context, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace (`ip netns add`), deleted on drop together with every process
/// still inside it.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `prb<pid>_<n>` with its loopback up.
    pub fn new() -> Result<Netns> {
        let name = format!(
            "prb{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        cmd::run(&mut command(&["ip", "netns", "add", &name]))?;
        let ns = Netns { name };
        ns.run(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/NAME`.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `nsenter --net=PATH argv...`: a command that runs inside the namespace. nsenter (not
    /// `ip netns exec`) keeps the host's /sys, so the cgroup2 mount stays visible.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path())).args(argv);
        c
    }

    /// Runs `argv` in the namespace (bounded) and returns its stdout.
    pub fn run(&self, argv: &[&str]) -> Result<String> {
        cmd::run(&mut self.command(argv))
    }

    /// Runs `f` on a new thread that has joined this namespace (see [`enter_path`]).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        enter_path(&self.path(), f)
    }

    /// The pids of the processes in the namespace.
    pub fn pids(&self) -> Vec<i32> {
        cmd::run(&mut command(&["ip", "netns", "pids", &self.name]))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Sets `net.*` sysctl `key` (dotted, relative to /proc/sys) inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run(&["sysctl", "-q", "-w", &format!("{key}={value}")])
            .map(|_| ())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes a test left behind in its own namespace (a Child guard normally stops them
        // first). Bounded: a few rounds of SIGKILL.
        for _ in 0..20 {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill(2); these are processes inside a namespace this test created.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Err(e) = cmd::run(&mut command(&["ip", "netns", "del", &self.name])) {
            eprintln!("warning: could not delete netns {}: {e}", self.name);
        }
    }
}

/// Runs `f` on a new thread that has joined the network namespace at `path`
/// (setns(CLONE_NEWNET) affects only the calling thread). Sockets made there stay in that
/// namespace after `f` returns.
pub fn enter_path<T: Send>(path: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            let file = std::fs::File::open(path).with_context(|| format!("open {path}"))?;
            // SAFETY: setns on a valid namespace fd; it changes only this thread.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns({path}): {}", std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow::anyhow!("thread in netns {path} panicked: {msg}")
        })?
    })
}

/// Two namespaces joined by a veth pair: `a` (host A, `veth_a`, 10.231.X.1) and `b` (host B,
/// `veth_b`, 10.231.X.2). Each test picks its own X so concurrent test binaries never share
/// addresses (sock_ops and the retransmit tracepoint see the sockets of every namespace, keyed
/// by peer address).
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
    pub veth_a: String,
    pub veth_b: String,
    pub ip_a: Ipv4Addr,
    pub ip_b: Ipv4Addr,
    /// fd00:231:X::1 and ::2 when built with IPv6.
    pub ip6_a: Option<Ipv6Addr>,
    pub ip6_b: Option<Ipv6Addr>,
    /// The veths' MAC addresses: 02:00:0a:e7:X:01 and :02.
    pub mac_a: [u8; 6],
    pub mac_b: [u8; 6],
}

/// Options of [`Pair::with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PairOpts {
    /// Add fd00:231:X::1/64 and ::2/64 (otherwise IPv6 is disabled on the veths, which keeps
    /// them quiet: no router solicitations, MLD reports or DAD).
    pub ipv6: bool,
    /// Turn TSO, GSO and GRO off on both ends, so that every skb is one wire packet.
    pub no_offloads: bool,
}

impl Pair {
    /// IPv4 only, offloads left as the kernel sets them.
    pub fn new(subnet: u8) -> Result<Pair> {
        Pair::with(subnet, PairOpts::default())
    }

    pub fn with(subnet: u8, opts: PairOpts) -> Result<Pair> {
        let a = Netns::new()?;
        let b = Netns::new()?;
        let veth_a = format!("veth{subnet}a");
        let veth_b = format!("veth{subnet}b");
        // Fixed MACs, so each side gets a permanent neighbour entry for the other: no ARP or
        // neighbour discovery on the link, only the test's own traffic.
        let mac = |h: u8| format!("02:00:0a:e7:{subnet:02x}:{h:02x}");
        let (mac_a, mac_b) = (mac(1), mac(2));
        cmd::run(&mut command(&[
            "ip",
            "link",
            "add",
            &veth_a,
            "address",
            &mac_a,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            &veth_b,
            "address",
            &mac_b,
            "netns",
            b.name(),
        ]))?;
        let ip_a = Ipv4Addr::new(10, 231, subnet, 1);
        let ip_b = Ipv4Addr::new(10, 231, subnet, 2);
        let (ip6_a, ip6_b) = if opts.ipv6 {
            let p = |h| Ipv6Addr::new(0xfd00, 0x231, subnet as u16, 0, 0, 0, 0, h);
            (Some(p(1)), Some(p(2)))
        } else {
            (None, None)
        };
        let sides = [
            (&a, &veth_a, ip_a, ip6_a, ip_b, ip6_b, &mac_b),
            (&b, &veth_b, ip_b, ip6_b, ip_a, ip6_a, &mac_a),
        ];
        for (ns, dev, ip4, ip6, peer4, peer6, peer_mac) in sides {
            if ip6.is_none() {
                ns.sysctl(&format!("net.ipv6.conf.{dev}.disable_ipv6"), "1")?;
            } else {
                // No link-local address (so no DAD, no MLD for it), no router solicitations.
                ns.sysctl(&format!("net.ipv6.conf.{dev}.addr_gen_mode"), "1")?;
                ns.sysctl(&format!("net.ipv6.conf.{dev}.router_solicitations"), "0")?;
            }
            ns.run(&["ip", "addr", "add", &format!("{ip4}/24"), "dev", dev])?;
            let p4 = peer4.to_string();
            ns.run(&[
                "ip",
                "neigh",
                "replace",
                &p4,
                "lladdr",
                peer_mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])?;
            if let (Some(ip6), Some(peer6)) = (ip6, peer6) {
                ns.run(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("{ip6}/64"),
                    "dev",
                    dev,
                    "nodad",
                ])?;
                let p6 = peer6.to_string();
                ns.run(&[
                    "ip",
                    "neigh",
                    "replace",
                    &p6,
                    "lladdr",
                    peer_mac,
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ])?;
            }
            if opts.no_offloads {
                set_offloads(ns, dev, false)?;
            }
            ns.run(&["ip", "link", "set", dev, "up"])?;
        }
        Ok(Pair {
            a,
            b,
            veth_a,
            veth_b,
            ip_a,
            ip_b,
            ip6_a,
            ip6_b,
            mac_a: [2, 0, 0x0a, 0xe7, subnet, 1],
            mac_b: [2, 0, 0x0a, 0xe7, subnet, 2],
        })
    }

    /// More IPv4 addresses (/24) for B, each with a permanent neighbour entry on A: more peers
    /// for A, and still no ARP on the link.
    pub fn add_b_addresses(&self, addrs: &[Ipv4Addr]) -> Result<()> {
        let mac = self
            .mac_b
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        for a in addrs {
            let a = a.to_string();
            let cidr = format!("{a}/24");
            self.b
                .run(&["ip", "addr", "add", &cidr, "dev", &self.veth_b])?;
            self.a.run(&[
                "ip",
                "neigh",
                "replace",
                &a,
                "lladdr",
                &mac,
                "dev",
                &self.veth_a,
                "nud",
                "permanent",
            ])?;
        }
        Ok(())
    }
}

/// `ethtool -K DEV tso|gso|gro on|off` inside `ns`.
pub fn set_offloads(ns: &Netns, dev: &str, on: bool) -> Result<()> {
    let v = if on { "on" } else { "off" };
    ns.run(&["ethtool", "-K", dev, "tso", v, "gso", v, "gro", v])
        .map(|_| ())
}

/// Sends `count` raw Ethernet frames of `len` bytes (header included, >= 60) with
/// `ethertype` from `dev` in `ns` to `dst`, through an AF_PACKET socket: non-IP traffic.
pub fn send_raw_frames(
    ns: &Netns,
    dev: &str,
    dst: [u8; 6],
    ethertype: u16,
    len: usize,
    count: usize,
) -> Result<()> {
    if !(60..=1514).contains(&len) {
        bail!("frame length {len} outside 60..=1514");
    }
    let dev = std::ffi::CString::new(dev)?;
    ns.enter(move || -> Result<()> {
        // SAFETY: plain socket/if_nametoindex/sendto/close calls on values built here.
        unsafe {
            let ifindex = libc::if_nametoindex(dev.as_ptr());
            if ifindex == 0 {
                bail!("no interface {dev:?}");
            }
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            if fd < 0 {
                bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
            }
            let mut frame = vec![0u8; len];
            frame[..6].copy_from_slice(&dst);
            frame[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xfe]);
            frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_protocol = ethertype.to_be();
            sa.sll_ifindex = ifindex as i32;
            sa.sll_halen = 6;
            sa.sll_addr[..6].copy_from_slice(&dst);
            let mut result = Ok(());
            for _ in 0..count {
                let n = libc::sendto(
                    fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&sa as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                if n != frame.len() as isize {
                    result = Err(anyhow::anyhow!(
                        "sendto: {}",
                        std::io::Error::last_os_error()
                    ));
                    break;
                }
            }
            libc::close(fd);
            result
        }
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root; skipped (passes trivially) otherwise so that `cargo test` of the parsers
    /// runs anywhere.
    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn netns_lifecycle_and_enter() {
        if !root() {
            return;
        }
        let ns = Netns::new().unwrap();
        let name = ns.name().to_owned();
        assert!(std::path::Path::new(&ns.path()).exists());
        // Inside, only lo exists; outside, the host's interfaces.
        let links = ns
            .enter(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap())
            .unwrap();
        let names: Vec<_> = crate::kernel::parse_proc_net_dev(&links)
            .unwrap()
            .into_keys()
            .collect();
        assert_eq!(names, vec!["lo".to_string()]);
        let mut sleeper = ns.command(&["sleep", "30"]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!ns.pids().is_empty());
        drop(ns);
        // Drop killed the process inside and removed the namespace.
        let st = sleeper.wait().unwrap();
        assert!(!st.success());
        assert!(!std::path::Path::new(&format!("/var/run/netns/{name}")).exists());
    }

    #[test]
    fn pair_connects_without_neighbour_discovery() {
        if !root() {
            return;
        }
        use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
        let p = Pair::with(
            250,
            PairOpts {
                ipv6: true,
                no_offloads: true,
            },
        )
        .unwrap();
        for ip in [IpAddr::from(p.ip_b), IpAddr::from(p.ip6_b.unwrap())] {
            let l =
                p.b.enter(|| TcpListener::bind(SocketAddr::new(ip, 7000)).unwrap())
                    .unwrap();
            let ok =
                p.a.enter(|| {
                    TcpStream::connect_timeout(&SocketAddr::new(ip, 7000), Duration::from_secs(3))
                        .is_ok()
                })
                .unwrap();
            assert!(ok, "connect to {ip}");
            drop(l);
        }
        let neigh = p.a.run(&["ip", "neigh", "show", "dev", &p.veth_a]).unwrap();
        assert!(
            neigh.contains("PERMANENT") && neigh.contains("02:00:0a:e7:fa:02"),
            "{neigh}"
        );
        let features = p.a.run(&["ethtool", "-k", &p.veth_a]).unwrap();
        assert!(
            features.contains("tcp-segmentation-offload: off"),
            "{features}"
        );
        // Nothing on the link but what the test sent: no ARP, no ND.
        let t = crate::kernel::iface_counters(&p.a, &p.veth_a).unwrap();
        assert!(t.tx_packets <= 8.0, "{t:?}");
    }
}
