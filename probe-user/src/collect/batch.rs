//! Whole-map reads with BPF_MAP_LOOKUP_BATCH (kernel >= 5.6): one syscall per few thousand
//! entries instead of two per entry (get_next_key + lookup), which is what keeps a tick over
//! tens of thousands of flows cheap. aya has no batch API, hence this small raw syscall.
use std::{
    io,
    mem::{size_of, MaybeUninit},
    os::fd::{AsRawFd, OwnedFd},
};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per syscall.
const CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Reads every (key, value) of a non-per-CPU hash map. Err(Unsupported) on kernels without
/// batch lookups, so the caller can fall back to iterating.
pub fn lookup_all<K: Pod, V: Pod>(fd: &OwnedFd) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    let mut keys: Vec<MaybeUninit<K>> = Vec::with_capacity(CHUNK);
    let mut values: Vec<MaybeUninit<V>> = Vec::with_capacity(CHUNK);
    // Hash maps use a u32 bucket cursor; 8 bytes leaves room for any map type's cursor.
    let mut cursor_in = 0u64;
    let mut cursor_out = 0u64;
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &mut cursor_in as *mut u64 as u64
            },
            out_batch: &mut cursor_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at valid buffers of CHUNK keys and values of the map's sizes
        // (K and V are the map's key and value types), and lives across the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        let n = attr.count as usize;
        for i in 0..n.min(CHUNK) {
            // SAFETY: the kernel wrote the first `count` entries.
            unsafe {
                out.push((
                    keys.as_ptr().add(i).read().assume_init(),
                    values.as_ptr().add(i).read().assume_init(),
                ))
            };
        }
        match err {
            None => {}
            // ENOENT: the walk is complete (the last chunk may still have entries).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            // ENOSPC: a bucket held more than CHUNK entries; the iterator copes with any layout.
            Some(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL) | Some(libc::ENOTSUP) | Some(libc::ENOSPC)
                ) =>
            {
                return Err(io::Error::new(io::ErrorKind::Unsupported, e))
            }
            Some(e) => return Err(e),
        }
        cursor_in = cursor_out;
        first = false;
        // Bounded: a map never holds more than u32::MAX entries; stop long before.
        if out.len() > 16 * 1024 * 1024 {
            return Ok(out);
        }
    }
}

/// A duplicate of a map's fd, for batch reads beside aya's typed handle.
pub fn dup_fd(map: &aya::maps::Map) -> Option<OwnedFd> {
    use std::os::fd::AsFd as _;
    match map {
        aya::maps::Map::HashMap(d) | aya::maps::Map::LruHashMap(d) => {
            d.fd().as_fd().try_clone_to_owned().ok()
        }
        _ => None,
    }
}

/// Reads a whole map: batched when the kernel can, else entry by entry through aya.
pub struct MapReader {
    fd: Option<OwnedFd>,
}

impl MapReader {
    pub fn new(fd: Option<OwnedFd>) -> Self {
        Self { fd }
    }

    pub fn read<K: Pod, V: Pod>(&mut self, fallback: impl FnOnce() -> Vec<(K, V)>) -> Vec<(K, V)> {
        if let Some(fd) = &self.fd {
            match lookup_all::<K, V>(fd) {
                Ok(v) => return v,
                Err(e) => {
                    tracing::info!("batched map reads unavailable ({e}); reading entry by entry");
                    self.fd = None;
                }
            }
        }
        fallback()
    }
}
