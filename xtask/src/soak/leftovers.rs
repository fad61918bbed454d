//! What a stopped daemon must not leave in the kernel: tc filters or a clsact qdisc on any
//! interface of its namespace, and any BPF program or map it held (a TCX link, a netlink
//! filter or a pin keeps its program alive, so "every program id it held is gone" covers
//! all three), and no new entry under /sys/fs/bpf.
use crate::lab::cmd;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// The BPF program and map ids a process holds (from /proc/PID/fdinfo: program fds and
/// links carry `prog_id`, map fds `map_id`).
pub fn held_ids(pid: u32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let (mut progs, mut maps) = (BTreeSet::new(), BTreeSet::new());
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return (progs, maps);
    };
    for e in dir.flatten() {
        // An fd may close between the listing and the read.
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim().parse::<u32>();
            match (k.trim(), v) {
                ("prog_id", Ok(id)) if id > 0 => {
                    progs.insert(id);
                }
                ("map_id", Ok(id)) if id > 0 => {
                    maps.insert(id);
                }
                _ => {}
            }
        }
    }
    (progs, maps)
}

/// Ids listed by `bpftool -j prog show` / `map show`.
fn bpftool_ids(what: &str) -> Result<BTreeSet<u32>> {
    let out = cmd::run(&["bpftool", "-j", what, "show"])?;
    let v: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("bpftool {what} show: not JSON"))?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| o["id"].as_u64().map(|i| i as u32))
                .collect()
        })
        .unwrap_or_default())
}

/// Every path under /sys/fs/bpf (pins).
pub fn bpffs_entries() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>, depth: usize) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.insert(p.display().to_string());
            if depth < 8 && e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, out, depth + 1);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new("/sys/fs/bpf"), &mut out, 0);
    out
}

/// Interfaces of namespace `ns` (without lo).
pub fn interfaces(ns: &str) -> Result<Vec<String>> {
    let out = cmd::run(&["ip", "-n", ns, "-o", "link", "show"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .filter(|n| !n.is_empty() && n != "lo")
        .collect())
}

/// tc filters and clsact qdiscs on the interfaces of `ns`, one line each.
pub fn tc_leftovers(ns: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for dev in interfaces(ns)? {
        for hook in ["ingress", "egress"] {
            // An interface deleted meanwhile has nothing left on it: skip its error.
            let Ok(out) = cmd::run(&["tc", "-n", ns, "filter", "show", "dev", &dev, hook]) else {
                continue;
            };
            if !out.trim().is_empty() {
                let first = out.lines().next().unwrap_or("").trim();
                found.push(format!("tc filter on {dev} {hook}: {first}"));
            }
        }
        if let Ok(out) = cmd::run(&["tc", "-n", ns, "qdisc", "show", "dev", &dev]) {
            if out.lines().any(|l| l.starts_with("qdisc clsact")) {
                found.push(format!("clsact qdisc on {dev}"));
            }
        }
    }
    Ok(found)
}

/// Program and map ids of `progs`/`maps` that still exist, waiting up to 3 s for the kernel
/// to release them (freeing is deferred a little after the process exits).
pub fn live_bpf(progs: &BTreeSet<u32>, maps: &BTreeSet<u32>) -> Result<Vec<String>> {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let p: Vec<u32> = bpftool_ids("prog")?.intersection(progs).copied().collect();
        let m: Vec<u32> = bpftool_ids("map")?.intersection(maps).copied().collect();
        if (p.is_empty() && m.is_empty()) || Instant::now() >= until {
            let mut out = Vec::new();
            if !p.is_empty() {
                out.push(format!("BPF programs still loaded: ids {p:?}"));
            }
            if !m.is_empty() {
                out.push(format!("BPF maps still allocated: ids {m:?}"));
            }
            return Ok(out);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_a_process_without_bpf() {
        let (p, m) = held_ids(std::process::id());
        assert!(p.is_empty() && m.is_empty());
    }
}
