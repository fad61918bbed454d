//! RDMA fixture devices for the soak: mlx5-shaped sysfs trees under a directory probe reads
//! as `[rdma] sysfs_root`, that appear, count, vanish, and have counter files turn
//! unreadable (root ignores file modes, so the file is replaced by a directory, a dangling
//! symlink, a FIFO or garbage) and later readable again. Counters only ever grow, so any
//! counter probe exports for them must too. The tree is removed on drop.
use super::rng::Rng;
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Counter files of each port: (group directory, name).
const FILES: &[(&str, &str)] = &[
    ("counters", "port_xmit_data"),
    ("counters", "port_rcv_data"),
    ("counters", "port_xmit_packets"),
    ("counters", "port_rcv_packets"),
    ("counters", "port_xmit_wait"),
    ("hw_counters", "np_cnp_sent"),
    ("hw_counters", "rp_cnp_handled"),
    ("hw_counters", "np_ecn_marked_roce_packets"),
    ("hw_counters", "out_of_sequence"),
];

/// The ways a counter file turns unreadable.
const BREAKS: &[&str] = &[
    "directory",
    "dangling-symlink",
    "fifo",
    "garbage",
    "oversized",
];

struct Device {
    /// Running totals by file index.
    totals: Vec<u64>,
    /// Files currently broken.
    broken: BTreeSet<usize>,
}

pub struct RdmaFixture {
    /// Parent of the class directory; holds the write-then-rename temporary file.
    base: PathBuf,
    devices: BTreeMap<String, Device>,
    next: u32,
    pub added: u64,
    pub removed: u64,
    pub broken: u64,
    pub repaired: u64,
}

impl RdmaFixture {
    pub fn create(base: &Path) -> Result<Self> {
        let _ = std::fs::remove_dir_all(base);
        std::fs::create_dir_all(base.join("infiniband"))
            .with_context(|| format!("creating {}", base.display()))?;
        Ok(Self {
            base: base.to_path_buf(),
            devices: BTreeMap::new(),
            next: 0,
            added: 0,
            removed: 0,
            broken: 0,
            repaired: 0,
        })
    }

    /// `[rdma] sysfs_root` for probe.
    pub fn class_dir(&self) -> PathBuf {
        self.base.join("infiniband")
    }

    pub fn live(&self) -> usize {
        self.devices.len()
    }

    fn port(&self, dev: &str) -> PathBuf {
        self.class_dir().join(dev).join("ports/1")
    }

    /// A new device with fresh counters; a new name every time, so that a name never comes
    /// back with counters lower than before.
    pub fn add(&mut self) -> Result<String> {
        let name = format!("mlx5_{}", self.next);
        self.next += 1;
        // Built beside the class directory and renamed in: probe never sees half a device.
        let staging = self.base.join(format!(".new-{name}"));
        probe_tests::rdma::write_port(&staging.join("ports/1"), FILES)?;
        std::fs::write(staging.join("node_guid"), "0c42:a103:0003:55e2\n")?;
        std::fs::rename(&staging, self.class_dir().join(&name))?;
        self.devices.insert(
            name.clone(),
            Device {
                totals: vec![0; FILES.len()],
                broken: BTreeSet::new(),
            },
        );
        self.added += 1;
        Ok(name)
    }

    /// Removes a random device: sometimes at once (renamed away), sometimes file by file,
    /// as a driver unregistering under a reader.
    pub fn remove(&mut self, rng: &mut Rng) -> Result<Option<String>> {
        let Some(name) = self.pick(rng) else {
            return Ok(None);
        };
        let dir = self.class_dir().join(&name);
        if rng.chance(0.5) {
            let gone = self.base.join(format!(".gone-{name}"));
            std::fs::rename(&dir, &gone)?;
            std::fs::remove_dir_all(&gone)?;
        } else {
            std::fs::remove_dir_all(&dir)?;
        }
        self.devices.remove(&name);
        self.removed += 1;
        Ok(Some(name))
    }

    fn pick(&self, rng: &mut Rng) -> Option<String> {
        let n = self.devices.len() as u64;
        self.devices.keys().nth(rng.below(n) as usize).cloned()
    }

    /// Breaks a readable counter file of a random device, or repairs a broken one (with a
    /// value at least the last one written). Returns what it did.
    pub fn break_or_repair(&mut self, rng: &mut Rng) -> Result<Option<String>> {
        let Some(name) = self.pick(rng) else {
            return Ok(None);
        };
        let port = self.port(&name);
        let dev = self.devices.get_mut(&name).expect("picked");
        let i = rng.below(FILES.len() as u64) as usize;
        let (g, f) = FILES[i];
        let path = port.join(g).join(f);
        if dev.broken.remove(&i) {
            remove_any(&path)?;
            std::fs::write(&path, format!("{}\n", dev.totals[i]))?;
            self.repaired += 1;
            return Ok(Some(format!("repaired {name}/{g}/{f}")));
        }
        let how = BREAKS[rng.below(BREAKS.len() as u64) as usize];
        remove_any(&path)?;
        match how {
            "directory" => std::fs::create_dir(&path)?,
            "dangling-symlink" => std::os::unix::fs::symlink("/nonexistent/probe-soak", &path)?,
            "fifo" => {
                let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
                // SAFETY: mkfifo with a valid NUL-terminated path.
                if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
                    return Err(std::io::Error::last_os_error()).context("mkfifo");
                }
            }
            "garbage" => std::fs::write(&path, b"N/A (no PMA)\n\xff\xfe-12x\n")?,
            _ => std::fs::write(&path, "9".repeat(8192))?,
        }
        dev.broken.insert(i);
        self.broken += 1;
        Ok(Some(format!("broke {name}/{g}/{f} ({how})")))
    }

    /// Advances every readable counter of every device, as busy ports do (write, then
    /// rename: a reader never sees half a number).
    pub fn advance(&mut self, rng: &mut Rng) -> Result<()> {
        let tmp = self.base.join(".tmp");
        let class = self.class_dir();
        for (name, dev) in &mut self.devices {
            let port = class.join(name).join("ports/1");
            for (i, (g, f)) in FILES.iter().enumerate() {
                if dev.broken.contains(&i) {
                    continue;
                }
                dev.totals[i] += rng.below(1_000_000);
                std::fs::write(&tmp, format!("{}\n", dev.totals[i]))?;
                std::fs::rename(&tmp, port.join(g).join(f))?;
            }
        }
        Ok(())
    }
}

fn remove_any(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path)?,
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
    }
    Ok(())
}

impl Drop for RdmaFixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_come_break_heal_and_go() {
        let base = std::env::temp_dir().join(format!("soak-rdma-test-{}", std::process::id()));
        let mut rng = Rng::new(3, 0);
        {
            let mut fx = RdmaFixture::create(&base).unwrap();
            let name = fx.add().unwrap();
            fx.advance(&mut rng).unwrap();
            let xmit = fx.port(&name).join("counters/port_xmit_data");
            let v: u64 = std::fs::read_to_string(&xmit)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert_eq!(v, fx.devices[&name].totals[0]);
            for _ in 0..40 {
                fx.break_or_repair(&mut rng).unwrap();
                fx.advance(&mut rng).unwrap();
            }
            assert!(fx.broken > 0 && fx.repaired > 0);
            assert_eq!(fx.remove(&mut rng).unwrap(), Some(name));
            assert_eq!(fx.live(), 0);
            assert_eq!(
                std::fs::read_dir(fx.class_dir()).unwrap().count(),
                0,
                "the class directory is empty again"
            );
        }
        assert!(!base.exists());
    }
}
