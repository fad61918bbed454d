//! Tracepoints. `tcp:tcp_retransmit_skb` sees retransmits of every socket, including those
//! opened before probe started or in cgroups sock_ops does not cover.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use probe_ebpf::{errors, log2_bucket, ConnKey, PeerKey, AF_INET, AF_INET6};

use crate::maps::{
    atomic_add, bucket_index, lookup_or_copy, zeroed, CONNS, DROPS, PEER_TCP, QDISC_INFLIGHT,
    QDISC_SOJOURN, ZERO_NS_HIST, ZERO_PEER,
};

// Field offsets in the tracepoint record, patched by the loader from the event's `format`
// file (they moved between kernel versions). Zero means "unknown": the program then skips.
#[unsafe(no_mangle)]
static RETX_OFF_FAMILY: u32 = 0;
#[unsafe(no_mangle)]
static RETX_OFF_SPORT: u32 = 0;
#[unsafe(no_mangle)]
static RETX_OFF_DPORT: u32 = 0;
#[unsafe(no_mangle)]
static RETX_OFF_SADDR: u32 = 0;
#[unsafe(no_mangle)]
static RETX_OFF_DADDR: u32 = 0;
#[unsafe(no_mangle)]
static RETX_OFF_SADDR_V6: u32 = 0;
#[unsafe(no_mangle)]
static RETX_OFF_DADDR_V6: u32 = 0;
#[unsafe(no_mangle)]
static DROP_OFF_REASON: u32 = 0;
#[unsafe(no_mangle)]
static QDEQ_OFF_SKB: u32 = 0;

#[inline(always)]
fn off(v: &u32) -> usize {
    unsafe { core::ptr::read_volatile(v) as usize }
}

#[tracepoint]
pub fn tp_tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let _ = retransmit(&ctx);
    0
}

#[inline(always)]
fn retransmit(ctx: &TracePointContext) -> Option<()> {
    let fam_off = off(&RETX_OFF_FAMILY);
    if fam_off == 0 {
        return None;
    }
    // SAFETY: offsets come from the kernel's own description of this record.
    let family: u16 = unsafe { ctx.read_at(fam_off) }.ok()?;
    let mut c: ConnKey = zeroed();
    if family == AF_INET as u16 {
        c.family = AF_INET;
        // Four address bytes read as one word: the bytes stay in network order.
        c.laddr[0] = unsafe { ctx.read_at::<u32>(off(&RETX_OFF_SADDR)) }.ok()?;
        c.raddr[0] = unsafe { ctx.read_at::<u32>(off(&RETX_OFF_DADDR)) }.ok()?;
    } else if family == AF_INET6 as u16 {
        c.family = AF_INET6;
        c.laddr = unsafe { ctx.read_at(off(&RETX_OFF_SADDR_V6)) }.ok()?;
        c.raddr = unsafe { ctx.read_at(off(&RETX_OFF_DADDR_V6)) }.ok()?;
    } else {
        return None;
    }
    // The record's ports are in host order.
    c.lport = unsafe { ctx.read_at::<u16>(off(&RETX_OFF_SPORT)) }.ok()?;
    c.rport = unsafe { ctx.read_at::<u16>(off(&RETX_OFF_DPORT)) }.ok()?;

    let mut p: PeerKey = zeroed();
    p.addr = c.raddr;
    p.family = c.family;
    let t = lookup_or_copy(&PEER_TCP, &p, &ZERO_PEER, errors::PEERS_FULL)?;
    // SAFETY: this CPU's value of a live per-CPU map entry.
    unsafe { (*t).retrans_events += 1 };
    // Sockets sock_ops tracks report exact segment counts through RETRANS_CB; count the
    // others here, one segment per event.
    if CONNS.get_ptr(&c).is_none() {
        unsafe { (*t).retrans_segs += 1 };
    }
    Some(())
}

/// `skb:kfree_skb`: every dropped packet on the host, by the kernel's drop reason.
#[tracepoint]
pub fn tp_kfree_skb(ctx: TracePointContext) -> u32 {
    let off = off(&DROP_OFF_REASON);
    if off == 0 {
        return 0;
    }
    let Ok(reason) = (unsafe { ctx.read_at::<u32>(off) }) else {
        return 0;
    };
    match DROPS.get_ptr_mut(&reason) {
        // SAFETY: per-CPU value: only this CPU writes it during this run.
        Some(p) => unsafe { *p += 1 },
        None => {
            let _ = DROPS.insert(&reason, &1, 0);
        }
    }
    0
}

/// `qdisc:qdisc_dequeue`: a packet TC egress saw on a monitored interface leaves the qdisc;
/// the time since is its sojourn.
#[tracepoint]
pub fn tp_qdisc_dequeue(ctx: TracePointContext) -> u32 {
    let _ = dequeue(&ctx);
    0
}

#[inline(always)]
fn dequeue(ctx: &TracePointContext) -> Option<()> {
    let skb_off = off(&QDEQ_OFF_SKB);
    if skb_off == 0 {
        return None;
    }
    let skb: u64 = unsafe { ctx.read_at(skb_off) }.ok()?;
    // An empty dequeue reports a null skb.
    if skb == 0 {
        return None;
    }
    let rec = unsafe { *QDISC_INFLIGHT.get_ptr(&skb)? };
    let _ = QDISC_INFLIGHT.remove(&skb);
    let now = unsafe { bpf_ktime_get_ns() };
    let ns = now.saturating_sub(rec.enqueued_ns);
    let ifindex = rec.ifindex;
    let h = lookup_or_copy(
        &QDISC_SOJOURN,
        &ifindex,
        &ZERO_NS_HIST,
        errors::SOJOURN_FULL,
    )?;
    // SAFETY: live map value; bucket_index bounds the offset.
    unsafe {
        atomic_add(
            (*h).buckets.as_mut_ptr().add(bucket_index(log2_bucket(ns))),
            1,
        );
        atomic_add(&mut (*h).count, 1);
        atomic_add(&mut (*h).sum_ns, ns);
    }
    Some(())
}
