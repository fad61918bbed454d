//! The kernel/user ABI of probe: map keys, map values and load-time globals shared by the
//! eBPF programs (built for `bpfel-unknown-none`) and the `probe` daemon (built for the host).
//!
//! Every type is `#[repr(C)]`, explicitly padded, and has a size asserted at compile time, so
//! the two sides cannot silently disagree. Addresses are stored in network byte order in a
//! 16-byte array (IPv4 in the first four bytes); ports in host byte order.
#![no_std]

/// An IP address as 16 bytes in network order (IPv4 in the first four), held in u32 words:
/// the same bytes as `[u8; 16]`, but 4-byte aligned, so the eBPF code zeroes and copies keys
/// with word stores instead of byte loops (the BPF backend turns unaligned memset/memcpy
/// into calls to a byte-at-a-time builtin).
pub type Addr = [u32; 4];

/// The address bytes, in network order.
#[inline(always)]
pub fn addr_bytes(a: &Addr) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let w = a[i].to_ne_bytes();
        out[i * 4] = w[0];
        out[i * 4 + 1] = w[1];
        out[i * 4 + 2] = w[2];
        out[i * 4 + 3] = w[3];
        i += 1;
    }
    out
}

/// Address families, as the kernel numbers them.
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

/// Traffic direction at a TC hook.
pub const DIR_INGRESS: u8 = 0;
pub const DIR_EGRESS: u8 = 1;

/// Number of log2 buckets in kernel histograms. Bucket `i` counts values `v` with
/// `2^i <= v < 2^(i+1)` (bucket 0 also takes 0); the last bucket takes everything above.
pub const LOG2_BUCKETS: usize = 32;

/// Default map sizes. The daemon may resize maps at load time.
pub const FLOWS_MAX_ENTRIES: u32 = 65_536;
pub const CONNS_MAX_ENTRIES: u32 = 65_536;
pub const PEERS_MAX_ENTRIES: u32 = 16_384;
pub const IFACES_MAX_ENTRIES: u32 = 1_024;
/// Slots QDISC_IFACES (IFACES_MAX_ENTRIES slots, a power of two) is probed for an ifindex.
pub const QDISC_IFACE_PROBES: u32 = 4;
pub const BURSTS_MAX_ENTRIES: u32 = 16_384;
/// Slots per CPU of SERIES_SLOTS, the per-CPU table of series counters (a power of two; the
/// loader may change it and patches SERIES_SLOTS_MASK to match). 64 bytes each per possible
/// CPU, and user space reads all of them every tick: 1,024 is 64 KiB per CPU.
pub const SERIES_SLOTS_DEFAULT: u32 = 1_024;
/// Series that found no slot in their CPU's table, in SERIES (a per-CPU hash). Not
/// preallocated: a per-CPU entry costs its size on every possible CPU, so memory follows
/// the series that overflow.
pub const SERIES_MAX_ENTRIES: u32 = 16_384;
/// Packets waiting in a monitored qdisc, keyed by skb address (for sojourn time).
pub const QDISC_INFLIGHT_MAX_ENTRIES: u32 = 65_536;
pub const DROP_REASONS_MAX_ENTRIES: u32 = 1_024;
/// Burst-end records per CPU in BURST_EVENTS by default (a power of two; the loader sizes the
/// rings from `[maps] burst_events_bytes_per_cpu` and patches BURST_EVENTS_SHIFT to match). A
/// record is one 64-byte line (`BurstSlot`), so 4,096 is 256 KiB per CPU: user space drains
/// every 25 ms when busy, so that is 163,840 burst ends a second per CPU before the kernel has to drop
/// one.
pub const BURST_EVENTS_PER_CPU_DEFAULT: u32 = 4_096;

/// Slots of the ERRORS per-CPU array: inserts (or ring buffer reservations) that a full map
/// refused.
pub mod errors {
    pub const FLOWS_FULL: u32 = 0;
    pub const CONNS_FULL: u32 = 1;
    pub const PEERS_FULL: u32 = 2;
    pub const BURSTS_FULL: u32 = 3;
    pub const QDISC_INFLIGHT_FULL: u32 = 4;
    pub const NONIP_FULL: u32 = 5;
    pub const SOJOURN_FULL: u32 = 6;
    /// A burst end its CPU's full BURST_EVENTS ring had no room for (an event lost).
    pub const BURST_EVENTS_FULL: u32 = 7;
    /// A packet of a new series the full SERIES map refused: its series misses it.
    pub const SERIES_FULL: u32 = 8;
    /// Slots in the array: one per name.
    pub const COUNT: u32 = NAMES.len() as u32;
    /// Map names for the exported label, by slot.
    pub const NAMES: [&str; 9] = [
        "FLOWS",
        "CONNS",
        "PEER_TCP",
        "PEER_BURSTS",
        "QDISC_INFLIGHT",
        "NONIP",
        "QDISC_SOJOURN",
        "BURST_EVENTS",
        "SERIES",
    ];
}

/// Names of the maps and programs in the object file, used by the loader.
pub mod names {
    pub const FLOWS: &str = "FLOWS";
    pub const NONIP: &str = "NONIP";
    pub const CONNS: &str = "CONNS";
    pub const PEER_TCP: &str = "PEER_TCP";
    pub const PEER_SLOTS: &str = "PEER_SLOTS";
    pub const TCP_EPOCH: &str = "TCP_EPOCH";
    pub const CONN_FLOOR: &str = "CONN_FLOOR";
    pub const SOCK_COUNTED: &str = "SOCK_COUNTED";
    pub const PEER_BURSTS: &str = "PEER_BURSTS";
    pub const SERIES: &str = "SERIES";
    pub const SERIES_SLOTS: &str = "SERIES_SLOTS";
    pub const DROPS: &str = "DROPS";
    pub const QDISC_IFACES: &str = "QDISC_IFACES";
    pub const QDISC_INFLIGHT: &str = "QDISC_INFLIGHT";
    pub const QDISC_SOJOURN: &str = "QDISC_SOJOURN";
    pub const ERRORS: &str = "ERRORS";
    pub const FLOW_INSERTS: &str = "FLOW_INSERTS";
    pub const FLOW_EPOCH: &str = "FLOW_EPOCH";
    pub const BURST_EVENTS: &str = "BURST_EVENTS";
    pub const BURST_EVENTS_POS: &str = "BURST_EVENTS_POS";
    pub const KFREE_SKB: &str = "tp_kfree_skb";
    pub const QDISC_DEQUEUE: &str = "tp_qdisc_dequeue";
    pub const TC_INGRESS_ETH: &str = "tc_ingress_eth";
    pub const TC_EGRESS_ETH: &str = "tc_egress_eth";
    pub const TC_INGRESS_RAWIP: &str = "tc_ingress_rawip";
    pub const TC_EGRESS_RAWIP: &str = "tc_egress_rawip";
    pub const SOCK_OPS: &str = "sockops_tcp";
    pub const TCP_RETRANSMIT: &str = "tp_tcp_retransmit_skb";
    /// The programs that select what a walk of FLOWS and CONNS keeps, and their outputs.
    pub const FLOW_SELECT: &str = "select_flows";
    pub const CONN_SELECT: &str = "select_conns";
    pub const FLOW_PICKS: &str = "FLOW_PICKS";
    pub const FLOW_WALK: &str = "FLOW_WALK";
    pub const CONN_PICKS: &str = "CONN_PICKS";
    pub const CONN_WALK: &str = "CONN_WALK";
}

/// Names of the load-time globals (`static`s patched by the loader before load).
pub mod globals {
    /// u64: an idle gap longer than this (ns) ends a flow's burst.
    pub const BURST_GAP_NS: &str = "BURST_GAP_NS";
    /// u32: SERIES_SLOTS' max_entries - 1 (a power of two minus one).
    pub const SERIES_SLOTS_MASK: &str = "SERIES_SLOTS_MASK";
    /// u32: PEER_SLOTS' max_entries - 1 (a power of two minus one).
    pub const PEER_SLOTS_MASK: &str = "PEER_SLOTS_MASK";
    /// u32: log2 of the burst-end records per CPU in BURST_EVENTS.
    pub const BURST_EVENTS_SHIFT: &str = "BURST_EVENTS_SHIFT";
    /// u32: 1 on x86-64, whose stores are seen in program order (see RingPos).
    pub const STORES_ARE_ORDERED: &str = "STORES_ARE_ORDERED";
    /// u32 offsets of fields in the `tcp:tcp_retransmit_skb` tracepoint record, read by the
    /// loader from the event's `format` file because they differ between kernels.
    pub const RETX_OFF_FAMILY: &str = "RETX_OFF_FAMILY";
    pub const RETX_OFF_SPORT: &str = "RETX_OFF_SPORT";
    pub const RETX_OFF_DPORT: &str = "RETX_OFF_DPORT";
    pub const RETX_OFF_SADDR: &str = "RETX_OFF_SADDR";
    pub const RETX_OFF_DADDR: &str = "RETX_OFF_DADDR";
    pub const RETX_OFF_SADDR_V6: &str = "RETX_OFF_SADDR_V6";
    pub const RETX_OFF_DADDR_V6: &str = "RETX_OFF_DADDR_V6";
    /// u32 offset of `reason` in `skb:kfree_skb`.
    pub const DROP_OFF_REASON: &str = "DROP_OFF_REASON";
    /// u32 offset of `skbaddr` in `qdisc:qdisc_dequeue`.
    pub const QDEQ_OFF_SKB: &str = "QDEQ_OFF_SKB";
}

/// One direction of one flow on one interface, as the packet headers name it (for egress
/// `src` is local, for ingress `dst` is local).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: Addr,
    pub dst: Addr,
    pub sport: u16,
    pub dport: u16,
    pub ifindex: u32,
    pub family: u8,
    pub proto: u8,
    pub direction: u8,
    pub _pad: u8,
}

/// Per-flow counters. `bytes` and `packets` are wire-equivalent: a GSO/TSO super-packet
/// counts as its segments, each with its own headers, as qdisc statistics count it.
///
/// 96 bytes, so that an entry of the flow map (the kernel's 48-byte element header, the
/// 44-byte key rounded to 48, this) is exactly three cache lines and every entry starts on
/// one: a cold packet touches three lines, not three or four. The four fields every packet
/// writes come first, in the line the key's tail shares; the mark, which every packet reads
/// and the first after a walk writes, starts the next.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub bytes: u64,
    pub packets: u64,
    pub last_seen_ns: u64,
    /// Size of the burst in progress.
    pub burst_bytes: u64,
    /// The daemon's walk epoch (FLOW_EPOCH) of this flow's first packet since that epoch
    /// began, and `bytes` before that packet: what moved since the daemon's last walk is
    /// `bytes - mark_bytes` if `mark_epoch` is the current epoch, else nothing. So the walk
    /// keeps nothing per flow.
    pub mark_epoch: u32,
    pub _pad: u32,
    /// Start time of the burst in progress.
    pub burst_start_ns: u64,
    /// `packets` when the burst in progress started: the burst's packets are the difference,
    /// so counting them costs nothing per packet.
    pub burst_start_packets: u64,
    /// Bursts that have ended (an idle gap > BURST_GAP_NS followed them).
    pub bursts: u64,
    /// Size and duration of the last burst that ended, and the largest one seen.
    pub last_burst_bytes: u64,
    pub last_burst_ns: u64,
    pub max_burst_bytes: u64,
    pub mark_bytes: u64,
}

/// Traffic that is not IP (ARP, LLDP, ...) is counted per interface and direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IfaceKey {
    pub ifindex: u32,
    pub direction: u8,
    pub _pad0: u8,
    pub _pad1: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceStats {
    pub bytes: u64,
    pub packets: u64,
}

/// A remote host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PeerKey {
    pub addr: Addr,
    pub family: u8,
    pub _pad0: u8,
    pub _pad1: u16,
}

/// TCP state kept per peer in the kernel, per CPU (PEER_TCP is a per-CPU map: the
/// callbacks add without atomics, and user space sums the CPUs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerTcp {
    /// RTT samples (one per round trip per connection) in log2 buckets of microseconds.
    pub rtt_buckets: [u64; LOG2_BUCKETS],
    pub rtt_count: u64,
    pub rtt_sum_us: u64,
    /// Retransmitted segments (sock_ops RETRANS_CB for tracked sockets, counting segments as
    /// TcpRetransSegs does; the tracepoint, one per event, for sockets opened before probe).
    pub retrans_segs: u64,
    /// Retransmit events seen by the tracepoint for any socket.
    pub retrans_events: u64,
    /// Connections that reached ESTABLISHED while probe ran, and those of them that closed
    /// since: open = opened - closed, summed over CPUs (a socket may open on one CPU and
    /// close on another).
    pub opened: u64,
    pub closed: u64,
    /// The RTT window of the current and the previous tick, indexed by the tick's epoch
    /// (TCP_EPOCH) & 1: user space bumps the epoch, then reads the window of the tick that
    /// just ended while the callbacks write the other one.
    pub windows: [RttWindow; 2],
}

/// Slots per CPU of PEER_SLOTS at most (a power of two; the loader may make it smaller and
/// patches PEER_SLOTS_MASK to match). 360 bytes each per possible CPU, read every tick.
pub const PEER_SLOTS_PER_CPU: u32 = 256;

/// Slots a peer may try in its CPU's PEER_SLOTS before it goes to PEER_TCP.
pub const PEER_SLOT_PROBES: u32 = 4;

/// One slot of PEER_SLOTS: one peer's TCP counters as one CPU counted them. `key.family` 0
/// marks a free slot. A slot, once taken, stays its peer's for the life of the maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerSlot {
    pub key: PeerKey,
    pub tcp: PeerTcp,
}

/// What a peer's connections reported at their round-trip callbacks during one tick on one
/// CPU: how many round trips, the largest smoothed RTT any of them left, and the smallest
/// minimum RTT. Valid only if `epoch` is the tick's epoch: the first callback of a new tick
/// resets it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttWindow {
    pub epoch: u32,
    pub samples: u32,
    pub srtt_us: u32,
    pub min_rtt_us: u32,
}

impl Default for PeerTcp {
    fn default() -> Self {
        Self {
            rtt_buckets: [0; LOG2_BUCKETS],
            rtt_count: 0,
            rtt_sum_us: 0,
            retrans_segs: 0,
            retrans_events: 0,
            opened: 0,
            closed: 0,
            windows: [RttWindow::default(); 2],
        }
    }
}

/// Bursts of one peer's traffic on one interface in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BurstKey {
    pub addr: Addr,
    pub ifindex: u32,
    pub family: u8,
    pub direction: u8,
    pub _pad: u16,
}

/// One series' traffic (SERIES, keyed by BurstKey), per CPU: wire-equivalent bytes and
/// packets as FlowStats counts them, and the ECN counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeriesStats {
    pub bytes: u64,
    pub packets: u64,
    pub ce_packets: u64,
    pub ect_packets: u64,
}

/// One slot of SERIES_SLOTS: one series' traffic as one CPU counted it, and which series that
/// is. 64 bytes. `tag` packs ifindex, family and direction with a bit that marks the slot
/// taken (0: free); `last_ns` is the slot's last packet, after which a slot idle for
/// SERIES_STALE_NS may be taken by another series.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeriesSlot {
    pub addr: Addr,
    pub tag: u64,
    pub last_ns: u64,
    pub bytes: u64,
    pub packets: u64,
    pub ce_packets: u64,
    pub ect_packets: u64,
}

impl SeriesSlot {
    pub const TAKEN: u64 = 1 << 48;

    #[inline(always)]
    pub fn tag(ifindex: u32, family: u8, direction: u8) -> u64 {
        ifindex as u64 | (family as u64) << 32 | (direction as u64) << 40 | Self::TAKEN
    }

    /// (ifindex, family, direction) of a taken slot's tag.
    pub fn untag(tag: u64) -> (u32, u8, u8) {
        (tag as u32, (tag >> 32) as u8, (tag >> 40) as u8)
    }
}

/// A series slot untouched this long may be taken by another series (ns). Far above any tick:
/// user space has long read the old series' last counts.
pub const SERIES_STALE_NS: u64 = 600_000_000_000;

/// Ended bursts: log2 histograms of their sizes (bytes) and durations (ns).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BurstHist {
    pub size_buckets: [u64; LOG2_BUCKETS],
    pub duration_buckets: [u64; LOG2_BUCKETS],
    pub count: u64,
    pub bytes: u64,
    pub duration_ns: u64,
}

impl Default for BurstHist {
    fn default() -> Self {
        Self {
            size_buckets: [0; LOG2_BUCKETS],
            duration_buckets: [0; LOG2_BUCKETS],
            count: 0,
            bytes: 0,
            duration_ns: 0,
        }
    }
}

/// One ended burst of one flow, streamed through the writing CPU's BURST_EVENTS ring: one
/// record per burst, never per packet. Written when the flow's next packet comes after an
/// idle gap longer than BURST_GAP_NS; times are the kernel's monotonic clock
/// (bpf_ktime_get_ns).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BurstEnd {
    /// First packet of the burst.
    pub start_ns: u64,
    /// First to last packet.
    pub duration_ns: u64,
    /// Wire-equivalent bytes and packets, as FlowStats counts them.
    pub bytes: u64,
    pub packets: u64,
    /// The remote address (dst for egress, src for ingress), network order.
    pub addr: Addr,
    pub ifindex: u32,
    pub family: u8,
    pub direction: u8,
    pub _pad: u16,
}

/// A slot of BURST_EVENTS: a BurstEnd padded to one cache line. The map is an mmapable array
/// of rings of 1 << BURST_EVENTS_SHIFT slots, one ring per possible CPU (CPU c's starts at
/// slot c << BURST_EVENTS_SHIFT), which user space reads in place.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BurstSlot {
    pub end: BurstEnd,
    /// 1 + the index of the burst's series in the writing CPU's SERIES_SLOTS, 0 when the
    /// series has no slot there. Only a hint: user space files the record by (CPU, slot)
    /// without hashing its key, and checks the key (a slot can change series).
    pub series_slot: u32,
    pub _pad: u32,
}

/// A CPU's positions in its BURST_EVENTS ring (BURST_EVENTS_POS, an mmapable array indexed by
/// CPU; one cache line each). Both count records since load (a u64 does not wrap); the
/// record of count n is in slot n & (records per CPU - 1) of the CPU's ring.
/// - `head` is written only by the programs on that CPU (one writer: TC runs with bottom
///   halves off, so two runs never interleave on one CPU), and published after the record:
///   with a plain store on x86-64, whose stores are seen in program order, elsewhere with a
///   fully ordered atomic add;
/// - `tail` is written only by user space, after it has copied the records before it. The
///   program refuses a record while head - tail is the ring's size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingPos {
    pub head: u64,
    pub tail: u64,
    pub _pad: [u64; 6],
}

/// A packet waiting in a monitored interface's qdisc (QDISC_INFLIGHT, keyed by skb address).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inflight {
    pub enqueued_ns: u64,
    pub ifindex: u32,
    pub _pad: u32,
}

/// A log2 histogram of durations in nanoseconds (qdisc sojourn time per interface).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsHist {
    pub buckets: [u64; LOG2_BUCKETS],
    pub count: u64,
    pub sum_ns: u64,
}

impl Default for NsHist {
    fn default() -> Self {
        Self {
            buckets: [0; LOG2_BUCKETS],
            count: 0,
            sum_ns: 0,
        }
    }
}

/// A TCP connection, from the local side.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub laddr: Addr,
    pub raddr: Addr,
    pub lport: u16,
    pub rport: u16,
    pub family: u8,
    pub _pad0: u8,
    pub _pad1: u16,
}

/// Per-connection TCP state from sock_ops callbacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Smoothed RTT (us), as `ss -ti` reports it.
    pub srtt_us: u32,
    /// The kernel's windowed minimum RTT (us).
    pub min_rtt_us: u32,
    pub snd_cwnd: u32,
    pub packets_out: u32,
    pub retrans_out: u32,
    /// tcp_sock.total_retrans: retransmitted segments over the connection's life.
    pub total_retrans: u32,
    /// TCP state (TCP_ESTABLISHED = 1 ... TCP_CLOSE = 7).
    pub state: u32,
    pub _pad: u32,
    pub bytes_acked: u64,
    pub bytes_received: u64,
}

/// TCP_CLOSE in the kernel's state enum.
pub const TCP_CLOSE: u32 = 7;

/// Buckets of the flow walk's histogram of bytes moved: 8 per power of two (walk_bucket).
pub const WALK_HIST: usize = 512;

/// The flow walk's histogram bucket of `moved` bytes: the value itself below 8, else 8 per
/// power of two (`8 * log2 + the three bits after the top one`), so a threshold at a bucket
/// boundary lets through at most an eighth of an octave more than it must.
#[inline(always)]
pub fn walk_bucket(moved: u64) -> usize {
    if moved < 8 {
        return moved as usize;
    }
    let b = 63 - moved.leading_zeros() as u64;
    (b * 8 + ((moved >> (b - 3)) & 7)) as usize
}

/// The smallest value in walk_bucket's bucket `i` (buckets 8 to 23 are never used: 8).
pub fn walk_bucket_floor(i: usize) -> u64 {
    if i < 8 {
        return i as u64;
    }
    if i < 24 {
        return 8;
    }
    let (b, sub) = ((i / 8) as u64, (i % 8) as u64);
    (8 + sub) << (b - 3)
}
/// Records the flow walk can write (FLOW_PICKS): far more than the top list needs; idle
/// flows past it wait for the next walk. CONN_PICKS is as large as CONNS.
pub const PICKS_MAX: u32 = 4096;

/// The flow-selection walk (select_flows): its parameters, set by the daemon for one run,
/// and what it found, read back from FLOW_WALK. A flow is picked if it moved more than
/// `min_moved` bytes in `epoch` (a candidate top flow) or was idle longer than
/// `idle_timeout_ns` at `now_ns` (then deleted after its record is written).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowWalk {
    pub now_ns: u64,
    pub idle_timeout_ns: u64,
    pub min_moved: u64,
    /// FLOW_EPOCH as the daemon reads it.
    pub epoch: u32,
    /// Records written to FLOW_PICKS.
    pub written: u32,
    /// Entries visited, the deleted ones included.
    pub visited: u64,
    /// 1 if FLOW_PICKS filled up: later picks were not written (nor idle flows deleted).
    pub full: u32,
    pub _pad: u32,
    /// Flows that moved, by walk_bucket of the bytes they moved: where the threshold of a
    /// run that found too few or too many candidates should have been. Zeroed by the
    /// daemon before each run.
    pub hist: [u32; WALK_HIST],
}

impl Default for FlowWalk {
    fn default() -> Self {
        Self {
            now_ns: 0,
            idle_timeout_ns: 0,
            min_moved: 0,
            epoch: 0,
            written: 0,
            visited: 0,
            full: 0,
            _pad: 0,
            hist: [0; WALK_HIST],
        }
    }
}

/// The connection-selection walk (select_conns): its floor (us), set by the daemon for one
/// run, and what it found, read back from CONN_WALK.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnWalk {
    pub floor: u32,
    /// Records written to CONN_PICKS.
    pub written: u32,
    /// 1 if CONN_PICKS filled up: later connections were not written (nor deleted).
    pub full: u32,
}

/// Bits of a selection record's `kind`.
pub mod pick {
    /// A flow that moved more than `min_moved` since the last walk.
    pub const TOP: u32 = 1;
    /// A flow idle past its timeout: written, then deleted from FLOWS.
    pub const IDLE: u32 = 2;
    /// An open connection at or above the floor.
    pub const SLOW: u32 = 4;
    /// A connection deleted from CONNS (closed, or below the floor): its key only.
    pub const GONE: u32 = 8;
}

/// One record of the flow-selection walk (FLOW_PICKS).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowPick {
    pub kind: u32,
    pub key: FlowKey,
    pub stats: FlowStats,
}

/// One record of the connection-selection walk (CONN_PICKS): an open connection at or
/// above the floor (SLOW), or one the walk deleted (GONE, key only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnPick {
    pub kind: u32,
    pub key: ConnKey,
    pub _pad: u32,
    pub stats: ConnStats,
}

/// log2 bucket of a value, clamped to the last bucket.
#[inline(always)]
pub fn log2_bucket(v: u64) -> usize {
    if v == 0 {
        return 0;
    }
    let b = 63 - v.leading_zeros() as usize;
    if b >= LOG2_BUCKETS {
        LOG2_BUCKETS - 1
    } else {
        b
    }
}

const _: () = {
    assert!(core::mem::size_of::<FlowKey>() == 44);
    assert!(core::mem::size_of::<FlowStats>() == 96);
    assert!(core::mem::size_of::<IfaceKey>() == 8);
    assert!(core::mem::size_of::<PeerKey>() == 20);
    assert!(core::mem::size_of::<PeerTcp>() == 8 * (LOG2_BUCKETS + 6) + 2 * 16);
    assert!(core::mem::size_of::<ConnKey>() == 40);
    assert!(core::mem::size_of::<ConnStats>() == 48);
    assert!(core::mem::size_of::<FlowWalk>() == 48 + 4 * WALK_HIST);
    assert!(core::mem::size_of::<ConnWalk>() == 12);
    assert!(core::mem::size_of::<FlowPick>() == 144);
    assert!(core::mem::offset_of!(FlowPick, stats) == 48);
    assert!(core::mem::size_of::<ConnPick>() == 96);
    assert!(core::mem::offset_of!(ConnPick, stats) == 48);
    assert!(core::mem::size_of::<BurstKey>() == 24);
    assert!(core::mem::size_of::<SeriesStats>() == 32);
    assert!(core::mem::size_of::<SeriesSlot>() == 64);
    assert!(core::mem::size_of::<BurstHist>() == 8 * (2 * LOG2_BUCKETS + 3));
    assert!(core::mem::size_of::<NsHist>() == 8 * (LOG2_BUCKETS + 2));
    assert!(core::mem::size_of::<Inflight>() == 16);
    // One record per 64-byte line of the rings' page-aligned array.
    assert!(core::mem::size_of::<BurstEnd>() == 56);
    assert!(core::mem::size_of::<BurstSlot>() == 64);
    assert!(core::mem::size_of::<RingPos>() == 64);
    assert!(errors::COUNT as usize == errors::NAMES.len());
    assert!(errors::BURST_EVENTS_FULL < errors::COUNT);
};

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), Copy, and have no implicit padding (sizes are asserted
    // above), so any bit pattern the kernel writes is a valid value.
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowStats {}
    unsafe impl aya::Pod for IfaceKey {}
    unsafe impl aya::Pod for IfaceStats {}
    unsafe impl aya::Pod for PeerKey {}
    unsafe impl aya::Pod for PeerTcp {}
    unsafe impl aya::Pod for PeerSlot {}
    unsafe impl aya::Pod for RttWindow {}
    unsafe impl aya::Pod for ConnKey {}
    unsafe impl aya::Pod for ConnStats {}
    unsafe impl aya::Pod for BurstKey {}
    unsafe impl aya::Pod for BurstHist {}
    unsafe impl aya::Pod for SeriesStats {}
    unsafe impl aya::Pod for SeriesSlot {}
    unsafe impl aya::Pod for NsHist {}
    unsafe impl aya::Pod for Inflight {}
    unsafe impl aya::Pod for BurstEnd {}
    unsafe impl aya::Pod for BurstSlot {}
    unsafe impl aya::Pod for RingPos {}
    unsafe impl aya::Pod for FlowWalk {}
    unsafe impl aya::Pod for ConnWalk {}
    unsafe impl aya::Pod for FlowPick {}
    unsafe impl aya::Pod for ConnPick {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_buckets_bound_their_values() {
        let mut last = 0;
        for v in (0..5_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let i = walk_bucket(v);
            assert!(i < WALK_HIST && i >= last, "{v}");
            assert!(walk_bucket_floor(i) <= v, "{v}");
            if i + 1 < WALK_HIST {
                assert!(v < walk_bucket_floor(i + 1), "{v}");
            }
            last = i;
        }
        // An eighth of an octave: 1,000 falls in [960, 1024).
        assert_eq!(walk_bucket_floor(walk_bucket(1_000)), 960);
    }

    #[test]
    fn log2_buckets_cover_edges() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(2), 1);
        assert_eq!(log2_bucket(3), 1);
        assert_eq!(log2_bucket(1024), 10);
        assert_eq!(log2_bucket(u64::MAX), LOG2_BUCKETS - 1);
    }
}
