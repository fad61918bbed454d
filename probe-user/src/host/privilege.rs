//! Capability check up front, so a missing privilege is one clear line instead of an EPERM
//! from deep inside the loader.
use anyhow::{bail, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability bits of this process, from /proc/self/status.
fn effective_caps() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    for line in status.lines() {
        if let Some(hex) = line.strip_prefix("CapEff:") {
            return Ok(u64::from_str_radix(hex.trim(), 16)?);
        }
    }
    bail!("no CapEff line in /proc/self/status")
}

/// Fails naming the first missing capability. CAP_SYS_ADMIN stands in for CAP_BPF and
/// CAP_PERFMON, as on kernels before 5.8.
pub fn check() -> Result<()> {
    let caps = effective_caps()?;
    let has = |c: u32| caps & (1u64 << c) != 0;
    let sys_admin = has(CAP_SYS_ADMIN);
    let missing = if !(has(CAP_BPF) || sys_admin) {
        Some("CAP_BPF")
    } else if !has(CAP_NET_ADMIN) {
        Some("CAP_NET_ADMIN")
    } else if !(has(CAP_PERFMON) || sys_admin) {
        Some("CAP_PERFMON")
    } else {
        None
    };
    if let Some(cap) = missing {
        bail!(
            "missing capability {cap}: run probe as root, or grant CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (systemd: AmbientCapabilities=CAP_BPF CAP_NET_ADMIN CAP_PERFMON)"
        );
    }
    // Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift it. Newer kernels
    // ignore it, and failing to raise it is not fatal.
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK; fine on kernels >= 5.11");
    }
    Ok(())
}

/// True when the process may use BPF_ENABLE_STATS (needs CAP_SYS_ADMIN).
pub fn has_sys_admin() -> bool {
    effective_caps()
        .map(|c| c & (1u64 << CAP_SYS_ADMIN) != 0)
        .unwrap_or(false)
}
