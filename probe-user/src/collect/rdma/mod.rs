//! RDMA verbs counter poller.
//!
//! RDMA traffic (InfiniBand, RoCE) bypasses the kernel network stack, so the eBPF programs never
//! see it; the NIC's own counters are the only window. This collector reads them from sysfs
//! (`<root>/<device>/ports/<N>/{counters,hw_counters}/*` plus the port attributes), turns them
//! into monotonic totals in base units and per-second rates, and publishes one
//! [`RdmaSnapshot`] per tick.
//!
//! * [`sysfs`]: reading one tree (device and port listing, attribute parsing, counter files).
//! * [`counters`]: counter semantics: legacy widths, saturation, wrap, units, accumulation, and
//!   the table of explicitly named metrics.
//! * [`verbs`]: device discovery through libibverbs (cargo feature `rdma-verbs`).
//! * [`poller`]: [`RdmaPoller`] (one synchronous pass) and [`spawn`] (a dedicated thread).
//! * [`export`]: [`encode_metrics`], the `probe_rdma_*` series.
//!
//! Data flows one way: the poller thread publishes `Arc<RdmaSnapshot>` on a
//! `tokio::sync::watch` channel; the exporter and the feature windows read the latest value.
//! The metrics are documented in `docs/rdma.md`.

pub mod counters;
pub mod export;
pub mod poller;
pub mod sysfs;
pub mod verbs;

#[cfg(test)]
pub(crate) mod fixtures;

use std::collections::BTreeMap;

use serde::Serialize;

// `keys` and `RdmaPoller` are for the feature windows and callers that poll synchronously; the
// allow keeps a binary crate quiet until they are wired in.
#[allow(unused_imports)]
pub use counters::keys;
pub use export::encode_metrics;
#[allow(unused_imports)]
pub use poller::{spawn, RdmaPoller};

pub use crate::config::{RdmaConfig, DEFAULT_SYSFS_ROOT};

/// Everything one poll saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RdmaSnapshot {
    /// One entry per (device, port) found under the sysfs root, sorted by device then port.
    pub ports: Vec<RdmaPort>,
    /// Counter and attribute reads that failed since the poller started (unsupported counters,
    /// I/O errors, unparsable values). Each failed read counts once per poll.
    pub read_errors_total: u64,
    /// Devices known to sysfs and/or to libibverbs, sorted by name.
    pub devices_seen: Vec<RdmaDevice>,
    /// Monotonic time since the previous poll, in seconds; `None` on the first poll.
    pub elapsed_seconds: Option<f64>,
}

/// One RDMA device, as discovered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RdmaDevice {
    /// Kernel device name, e.g. `mlx5_0`, `rxe0`.
    pub name: String,
    /// Node GUID in the sysfs notation (`0c42:a103:0003:55e2`), from libibverbs when it lists the
    /// device, else from `<root>/<device>/node_guid`.
    pub node_guid: Option<String>,
    /// The device has a directory under the sysfs root (its counters are read).
    pub in_sysfs: bool,
    /// libibverbs lists the device (always false without the `rdma-verbs` feature).
    pub in_verbs: bool,
}

/// One port of one device: attributes, monotonic counters and per-second rates.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RdmaPort {
    /// Device name, e.g. `mlx5_0`.
    pub device: String,
    /// Port number (1-based, as under `ports/`).
    pub port: u32,
    /// `InfiniBand`, `Ethernet` (RoCE, iWARP) or `Unknown`; `None` when unreadable.
    pub link_layer: Option<String>,
    /// Logical state name from `state` (`ACTIVE`, `DOWN`, `INIT`, `ARMED`, ...).
    pub state: Option<String>,
    /// Physical state name from `phys_state` (`LinkUp`, `Polling`, `Disabled`, ...).
    pub phys_state: Option<String>,
    /// Link rate from `rate` (`100 Gb/sec (4X EDR)` -> 100e9).
    pub rate_bits_per_second: Option<u64>,
    /// Monotonic totals in base units (bytes, packets, events), keyed by name: the names in
    /// [`keys`] for the explicitly named counters, `counters/<file>` and `hw_counters/<file>`
    /// for every other counter file found. A counter keeps its last total while a read fails.
    pub counters: BTreeMap<String, u64>,
    /// Per-second rates over the last interval, same keys as `counters`. A counter has a rate
    /// only when it was read on this poll and the previous one and is not saturated.
    pub rates: BTreeMap<String, f64>,
    /// Legacy `counters/` files stuck at their maximum (e.g. `port_xmit_data` at 2^32-1): their
    /// totals no longer advance until the counter is reset.
    pub saturated: Vec<String>,
}

impl RdmaPort {
    /// The monotonic total of a counter (see [`keys`]), in base units.
    pub fn counter(&self, key: &str) -> Option<u64> {
        self.counters.get(key).copied()
    }

    /// The per-second rate of a counter (see [`keys`]) over the last interval.
    #[allow(dead_code)] // for the feature windows
    pub fn rate(&self, key: &str) -> Option<f64> {
        self.rates.get(key).copied()
    }
}
