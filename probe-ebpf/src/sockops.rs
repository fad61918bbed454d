//! sock_ops on the cgroup v2 root: turns on RTT, retransmit and state callbacks for every
//! TCP connection established after attach, and keeps per-connection and per-peer state.
use aya_ebpf::{
    bindings::{
        BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_RETRANS_CB, BPF_SOCK_OPS_RETRANS_CB_FLAG,
        BPF_SOCK_OPS_RTT_CB, BPF_SOCK_OPS_RTT_CB_FLAG, BPF_SOCK_OPS_STATE_CB,
        BPF_SOCK_OPS_STATE_CB_FLAG,
    },
    helpers::generated::bpf_sk_storage_get,
    macros::sock_ops,
    programs::SockOpsContext,
};
use probe_ebpf::{
    errors, log2_bucket, ConnKey, ConnStats, PeerKey, PeerTcp, AF_INET, AF_INET6,
    PEER_SLOTS_PER_CPU, PEER_SLOT_PROBES, TCP_CLOSE,
};

use crate::maps::{
    addr_hash, bucket_index, lookup_or_copy, lookup_or_init, zeroed, CONNS, CONN_FLOOR, PEER_SLOTS,
    PEER_TCP, SOCK_COUNTED, TCP_EPOCH, ZERO_PEER,
};

/// PEER_SLOTS' size minus one. Patched by the loader when it resizes the table.
#[unsafe(no_mangle)]
static PEER_SLOTS_MASK: u32 = PEER_SLOTS_PER_CPU - 1;

#[sock_ops]
pub fn sockops_tcp(ctx: SockOpsContext) -> u32 {
    let _ = handle(&ctx);
    1
}

/// Reads one u32 of the context. Volatile so that every field is its own `ctx + constant`
/// load: the verifier rejects loads through a ctx pointer the compiler has offset and
/// spilled, which is what a plain copy of the address arrays turns into.
#[inline(always)]
fn ctx_u32(p: *const u32) -> u32 {
    // SAFETY: p points at a field of the kernel's bpf_sock_ops context.
    unsafe { core::ptr::read_volatile(p) }
}

/// The peer's key: the family and the remote address, all a round trip below the
/// slow-connection floor needs.
#[inline(always)]
fn peer_key(ctx: &SockOpsContext) -> Option<PeerKey> {
    let o = ctx.ops;
    let family = ctx.family();
    let mut p: PeerKey = zeroed();
    // Addresses are in network byte order already; keep the bytes as they are.
    if family == AF_INET as u32 {
        p.family = AF_INET;
        p.addr[0] = ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip4) });
    } else if family == AF_INET6 as u32 {
        p.family = AF_INET6;
        p.addr = [
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[0]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[1]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[2]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[3]) }),
        ];
    } else {
        return None;
    }
    Some(p)
}

/// The connection's key: the peer's, plus the local address and both ports.
#[inline(always)]
fn conn_key(ctx: &SockOpsContext, p: &PeerKey) -> ConnKey {
    let o = ctx.ops;
    let mut c: ConnKey = zeroed();
    c.family = p.family;
    c.raddr = p.addr;
    if p.family == AF_INET {
        c.laddr[0] = ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip4) });
    } else {
        c.laddr = [
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[0]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[1]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[2]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[3]) }),
        ];
    }
    // local_port is host order; remote_port holds the network-order port in its upper half.
    c.lport = ctx_u32(unsafe { core::ptr::addr_of!((*o).local_port) }) as u16;
    let rport = ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_port) });
    c.rport = u16::from_be((rport >> 16) as u16);
    c
}

#[inline(always)]
fn keys(ctx: &SockOpsContext) -> Option<(ConnKey, PeerKey)> {
    let p = peer_key(ctx)?;
    Some((conn_key(ctx, &p), p))
}

/// The socket's smoothed RTT (us) as the context holds it (before a round trip's sample).
#[inline(always)]
fn ctx_srtt(ctx: &SockOpsContext) -> u32 {
    // The kernel keeps srtt scaled by 8.
    ctx_u32(unsafe { core::ptr::addr_of!((*ctx.ops).srtt_us) }) >> 3
}

#[inline(always)]
fn handle(ctx: &SockOpsContext) -> Option<()> {
    let op = ctx.op();
    match op {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB | BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => {
            let flags = BPF_SOCK_OPS_RTT_CB_FLAG
                | BPF_SOCK_OPS_RETRANS_CB_FLAG
                | BPF_SOCK_OPS_STATE_CB_FLAG;
            let _ = ctx.set_cb_flags((ctx.cb_flags() | flags) as i32);
            let (c, p) = keys(ctx)?;
            // Counted once per socket, and only if its close can be matched to this count.
            if let Some(mark) = counted_mark(ctx, BPF_SK_STORAGE_GET_F_CREATE as u64) {
                // SAFETY: live socket storage and per-CPU map value.
                unsafe {
                    if *mark == 0 {
                        *mark = 1;
                        if let Some(t) = peer(&p) {
                            (*t).opened += 1;
                        }
                    }
                }
            }
            if ctx_srtt(ctx) < floor() {
                return Some(());
            }
            let Some(v) = lookup_or_init(&CONNS, &c, ConnStats::default, errors::CONNS_FULL) else {
                aya_log_ebpf::warn!(
                    ctx,
                    "CONNS map full: a connection is not tracked (raise maps.conns)"
                );
                return None;
            };
            refresh(ctx, v);
        }
        BPF_SOCK_OPS_RTT_CB => {
            // The kernel calls this once per round trip (when an ACK passes the sequence
            // that started the round), not per ACK. args[0] is that ACK's RTT sample, args[1]
            // the updated smoothed RTT (scaled by 8); the context still holds the old one.
            let p = peer_key(ctx)?;
            let mrtt = ctx.arg(0) as u64;
            let srtt = ctx.arg(1) >> 3;
            // Per-connection state only at or above the floor, and on the way down through
            // it, so that an entry below it is never fresher-looking than it is: user space
            // deletes those at its next walk.
            if srtt.max(ctx_srtt(ctx)) >= floor() {
                let c = conn_key(ctx, &p);
                if let Some(v) = lookup_or_init(&CONNS, &c, ConnStats::default, errors::CONNS_FULL)
                {
                    refresh(ctx, v);
                    // SAFETY: live map value.
                    unsafe { (*v).srtt_us = srtt };
                }
            }
            let min_rtt = ctx_u32(unsafe { core::ptr::addr_of!((*ctx.ops).rtt_min) });
            let t = peer(&p)?;
            // SAFETY: this CPU's value of a live map entry; the bucket index is clamped by
            // log2_bucket and bucket_index.
            unsafe {
                let b = bucket_index(log2_bucket(mrtt));
                *(*t).rtt_buckets.as_mut_ptr().add(b) += 1;
                (*t).rtt_count += 1;
                (*t).rtt_sum_us += mrtt;
                let epoch = epoch();
                let w = &mut (*t).windows[(epoch & 1) as usize];
                if w.epoch != epoch {
                    w.epoch = epoch;
                    w.samples = 0;
                    w.srtt_us = 0;
                    w.min_rtt_us = min_rtt;
                }
                w.samples += 1;
                w.srtt_us = w.srtt_us.max(srtt);
                w.min_rtt_us = w.min_rtt_us.min(min_rtt);
            }
        }
        BPF_SOCK_OPS_RETRANS_CB => {
            let (c, p) = keys(ctx)?;
            // args[1] is the number of segments retransmitted, as TcpRetransSegs counts them.
            let segs = ctx.arg(1) as u64;
            if let Some(v) = CONNS.get_ptr_mut(&c) {
                refresh(ctx, v);
            }
            let t = peer(&p)?;
            unsafe { (*t).retrans_segs += segs };
        }
        BPF_SOCK_OPS_STATE_CB => {
            let (c, p) = keys(ctx)?;
            // args[1] is the new state. User space removes closed entries after reading them.
            let new_state = ctx.arg(1);
            if let Some(v) = CONNS.get_ptr_mut(&c) {
                refresh(ctx, v);
                unsafe { (*v).state = new_state };
            }
            if new_state == TCP_CLOSE {
                if let Some(mark) = counted_mark(ctx, 0) {
                    // SAFETY: live socket storage and per-CPU map value.
                    unsafe {
                        if *mark == 1 {
                            *mark = 0;
                            if let Some(t) = peer(&p) {
                                (*t).closed += 1;
                            }
                        }
                    }
                }
            }
        }
        _ => {}
    }
    Some(())
}

/// This CPU's counters of the peer: its PEER_SLOTS slot, taken if one of the probed slots
/// is free, else its PEER_TCP entry, inserted if absent.
#[inline(always)]
fn peer(p: &PeerKey) -> Option<*mut PeerTcp> {
    let h = addr_hash(&p.addr, p.family as u64);
    let mask = unsafe { core::ptr::read_volatile(&PEER_SLOTS_MASK) };
    let mut i = 0u32;
    while i < PEER_SLOT_PROBES {
        let Some(s) = PEER_SLOTS.get_ptr_mut(h.wrapping_add(i) & mask) else {
            break;
        };
        // SAFETY: this CPU's slot of a live per-CPU value: no other writer during this run.
        unsafe {
            if (*s).key.family == 0 {
                (*s).key = *p;
            }
            if (*s).key.family == p.family && (*s).key.addr == p.addr {
                return Some(core::ptr::addr_of_mut!((*s).tcp));
            }
        }
        i += 1;
    }
    lookup_or_copy(&PEER_TCP, p, &ZERO_PEER, errors::PEERS_FULL)
}

/// The slow-connection floor user space last wrote (0 before its first walk).
#[inline(always)]
fn floor() -> u32 {
    CONN_FLOOR.get(0).copied().unwrap_or(0)
}

/// The tick epoch user space last wrote (0 before its first tick).
#[inline(always)]
fn epoch() -> u32 {
    TCP_EPOCH.get(0).copied().unwrap_or(0)
}

/// The socket's SOCK_COUNTED mark (1: its ESTABLISHED was counted and its close not yet),
/// created if `flags` says so.
#[inline(always)]
fn counted_mark(ctx: &SockOpsContext, flags: u64) -> Option<*mut u32> {
    // SAFETY: ctx.ops is the kernel's context; sk may be null, checked before use.
    let sk =
        unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*ctx.ops).__bindgen_anon_2.sk)) };
    if sk.is_null() {
        return None;
    }
    let map = core::ptr::from_ref(&SOCK_COUNTED).cast_mut().cast();
    // SAFETY: a full socket from the context and the storage map's own definition.
    let v = unsafe { bpf_sk_storage_get(map, sk.cast(), core::ptr::null_mut(), flags) };
    (!v.is_null()).then_some(v.cast::<u32>())
}

/// Copies the socket's current TCP state into its map entry.
#[inline(always)]
fn refresh(ctx: &SockOpsContext, v: *mut ConnStats) {
    // SAFETY: ctx.ops is the kernel's context; v is a live map value.
    unsafe {
        use core::ptr::{addr_of, read_volatile};
        let o = ctx.ops;
        let s = &mut *v;
        s.srtt_us = ctx_srtt(ctx);
        s.min_rtt_us = ctx_u32(addr_of!((*o).rtt_min));
        s.snd_cwnd = ctx_u32(addr_of!((*o).snd_cwnd));
        s.packets_out = ctx_u32(addr_of!((*o).packets_out));
        s.retrans_out = ctx_u32(addr_of!((*o).retrans_out));
        s.total_retrans = ctx_u32(addr_of!((*o).total_retrans));
        s.state = ctx_u32(addr_of!((*o).state));
        s.bytes_acked = read_volatile(addr_of!((*o).bytes_acked));
        s.bytes_received = read_volatile(addr_of!((*o).bytes_received));
    }
}
