//! Test fixtures: sysfs trees shaped like real ones, written into a temporary directory.
//!
//! As on a real host, `<tmp>/sys/class/infiniband/<device>` is a symlink to the device's
//! directory under `<tmp>/sys/devices/...`. Counter files hold a decimal number and a newline.

use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// Legacy + extended IB PerfMgt counters (`pma_attrs_ext`): what mlx5 exposes under `counters/`.
const MLX5_COUNTERS: &[(&str, u64)] = &[
    ("VL15_dropped", 0),
    ("excessive_buffer_overrun_errors", 0),
    ("link_downed", 1),
    ("link_error_recovery", 0),
    ("local_link_integrity_errors", 0),
    ("multicast_rcv_packets", 12),
    ("multicast_xmit_packets", 9),
    ("port_rcv_constraint_errors", 0),
    ("port_rcv_data", 2_000_000),
    ("port_rcv_errors", 0),
    ("port_rcv_packets", 40_000),
    ("port_rcv_remote_physical_errors", 0),
    ("port_rcv_switch_relay_errors", 0),
    ("port_xmit_constraint_errors", 0),
    ("port_xmit_data", 1_000_000),
    ("port_xmit_discards", 0),
    ("port_xmit_packets", 30_000),
    ("port_xmit_wait", 500),
    ("symbol_error", 0),
    ("unicast_rcv_packets", 39_988),
    ("unicast_xmit_packets", 29_991),
];

/// mlx5 q counters (basic, out_of_seq, retransmission, extended errors).
const MLX5_Q_COUNTERS: &[(&str, u64)] = &[
    ("duplicate_request", 0),
    ("implied_nak_seq_err", 0),
    ("local_ack_timeout_err", 0),
    ("out_of_buffer", 0),
    ("out_of_sequence", 0),
    ("packet_seq_err", 0),
    ("req_cqe_error", 0),
    ("req_cqe_flush_error", 0),
    ("req_remote_access_errors", 0),
    ("req_remote_invalid_request", 0),
    ("resp_cqe_error", 0),
    ("resp_cqe_flush_error", 0),
    ("resp_local_length_error", 0),
    ("resp_remote_access_errors", 0),
    ("rnr_nak_retry_err", 0),
    ("rx_atomic_requests", 0),
    ("rx_read_requests", 100),
    ("rx_write_requests", 5_000),
];

/// mlx5 congestion counters (RoCE ports with cc_query_allowed) and RoCE accel counters.
const MLX5_ROCE_COUNTERS: &[(&str, u64)] = &[
    ("np_cnp_sent", 10),
    ("np_ecn_marked_roce_packets", 20),
    ("rp_cnp_handled", 30),
    ("rp_cnp_ignored", 0),
    ("roce_adp_retrans", 0),
    ("roce_adp_retrans_to", 0),
    ("roce_slow_restart", 0),
    ("roce_slow_restart_cnps", 0),
    ("roce_slow_restart_trans", 0),
    ("rx_icrc_encapsulated", 0),
];

/// rxe (soft-RoCE) hw counters: no `counters/` directory at all.
const RXE_HW_COUNTERS: &[(&str, u64)] = &[
    ("ack_deferred", 0),
    ("completer_retry_err", 0),
    ("duplicate_request", 0),
    ("link_downed", 0),
    ("out_of_seq_request", 0),
    ("rcvd_pkts", 800),
    ("rcvd_rnr_err", 0),
    ("rcvd_seq_err", 0),
    ("rdma_recvs", 0),
    ("rdma_sends", 0),
    ("retry_exceeded_err", 0),
    ("retry_rnr_exceeded_err", 0),
    ("send_err", 0),
    ("send_rnr_err", 0),
    ("sent_pkts", 900),
];

pub struct Fixture {
    dir: TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("sys/class/infiniband")).expect("class dir");
        Self { dir }
    }

    /// The class root to put in `RdmaConfig::sysfs_root`.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("sys/class/infiniband")
    }

    fn device_target(&self, device: &str) -> PathBuf {
        self.dir
            .path()
            .join("sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0/infiniband")
            .join(device)
    }

    fn port_dir(&self, device: &str, port: u32) -> PathBuf {
        self.root()
            .join(device)
            .join("ports")
            .join(port.to_string())
    }

    fn device(&self, device: &str, guid: &str) {
        let target = self.device_target(device);
        fs::create_dir_all(&target).expect("device dir");
        std::os::unix::fs::symlink(&target, self.root().join(device)).expect("class symlink");
        write(&target.join("node_guid"), &format!("{guid}\n"));
        write(&target.join("sys_image_guid"), &format!("{guid}\n"));
        write(&target.join("node_type"), "1: CA\n");
        write(&target.join("fw_ver"), "20.39.1002\n");
    }

    fn port(&self, device: &str, port: u32, rate: &str, link_layer: &str) {
        let dir = self.port_dir(device, port);
        fs::create_dir_all(&dir).expect("port dir");
        write(&dir.join("state"), "4: ACTIVE\n");
        write(&dir.join("phys_state"), "5: LinkUp\n");
        write(&dir.join("rate"), &format!("{rate}\n"));
        write(&dir.join("link_layer"), &format!("{link_layer}\n"));
        write(&dir.join("lid"), "0x5\n");
        write(&dir.join("sm_lid"), "0x1\n");
        write(&dir.join("cap_mask"), "0xa651e848\n");
        fs::create_dir_all(dir.join("gids")).expect("gids");
        write(
            &dir.join("gids/0"),
            "fe80:0000:0000:0000:0c42:a103:0003:55e2\n",
        );
    }

    fn counters(&self, device: &str, port: u32, group: &str, values: &[(&str, u64)]) {
        let dir = self.port_dir(device, port).join(group);
        fs::create_dir_all(&dir).expect("counter dir");
        for (name, value) in values {
            write(&dir.join(name), &format!("{value}\n"));
        }
        if group == "hw_counters" {
            write(&dir.join("lifespan"), "10\n");
        }
    }

    /// mlx5 (ConnectX) port 1 on InfiniBand EDR: extended PMA counters, q counters, no
    /// congestion counters.
    pub fn mlx5_ib(&self, device: &str) {
        self.device(device, "0c42:a103:0003:55e2");
        self.port(device, 1, "100 Gb/sec (4X EDR)", "InfiniBand");
        self.counters(device, 1, "counters", MLX5_COUNTERS);
        self.counters(device, 1, "hw_counters", MLX5_Q_COUNTERS);
    }

    /// mlx5 port 1 on Ethernet (RoCE v2): PMA counters (emulated by mlx5), q counters and the
    /// congestion counters.
    pub fn mlx5_roce(&self, device: &str) {
        self.device(device, "0c42:a103:0010:8a3c");
        self.port(device, 1, "100 Gb/sec (4X EDR)", "Ethernet");
        self.counters(device, 1, "counters", MLX5_COUNTERS);
        let mut hw: Vec<(&str, u64)> = MLX5_Q_COUNTERS.to_vec();
        hw.extend_from_slice(MLX5_ROCE_COUNTERS);
        self.counters(device, 1, "hw_counters", &hw);
    }

    /// rxe (soft-RoCE over a netdev) port 1: only `hw_counters/`.
    pub fn rxe(&self, device: &str) {
        let dir = self
            .dir
            .path()
            .join("sys/devices/virtual/infiniband")
            .join(device);
        fs::create_dir_all(&dir).expect("rxe dir");
        std::os::unix::fs::symlink(&dir, self.root().join(device)).expect("class symlink");
        write(&dir.join("node_guid"), "5054:00ff:fe12:3456\n");
        write(&dir.join("node_type"), "1: CA\n");
        self.port(device, 1, "10 Gb/sec (1X QDR)", "Ethernet");
        self.counters(device, 1, "hw_counters", RXE_HW_COUNTERS);
    }

    /// Writes a counter or attribute value (`rel` is relative to the port directory).
    pub fn set(&self, device: &str, port: u32, rel: &str, value: u64) {
        self.write(device, port, rel, &format!("{value}\n"));
    }

    pub fn write(&self, device: &str, port: u32, rel: &str, text: &str) {
        let path = self.port_dir(device, port).join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("parent dir");
        }
        write(&path, text);
    }

    /// Puts a directory where a file is expected (reads fail with EISDIR, even for root).
    pub fn replace_with_dir(&self, device: &str, port: u32, rel: &str) {
        let path = self.port_dir(device, port).join(rel);
        let _ = fs::remove_file(&path);
        fs::create_dir_all(&path).expect("dir in place of a file");
    }

    /// Removes a device the way the kernel does: the class link and the device directory go.
    pub fn remove_device(&self, device: &str) {
        let link = self.root().join(device);
        let target = fs::read_link(&link).expect("class link");
        fs::remove_file(&link).expect("remove link");
        fs::remove_dir_all(target).expect("remove device dir");
    }
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A snapshot of three devices (InfiniBand and RoCE mlx5, rxe) after two polls, with a
/// saturated counter and a counter that is a directory.
pub fn snapshot() -> super::RdmaSnapshot {
    let fx = Fixture::new();
    fx.mlx5_ib("mlx5_0");
    fx.mlx5_roce("mlx5_1");
    fx.rxe("rxe0");
    fx.set("mlx5_0", 1, "counters/port_xmit_wait", 0xFFFF_FFFF);
    fx.replace_with_dir("mlx5_0", 1, "counters/symbol_error");
    let mut p = super::RdmaPoller::with_discovery(
        super::RdmaConfig {
            sysfs_root: fx.root(),
            interval: std::time::Duration::from_secs(1),
        },
        || super::verbs::VerbsDiscovery::Disabled,
    );
    let t0 = std::time::Instant::now();
    p.poll_at(t0);
    fx.set("mlx5_0", 1, "counters/port_xmit_data", 1_000_100);
    p.poll_at(t0 + std::time::Duration::from_secs(1))
}
