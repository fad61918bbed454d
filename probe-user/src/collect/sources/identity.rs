//! Who this probe is: its host name, the training job it was told it serves, and the
//! addresses of its network namespace. Every other host's probe names this host only by an
//! address (its `peer` label); these series let one PromQL query join that peer to this
//! host's own series (docs/prometheus.md, "Joining hosts").
use std::{
    ffi::CStr,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result};

use super::{Kind, Metric, Sample, Source};
use crate::collect::readings::is_peer_address;

static HOST: Metric = Metric {
    name: "probe_host_info",
    help: "Always 1: this host's name and the training job set by --training-job (empty if none)",
    kind: Kind::Gauge,
};
static ADDRESS: Metric = Metric {
    name: "probe_host_address_info",
    help: "Always 1: an address of this host (of probe's network namespace), as other hosts' probes name it in their peer label",
    kind: Kind::Gauge,
};

pub struct Identity {
    training_job: String,
}

impl Identity {
    pub fn new(training_job: Option<&str>) -> Self {
        Self {
            training_job: training_job.unwrap_or_default().to_owned(),
        }
    }
}

impl Source for Identity {
    fn name(&self) -> &'static str {
        "identity"
    }

    fn metrics(&self) -> &'static [&'static Metric] {
        static ALL: [&Metric; 2] = [&HOST, &ADDRESS];
        &ALL
    }

    fn read(&mut self, out: &mut Vec<Sample>) -> Result<()> {
        // The UTS namespace's name, as `hostname` prints it.
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("reading /proc/sys/kernel/hostname")?;
        out.push(Sample {
            metric: &HOST,
            labels: vec![
                ("hostname", hostname.trim().to_owned()),
                ("training_job", self.training_job.clone()),
            ],
            value: 1.0,
        });
        for (iface, addr) in addresses()? {
            out.push(Sample {
                metric: &ADDRESS,
                labels: vec![("iface", iface), ("address", addr.to_string())],
                value: 1.0,
            });
        }
        Ok(())
    }
}

/// The namespace's (interface, address) pairs that can be peers, sorted, from getifaddrs(3).
fn addresses() -> Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that freeifaddrs releases below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getifaddrs");
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points at a sockaddr of the family it states.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        if !is_peer_address(&addr) {
            continue;
        }
        // SAFETY: a NUL-terminated name, alive until freeifaddrs.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push((name, addr));
    }
    // SAFETY: the list getifaddrs allocated, freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_link_local_addresses_are_not_peers() {
        for a in [
            "127.0.0.1",
            "169.254.3.4",
            "::1",
            "fe80::1",
            "0.0.0.0",
            "::",
        ] {
            assert!(!is_peer_address(&a.parse().unwrap()), "{a}");
        }
        for a in ["10.0.0.1", "192.168.1.2", "2001:db8::1", "fd00::5"] {
            assert!(is_peer_address(&a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn names_the_host_as_the_kernel_does_and_the_job_it_was_given() {
        let mut out = Vec::new();
        Identity::new(Some("llama-70b")).read(&mut out).unwrap();
        let host = &out[0];
        assert_eq!(host.metric.name, "probe_host_info");
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(
            host.labels,
            [
                ("hostname", kernel.trim().to_owned()),
                ("training_job", "llama-70b".to_owned())
            ]
        );
        // Every address is one getifaddrs gave and a peer could name.
        for s in &out[1..] {
            assert_eq!(s.metric.name, "probe_host_address_info");
            let a: IpAddr = s.labels[1].1.parse().unwrap();
            assert!(is_peer_address(&a));
        }
    }
}
