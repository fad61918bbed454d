//! sock_ops on the cgroup v2 root: turns on RTT, retransmit and state callbacks for every
//! TCP connection established after attach, and keeps per-connection and per-peer state.
use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_RETRANS_CB, BPF_SOCK_OPS_RETRANS_CB_FLAG, BPF_SOCK_OPS_RTT_CB,
        BPF_SOCK_OPS_RTT_CB_FLAG, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
    },
    macros::sock_ops,
    programs::SockOpsContext,
};
use probe_ebpf::{errors, log2_bucket, ConnKey, ConnStats, PeerKey, AF_INET, AF_INET6};

use crate::maps::{
    atomic_add, bucket_index, lookup_or_copy, lookup_or_init, zeroed, CONNS, PEER_TCP, ZERO_PEER,
};

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

#[inline(always)]
fn keys(ctx: &SockOpsContext) -> Option<(ConnKey, PeerKey)> {
    let o = ctx.ops;
    let family = ctx.family();
    let mut c: ConnKey = zeroed();
    let mut p: PeerKey = zeroed();
    // Addresses are in network byte order already; keep the bytes as they are.
    if family == AF_INET as u32 {
        c.family = AF_INET;
        let l = ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip4) });
        let r = ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip4) });
        c.laddr[0] = l;
        c.raddr[0] = r;
    } else if family == AF_INET6 as u32 {
        c.family = AF_INET6;
        let l = [
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[0]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[1]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[2]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).local_ip6[3]) }),
        ];
        let r = [
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[0]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[1]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[2]) }),
            ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_ip6[3]) }),
        ];
        c.laddr = l;
        c.raddr = r;
    } else {
        return None;
    }
    // local_port is host order; remote_port holds the network-order port in its upper half.
    c.lport = ctx_u32(unsafe { core::ptr::addr_of!((*o).local_port) }) as u16;
    let rport = ctx_u32(unsafe { core::ptr::addr_of!((*o).remote_port) });
    c.rport = u16::from_be((rport >> 16) as u16);
    p.family = c.family;
    p.addr = c.raddr;
    Some((c, p))
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
            let (c, _) = keys(ctx)?;
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
            // Between rounds, tp_tcp_probe keeps srtt fresh.
            let (c, p) = keys(ctx)?;
            let mrtt = ctx.arg(0) as u64;
            let srtt = ctx.arg(1) >> 3;
            if let Some(v) = lookup_or_init(&CONNS, &c, ConnStats::default, errors::CONNS_FULL) {
                refresh(ctx, v);
                // SAFETY: live map value.
                unsafe {
                    (*v).srtt_us = srtt;
                    (*v).last_rtt_us = mrtt as u32;
                    (*v).rtt_samples += 1;
                }
            }
            let t = lookup_or_copy(&PEER_TCP, &p, &ZERO_PEER, errors::PEERS_FULL)?;
            // SAFETY: live map value; the bucket index is clamped by log2_bucket.
            unsafe {
                let b = bucket_index(log2_bucket(mrtt));
                // No bounds-check panic path: bucket_index bounds b to 0..32.
                atomic_add((*t).rtt_buckets.as_mut_ptr().add(b), 1);
                atomic_add(&mut (*t).rtt_count, 1);
                atomic_add(&mut (*t).rtt_sum_us, mrtt);
            }
        }
        BPF_SOCK_OPS_RETRANS_CB => {
            let (c, p) = keys(ctx)?;
            // args[1] is the number of segments retransmitted, as TcpRetransSegs counts them.
            let segs = ctx.arg(1) as u64;
            if let Some(v) = CONNS.get_ptr_mut(&c) {
                refresh(ctx, v);
            }
            let t = lookup_or_copy(&PEER_TCP, &p, &ZERO_PEER, errors::PEERS_FULL)?;
            unsafe { atomic_add(&mut (*t).retrans_segs, segs) };
        }
        BPF_SOCK_OPS_STATE_CB => {
            let (c, _) = keys(ctx)?;
            // args[1] is the new state. User space removes closed entries after reading them.
            let new_state = ctx.arg(1);
            if let Some(v) = CONNS.get_ptr_mut(&c) {
                refresh(ctx, v);
                unsafe { (*v).state = new_state };
            }
        }
        _ => {}
    }
    Some(())
}

/// Copies the socket's current TCP state into its map entry.
#[inline(always)]
fn refresh(ctx: &SockOpsContext, v: *mut ConnStats) {
    // SAFETY: ctx.ops is the kernel's context; v is a live map value.
    unsafe {
        use core::ptr::{addr_of, read_volatile};
        let o = ctx.ops;
        let s = &mut *v;
        // The kernel keeps srtt scaled by 8.
        s.srtt_us = ctx_u32(addr_of!((*o).srtt_us)) >> 3;
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
