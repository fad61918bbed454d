//! The BPF links a process holds, from `/proc/PID/fdinfo`: for a TCX link the kernel prints
//! the interface index and the hook (bpftool 7.1, Debian 12's, shows TCX links only as
//! `type 11`). A TCX link whose interface vanished stays alive while its fd is open, with
//! ifindex 0: this is how a leak shows.
use anyhow::{Context, Result};
use std::collections::BTreeMap;

/// One BPF link held by a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLink {
    pub fd: u32,
    /// `tcx`, `perf`, `cgroup`, `tracing`, ...
    pub link_type: String,
    pub link_id: u32,
    pub prog_id: u32,
    /// TCX and netkit links: the interface (0 once it is gone).
    pub ifindex: Option<u32>,
    /// As printed, e.g. `46 (ingress)`.
    pub attach_type: Option<String>,
}

/// Parses one fdinfo file; None if the fd is not a BPF link.
pub fn parse_fdinfo(fd: u32, text: &str) -> Option<HeldLink> {
    let fields: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u32>().ok());
    Some(HeldLink {
        fd,
        link_type: fields.get("link_type")?.to_string(),
        link_id: num("link_id")?,
        prog_id: num("prog_id").unwrap_or(0),
        ifindex: num("ifindex"),
        attach_type: fields.get("attach_type").map(|s| s.to_string()),
    })
}

/// The BPF links `pid` holds.
pub fn held_links(pid: u32) -> Result<Vec<HeldLink>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let e = e?;
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // An fd may close between the listing and the read.
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        out.extend(parse_fdinfo(fd, &text));
    }
    out.sort_by_key(|l| l.link_id);
    Ok(out)
}

/// The TCX links `pid` holds.
pub fn tcx_links(pid: u32) -> Result<Vec<HeldLink>> {
    Ok(held_links(pid)?
        .into_iter()
        .filter(|l| l.link_type == "tcx")
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcx_and_other_links() {
        let tcx = "pos:\t0\nflags:\t02000000\nmnt_id:\t17\nino:\t1039\nlink_type:\ttcx\n\
                   link_id:\t575\nprog_tag:\t5ab189e955bead31\nprog_id:\t1276\nifindex:\t2\n\
                   attach_type:\t46 (ingress)\n";
        let l = parse_fdinfo(43, tcx).unwrap();
        assert_eq!(l.link_type, "tcx");
        assert_eq!((l.link_id, l.prog_id, l.ifindex), (575, 1276, Some(2)));
        assert_eq!(l.attach_type.as_deref(), Some("46 (ingress)"));
        let perf = "pos:\t0\nlink_type:\tperf\nlink_id:\t570\nprog_id:\t1271\n\
                    tp_name:\ttcp_retransmit_skb\n";
        assert_eq!(parse_fdinfo(30, perf).unwrap().ifindex, None);
        assert_eq!(parse_fdinfo(3, "pos:\t0\nflags:\t02\nmnt_id:\t1\n"), None);
        // This process holds no links, and reading its own fdinfo works.
        assert!(tcx_links(std::process::id()).unwrap().is_empty());
    }
}
