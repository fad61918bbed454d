//! Whole-map walks with BPF_MAP_LOOKUP_BATCH (kernel >= 5.6): one syscall per chunk of up to
//! a few thousand entries instead of two per entry (get_next_key + lookup), which is what
//! keeps a walk over tens of thousands of flows cheap. Each chunk goes to the caller before
//! the next is read into the same buffer, so a walk's memory does not grow with the map.
//! aya has no batch API, hence this small raw syscall.
use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, OwnedFd},
};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
/// Bytes of keys and values asked for per syscall: the reader's whole buffer. A walk reads
/// the map a chunk at a time into it and hands each chunk on before reading the next, so the
/// daemon's memory for a walk is this, not the map's size (read whole, 10,000 flows took
/// ~2 MiB of buffers per map).
const CHUNK_BYTES: usize = 256 * 1024;
/// Entries per syscall, whatever their size: at least a hash bucket's worth (a bucket must
/// fit in one chunk, else ENOSPC), at most a few thousand.
const MIN_CHUNK: usize = 64;
const MAX_CHUNK: usize = 4096;

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

/// One batch command of bpf(2); the kernel writes back `attr.count` (and the cursor).
///
/// # Safety
/// `attr`'s pointers must point at buffers that fit `count` entries of the map's sizes.
unsafe fn batch_call(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: the caller's buffers; attr lives across the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Entries asked for per syscall when each holds a K and `per` Vs.
fn chunk_entries<K, V>(per: usize) -> usize {
    let entry = size_of::<K>() + per.max(1) * size_of::<V>();
    (CHUNK_BYTES / entry.max(1)).clamp(MIN_CHUNK, MAX_CHUNK)
}

/// How a batched walk ended.
#[derive(Debug)]
enum Walk {
    /// Every entry was handed on.
    Complete,
    /// The first chunk failed (a kernel that cannot batch this map, or any other error):
    /// nothing was handed on, so the caller can iterate instead.
    Unsupported(io::Error),
    /// Failed after some chunks were handed on: those stand, the rest of this walk is lost.
    Cut(io::Error),
}

/// Walks every (key, value) of a map a chunk at a time: each chunk is read into `keys` and
/// `values` (reused, never grown past one chunk) and handed to `each` before the next is
/// read. An entry holds `per` values: 1, or for a per-CPU map one per possible CPU (V's
/// size must then be a multiple of 8, as the kernel lays them out).
fn lookup_chunks<K: Pod, V: Pod>(
    fd: &OwnedFd,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
    per: usize,
    each: &mut dyn FnMut(&[K], &[V]),
) -> Walk {
    let per = per.max(1);
    let chunk = chunk_entries::<K, V>(per);
    keys.clear();
    values.clear();
    keys.reserve(chunk);
    values.reserve(chunk * per);
    // Hash maps use a u32 bucket cursor; 8 bytes leaves room for any map type's cursor.
    let mut cursor_in = 0u64;
    let mut cursor_out = 0u64;
    let mut first = true;
    let mut handed = 0usize;
    loop {
        keys.clear();
        values.clear();
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &mut cursor_in as *mut u64 as u64
            },
            out_batch: &mut cursor_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at room for `chunk` keys and `chunk * per` values of the map's
        // sizes (reserved above; K and V are the map's key and value types), and lives across
        // the call.
        let err = unsafe { batch_call(BPF_MAP_LOOKUP_BATCH, &mut attr) }.err();
        let complete = err
            .as_ref()
            .is_some_and(|e| e.raw_os_error() == Some(libc::ENOENT));
        // Only a success or ENOENT (the walk is complete; the last chunk may still have
        // entries) says how many entries the kernel wrote; after any other error, `count`
        // may still be what was asked.
        if err.is_none() || complete {
            let n = (attr.count as usize).min(chunk);
            // SAFETY: the kernel wrote the first `n` keys and `n * per` values, and K and V
            // are Pod: any bytes are valid values.
            unsafe {
                keys.set_len(n);
                values.set_len(n * per);
            }
            each(keys, values);
            handed += n;
        }
        match err {
            None => {}
            Some(_) if complete => return Walk::Complete,
            // EINVAL/ENOTSUP: no batch lookups here; ENOSPC: a bucket held more entries than
            // a chunk. The iterator copes with either, and with anything else on the first
            // chunk: nothing has been handed on yet.
            Some(e) if handed == 0 => return Walk::Unsupported(e),
            Some(e) => return Walk::Cut(e),
        }
        cursor_in = cursor_out;
        first = false;
        // Bounded: a map never holds more than u32::MAX entries; stop long before.
        if handed > 16 * 1024 * 1024 {
            return Walk::Complete;
        }
    }
}

/// Deletes `keys` with BPF_MAP_DELETE_BATCH (kernel >= 5.6): one syscall for all of them
/// instead of one each. The kernel stops at the first key it cannot delete and says how many
/// it did; a key already gone (ENOENT: evicted since the walk found it) is skipped and the
/// rest go on. Any other error returns the keys that may not be deleted yet.
fn delete_keys<'k, K: Pod>(fd: &OwnedFd, keys: &'k [K]) -> Result<(), (io::Error, &'k [K])> {
    let mut rest = keys;
    // Bounded: every round deletes or skips at least one key, or returns.
    while !rest.is_empty() {
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: rest.len().min(u32::MAX as usize) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at `count` keys of the map's key type K, which live across the
        // call; the kernel only reads them.
        let Err(e) = (unsafe { batch_call(BPF_MAP_DELETE_BATCH, &mut attr) }) else {
            // All asked were deleted.
            rest = &rest[(attr.count as usize).clamp(1, rest.len())..];
            continue;
        };
        // Only a failed delete (ENOENT) says for sure that `count` is the kernel's: an
        // error before its loop leaves what was asked. Any other error hands back every
        // key of this call; deleting one twice is harmless (ENOENT).
        let done = attr.count as usize;
        if e.raw_os_error() != Some(libc::ENOENT) || done >= rest.len() {
            return Err((e, rest));
        }
        rest = &rest[done + 1..];
    }
    Ok(())
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

/// Reads a whole map, a chunk at a time: batched when the kernel can, else entry by entry
/// through aya; and deletes what a walk found stale, batched likewise.
pub struct MapReader<K, V> {
    fd: Option<OwnedFd>,
    /// False once the kernel refused a batched delete: keys then go one by one.
    delete_batched: bool,
    /// One chunk's keys and values, reused by every walk.
    keys: Vec<K>,
    values: Vec<V>,
}

impl<K: Pod, V: Pod + Default> MapReader<K, V> {
    pub fn new(fd: Option<OwnedFd>) -> Self {
        Self {
            fd,
            delete_batched: true,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Deletes `keys` from the map: in one syscall when the kernel can, else each with
    /// `one` (aya's per-key delete). A key already gone is skipped either way. A walk that
    /// deletes thousands of stale entries (the connection walk, below its floor) spent most
    /// of its time in a syscall per key.
    pub fn delete(&mut self, keys: &[K], mut one: impl FnMut(&K)) {
        let rest = match &self.fd {
            Some(fd) if self.delete_batched => match delete_keys(fd, keys) {
                Ok(()) => return,
                Err((e, rest)) => {
                    tracing::info!("batched map deletes unavailable ({e}); deleting key by key");
                    self.delete_batched = false;
                    rest
                }
            },
            _ => keys,
        };
        for k in rest {
            one(k);
        }
    }

    /// Hands every entry of the map to `each`, in the kernel's order.
    pub fn for_each(
        &mut self,
        fallback: impl FnOnce() -> Vec<(K, V)>,
        mut each: impl FnMut(&K, &V),
    ) {
        let batched = self.batch(1, &mut |keys, values| {
            for (k, v) in keys.iter().zip(values) {
                each(k, v);
            }
        });
        if !batched {
            for (k, v) in fallback() {
                each(&k, &v);
            }
        }
    }

    /// Hands every entry of a per-CPU map to `each`: its key and its `cpus` values.
    pub fn for_each_per_cpu(
        &mut self,
        cpus: usize,
        fallback: impl FnOnce() -> Vec<(K, Vec<V>)>,
        mut each: impl FnMut(&K, &[V]),
    ) {
        let cpus = cpus.max(1);
        let batched = self.batch(cpus, &mut |keys, values| {
            for (k, v) in keys.iter().zip(values.chunks_exact(cpus)) {
                each(k, v);
            }
        });
        if !batched {
            for (k, mut v) in fallback() {
                v.resize(cpus, V::default());
                each(&k, &v);
            }
        }
    }

    /// `for_each_per_cpu` over a per-CPU array (its fallback reads `map` index by index).
    pub fn for_each_per_cpu_array(
        &mut self,
        cpus: usize,
        map: &aya::maps::PerCpuArray<aya::maps::MapData, V>,
        each: impl FnMut(&K, &[V]),
    ) where
        K: From<u32>,
    {
        self.for_each_per_cpu(
            cpus,
            || {
                (0..map.len())
                    .filter_map(|i| {
                        Some((K::from(i), map.get(&i, 0).ok()?.iter().copied().collect()))
                    })
                    .collect()
            },
            each,
        );
    }

    /// `for_each_per_cpu` over a per-CPU hash map (its fallback iterates `map`).
    pub fn for_each_per_cpu_map(
        &mut self,
        cpus: usize,
        map: &aya::maps::PerCpuHashMap<aya::maps::MapData, K, V>,
        each: impl FnMut(&K, &[V]),
    ) {
        self.for_each_per_cpu(
            cpus,
            || {
                map.iter()
                    .filter_map(Result::ok)
                    .map(|(k, v)| (k, v.iter().copied().collect()))
                    .collect()
            },
            each,
        );
    }

    /// A batched walk; false if the kernel cannot batch this map (from then on, not tried
    /// again) and nothing was handed on, so the caller iterates instead.
    fn batch(&mut self, per: usize, each: &mut dyn FnMut(&[K], &[V])) -> bool {
        let Some(fd) = &self.fd else {
            return false;
        };
        match lookup_chunks::<K, V>(fd, &mut self.keys, &mut self.values, per, each) {
            Walk::Complete => true,
            Walk::Unsupported(e) => {
                tracing::info!("batched map reads unavailable ({e}); reading entry by entry");
                self.fd = None;
                false
            }
            Walk::Cut(e) => {
                // The entries before the failure were handed on and cannot be taken back:
                // this read is short; later ones iterate.
                tracing::warn!(
                    "a batched map read failed part way ({e}); this read is short, later ones read entry by entry"
                );
                self.fd = None;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fit_the_buffer_and_a_bucket() {
        use probe_ebpf::{FlowKey, FlowStats, PeerKey, PeerTcp};
        // A flow: 44-byte key, 96-byte value.
        assert_eq!(chunk_entries::<FlowKey, FlowStats>(1), 1872);
        // Small entries stop at MAX_CHUNK.
        assert_eq!(chunk_entries::<u32, u64>(1), MAX_CHUNK);
        // A per-CPU peer (336 bytes a CPU) on 2 and on 128 CPUs: the second would be 6
        // entries, raised to a bucket's worth.
        assert_eq!(chunk_entries::<PeerKey, PeerTcp>(2), 378);
        assert_eq!(chunk_entries::<PeerKey, PeerTcp>(128), MIN_CHUNK);
    }

    /// Batched deletes against a real LRU hash map (root: it creates the maps; no program is
    /// attached): the keys asked go, keys that were never there (or were evicted) are
    /// skipped without stopping the rest, and the others stay.
    #[test]
    fn deletes_in_a_batch_and_skips_keys_already_gone() {
        use aya::maps::{HashMap, Map, MapData};
        use probe_ebpf::{names, ConnKey, ConnStats};
        // SAFETY: a plain libc call.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: creating BPF maps needs root (CI runs as root)");
            return;
        }
        let ebpf = aya::EbpfLoader::new()
            .load(crate::bpf::load::OBJECT)
            .unwrap();
        let fd = || dup_fd(ebpf.map(names::CONNS).unwrap()).unwrap();
        let mut map: HashMap<_, ConnKey, ConnStats> =
            HashMap::try_from(Map::LruHashMap(MapData::from_fd(fd()).unwrap())).unwrap();
        let key = |i: u16| ConnKey {
            lport: i,
            ..ConnKey::default()
        };
        for i in 0..100 {
            map.insert(key(i), ConnStats::default(), 0).unwrap();
        }
        // 0, 2, ... 118 and 1,000: 50 present and 11 never inserted, one among the first
        // (the kernel stops there) and ten at the end.
        let mut doomed: Vec<ConnKey> = (0..60).map(|i| key(2 * i)).collect();
        doomed.insert(7, key(1_000));
        let mut reader = MapReader::<ConnKey, ConnStats>::new(Some(fd()));
        let mut one_by_one = 0;
        reader.delete(&doomed, |_| one_by_one += 1);
        assert_eq!(one_by_one, 0, "the kernel batches deletes (>= 5.6)");
        let left: Vec<u16> = map
            .keys()
            .map(|k| k.unwrap().lport)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(left, (0..50).map(|i| 2 * i + 1).collect::<Vec<u16>>());

        // Without batching, each key goes to the per-key delete.
        let mut reader = MapReader::<ConnKey, ConnStats>::new(None);
        let mut seen = Vec::new();
        reader.delete(&doomed[..3], |k| seen.push(k.lport));
        assert_eq!(seen, [0, 2, 4]);
    }
}
