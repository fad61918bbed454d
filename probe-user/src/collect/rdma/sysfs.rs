//! Reading one RDMA sysfs tree.
//!
//! Layout (drivers/infiniband/core/sysfs.c), under the class root (`/sys/class/infiniband`):
//!
//! ```text
//! <device>/node_guid                       0c42:a103:0003:55e2
//! <device>/ports/<N>/state                 4: ACTIVE
//! <device>/ports/<N>/phys_state            5: LinkUp
//! <device>/ports/<N>/rate                  100 Gb/sec (4X EDR)
//! <device>/ports/<N>/link_layer            InfiniBand | Ethernet
//! <device>/ports/<N>/counters/<name>       decimal, IB PerfMgt counters (absent without a PMA, e.g. rxe)
//! <device>/ports/<N>/hw_counters/<name>    decimal, driver statistics, plus `lifespan` (not a counter)
//! ```
//!
//! A counter read can fail (EINVAL when the PMA query fails, EOPNOTSUPP/ENOSYS for an
//! unsupported counter, EIO, or `N/A (no PMA)` text on old kernels): such a file is skipped and
//! reported as a [`Failure`]. Only regular files and directories are ever opened, so a FIFO in a
//! fixture tree cannot block the poller.

use std::fs::{self, File, FileType};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::counters::Group;

/// Largest sysfs attribute the reader accepts (one page).
const MAX_ATTR_BYTES: u64 = 4096;

/// `ENODEV`: what reads of a device being unregistered return (same value on every Linux arch).
const ENODEV: i32 = 19;

/// Files in `hw_counters/` that are not counters.
const HW_COUNTERS_NON_COUNTERS: &[&str] = &["lifespan"];

/// Why a read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// EINVAL, EOPNOTSUPP, ENOSYS: the device or driver does not provide this value.
    Unsupported,
    /// ENOENT, ENODEV: the file went away (device or port removed while reading).
    Gone,
    /// Not a regular file (FIFO, socket, device node): never opened.
    NotAFile,
    /// The content is not what the attribute should hold (e.g. `N/A (no PMA)`).
    Parse,
    /// Any other I/O error (EIO, EISDIR, EACCES, ...).
    Io,
}

/// A failed read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Path relative to the port directory (e.g. `counters/port_xmit_wait`, `rate`), or the
    /// absolute path for device-level files.
    pub what: String,
    pub kind: FailureKind,
    pub detail: String,
}

impl FailureKind {
    fn of(err: &io::Error) -> FailureKind {
        match err.kind() {
            io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported => FailureKind::Unsupported,
            io::ErrorKind::NotFound => FailureKind::Gone,
            _ if err.raw_os_error() == Some(ENODEV) => FailureKind::Gone,
            _ => FailureKind::Io,
        }
    }
}

/// Port attributes, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortAttrs {
    pub state: Option<String>,
    pub phys_state: Option<String>,
    pub rate_bits_per_second: Option<u64>,
    pub link_layer: Option<String>,
}

/// One counter file's reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterFile {
    pub group: Group,
    pub file: String,
    /// The parsed value, or `None` when the read failed (the failure is in
    /// [`PortReading::failures`]). The file is listed either way.
    pub value: Option<u64>,
}

/// Everything read from one port directory in one pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortReading {
    pub attrs: PortAttrs,
    /// Every file listed in `counters/` and `hw_counters/` (except `lifespan`), sorted by group
    /// then name.
    pub counters: Vec<CounterFile>,
    pub failures: Vec<Failure>,
    /// The port directory disappeared during the pass: drop the port, ignore its failures.
    pub vanished: bool,
}

/// Lists the device names under the class root. A missing root means no RDMA devices.
pub fn list_devices(root: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries.flatten() {
        // Class entries are symlinks into /sys/devices: follow them; anything that is not a
        // directory (or a dangling link) is not a device.
        let path = entry.path();
        if path.is_dir() {
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Lists the port numbers of a device (`<device>/ports/<N>`), sorted. Entries that are not
/// numbers are ignored.
pub fn list_ports(device_dir: &Path) -> io::Result<Vec<u32>> {
    let mut ports: Vec<u32> = fs::read_dir(device_dir.join("ports"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}

/// Reads a device's node GUID (`<device>/node_guid`).
pub fn read_node_guid(device_dir: &Path) -> Result<String, Failure> {
    let path = device_dir.join("node_guid");
    let what = path.display().to_string();
    let text = read_attr(&path, None).map_err(|(kind, detail)| Failure {
        what: what.clone(),
        kind,
        detail,
    })?;
    let guid = text.trim();
    if guid.is_empty() {
        return Err(Failure {
            what,
            kind: FailureKind::Parse,
            detail: "empty".into(),
        });
    }
    Ok(guid.to_owned())
}

/// Reads one port directory: attributes and every counter file found.
pub fn read_port(port_dir: &Path) -> PortReading {
    let mut reading = PortReading::default();
    if !port_dir.is_dir() {
        reading.vanished = true;
        return reading;
    }
    reading.attrs = PortAttrs {
        state: read_port_attr(port_dir, "state", parse_state, &mut reading.failures),
        phys_state: read_port_attr(port_dir, "phys_state", parse_state, &mut reading.failures),
        rate_bits_per_second: read_port_attr(port_dir, "rate", parse_rate, &mut reading.failures),
        link_layer: read_port_attr(port_dir, "link_layer", parse_word, &mut reading.failures),
    };
    for group in [Group::Counters, Group::HwCounters] {
        read_counter_dir(port_dir, group, &mut reading);
    }
    if reading.failures.iter().any(|f| f.kind == FailureKind::Gone) && !port_dir.is_dir() {
        reading.vanished = true;
    }
    reading
}

fn read_port_attr<T>(
    port_dir: &Path,
    name: &str,
    parse: fn(&str) -> Option<T>,
    failures: &mut Vec<Failure>,
) -> Option<T> {
    let path = port_dir.join(name);
    match read_attr(&path, None) {
        Ok(text) => {
            let parsed = parse(&text);
            if parsed.is_none() {
                failures.push(Failure {
                    what: name.to_owned(),
                    kind: FailureKind::Parse,
                    detail: format!("unexpected content {:?}", text.trim()),
                });
            }
            parsed
        }
        // Old kernels lack some attributes (link_layer): absent is not a failure.
        Err((FailureKind::Gone, _)) if port_dir.is_dir() => None,
        Err((kind, detail)) => {
            failures.push(Failure {
                what: name.to_owned(),
                kind,
                detail,
            });
            None
        }
    }
}

fn read_counter_dir(port_dir: &Path, group: Group, reading: &mut PortReading) {
    let dir = port_dir.join(group.dir());
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        // Not every port has both groups (rxe has no counters/; old drivers no hw_counters/).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return
        }
        Err(e) => {
            reading.failures.push(Failure {
                what: group.dir().to_owned(),
                kind: FailureKind::of(&e),
                detail: e.to_string(),
            });
            return;
        }
    };
    let mut files: Vec<(String, Option<FileType>)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            Some((name, e.file_type().ok()))
        })
        .filter(|(name, _)| {
            group != Group::HwCounters || !HW_COUNTERS_NON_COUNTERS.contains(&name.as_str())
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    for (file, file_type) in files {
        let value = match read_attr(&dir.join(&file), file_type) {
            Ok(text) => match parse_counter(&text) {
                Some(v) => Some(v),
                None => {
                    reading.failures.push(Failure {
                        what: group.key(&file),
                        kind: FailureKind::Parse,
                        detail: format!("not a counter value: {:?}", text.trim()),
                    });
                    None
                }
            },
            Err((kind, detail)) => {
                reading.failures.push(Failure {
                    what: group.key(&file),
                    kind,
                    detail,
                });
                None
            }
        };
        reading.counters.push(CounterFile { group, file, value });
    }
}

/// Reads a small attribute file. Only regular files and directories are opened (a directory
/// fails with EISDIR on read); FIFOs, sockets and device nodes are refused unopened.
fn read_attr(path: &Path, file_type: Option<FileType>) -> Result<String, (FailureKind, String)> {
    let err = |e: io::Error| (FailureKind::of(&e), e.to_string());
    let openable = match file_type {
        Some(t) if t.is_file() || t.is_dir() => true,
        // Symlinks (and an unknown type) are resolved first.
        Some(t) if !t.is_symlink() => false,
        _ => {
            let md = fs::metadata(path).map_err(err)?;
            md.is_file() || md.is_dir()
        }
    };
    if !openable {
        return Err((FailureKind::NotAFile, "not a regular file".into()));
    }
    let mut text = String::new();
    File::open(path)
        .and_then(|f| f.take(MAX_ATTR_BYTES).read_to_string(&mut text))
        .map_err(err)?;
    Ok(text)
}

/// A counter file: one unsigned decimal number and a newline.
pub fn parse_counter(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `4: ACTIVE` -> `ACTIVE`, `5: LinkUp` -> `LinkUp`, `7: Phy Test` -> `Phy Test`.
pub fn parse_state(text: &str) -> Option<String> {
    let text = text.trim();
    let name = match text.split_once(':') {
        Some((_, name)) => name.trim(),
        None => text,
    };
    label_safe(name)
}

/// `InfiniBand`, `Ethernet`, `Unknown`.
fn parse_word(text: &str) -> Option<String> {
    label_safe(text.trim())
}

/// Attribute text that can become a label value: non-empty, no control characters.
fn label_safe(text: &str) -> Option<String> {
    (!text.is_empty() && !text.chars().any(char::is_control)).then(|| text.to_owned())
}

/// `100 Gb/sec (4X EDR)` -> 100_000_000_000; `2.5 Gb/sec (1X SDR)` -> 2_500_000_000.
pub fn parse_rate(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    let factor = match words.next()? {
        "Gb/sec" | "Gb/s" => 1e9,
        "Mb/sec" | "Mb/s" => 1e6,
        _ => return None,
    };
    let bits = number * factor;
    (bits.is_finite() && bits >= 0.0 && bits < u64::MAX as f64).then(|| bits.round() as u64)
}

/// The directory of one port.
pub fn port_dir(root: &Path, device: &str, port: u32) -> PathBuf {
    root.join(device).join("ports").join(port.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::Fixture;
    use super::*;

    #[test]
    fn parses_port_attributes() {
        assert_eq!(parse_state("4: ACTIVE\n").as_deref(), Some("ACTIVE"));
        assert_eq!(parse_state("1: DOWN\n").as_deref(), Some("DOWN"));
        assert_eq!(parse_state("5: LinkUp\n").as_deref(), Some("LinkUp"));
        assert_eq!(parse_state("7: Phy Test\n").as_deref(), Some("Phy Test"));
        assert_eq!(parse_state("ACTIVE").as_deref(), Some("ACTIVE"));
        assert_eq!(parse_state("\n"), None);
        assert_eq!(parse_state("4: ACT\0IVE\n"), None);
        assert_eq!(parse_rate("100 Gb/sec (4X EDR)\n"), Some(100_000_000_000));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)\n"), Some(2_500_000_000));
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)\n"), Some(400_000_000_000));
        assert_eq!(parse_rate("25 Gb/sec (1X EDR)\n"), Some(25_000_000_000));
        assert_eq!(parse_rate("10 Gb/sec (4X)\n"), Some(10_000_000_000));
        assert_eq!(parse_rate("fast\n"), None);
        assert_eq!(parse_rate("100 furlongs\n"), None);
        assert_eq!(parse_rate("-5 Gb/sec\n"), None);
        assert_eq!(parse_rate("NaN Gb/sec\n"), None);
        assert_eq!(parse_rate(""), None);
    }

    #[test]
    fn parses_counter_values() {
        assert_eq!(parse_counter("123\n"), Some(123));
        assert_eq!(parse_counter("18446744073709551615\n"), Some(u64::MAX));
        assert_eq!(parse_counter("N/A (no PMA)\n"), None);
        assert_eq!(parse_counter("-1\n"), None);
        assert_eq!(parse_counter(""), None);
    }

    #[test]
    fn reads_an_mlx5_infiniband_port() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        assert_eq!(list_devices(&fx.root()).unwrap(), vec!["mlx5_0"]);
        assert_eq!(list_ports(&fx.root().join("mlx5_0")).unwrap(), vec![1]);
        assert_eq!(
            read_node_guid(&fx.root().join("mlx5_0")).unwrap(),
            "0c42:a103:0003:55e2"
        );
        let r = read_port(&port_dir(&fx.root(), "mlx5_0", 1));
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert!(!r.vanished);
        assert_eq!(
            r.attrs,
            PortAttrs {
                state: Some("ACTIVE".into()),
                phys_state: Some("LinkUp".into()),
                rate_bits_per_second: Some(100_000_000_000),
                link_layer: Some("InfiniBand".into()),
            }
        );
        let find = |g: Group, f: &str| {
            r.counters
                .iter()
                .find(|c| c.group == g && c.file == f)
                .and_then(|c| c.value)
        };
        assert_eq!(find(Group::Counters, "port_xmit_data"), Some(1_000_000));
        assert_eq!(find(Group::HwCounters, "out_of_sequence"), Some(0));
        // `lifespan` is a setting, not a counter.
        assert!(!r.counters.iter().any(|c| c.file == "lifespan"));
    }

    #[test]
    fn hw_counters_are_discovered_by_listing() {
        let fx = Fixture::new();
        fx.rxe("rxe0");
        fx.set("rxe0", 1, "hw_counters/some_future_counter", 42);
        let r = read_port(&port_dir(&fx.root(), "rxe0", 1));
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert!(r.counters.iter().all(|c| c.group == Group::HwCounters));
        assert!(r
            .counters
            .iter()
            .any(|c| c.file == "some_future_counter" && c.value == Some(42)));
        assert!(r.counters.iter().any(|c| c.file == "rdma_sends"));
        assert_eq!(r.attrs.link_layer.as_deref(), Some("Ethernet"));
    }

    #[test]
    fn unreadable_and_garbage_files_are_skipped_and_reported() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        // A directory where a counter file should be: EISDIR on read, for root too.
        fx.replace_with_dir("mlx5_0", 1, "counters/symbol_error");
        // Old kernels print this text instead of failing.
        fx.write("mlx5_0", 1, "counters/port_rcv_errors", "N/A (no PMA)\n");
        fx.write("mlx5_0", 1, "rate", "garbage\n");
        let r = read_port(&port_dir(&fx.root(), "mlx5_0", 1));
        let kinds: Vec<_> = r
            .failures
            .iter()
            .map(|f| (f.what.as_str(), f.kind))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("rate", FailureKind::Parse),
                ("counters/port_rcv_errors", FailureKind::Parse),
                ("counters/symbol_error", FailureKind::Io),
            ]
        );
        // Everything else was still read, and the failed files are still listed.
        let symbol = r.counters.iter().find(|c| c.file == "symbol_error");
        assert_eq!(symbol.map(|c| c.value), Some(None));
        assert!(r
            .counters
            .iter()
            .any(|c| c.file == "port_xmit_data" && c.value.is_some()));
        assert_eq!(r.attrs.rate_bits_per_second, None);
        assert_eq!(r.attrs.state.as_deref(), Some("ACTIVE"));
    }

    #[test]
    fn a_fifo_is_never_opened() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        let path = port_dir(&fx.root(), "mlx5_0", 1).join("hw_counters/out_of_buffer");
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !made {
            eprintln!("mkfifo unavailable; skipping");
            return;
        }
        // Opening a FIFO without a writer would block forever: it must be refused unopened.
        let r = read_port(&port_dir(&fx.root(), "mlx5_0", 1));
        assert_eq!(r.failures.len(), 1);
        assert_eq!(r.failures[0].kind, FailureKind::NotAFile);
        assert_eq!(r.failures[0].what, "hw_counters/out_of_buffer");
    }

    #[test]
    fn a_missing_port_is_vanished_and_a_missing_root_has_no_devices() {
        let fx = Fixture::new();
        let r = read_port(&port_dir(&fx.root(), "mlx5_9", 1));
        assert!(r.vanished);
        assert_eq!(
            list_devices(&fx.root().join("nonexistent")).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn stray_entries_are_not_devices_or_ports() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        std::fs::write(fx.root().join("README"), "not a device").unwrap();
        std::os::unix::fs::symlink("/nonexistent/target", fx.root().join("dangling")).unwrap();
        std::fs::create_dir_all(fx.root().join("mlx5_0/ports/notaport")).unwrap();
        assert_eq!(list_devices(&fx.root()).unwrap(), vec!["mlx5_0"]);
        assert_eq!(list_ports(&fx.root().join("mlx5_0")).unwrap(), vec![1]);
    }
}
