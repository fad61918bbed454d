//! Tracepoints. `tcp:tcp_retransmit_skb` sees retransmits of every socket, including those
//! opened before probe started or in cgroups sock_ops does not cover.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use probe_ebpf::{ConnKey, PeerKey, AF_INET, AF_INET6};

use crate::maps::{atomic_add, peer_tcp, CONNS};

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
    let mut c = ConnKey::default();
    if family == AF_INET as u16 {
        c.family = AF_INET;
        let s: [u8; 4] = unsafe { ctx.read_at(off(&RETX_OFF_SADDR)) }.ok()?;
        let d: [u8; 4] = unsafe { ctx.read_at(off(&RETX_OFF_DADDR)) }.ok()?;
        c.laddr[..4].copy_from_slice(&s);
        c.raddr[..4].copy_from_slice(&d);
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

    let p = PeerKey {
        addr: c.raddr,
        family: c.family,
        _pad: [0; 3],
    };
    let t = peer_tcp(&p)?;
    unsafe { atomic_add(&mut (*t).retrans_events, 1) };
    // Sockets sock_ops tracks report exact segment counts through RETRANS_CB; count the
    // others here, one segment per event.
    if CONNS.get_ptr(&c).is_none() {
        unsafe { atomic_add(&mut (*t).retrans_segs, 1) };
    }
    Some(())
}
