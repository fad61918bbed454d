//! Device discovery through libibverbs (the `ibverbs` crate), behind the cargo feature
//! `rdma-verbs` (on by default in the daemon).
//!
//! `ibv_get_device_list` gives the devices the verbs stack can use, with their node GUIDs and
//! kernel indices. It opens no device context and allocates nothing on the NIC. On a host
//! without an RDMA subsystem it fails with ENOSYS, or returns an empty list: both mean "no RDMA
//! devices", never an error.
//!
//! Ports are not enumerated here: the `ibverbs` crate's only port query (`Device::open`) is
//! hard-wired to port 1, refuses ports that are not ACTIVE and opens a device context. The
//! port list comes from `<root>/<device>/ports/` instead, which the same kernel driver fills.
//!
//! Without the feature (`--no-default-features`), [`discover`] returns
//! [`VerbsDiscovery::Disabled`], the binary does not link libibverbs, and the poller works from
//! sysfs alone.

use serde::Serialize;

/// A device as libibverbs lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerbsDevice {
    /// Kernel device name (`mlx5_0`).
    pub name: String,
    /// Node GUID in sysfs notation (`0c42:a103:0003:55e2`), when the device reports one.
    pub node_guid: Option<String>,
    /// Stable kernel device index, when known.
    pub index: Option<i32>,
}

/// What libibverbs said.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(dead_code)] // which variants a build constructs depends on the `rdma-verbs` feature
pub enum VerbsDiscovery {
    /// Built without the `rdma-verbs` feature.
    Disabled,
    /// No RDMA subsystem (ENOSYS) or an empty device list.
    NoDevices { reason: String },
    /// The devices libibverbs lists (at least one).
    Devices(Vec<VerbsDevice>),
    /// libibverbs failed for another reason (EPERM, ENOMEM, ...): the poller carries on with
    /// sysfs alone.
    Failed { error: String },
}

impl VerbsDiscovery {
    /// The listed devices (empty unless [`VerbsDiscovery::Devices`]).
    pub fn devices(&self) -> &[VerbsDevice] {
        match self {
            VerbsDiscovery::Devices(devices) => devices,
            _ => &[],
        }
    }
}

/// Formats a GUID the way sysfs prints `node_guid`: four groups of four hex digits.
#[cfg_attr(not(feature = "rdma-verbs"), allow(dead_code))]
pub fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// Lists RDMA devices through libibverbs. Never panics; never an error for "no RDMA".
#[cfg(feature = "rdma-verbs")]
pub fn discover() -> VerbsDiscovery {
    /// ENOSYS: no kernel support for RDMA (same value on x86, arm, riscv, ppc, s390).
    const ENOSYS: i32 = 38;
    let list = match ibverbs::devices() {
        Ok(list) => list,
        Err(e)
            if e.raw_os_error() == Some(ENOSYS) || e.kind() == std::io::ErrorKind::Unsupported =>
        {
            return VerbsDiscovery::NoDevices {
                reason: format!("no RDMA support in the kernel ({e})"),
            }
        }
        Err(e) => {
            return VerbsDiscovery::Failed {
                error: e.to_string(),
            }
        }
    };
    let devices: Vec<VerbsDevice> = list
        .iter()
        .filter_map(|device| {
            let name = device.name()?.to_str().ok()?.to_owned();
            Some(VerbsDevice {
                name,
                node_guid: device.guid().ok().map(|g| format_guid(u64::from(g))),
                index: device.index().ok(),
            })
        })
        .collect();
    if devices.is_empty() {
        VerbsDiscovery::NoDevices {
            reason: "libibverbs lists no devices".into(),
        }
    } else {
        VerbsDiscovery::Devices(devices)
    }
}

/// Built without the `rdma-verbs` feature: sysfs only.
#[cfg(not(feature = "rdma-verbs"))]
pub fn discover() -> VerbsDiscovery {
    VerbsDiscovery::Disabled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_formatted_like_sysfs() {
        assert_eq!(format_guid(0x0c42_a103_0003_55e2), "0c42:a103:0003:55e2");
        assert_eq!(format_guid(0), "0000:0000:0000:0000");
    }

    #[test]
    fn discovery_never_fails_hard() {
        // On a host without RDMA (this CI: ENOSYS) this is NoDevices; with the feature off,
        // Disabled; on an RDMA host, Devices. Never a panic.
        let d = discover();
        #[cfg(not(feature = "rdma-verbs"))]
        assert_eq!(d, VerbsDiscovery::Disabled);
        #[cfg(feature = "rdma-verbs")]
        assert_ne!(d, VerbsDiscovery::Disabled);
        match &d {
            VerbsDiscovery::Disabled => {}
            VerbsDiscovery::NoDevices { reason } => assert!(!reason.is_empty()),
            VerbsDiscovery::Devices(devices) => {
                assert!(!devices.is_empty());
                assert!(devices.iter().all(|d| !d.name.is_empty()));
            }
            VerbsDiscovery::Failed { error } => assert!(!error.is_empty()),
        }
        if !matches!(d, VerbsDiscovery::Devices(_)) {
            assert!(d.devices().is_empty());
        }
    }
}
