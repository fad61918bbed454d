//! TC classifiers: per-flow accounting (bytes, packets, ECN, bursts) on ingress and egress.
//!
//! Two variants per direction: `_eth` for devices with an Ethernet header and `_rawip` for
//! devices whose packets start at the IP header (tun, wireguard, ipip). The loader picks one
//! by the link type, which keeps the L3 offset a constant for the verifier and the CPU.
//! Every program returns TC_ACT_UNSPEC (-1): it only observes, the packet goes on as if the
//! filter were not there.
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, TC_ACT_UNSPEC},
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::classifier,
    programs::TcContext,
};
use probe_ebpf::{
    errors, log2_bucket, BurstKey, FlowKey, FlowStats, IfaceKey, IfaceStats, Inflight, SeriesSlot,
    SeriesStats, AF_INET, AF_INET6, BURST_EVENTS_PER_CPU_DEFAULT, DIR_EGRESS, DIR_INGRESS,
    IFACES_MAX_ENTRIES, QDISC_IFACE_PROBES, SERIES_SLOTS_DEFAULT, SERIES_STALE_NS,
};

use crate::maps::{
    addr_hash, atomic_add, atomic_publish, bucket_index, count_error, lookup_or_copy,
    lookup_or_create, store_release_tso, zeroed, BURST_EVENTS, BURST_EVENTS_POS, FLOWS, FLOW_EPOCH,
    FLOW_INSERTS, NONIP, PEER_BURSTS, QDISC_IFACES, QDISC_INFLIGHT, SERIES, SERIES_SLOTS,
    ZERO_BURSTS,
};

/// An idle gap longer than this ends a burst. Patched by the loader (`--burst-gap`).
#[unsafe(no_mangle)]
static BURST_GAP_NS: u64 = 1_000_000;

/// SERIES_SLOTS' size minus one. Patched by the loader when it resizes the table.
#[unsafe(no_mangle)]
static SERIES_SLOTS_MASK: u32 = SERIES_SLOTS_DEFAULT - 1;

/// log2 of BURST_EVENTS' records per CPU. Patched by the loader when it sizes the rings.
#[unsafe(no_mangle)]
static BURST_EVENTS_SHIFT: u32 = BURST_EVENTS_PER_CPU_DEFAULT.trailing_zeros();

/// 1 where the kernel runs on x86-64 (patched by the loader): there every store is a
/// release, so the ring's head is published with a plain store. A locked instruction would
/// wait for the record's stores to reach the cache, and the record's line is a cold miss:
/// ~15% of a TC run at 10,000 flows, measured at the instruction after the atomic.
#[unsafe(no_mangle)]
static STORES_ARE_ORDERED: u32 = 0;

/// Slots a series may try in its CPU's table before it goes to SERIES.
const SERIES_PROBES: u32 = 4;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

#[classifier]
pub fn tc_ingress_eth(ctx: TcContext) -> i32 {
    account(&ctx, ETH_HLEN, DIR_INGRESS);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn tc_egress_eth(ctx: TcContext) -> i32 {
    account(&ctx, ETH_HLEN, DIR_EGRESS);
    enqueued(&ctx);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn tc_ingress_rawip(ctx: TcContext) -> i32 {
    account(&ctx, 0, DIR_INGRESS);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn tc_egress_rawip(ctx: TcContext) -> i32 {
    account(&ctx, 0, DIR_EGRESS);
    enqueued(&ctx);
    TC_ACT_UNSPEC
}

/// TC egress runs right before the packet enters the interface's qdisc. On interfaces whose
/// qdisc queues, remember when, keyed by the skb's kernel address (the context pointer of a
/// TC program is the sk_buff itself), for tp_qdisc_dequeue to time its sojourn. Keying by
/// skb rather than by the dequeue event's ifindex keeps other namespaces' interfaces, whose
/// indexes repeat, out of the measurement.
#[inline(always)]
fn enqueued(ctx: &TcContext) {
    // SAFETY: the context pointer handed to this program.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if !queued(ifindex) {
        return;
    }
    let skb = ctx.skb.skb as u64;
    let v = Inflight {
        enqueued_ns: unsafe { bpf_ktime_get_ns() },
        ifindex,
        _pad: 0,
    };
    if QDISC_INFLIGHT.insert(&skb, &v, BPF_ANY as u64).is_err() {
        count_error(errors::QDISC_INFLIGHT_FULL);
    }
}

/// Whether `ifindex` is in the QDISC_IFACES set (see there).
#[inline(always)]
fn queued(ifindex: u32) -> bool {
    let mut i = 0u32;
    while i < QDISC_IFACE_PROBES {
        match QDISC_IFACES.get(ifindex.wrapping_add(i) & (IFACES_MAX_ENTRIES - 1)) {
            Some(&v) if v == ifindex => return true,
            Some(&0) | None => return false,
            Some(_) => {}
        }
        i += 1;
    }
    false
}

/// Reads a `T` at `off`: straight from the linear packet data when it is there (the common
/// case: headers are linear), else through bpf_skb_load_bytes. `T` must be at least two
/// bytes (see the TCP data offset read below).
#[inline(always)]
fn hdr<T: Copy>(ctx: &TcContext, off: usize) -> Option<T> {
    let start = ctx.data();
    let end = ctx.data_end();
    let len = core::mem::size_of::<T>();
    if start + off + len <= end {
        // SAFETY: bounds checked against data_end just above.
        return Some(unsafe { core::ptr::read_unaligned((start + off) as *const T) });
    }
    ctx.load::<T>(off).ok()
}

#[inline(always)]
fn account(ctx: &TcContext, l2_len: usize, direction: u8) {
    // SAFETY: ctx.skb.skb is the context pointer the kernel passed to this program.
    let skb = unsafe { &*ctx.skb.skb };
    let ifindex = skb.ifindex;
    let len = skb.len as u64;
    let mut l3 = l2_len;
    let mut proto = u16::from_be(skb.protocol as u16);
    if l2_len != 0 && (proto == ETH_P_8021Q || proto == ETH_P_8021AD) {
        // A VLAN tag left in the data (no hardware offload): the real type follows it.
        match hdr::<u16>(ctx, ETH_HLEN + 2) {
            Some(p) => proto = u16::from_be(p),
            None => return nonip(ifindex, direction, len),
        }
        l3 += 4;
    }

    let mut key: FlowKey = zeroed();
    key.ifindex = ifindex;
    key.direction = direction;
    let ecn: u8;
    let l4: usize;
    let mut has_ports = true;
    if proto == ETH_P_IP {
        // version/ihl, tos, total length, id, frag, ttl, proto, csum, saddr, daddr
        let Some(h) = hdr::<[u8; 20]>(ctx, l3) else {
            return nonip(ifindex, direction, len);
        };
        key.family = AF_INET;
        key.proto = h[9];
        ecn = h[1] & 0x3;
        key.src[0] = u32::from_ne_bytes([h[12], h[13], h[14], h[15]]);
        key.dst[0] = u32::from_ne_bytes([h[16], h[17], h[18], h[19]]);
        let frag_off = u16::from_be_bytes([h[6], h[7]]) & 0x1fff;
        if frag_off != 0 {
            // A later fragment carries no L4 header.
            has_ports = false;
        }
        l4 = l3 + ((h[0] & 0x0f) as usize) * 4;
    } else if proto == ETH_P_IPV6 {
        let Some(h) = hdr::<[u8; 40]>(ctx, l3) else {
            return nonip(ifindex, direction, len);
        };
        key.family = AF_INET6;
        // Extension headers are not walked: such packets are accounted with ports 0.
        key.proto = h[6];
        ecn = (h[1] >> 4) & 0x3;
        for i in 0..4 {
            let (s, d) = (8 + 4 * i, 24 + 4 * i);
            key.src[i] = u32::from_ne_bytes([h[s], h[s + 1], h[s + 2], h[s + 3]]);
            key.dst[i] = u32::from_ne_bytes([h[d], h[d + 1], h[d + 2], h[d + 3]]);
        }
        l4 = l3 + 40;
    } else {
        return nonip(ifindex, direction, len);
    }

    // Header length of one segment, to expand a GSO super-packet into wire bytes.
    let mut hdr_len = l4 as u64;
    if has_ports && (key.proto == IPPROTO_TCP || key.proto == IPPROTO_UDP) {
        if let Some(p) = hdr::<[u8; 4]>(ctx, l4) {
            key.sport = u16::from_be_bytes([p[0], p[1]]);
            key.dport = u16::from_be_bytes([p[2], p[3]]);
        }
        if key.proto == IPPROTO_TCP {
            // Two bytes, not one: LLVM turns a one-byte bounds check into a form (`p < end`)
            // from which the verifier derives no readable range.
            if let Some(off) = hdr::<[u8; 2]>(ctx, l4 + 12) {
                hdr_len += ((off[0] >> 4) as u64) * 4;
            }
        } else {
            hdr_len += 8;
        }
    }

    let segs = if skb.gso_segs > 1 {
        skb.gso_segs as u64
    } else {
        1
    };
    let wire_bytes = len + (segs - 1) * hdr_len;
    let now = unsafe { bpf_ktime_get_ns() };
    let series_slot = count_series(&key, now, wire_bytes, segs, ecn);

    let epoch = FLOW_EPOCH.get(0).copied().unwrap_or(0);
    let init = || FlowStats {
        last_seen_ns: now,
        burst_start_ns: now,
        mark_epoch: epoch,
        ..FlowStats::default()
    };
    // Creations are counted for the daemon's eviction count (FLOW_INSERTS).
    let created = || {
        if let Some(p) = FLOW_INSERTS.get_ptr_mut(0) {
            // SAFETY: this CPU's slot: no other writer during this run.
            unsafe { *p += 1 };
        }
    };
    let Some(v) = lookup_or_create(&FLOWS, &key, init, errors::FLOWS_FULL, created) else {
        aya_log_ebpf::warn!(
            ctx,
            "FLOWS map full: a packet was not counted (raise maps.flows)"
        );
        return;
    };
    // SAFETY: v points at a live map value for the duration of this run.
    let s = unsafe { &mut *v };
    // Plain adds, like the burst fields below: a flow's packets are almost always handled by
    // one CPU at a time, and a rare lost update only blurs this flow's detail. The exported
    // counters are the series', counted per CPU above, exactly.
    if s.mark_epoch != epoch {
        s.mark_epoch = epoch;
        s.mark_bytes = s.bytes;
    }
    s.bytes += wire_bytes;
    s.packets += segs;

    // Bursts.
    let gap = unsafe { core::ptr::read_volatile(&BURST_GAP_NS) };
    let last = s.last_seen_ns;
    if now > last && now - last > gap && s.burst_bytes > 0 {
        let start = s.burst_start_ns;
        let size = s.burst_bytes;
        let duration = last.saturating_sub(start);
        // `packets` already holds this packet, which opens the next burst.
        let packets_before = s.packets.saturating_sub(segs);
        let packets = packets_before.saturating_sub(s.burst_start_packets);
        s.last_burst_bytes = size;
        s.last_burst_ns = duration;
        if size > s.max_burst_bytes {
            s.max_burst_bytes = size;
        }
        s.bursts += 1;
        s.burst_start_ns = now;
        s.burst_bytes = 0;
        s.burst_start_packets = packets_before;
        burst_ended(&key, start, size, duration, packets, series_slot);
    }
    s.burst_bytes += wire_bytes;
    s.last_seen_ns = now;
}

/// Adds the packet to its series (peer, interface, direction): the exported per-series
/// counters, which the daemon then reads without walking every flow. In this CPU's table
/// when the series has (or finds) one of the few slots its hash points at, else in SERIES.
/// Returns 1 + the slot's index, or 0 for SERIES (BurstSlot::series_slot).
#[inline(always)]
fn count_series(k: &FlowKey, now: u64, bytes: u64, segs: u64, ecn: u8) -> u32 {
    let ce = if ecn == 0x3 { segs } else { 0 };
    let ect = if ecn != 0 { segs } else { 0 };
    let addr = if k.direction == DIR_EGRESS {
        &k.dst
    } else {
        &k.src
    };
    let tag = SeriesSlot::tag(k.ifindex, k.family, k.direction);
    let h = addr_hash(addr, tag);
    let mask = unsafe { core::ptr::read_volatile(&SERIES_SLOTS_MASK) };
    let mut i = 0u32;
    while i < SERIES_PROBES {
        let index = h.wrapping_add(i) & mask;
        let Some(p) = SERIES_SLOTS.get_ptr_mut(index) else {
            break;
        };
        // SAFETY: this CPU's slot: no other writer during this run.
        let s = unsafe { &mut *p };
        if s.tag == tag && s.addr == *addr {
            s.last_ns = now;
            s.bytes += bytes;
            s.packets += segs;
            s.ce_packets += ce;
            s.ect_packets += ect;
            return index + 1;
        }
        if s.tag == 0 || now.saturating_sub(s.last_ns) > SERIES_STALE_NS {
            // Free, or its series has long been read for the last time: start this one.
            s.addr = *addr;
            s.tag = tag;
            s.last_ns = now;
            s.bytes = bytes;
            s.packets = segs;
            s.ce_packets = ce;
            s.ect_packets = ect;
            return index + 1;
        }
        i += 1;
    }
    let mut key: BurstKey = zeroed();
    key.addr = *addr;
    key.ifindex = k.ifindex;
    key.family = k.family;
    key.direction = k.direction;
    let add = |p: *mut SeriesStats| {
        // SAFETY: this CPU's slot of a live per-CPU value: no other writer during this run.
        unsafe {
            (*p).bytes += bytes;
            (*p).packets += segs;
            (*p).ce_packets += ce;
            (*p).ect_packets += ect;
        }
    };
    if let Some(p) = SERIES.get_ptr_mut(&key) {
        add(p);
        return 0;
    }
    let v = SeriesStats {
        bytes,
        packets: segs,
        ce_packets: ce,
        ect_packets: ect,
    };
    // NOEXIST: if another CPU created the series meanwhile, add to this CPU's part of it.
    if SERIES.insert(&key, &v, BPF_NOEXIST as u64).is_ok() {
        return 0;
    }
    match SERIES.get_ptr_mut(&key) {
        Some(p) => add(p),
        None => count_error(errors::SERIES_FULL),
    }
    0
}

/// Streams an ended burst to user space, which folds the records into the per-peer
/// histograms. Only when the ring is full does the burst go into PEER_BURSTS here, so the
/// histograms stay exact while the event is lost. Updating a per-peer map on every burst end
/// was most of this path's cost: a second hash lookup and five atomic adds on cache lines
/// that every CPU sending to that peer writes. Runs once per burst, not per packet.
#[inline(always)]
fn burst_ended(
    k: &FlowKey,
    start_ns: u64,
    size: u64,
    duration_ns: u64,
    packets: u64,
    series_slot: u32,
) {
    let addr = if k.direction == DIR_EGRESS {
        &k.dst
    } else {
        &k.src
    };
    if emit_burst(k, addr, start_ns, size, duration_ns, packets, series_slot) {
        return;
    }
    let mut key: BurstKey = zeroed();
    key.addr = *addr;
    key.ifindex = k.ifindex;
    key.family = k.family;
    key.direction = k.direction;
    let Some(h) = lookup_or_copy(&PEER_BURSTS, &key, &ZERO_BURSTS, errors::BURSTS_FULL) else {
        return;
    };
    // SAFETY: live map value; bucket_index bounds both offsets to the arrays.
    unsafe {
        atomic_add(
            (*h).size_buckets
                .as_mut_ptr()
                .add(bucket_index(log2_bucket(size))),
            1,
        );
        atomic_add(
            (*h).duration_buckets
                .as_mut_ptr()
                .add(bucket_index(log2_bucket(duration_ns))),
            1,
        );
        atomic_add(&mut (*h).count, 1);
        atomic_add(&mut (*h).bytes, size);
        atomic_add(&mut (*h).duration_ns, duration_ns);
    }
}

/// Writes one BurstEnd record into this CPU's BURST_EVENTS ring; false, counted, when the
/// ring is full (user space has not yet read the records a ring's length back). Nothing
/// wakes user space: it drains the rings every 25-100 ms.
#[inline(always)]
fn emit_burst(
    k: &FlowKey,
    addr: &probe_ebpf::Addr,
    start_ns: u64,
    size: u64,
    duration_ns: u64,
    packets: u64,
    series_slot: u32,
) -> bool {
    // SAFETY: a helper without arguments; BPF programs run with migration off, so the CPU
    // stays the same for the rest of this run.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let shift = unsafe { core::ptr::read_volatile(&BURST_EVENTS_SHIFT) } & 31;
    let Some(pos) = BURST_EVENTS_POS.get_ptr_mut(cpu) else {
        count_error(errors::BURST_EVENTS_FULL);
        return false;
    };
    // SAFETY: a live map value. `head` has one writer, this CPU; `tail` is user space's, read
    // once (volatile: it changes under us).
    let (head, tail) = unsafe { ((*pos).head, core::ptr::read_volatile(&(*pos).tail)) };
    let len = 1u64 << shift;
    if head.wrapping_sub(tail) >= len {
        count_error(errors::BURST_EVENTS_FULL);
        return false;
    }
    let slot = (cpu << shift) | (head & (len - 1)) as u32;
    let Some(p) = BURST_EVENTS.get_ptr_mut(slot) else {
        count_error(errors::BURST_EVENTS_FULL);
        return false;
    };
    // SAFETY: a live map value that user space does not read until `head` passes it.
    unsafe {
        let e = &mut (*p).end;
        e.start_ns = start_ns;
        e.duration_ns = duration_ns;
        e.bytes = size;
        e.packets = packets;
        e.addr = *addr;
        e.ifindex = k.ifindex;
        e.family = k.family;
        e.direction = k.direction;
        e._pad = 0;
        (*p).series_slot = series_slot;
        if core::ptr::read_volatile(&STORES_ARE_ORDERED) != 0 {
            store_release_tso(&mut (*pos).head, head + 1);
        } else {
            atomic_publish(&mut (*pos).head, 1);
        }
    }
    true
}

#[inline(always)]
fn nonip(ifindex: u32, direction: u8, len: u64) {
    let mut key: IfaceKey = zeroed();
    key.ifindex = ifindex;
    key.direction = direction;
    match NONIP.get_ptr_mut(&key) {
        // SAFETY: a per-CPU value: only this CPU writes it during this run.
        Some(p) => unsafe {
            (*p).bytes += len;
            (*p).packets += 1;
        },
        None => {
            if NONIP
                .insert(
                    &key,
                    &IfaceStats {
                        bytes: len,
                        packets: 1,
                    },
                    0,
                )
                .is_err()
            {
                count_error(errors::NONIP_FULL);
            }
        }
    }
}
