//! The BPF maps a process holds, as the kernel shows them: map ids from `/proc/PID/fdinfo`,
//! names and contents from bpftool. Lets a test check what probe keeps in the kernel
//! without asking probe.
use crate::cmd;
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;

/// The ids of the BPF maps `pid` holds an fd of.
pub fn held_map_ids(pid: u32) -> Result<BTreeSet<u32>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut ids = BTreeSet::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        // An fd may close between the listing and the read.
        let Ok(text) = std::fs::read_to_string(e?.path()) else {
            continue;
        };
        ids.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("map_id:"))
                .filter_map(|v| v.trim().parse::<u32>().ok())
                .filter(|id| *id > 0),
        );
    }
    Ok(ids)
}

fn bpftool_json(args: &[&str]) -> Result<serde_json::Value> {
    let mut argv = vec!["bpftool", "-j"];
    argv.extend_from_slice(args);
    let out = cmd::run(&mut cmd::command(&argv))?;
    serde_json::from_str(&out).with_context(|| format!("{}: not JSON", argv.join(" ")))
}

/// The id of the map named `name` (as the kernel keeps it: 15 characters at most) that
/// `pid` holds.
pub fn held_map(pid: u32, name: &str) -> Result<u32> {
    for id in held_map_ids(pid)? {
        let m = bpftool_json(&["map", "show", "id", &id.to_string()])?;
        if m["name"].as_str() == Some(name) {
            return Ok(id);
        }
    }
    bail!("process {pid} holds no BPF map named {name}")
}

/// Every key of map `id`, as raw bytes.
pub fn map_keys(id: u32) -> Result<Vec<Vec<u8>>> {
    let v = bpftool_json(&["map", "dump", "id", &id.to_string()])?;
    let entries = v.as_array().context("bpftool map dump: not an array")?;
    entries
        .iter()
        .map(|e| {
            e["key"]
                .as_array()
                .context("an entry without a key")?
                .iter()
                .map(|b| parse_hex_byte(b.as_str().unwrap_or("")))
                .collect()
        })
        .collect()
}

fn parse_hex_byte(s: &str) -> Result<u8> {
    let h = s.strip_prefix("0x").unwrap_or(s);
    u8::from_str_radix(h, 16).with_context(|| format!("not a hex byte: {s:?}"))
}

/// The little-endian u32 at `off` of a key (an ifindex, in probe's keys).
pub fn key_u32(key: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(key.get(off..off + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_fields() {
        assert_eq!(parse_hex_byte("0x0a").unwrap(), 10);
        assert_eq!(parse_hex_byte("0xff").unwrap(), 255);
        assert!(parse_hex_byte("0xg1").is_err());
        let key = [0u8, 0, 0, 0, 7, 1, 0, 0];
        assert_eq!(key_u32(&key, 4), Some(263));
        assert_eq!(key_u32(&key, 6), None);
    }
}
