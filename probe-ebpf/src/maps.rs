//! The maps every program shares, and the small helpers that update them.
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    btf_maps::SkStorage,
    macros::btf_map,
    macros::map,
    maps::{Array, LruHashMap, LruPerCpuHashMap, PerCpuArray, PerCpuHashMap},
};
use probe_ebpf::{
    errors, BurstHist, BurstKey, BurstSlot, ConnKey, ConnStats, FlowKey, FlowStats, IfaceKey,
    IfaceStats, Inflight, NsHist, PeerKey, PeerSlot, PeerTcp, RingPos, SeriesSlot, SeriesStats,
    BURSTS_MAX_ENTRIES, BURST_EVENTS_PER_CPU_DEFAULT, CONNS_MAX_ENTRIES, DROP_REASONS_MAX_ENTRIES,
    FLOWS_MAX_ENTRIES, IFACES_MAX_ENTRIES, PEERS_MAX_ENTRIES, PEER_SLOTS_PER_CPU,
    QDISC_INFLIGHT_MAX_ENTRIES, SERIES_MAX_ENTRIES, SERIES_SLOTS_DEFAULT,
};

/// Per-flow counters. LRU so that a full map evicts the coldest flow instead of dropping
/// new ones; user space counts evictions from FLOW_INSERTS.
#[map(name = "FLOWS")]
pub static FLOWS: LruHashMap<FlowKey, FlowStats> =
    LruHashMap::with_max_entries(FLOWS_MAX_ENTRIES, 0);

/// Non-IP traffic per interface and direction. Per-CPU: no atomics on the hot path.
#[map(name = "NONIP")]
pub static NONIP: PerCpuHashMap<IfaceKey, IfaceStats> =
    PerCpuHashMap::with_max_entries(IFACES_MAX_ENTRIES, 0);

/// TCP connections tracked by sock_ops.
#[map(name = "CONNS")]
pub static CONNS: LruHashMap<ConnKey, ConnStats> =
    LruHashMap::with_max_entries(CONNS_MAX_ENTRIES, 0);

/// Per-peer TCP state: RTT histogram, retransmits, open connections and the tick's RTT
/// window. Per CPU: sock_ops and the tracepoints add without atomics, and a callback
/// never waits on a line another CPU writes.
#[map(name = "PEER_TCP")]
pub static PEER_TCP: LruPerCpuHashMap<PeerKey, PeerTcp> =
    LruPerCpuHashMap::with_max_entries(PEERS_MAX_ENTRIES, 0);

/// sock_ops' fast path to a peer's counters: an open-addressed table per CPU, indexed by a
/// hash of the peer and probed PEER_SLOT_PROBES slots, reached with an inlined array lookup
/// instead of PEER_TCP's hash, LRU and helper call (~90-190 ns of a ~320-430 ns callback,
/// measured). A peer that finds no slot goes to PEER_TCP; user space sums both.
#[map(name = "PEER_SLOTS")]
pub static PEER_SLOTS: PerCpuArray<PeerSlot> = PerCpuArray::with_max_entries(PEER_SLOTS_PER_CPU, 0);

/// The daemon's tick number (one u32), bumped at the start of each read of PEER_TCP; sock_ops
/// writes RTT samples into the window of this epoch (PeerTcp::windows).
#[map(name = "TCP_EPOCH")]
pub static TCP_EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// The slow-connection floor (srtt, us; one u32), written by user space after each walk of
/// CONNS: a connection has a CONNS entry, refreshed at every round trip, while its srtt is
/// at or above it. Round trips below it do no per-connection work. 0 tracks every connection.
#[map(name = "CONN_FLOOR")]
pub static CONN_FLOOR: Array<u32> = Array::with_max_entries(1, 0);

/// Marks the sockets whose ESTABLISHED this probe counted in PeerTcp::opened, so that only
/// they count as closed: sockets a previous probe enabled callbacks on close too.
#[btf_map]
pub static SOCK_COUNTED: SkStorage<u32> = SkStorage::new();

/// Per-peer burst histograms, written when a burst ends.
#[map(name = "PEER_BURSTS")]
pub static PEER_BURSTS: LruHashMap<BurstKey, BurstHist> =
    LruHashMap::with_max_entries(BURSTS_MAX_ENTRIES, 0);

/// Series counters for the series that found no slot in SERIES_SLOTS, per CPU. Not LRU: a
/// full map refuses a new series and counts it (SERIES_FULL) rather than evict one whose
/// counts were not read yet.
#[map(name = "SERIES")]
pub static SERIES: PerCpuHashMap<BurstKey, SeriesStats> =
    PerCpuHashMap::with_max_entries(SERIES_MAX_ENTRIES, BPF_F_NO_PREALLOC);

/// The series counters' fast path: an open-addressed table per CPU, indexed by a hash of the
/// series and probed a few slots, with no lock, atomic or hash-map call. Each CPU takes
/// slots on its own, so one series may hold a different slot on each CPU; user space sums
/// them. A series that finds no slot goes to SERIES.
#[map(name = "SERIES_SLOTS")]
pub static SERIES_SLOTS: PerCpuArray<SeriesSlot> =
    PerCpuArray::with_max_entries(SERIES_SLOTS_DEFAULT, 0);

/// One record per ended burst, in a ring per CPU (see probe_ebpf::BurstSlot and RingPos),
/// drained by user space every 25-100 ms from its own mapping of the array. Not a BPF ring
/// buffer: its reservation takes a lock and writes a position every CPU shares, and its
/// submit is a locked exchange; here each CPU writes only its own lines, without a locked
/// instruction on x86-64, and user space reads without a syscall or a store per record. A
/// full ring refuses the record (counted in ERRORS, BURST_EVENTS_FULL). The loader sizes
/// both arrays by the possible CPUs.
#[map(name = "BURST_EVENTS")]
pub static BURST_EVENTS: Array<BurstSlot> =
    Array::with_max_entries(BURST_EVENTS_PER_CPU_DEFAULT, BPF_F_MMAPABLE);

/// Each CPU's head and tail in BURST_EVENTS.
#[map(name = "BURST_EVENTS_POS")]
pub static BURST_EVENTS_POS: Array<RingPos> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Dropped packets by kernel drop reason (skb:kfree_skb).
#[map(name = "DROPS")]
pub static DROPS: PerCpuHashMap<u32, u64> =
    PerCpuHashMap::with_max_entries(DROP_REASONS_MAX_ENTRIES, 0);

/// Monitored interfaces whose root qdisc queues packets (set by user space each tick):
/// their egress packets are timed from TC egress to qdisc dequeue. An open-addressed set
/// of ifindexes (0: free slot), probed QDISC_IFACE_PROBES deep from `ifindex & (size - 1)`:
/// an array lookup is inlined, where a hash-map lookup on every egress packet cost ~20 ns.
#[map(name = "QDISC_IFACES")]
pub static QDISC_IFACES: Array<u32> = Array::with_max_entries(IFACES_MAX_ENTRIES, 0);

/// Packets waiting in a monitored qdisc, by skb address. LRU: a packet the qdisc drops
/// never dequeues, and its entry ages out.
#[map(name = "QDISC_INFLIGHT")]
pub static QDISC_INFLIGHT: LruHashMap<u64, Inflight> =
    LruHashMap::with_max_entries(QDISC_INFLIGHT_MAX_ENTRIES, 0);

/// Sojourn time histogram per interface.
#[map(name = "QDISC_SOJOURN")]
pub static QDISC_SOJOURN: LruHashMap<u32, NsHist> =
    LruHashMap::with_max_entries(IFACES_MAX_ENTRIES, 0);

pub static ZERO_NS_HIST: NsHist = NsHist {
    buckets: [0; probe_ebpf::LOG2_BUCKETS],
    count: 0,
    sum_ns: 0,
};

/// The daemon's walk epoch of FLOWS (one u32), bumped after each walk: see
/// FlowStats::mark_epoch.
#[map(name = "FLOW_EPOCH")]
pub static FLOW_EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// Flow entries TC created (one slot, per CPU). The daemon counts LRU evictions of FLOWS as
/// created - deleted by itself - found in a walk, so it keeps nothing per flow to notice one.
#[map(name = "FLOW_INSERTS")]
pub static FLOW_INSERTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Inserts refused by a full map, by slot (see probe_ebpf::errors).
#[map(name = "ERRORS")]
pub static ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(errors::COUNT, 0);

/// A zeroed value without a memset call. LLVM merges zero stores into a memset, which the
/// BPF backend can only emit as a call to a byte-loop subprogram (dozens of instructions
/// per key, on every packet). Word stores followed by an asm block that claims to read the
/// memory keep LLVM from merging or re-deriving them.
/// `T` must be 4-byte aligned with a size that is a multiple of 4 (all ABI keys are).
#[inline(always)]
pub fn zeroed<T: Copy>() -> T {
    let mut v = core::mem::MaybeUninit::<T>::uninit();
    let w = v.as_mut_ptr() as *mut u32;
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 4 {
        // SAFETY: within the value, 4-byte aligned (see above).
        unsafe { core::ptr::write_volatile(w.add(i), 0) };
        i += 1;
    }
    // SAFETY: a register move (an empty block would give two BTF line records one
    // instruction, which the kernel rejects); it tells LLVM the memory at `w` may be read.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) w => _, options(nostack, readonly, preserves_flags))
    };
    // SAFETY: every byte was written.
    unsafe { v.assume_init() }
}

/// Counts a refused insert.
#[inline(always)]
pub fn count_error(slot: u32) {
    if let Some(p) = ERRORS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU writes it during this run.
        unsafe { *p += 1 };
    }
}

/// Adds `v` to a counter another CPU may be updating, with BPF's atomic add (XADD, which
/// every kernel since 3.18 accepts). core has no fetch_add for the BPF target because it
/// lacks compare-and-swap, hence the one line of assembly.
#[inline(always)]
pub fn atomic_add(p: *mut u64, v: u64) {
    // SAFETY: `p` points into a map value the kernel keeps alive for this program run, and
    // map values are 8-byte aligned.
    unsafe {
        core::arch::asm!("lock *(u64 *)({p} + 0) += {v}", p = in(reg) p, v = in(reg) v);
    }
}

/// Adds `v` to `*p` with a fully ordered atomic (BPF_FETCH: a full barrier on every JIT),
/// so that the stores before it are visible to user space before the new value is: the
/// release of a single writer's position. XADD (atomic_add) orders nothing on arm64.
#[inline(always)]
pub fn atomic_publish(p: *mut u64, v: u64) {
    // SAFETY: as atomic_add. The block is also a compiler barrier (it may touch any memory),
    // so LLVM keeps the record's stores before it.
    unsafe {
        core::arch::asm!("{v} = atomic_fetch_add((u64 *)({p} + 0), {v})", p = in(reg) p, v = inout(reg) v => _);
    }
}

/// Stores `v` at `p` after every store before it, on a CPU whose stores are seen in program
/// order (x86-64: the JIT keeps BPF's order, and the CPU's total store order does the rest).
/// The asm block is the compiler barrier: LLVM keeps earlier stores before it.
#[inline(always)]
pub fn store_release_tso(p: *mut u64, v: u64) {
    // SAFETY: `p` points into a live map value, 8-byte aligned.
    unsafe {
        core::arch::asm!("*(u64 *)({p} + 0) = {v}", p = in(reg) p, v = in(reg) v);
    }
}

/// Bounds a histogram bucket index for the verifier. The index is already clamped, so LLVM
/// would drop a plain `& 31` as redundant and the verifier would see an unbounded offset; an
/// AND it cannot see through keeps the bound explicit.
#[inline(always)]
pub fn bucket_index(mut b: usize) -> usize {
    // SAFETY: pure register arithmetic.
    unsafe {
        core::arch::asm!("{b} &= 31", b = inout(reg) b);
    }
    b
}

const _: () = assert!(probe_ebpf::LOG2_BUCKETS == 32);

/// The LRU hash maps, shared or per-CPU, as lookup_or_init and lookup_or_copy use them.
pub trait LruMap<K, V> {
    fn get_ptr_mut(&self, key: &K) -> Option<*mut V>;
    fn insert(&self, key: &K, value: &V, flags: u64) -> Result<(), i32>;
}

macro_rules! lru_map {
    ($t:ident) => {
        impl<K, V> LruMap<K, V> for $t<K, V> {
            #[inline(always)]
            fn get_ptr_mut(&self, key: &K) -> Option<*mut V> {
                $t::get_ptr_mut(self, key)
            }
            #[inline(always)]
            fn insert(&self, key: &K, value: &V, flags: u64) -> Result<(), i32> {
                $t::insert(self, key, value, flags)
            }
        }
    };
}
lru_map!(LruHashMap);
lru_map!(LruPerCpuHashMap);

/// Looks `key` up, inserting `init()` first if it is absent (built only on a miss: zeroing a
/// value costs on every packet).
#[inline(always)]
pub fn lookup_or_init<K, V, M: LruMap<K, V>>(
    map: &M,
    key: &K,
    init: impl FnOnce() -> V,
    error_slot: u32,
) -> Option<*mut V> {
    lookup_or_create(map, key, init, error_slot, || {})
}

/// The index hash of an address-keyed slot table (SERIES_SLOTS, PEER_SLOTS): multiplicative
/// hashing, whose product's high half mixes every bit of the address and of `salt`.
#[inline(always)]
pub fn addr_hash(addr: &probe_ebpf::Addr, salt: u64) -> u32 {
    let lo = addr[0] as u64 | (addr[1] as u64) << 32;
    let hi = addr[2] as u64 | (addr[3] as u64) << 32;
    ((lo ^ hi.rotate_left(29) ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

/// lookup_or_init, calling `created` when this call's insert made the entry (not when
/// another CPU's did meanwhile, nor when the map refused it).
#[inline(always)]
pub fn lookup_or_create<K, V, M: LruMap<K, V>>(
    map: &M,
    key: &K,
    init: impl FnOnce() -> V,
    error_slot: u32,
    created: impl FnOnce(),
) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    // NOEXIST: if another CPU inserted it meanwhile, keep theirs.
    if map.insert(key, &init(), BPF_NOEXIST as u64).is_ok() {
        created();
    }
    inserted(map, key, error_slot)
}

/// Like lookup_or_init, from a static template: for values too large to build on the
/// 512-byte BPF stack (histograms).
#[inline(always)]
pub fn lookup_or_copy<K, V, M: LruMap<K, V>>(
    map: &M,
    key: &K,
    template: &V,
    error_slot: u32,
) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = map.insert(key, template, BPF_NOEXIST as u64);
    inserted(map, key, error_slot)
}

/// The entry just inserted (by this CPU or another), or None, counted, if the map refused.
#[inline(always)]
fn inserted<K, V, M: LruMap<K, V>>(map: &M, key: &K, error_slot: u32) -> Option<*mut V> {
    let p = map.get_ptr_mut(key);
    if p.is_none() {
        count_error(error_slot);
    }
    p
}

pub static ZERO_PEER: PeerTcp = PeerTcp {
    rtt_buckets: [0; probe_ebpf::LOG2_BUCKETS],
    rtt_count: 0,
    rtt_sum_us: 0,
    retrans_segs: 0,
    retrans_events: 0,
    opened: 0,
    closed: 0,
    windows: [probe_ebpf::RttWindow {
        epoch: 0,
        samples: 0,
        srtt_us: 0,
        min_rtt_us: 0,
    }; 2],
};

pub static ZERO_BURSTS: BurstHist = BurstHist {
    size_buckets: [0; probe_ebpf::LOG2_BUCKETS],
    duration_buckets: [0; probe_ebpf::LOG2_BUCKETS],
    count: 0,
    bytes: 0,
    duration_ns: 0,
};

/// What the selection walks (select.rs) picked, read in place by the daemon.
#[map(name = "FLOW_PICKS")]
pub static FLOW_PICKS: Array<probe_ebpf::FlowPick> =
    Array::with_max_entries(probe_ebpf::PICKS_MAX, BPF_F_MMAPABLE);
/// As large as CONNS (the loader sizes both): a walk can write every connection when their
/// srtt are all alike, and the floor then lets every one through. The daemon maps, for each
/// walk, only as far as the records written go.
#[map(name = "CONN_PICKS")]
pub static CONN_PICKS: Array<probe_ebpf::ConnPick> =
    Array::with_max_entries(CONNS_MAX_ENTRIES, BPF_F_MMAPABLE);
/// The flow walk's summary (one FlowWalk).
#[map(name = "FLOW_WALK")]
pub static FLOW_WALK: Array<probe_ebpf::FlowWalk> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// The connection walk's summary (one ConnWalk).
#[map(name = "CONN_WALK")]
pub static CONN_WALK: Array<probe_ebpf::ConnWalk> = Array::with_max_entries(1, BPF_F_MMAPABLE);
