//! The RDMA poller over a sysfs tree of any shape: devices, ports and counter files that are
//! files, directories, dangling symlinks or FIFOs, with any content, changing between two
//! polls. Counter totals must never go backwards, whatever the files say.
#![no_main]
use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use probe_user::collect::rdma::{sysfs, verbs::VerbsDiscovery, RdmaConfig, RdmaPoller};

const DEVICES: [&str; 3] = ["mlx5_0", "mlx5_1", "rxe0"];
/// Paths under a device directory; `P` is replaced by the port number.
const ENTRIES: [&str; 16] = [
    "",
    "node_guid",
    "ports",
    "ports/P",
    "ports/P/state",
    "ports/P/phys_state",
    "ports/P/rate",
    "ports/P/link_layer",
    "ports/P/counters",
    "ports/P/counters/port_xmit_data",
    "ports/P/counters/port_rcv_data",
    "ports/P/counters/port_xmit_wait",
    "ports/P/counters/symbol_error",
    "ports/P/hw_counters",
    "ports/P/hw_counters/out_of_buffer",
    "ports/P/hw_counters/lifespan",
];

#[derive(Arbitrary, Debug)]
enum Node {
    File(String),
    Dir,
    DanglingSymlink,
    Fifo,
    Remove,
}

#[derive(Arbitrary, Debug)]
struct Op {
    device: u8,
    port: u8,
    entry: u8,
    node: Node,
}

#[derive(Arbitrary, Debug)]
struct Input {
    before: Vec<Op>,
    after: Vec<Op>,
    text: String,
}

fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("tempdir"))
        .path()
}

fn apply(root: &Path, op: &Op) {
    let device = DEVICES[op.device as usize % DEVICES.len()];
    let port = (op.port % 3).to_string();
    let rel = ENTRIES[op.entry as usize % ENTRIES.len()].replace('P', &port);
    let path: PathBuf = if rel.is_empty() {
        root.join(device)
    } else {
        root.join(device).join(rel)
    };
    // Whatever was there goes first; failures only mean the shape did not allow it.
    let _ = fs::remove_file(&path);
    let _ = fs::remove_dir_all(&path);
    if let Some(parent) = path.parent() {
        let _ = fs::create_dir_all(parent);
    }
    let _ = match &op.node {
        Node::File(text) => fs::write(&path, text.as_bytes()),
        Node::Dir => fs::create_dir(&path),
        Node::DanglingSymlink => std::os::unix::fs::symlink(root.join("gone"), &path),
        Node::Fifo => {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            Ok(())
        }
        Node::Remove => Ok(()),
    };
}

fuzz_target!(|input: Input| {
    let _ = sysfs::parse_counter(&input.text);
    let _ = sysfs::parse_state(&input.text);
    let _ = sysfs::parse_rate(&input.text);

    if input.before.len() + input.after.len() > 64 {
        return;
    }
    let root = scratch().join("infiniband");
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root).expect("scratch root");
    for op in &input.before {
        apply(&root, op);
    }
    let mut poller = RdmaPoller::with_discovery(
        RdmaConfig {
            sysfs_root: root.clone(),
            ..RdmaConfig::default()
        },
        || VerbsDiscovery::Disabled,
    );
    let first = poller.poll();
    for op in &input.after {
        apply(&root, op);
    }
    let second = poller.poll();
    assert!(second.read_errors_total >= first.read_errors_total);
    for p in &second.ports {
        let Some(old) = first
            .ports
            .iter()
            .find(|o| o.device == p.device && o.port == p.port)
        else {
            continue;
        };
        for (key, &total) in &p.counters {
            if let Some(&before) = old.counters.get(key) {
                assert!(
                    total >= before,
                    "{} port {} {key} went back from {before} to {total}",
                    p.device,
                    p.port
                );
            }
        }
    }
});
