//! The maps every program shares, and the small helpers that update them.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{LruHashMap, PerCpuHashMap},
};
use probe_ebpf::{
    ConnKey, ConnStats, FlowKey, FlowStats, IfaceKey, IfaceStats, PeerKey, PeerTcp,
    CONNS_MAX_ENTRIES, FLOWS_MAX_ENTRIES, IFACES_MAX_ENTRIES, PEERS_MAX_ENTRIES,
};

/// Per-flow counters. LRU so that a full map evicts the coldest flow instead of dropping
/// new ones; user space counts evictions by watching entries vanish.
#[map(name = "FLOWS")]
pub static FLOWS: LruHashMap<FlowKey, FlowStats> = LruHashMap::with_max_entries(FLOWS_MAX_ENTRIES, 0);

/// Non-IP traffic per interface and direction. Per-CPU: no atomics on the hot path.
#[map(name = "NONIP")]
pub static NONIP: PerCpuHashMap<IfaceKey, IfaceStats> =
    PerCpuHashMap::with_max_entries(IFACES_MAX_ENTRIES, 0);

/// TCP connections tracked by sock_ops.
#[map(name = "CONNS")]
pub static CONNS: LruHashMap<ConnKey, ConnStats> = LruHashMap::with_max_entries(CONNS_MAX_ENTRIES, 0);

/// Per-peer TCP state: RTT histogram and retransmits.
#[map(name = "PEER_TCP")]
pub static PEER_TCP: LruHashMap<PeerKey, PeerTcp> = LruHashMap::with_max_entries(PEERS_MAX_ENTRIES, 0);

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

/// Looks `key` up, inserting `init` first if it is absent. None when the map refuses the
/// insert (a full non-LRU map) and the entry still is not there.
#[inline(always)]
pub fn lookup_or_init<K, V>(map: &LruHashMap<K, V>, key: &K, init: &V) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    // NOEXIST: if another CPU inserted it meanwhile, keep theirs.
    let _ = map.insert(key, init, BPF_NOEXIST as u64);
    map.get_ptr_mut(key)
}

/// The per-peer TCP entry for `key`, created empty if needed.
#[inline(always)]
pub fn peer_tcp(key: &PeerKey) -> Option<*mut PeerTcp> {
    if let Some(p) = PEER_TCP.get_ptr_mut(key) {
        return Some(p);
    }
    // PeerTcp is 288 bytes: too large for the 512-byte BPF stack alongside the rest, so
    // build the zeroed value in place via a static zero template.
    let _ = PEER_TCP.insert(key, &ZERO_PEER, BPF_NOEXIST as u64);
    PEER_TCP.get_ptr_mut(key)
}

static ZERO_PEER: PeerTcp = PeerTcp {
    rtt_buckets: [0; probe_ebpf::LOG2_BUCKETS],
    rtt_count: 0,
    rtt_sum_us: 0,
    retrans_segs: 0,
    retrans_events: 0,
};
