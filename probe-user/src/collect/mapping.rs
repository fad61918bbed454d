//! A shared mapping of an mmapable BPF array's values: the burst-end rings and the
//! selection walks' records are read in place, without a syscall per read.
use std::{os::fd::AsFd, ptr::NonNull};

use anyhow::{bail, Context as _, Result};
use aya::maps::MapData;

/// A shared mapping of an mmapable BPF array's values, unmapped on drop. The mapping keeps
/// the map alive by itself (the kernel holds a reference for it), so no fd is kept.
pub struct Mapping {
    pub ptr: NonNull<u8>,
    pub len: usize,
}

// SAFETY: the mapping is plain shared memory; its readers take &mut self, and synchronise
// with the kernel side by their own protocol (burst_ring.rs: RingPos; the selection walks:
// the run returns before the records are read).
unsafe impl Send for Mapping {}

impl Mapping {
    pub fn new(map: &MapData, bytes: usize, writable: bool) -> Result<Self> {
        if bytes == 0 {
            bail!("an empty map cannot be mapped");
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let fd = map.fd().as_fd();
        // SAFETY: a fresh shared mapping of the map's fd; the kernel checks its size against
        // the map's (page-rounded) values and refuses a map that is not mmapable.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                prot,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of a BPF array");
        }
        let ptr = NonNull::new(p.cast::<u8>()).context("mmap returned null")?;
        Ok(Self { ptr, len: bytes })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
