//! TC classifiers: per-flow accounting (bytes, packets, ECN, bursts) on ingress and egress.
//!
//! Two variants per direction: `_eth` for devices with an Ethernet header and `_rawip` for
//! devices whose packets start at the IP header (tun, wireguard, ipip). The loader picks one
//! by the link type, which keeps the L3 offset a constant for the verifier and the CPU.
//! Every program returns TC_ACT_UNSPEC (-1): it only observes, the packet goes on as if the
//! filter were not there.
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_RB_NO_WAKEUP, TC_ACT_UNSPEC},
    helpers::bpf_ktime_get_ns,
    macros::classifier,
    programs::TcContext,
};
use probe_ebpf::{
    errors, log2_bucket, BurstEnd, BurstKey, FlowKey, FlowStats, IfaceKey, IfaceStats, Inflight,
    AF_INET, AF_INET6, DIR_EGRESS, DIR_INGRESS,
};

use crate::maps::{
    atomic_add, bucket_index, count_error, lookup_or_copy, lookup_or_init, zeroed, BURST_EVENTS,
    FLOWS, NONIP, PEER_BURSTS, QDISC_IFACES, QDISC_INFLIGHT, ZERO_BURSTS,
};

/// An idle gap longer than this ends a burst. Patched by the loader (`--burst-gap`).
#[unsafe(no_mangle)]
static BURST_GAP_NS: u64 = 1_000_000;

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
    if QDISC_IFACES.get_ptr(&ifindex).is_none() {
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

    let init = || FlowStats {
        first_seen_ns: now,
        last_seen_ns: now,
        burst_start_ns: now,
        ..FlowStats::default()
    };
    let Some(v) = lookup_or_init(&FLOWS, &key, init, errors::FLOWS_FULL) else {
        aya_log_ebpf::warn!(
            ctx,
            "FLOWS map full: a packet was not counted (raise maps.flows)"
        );
        return;
    };
    // SAFETY: v points at a live map value for the duration of this run.
    let s = unsafe { &mut *v };
    atomic_add(&mut s.bytes, wire_bytes);
    atomic_add(&mut s.packets, segs);
    if ecn == 0x3 {
        atomic_add(&mut s.ce_packets, segs);
    }
    if ecn != 0 {
        atomic_add(&mut s.ect_packets, segs);
    }

    // Bursts. The burst fields are plain stores: a flow's packets are almost always handled
    // by one CPU at a time, and a rare lost update only blurs one burst's size.
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
        burst_ended(&key, start, size, duration, packets);
    }
    s.burst_bytes += wire_bytes;
    s.last_seen_ns = now;
}

/// Streams an ended burst to user space, which folds the records into the per-peer
/// histograms. Only when the ring is full does the burst go into PEER_BURSTS here, so the
/// histograms stay exact while the event is lost. Updating a per-peer map on every burst end
/// was most of this path's cost: a second hash lookup and five atomic adds on cache lines
/// that every CPU sending to that peer writes. Runs once per burst, not per packet.
#[inline(always)]
fn burst_ended(k: &FlowKey, start_ns: u64, size: u64, duration_ns: u64, packets: u64) {
    let addr = if k.direction == DIR_EGRESS {
        &k.dst
    } else {
        &k.src
    };
    if emit_burst(k, addr, start_ns, size, duration_ns, packets) {
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

/// Writes one BurstEnd record into BURST_EVENTS; false, counted, when the ring is full.
/// No wakeup: user space drains the ring on its tick instead of polling it, so the kernel
/// need not queue an irq_work per record.
#[inline(always)]
fn emit_burst(
    k: &FlowKey,
    addr: &probe_ebpf::Addr,
    start_ns: u64,
    size: u64,
    duration_ns: u64,
    packets: u64,
) -> bool {
    let Some(mut e) = BURST_EVENTS.reserve::<BurstEnd>(0) else {
        count_error(errors::BURST_EVENTS_FULL);
        return false;
    };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is the reserved record, sized and 8-byte aligned for a BurstEnd; every
    // field is written before submit hands it over.
    unsafe {
        (*p).start_ns = start_ns;
        (*p).duration_ns = duration_ns;
        (*p).bytes = size;
        (*p).packets = packets;
        (*p).addr = *addr;
        (*p).ifindex = k.ifindex;
        (*p).family = k.family;
        (*p).direction = k.direction;
        (*p)._pad = 0;
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
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
