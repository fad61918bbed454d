//! Do-nothing programs, loaded with raw bpf(2) calls (no compiler, no object file) and
//! attached with links: the floor that BPF run-time statistics report for a program that
//! does nothing on this machine (dispatch plus the statistics' own clock reads), measured
//! beside probe's programs on the same events. A TC pair on the peer veth sees the same
//! packets as probe's TC programs; a sock_ops program on the cgroup v2 root runs at every
//! callback of every socket probe's sock_ops asked callbacks of (a cgroup runs all of its
//! sock_ops programs at each callback).
use anyhow::{bail, Context, Result};
use probe_tests::Netns;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_PROG_TYPE_SOCK_OPS: u32 = 13;
const BPF_CGROUP_SOCK_OPS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// `r0 = 1 (sock_ops: carry on); exit`.
const SOCK_OPS_PROGRAM: [u64; 2] = [
    // BPF_ALU64 | BPF_MOV | BPF_K (0xb7), dst r0, imm 1.
    u64::from_le_bytes([0xb7, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00]),
    // BPF_JMP | BPF_EXIT (0x95).
    u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
];

/// `r0 = -1 (TCX_NEXT: carry on as if nothing were attached); exit`.
const PROGRAM: [u64; 2] = [
    // BPF_ALU64 | BPF_MOV | BPF_K (0xb7), dst r0, imm -1.
    u64::from_le_bytes([0xb7, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff]),
    // BPF_JMP | BPF_EXIT (0x95).
    u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
];

/// union bpf_attr, large enough for the commands used here; unused bytes stay zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<i32> {
    // SAFETY: bpf(2) with a zero-padded attribute block of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<Attr>(),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}

/// One loaded program and its TCX link (detached when dropped).
struct Attached {
    name: &'static str,
    prog: OwnedFd,
    _link: OwnedFd,
}

/// Empty programs on the ingress and egress hooks of one interface.
pub struct NopTc {
    progs: Vec<Attached>,
}

/// A program's run-time statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunStats {
    pub run_ns: u64,
    pub runs: u64,
}

impl NopTc {
    /// Loads two empty classifiers and attaches them to `dev` in `ns` (ingress, egress).
    pub fn attach(ns: &Netns, dev: &str) -> Result<NopTc> {
        let dev = std::ffi::CString::new(dev)?;
        ns.enter(move || -> Result<NopTc> {
            // SAFETY: if_nametoindex on a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
            if ifindex == 0 {
                bail!("no interface {dev:?}");
            }
            let mut progs = Vec::new();
            for (name, attach_type) in [
                ("nop_ingress", BPF_TCX_INGRESS),
                ("nop_egress", BPF_TCX_EGRESS),
            ] {
                let prog = load(name, BPF_PROG_TYPE_SCHED_CLS, &PROGRAM)?;
                let mut a = Attr::new();
                a.u32(0, prog.as_raw_fd() as u32)
                    .u32(4, ifindex)
                    .u32(8, attach_type);
                let link = bpf(BPF_LINK_CREATE, &mut a)
                    .with_context(|| format!("attaching the empty TC program ({name})"))?;
                // SAFETY: a new fd the kernel just returned.
                let link = unsafe { OwnedFd::from_raw_fd(link) };
                progs.push(Attached {
                    name,
                    prog,
                    _link: link,
                });
            }
            Ok(NopTc { progs })
        })?
    }

    /// (program, statistics) of each attached program.
    pub fn stats(&self) -> Result<Vec<(&'static str, RunStats)>> {
        self.progs
            .iter()
            .map(|p| Ok((p.name, prog_stats(&p.prog)?)))
            .collect()
    }
}

/// An empty sock_ops program on the cgroup v2 root (detached when dropped).
pub struct NopSockOps {
    prog: Attached,
}

impl NopSockOps {
    pub const NAME: &'static str = "nop_sockops";

    /// Loads the empty sock_ops program and attaches it to the cgroup v2 root, beside
    /// probe's.
    pub fn attach() -> Result<NopSockOps> {
        let root = cgroup2_root()?;
        let cgroup = std::fs::File::open(&root)
            .with_context(|| format!("opening the cgroup v2 root {}", root.display()))?;
        let prog = load(Self::NAME, BPF_PROG_TYPE_SOCK_OPS, &SOCK_OPS_PROGRAM)?;
        let mut a = Attr::new();
        a.u32(0, prog.as_raw_fd() as u32)
            .u32(4, cgroup.as_raw_fd() as u32)
            .u32(8, BPF_CGROUP_SOCK_OPS);
        let link = bpf(BPF_LINK_CREATE, &mut a).context("attaching the empty sock_ops program")?;
        Ok(NopSockOps {
            prog: Attached {
                name: Self::NAME,
                prog,
                // SAFETY: a new fd the kernel just returned.
                _link: unsafe { OwnedFd::from_raw_fd(link) },
            },
        })
    }

    pub fn stats(&self) -> Result<RunStats> {
        prog_stats(&self.prog.prog)
    }
}

/// Where cgroup v2 is mounted (/proc/self/mounts).
fn cgroup2_root() -> Result<std::path::PathBuf> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fs) = (f.next()?, f.next()?, f.next()?);
            (fs == "cgroup2").then(|| std::path::PathBuf::from(dir))
        })
        .next()
        .context("no cgroup v2 mount in /proc/self/mounts")
}

fn load(name: &str, prog_type: u32, program: &[u64]) -> Result<OwnedFd> {
    let license = c"GPL";
    let mut a = Attr::new();
    a.u32(0, prog_type)
        .u32(4, program.len() as u32)
        .u64(8, program.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64);
    // prog_name: at most 15 bytes and a NUL.
    let n = name.len().min(15);
    a.0[48..48 + n].copy_from_slice(&name.as_bytes()[..n]);
    let fd =
        bpf(BPF_PROG_LOAD, &mut a).with_context(|| format!("loading the empty program {name}"))?;
    // SAFETY: a new fd the kernel just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// run_time_ns and run_cnt from struct bpf_prog_info (byte offsets 192 and 200 of the
/// kernel's UAPI layout, stable since Linux 5.1).
fn prog_stats(prog: &OwnedFd) -> Result<RunStats> {
    let mut info = [0u64; 29];
    let mut a = Attr::new();
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(4, std::mem::size_of_val(&info) as u32)
        .u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a).context("BPF_OBJ_GET_INFO_BY_FD")?;
    Ok(RunStats {
        run_ns: info[24],
        runs: info[25],
    })
}
