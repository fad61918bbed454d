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

/// Buffers of one map's batch reads, kept between ticks: a tick's read of tens of thousands
/// of entries then allocates nothing (fresh buffers of megabytes each tick are page faults,
/// and glibc keeps freed ones resident). They hold at most the map's max_entries.
pub struct BatchBuf<K, V> {
    keys: Vec<MaybeUninit<K>>,
    values: Vec<MaybeUninit<V>>,
    out: Vec<(K, V)>,
}

impl<K, V> Default for BatchBuf<K, V> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            values: Vec::new(),
            out: Vec::new(),
        }
    }
}

/// Reads every (key, value) of a non-per-CPU hash map into `buf`. Err(Unsupported) on
/// kernels without batch lookups, so the caller can fall back to iterating.
pub fn lookup_all<'a, K: Pod, V: Pod>(
    fd: &OwnedFd,
    buf: &'a mut BatchBuf<K, V>,
) -> io::Result<&'a [(K, V)]> {
    buf.out.clear();
    buf.keys.reserve_exact(CHUNK);
    buf.values.reserve_exact(CHUNK);
    let (out, keys, values) = (&mut buf.out, &mut buf.keys, &mut buf.values);
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
pub struct MapReader<K, V> {
    fd: Option<OwnedFd>,
    buf: BatchBuf<K, V>,
}

impl<K: Pod, V: Pod> MapReader<K, V> {
    pub fn new(fd: Option<OwnedFd>) -> Self {
        Self {
            fd,
            buf: BatchBuf::default(),
        }
    }

    /// The map's entries, valid until the next read.
    pub fn read(&mut self, fallback: impl FnOnce() -> Vec<(K, V)>) -> &[(K, V)] {
        if let Some(fd) = &self.fd {
            match lookup_all::<K, V>(fd, &mut self.buf) {
                // Returned through the field, not as the Ok value: that would keep
                // `self.buf` borrowed on the error path too (today's borrow checker).
                Ok(_) => return &self.buf.out,
                Err(e) => {
                    tracing::info!("batched map reads unavailable ({e}); reading entry by entry");
                    self.fd = None;
                }
            }
        }
        self.buf.out = fallback();
        &self.buf.out
    }
}
