//! A fake RDMA device for end-to-end tests on hosts without one (this kernel has no RDMA
//! subsystem): an mlx5-like RoCE port as a sysfs tree under a temporary directory, which
//! `probe run` reads through `[rdma] sysfs_root`, and a thread that advances its counters at
//! set rates, as a busy port's would. Removed and stopped on drop.
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A counter file: (group directory, file name).
pub type File = (&'static str, &'static str);
/// Per-second increments by file.
type Rates = Mutex<Vec<(File, f64)>>;

static NEXT: AtomicUsize = AtomicUsize::new(0);
/// The ticker stops on its own after this long, even if the test forgets it.
const MAX_RUN: Duration = Duration::from_secs(600);
const STEP: Duration = Duration::from_millis(200);

/// Counter files of the port: (group, file).
pub const TRANSMIT_DATA: File = ("counters", "port_xmit_data");
pub const RECEIVE_DATA: File = ("counters", "port_rcv_data");
pub const TRANSMIT_WAIT: File = ("counters", "port_xmit_wait");
pub const CNP_SENT: File = ("hw_counters", "np_cnp_sent");
pub const CNP_HANDLED: File = ("hw_counters", "rp_cnp_handled");
pub const ECN_MARKED: File = ("hw_counters", "np_ecn_marked_roce_packets");

const FILES: &[File] = &[
    TRANSMIT_DATA,
    RECEIVE_DATA,
    ("counters", "port_xmit_packets"),
    ("counters", "port_rcv_packets"),
    TRANSMIT_WAIT,
    ("counters", "port_xmit_discards"),
    ("counters", "link_downed"),
    CNP_SENT,
    CNP_HANDLED,
    ECN_MARKED,
    ("hw_counters", "out_of_sequence"),
    ("hw_counters", "packet_seq_err"),
    ("hw_counters", "local_ack_timeout_err"),
    ("hw_counters", "rnr_nak_retry_err"),
];

/// A RoCE port directory as mlx5 shows it (`<device>/ports/<N>`): ACTIVE, LinkUp,
/// 100 Gb/s, Ethernet, and `files` at 0.
pub fn write_port(port: &Path, files: &[File]) -> Result<()> {
    for g in ["counters", "hw_counters"] {
        std::fs::create_dir_all(port.join(g))?;
    }
    for (f, v) in [
        ("state", "4: ACTIVE"),
        ("phys_state", "5: LinkUp"),
        ("rate", "100 Gb/sec (4X EDR)"),
        ("link_layer", "Ethernet"),
    ] {
        std::fs::write(port.join(f), format!("{v}\n"))?;
    }
    for (g, f) in files {
        std::fs::write(port.join(g).join(f), "0\n")?;
    }
    Ok(())
}

pub struct FakePort {
    root: PathBuf,
    /// Per-second increments by file; the ticker reads them each step.
    rates: Arc<Rates>,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl FakePort {
    /// `<tmp>/infiniband/<device>/ports/1/...`, every counter at 0, the ticker running.
    pub fn start(device: &str) -> Result<FakePort> {
        let root = std::env::temp_dir().join(format!(
            "probe-rdma-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        // The class directory probe lists is a subdirectory, so that the ticker's temporary
        // file beside it is never taken for a device.
        let port = root.join("infiniband").join(device).join("ports/1");
        write_port(&port, FILES)?;
        let rates = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (rates, stop, port, tmp) =
                (rates.clone(), stop.clone(), port.clone(), root.join(".tmp"));
            std::thread::spawn(move || tick(&port, &tmp, &rates, &stop))
        };
        Ok(FakePort {
            root,
            rates,
            stop,
            ticker: Some(ticker),
        })
    }

    /// The directory to give probe as `[rdma] sysfs_root`.
    pub fn root(&self) -> PathBuf {
        self.root.join("infiniband")
    }

    /// From now on, `file` grows by `per_second`.
    pub fn set_rate(&self, file: File, per_second: f64) {
        let mut r = self.rates.lock().unwrap();
        r.retain(|(f, _)| *f != file);
        r.push((file, per_second));
    }
}

fn tick(port: &Path, tmp: &Path, rates: &Rates, stop: &AtomicBool) {
    let started = Instant::now();
    let mut totals: std::collections::HashMap<File, f64> = Default::default();
    while !stop.load(Ordering::Relaxed) && started.elapsed() < MAX_RUN {
        let now: Vec<_> = rates.lock().unwrap().clone();
        for (file, rate) in now {
            let t = totals.entry(file).or_default();
            *t += rate * STEP.as_secs_f64();
            // Write then rename: a reader never sees a half-written number. The temporary file
            // lives outside the counter directories, which probe lists on every poll.
            let path = port.join(file.0).join(file.1);
            if std::fs::write(tmp, format!("{}\n", *t as u64)).is_ok() {
                let _ = std::fs::rename(tmp, &path);
            }
        }
        std::thread::sleep(STEP);
    }
}

impl Drop for FakePort {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
