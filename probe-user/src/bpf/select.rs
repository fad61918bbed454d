//! Runs the selection walks (probe-ebpf's select.rs) on demand: two raw tracepoint programs
//! attached nowhere, run with BPF_PROG_TEST_RUN on the daemon's thread, that visit every
//! entry of FLOWS or CONNS in the kernel and write only what the daemon keeps to mmapable
//! arrays (read by collect/flows.rs and collect/conns.rs).
//!
//! aya 0.14 has no public test run; the command is one bpf(2) call with a context of u64
//! arguments (`bpf_attr.test`).
use std::{
    io,
    mem::size_of,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result};
use aya::{programs::RawTracePoint, Ebpf};

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The `test` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// A loaded selection program, run on demand.
pub struct Walk {
    prog: OwnedFd,
}

impl Walk {
    /// Runs the program once with `args` as its context; its return value.
    pub fn run(&self, args: &[u64]) -> io::Result<u32> {
        let mut attr = TestRunAttr {
            prog_fd: self.prog.as_raw_fd() as u32,
            ctx_size_in: std::mem::size_of_val(args) as u32,
            ctx_in: args.as_ptr() as u64,
            ..TestRunAttr::default()
        };
        // SAFETY: the test member of bpf_attr; `args` lives across the call, and the kernel
        // writes only `retval` and `duration` back into attr.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_TEST_RUN,
                &mut attr as *mut TestRunAttr,
                size_of::<TestRunAttr>(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(attr.retval)
    }
}

/// The loaded program `program` (bpf::load loads them), to run on demand.
pub fn walk(ebpf: &Ebpf, program: &str) -> Result<Walk> {
    let prog: &RawTracePoint = ebpf
        .program(program)
        .with_context(|| format!("program {program} missing from the object"))?
        .try_into()?;
    let fd = prog.fd().context("the selection program is not loaded")?;
    let prog = fd
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating the selection program's fd")?;
    Ok(Walk { prog })
}
