//! Whole-map reads with BPF_MAP_LOOKUP_BATCH (kernel >= 5.6): one syscall per few thousand
//! entries instead of two per entry (get_next_key + lookup), which is what keeps a tick over
//! tens of thousands of flows cheap. aya has no batch API, hence this small raw syscall.
use std::{
    io,
    mem::size_of,
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

/// One map's entries as read, keys and values side by side where the kernel wrote them,
/// kept between ticks: a tick's read of tens of thousands of entries then allocates nothing
/// (fresh buffers of megabytes each tick are page faults, and glibc keeps freed ones
/// resident) and copies nothing after the kernel's own copy. They hold at most the map's
/// max_entries.
pub struct BatchBuf<K, V> {
    keys: Vec<K>,
    values: Vec<V>,
}

impl<K, V> Default for BatchBuf<K, V> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl<K, V> BatchBuf<K, V> {
    /// The entries of the last read, in the kernel's order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.keys.iter().zip(&self.values)
    }

    /// The entries of the last read of a per-CPU map: each key with its `cpus` values.
    pub fn iter_per_cpu(&self, cpus: usize) -> impl Iterator<Item = (&K, &[V])> {
        self.keys.iter().zip(self.values.chunks_exact(cpus.max(1)))
    }

    fn fill_per_cpu(&mut self, cpus: usize, entries: Vec<(K, Vec<V>)>)
    where
        V: Default + Clone,
    {
        self.keys.clear();
        self.values.clear();
        for (k, mut v) in entries {
            v.resize(cpus.max(1), V::default());
            self.keys.push(k);
            self.values.extend(v);
        }
    }

    fn fill(&mut self, entries: impl IntoIterator<Item = (K, V)>) {
        self.keys.clear();
        self.values.clear();
        for (k, v) in entries {
            self.keys.push(k);
            self.values.push(v);
        }
    }
}

/// Reads every (key, value) of a map into `buf`, appending each chunk where the last ended.
/// An entry holds `per` values: 1, or for a per-CPU map one per possible CPU (V's size must
/// then be a multiple of 8, as the kernel lays them out). Err(Unsupported) on kernels
/// without batch lookups, so the caller can fall back to iterating.
pub fn lookup_all<K: Pod, V: Pod>(
    fd: &OwnedFd,
    buf: &mut BatchBuf<K, V>,
    per: usize,
) -> io::Result<()> {
    let per = per.max(1);
    let (keys, values) = (&mut buf.keys, &mut buf.values);
    keys.clear();
    values.clear();
    // Hash maps use a u32 bucket cursor; 8 bytes leaves room for any map type's cursor.
    let mut cursor_in = 0u64;
    let mut cursor_out = 0u64;
    let mut first = true;
    loop {
        keys.reserve(CHUNK);
        values.reserve(CHUNK * per);
        let at = keys.len();
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &mut cursor_in as *mut u64 as u64
            },
            out_batch: &mut cursor_out as *mut u64 as u64,
            // SAFETY (both): `at` (times `per`) is the length, and CHUNK (times `per`) more
            // fit in the capacity.
            keys: unsafe { keys.as_mut_ptr().add(at) } as u64,
            values: unsafe { values.as_mut_ptr().add(at * per) } as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at room for CHUNK keys and values of the map's sizes (K and V
        // are the map's key and value types, `per` values an entry), and lives across the
        // call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        let complete = err
            .as_ref()
            .is_some_and(|e| e.raw_os_error() == Some(libc::ENOENT));
        // Only a success or ENOENT (the walk is complete; the last chunk may still have
        // entries) says how many entries the kernel wrote; after any other error, `count`
        // may still be what was asked.
        if err.is_none() || complete {
            let n = (attr.count as usize).min(CHUNK);
            // SAFETY: the kernel wrote the first `n` entries after `at`, and K and V are Pod:
            // any bytes are valid values.
            unsafe {
                keys.set_len(at + n);
                values.set_len((at + n) * per);
            }
        }
        match err {
            None => {}
            Some(_) if complete => return Ok(()),
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
        if keys.len() > 16 * 1024 * 1024 {
            return Ok(());
        }
    }
}

/// A duplicate of a map's fd, for batch reads beside aya's typed handle.
pub fn dup_fd(map: &aya::maps::Map) -> Option<OwnedFd> {
    use std::os::fd::AsFd as _;
    match map {
        aya::maps::Map::HashMap(d)
        | aya::maps::Map::LruHashMap(d)
        | aya::maps::Map::PerCpuHashMap(d)
        | aya::maps::Map::PerCpuLruHashMap(d)
        | aya::maps::Map::PerCpuArray(d) => d.fd().as_fd().try_clone_to_owned().ok(),
        // A map type missing above would quietly cost two syscalls per entry every read.
        _ => {
            tracing::warn!("no batched reads for one of the maps: it is read entry by entry");
            None
        }
    }
}

/// Reads a whole map: batched when the kernel can, else entry by entry through aya.
pub struct MapReader<K, V> {
    fd: Option<OwnedFd>,
    buf: BatchBuf<K, V>,
}

impl<K: Pod, V: Pod + Default> MapReader<K, V> {
    pub fn new(fd: Option<OwnedFd>) -> Self {
        Self {
            fd,
            buf: BatchBuf::default(),
        }
    }

    /// The map's entries, valid until the next read.
    pub fn read(&mut self, fallback: impl FnOnce() -> Vec<(K, V)>) -> &BatchBuf<K, V> {
        if !self.batch(1) {
            self.buf.fill(fallback());
        }
        &self.buf
    }

    /// A per-CPU hash map's entries, `cpus` values each (see BatchBuf::iter_per_cpu).
    pub fn read_per_cpu_map(
        &mut self,
        cpus: usize,
        map: &aya::maps::PerCpuHashMap<aya::maps::MapData, K, V>,
    ) -> &BatchBuf<K, V> {
        self.read_per_cpu(cpus, || {
            map.iter()
                .filter_map(Result::ok)
                .map(|(k, v)| (k, v.iter().copied().collect()))
                .collect()
        })
    }

    /// A per-CPU map's entries, `cpus` values each (see BatchBuf::iter_per_cpu).
    pub fn read_per_cpu(
        &mut self,
        cpus: usize,
        fallback: impl FnOnce() -> Vec<(K, Vec<V>)>,
    ) -> &BatchBuf<K, V> {
        if !self.batch(cpus) {
            self.buf.fill_per_cpu(cpus, fallback());
        }
        &self.buf
    }

    /// A batched read into `buf`; false if the kernel cannot (from then on, not tried again).
    fn batch(&mut self, per: usize) -> bool {
        let Some(fd) = &self.fd else {
            return false;
        };
        match lookup_all::<K, V>(fd, &mut self.buf, per) {
            Ok(()) => true,
            Err(e) => {
                tracing::info!("batched map reads unavailable ({e}); reading entry by entry");
                self.fd = None;
                false
            }
        }
    }
}
