//! The walks of FLOWS and CONNS, selected in the kernel: two programs the daemon runs on
//! demand (BPF_PROG_TEST_RUN; they attach nowhere) that visit every entry with
//! bpf_for_each_map_elem and write only what the daemon keeps into an mmapable array it
//! reads in place. Copying every entry to user space with batch lookups was ~380 ns an
//! entry, and the daemon kept a few dozen of 20,000.
//!
//! Map-element iterators (`iter/bpf_map_elem`) would do the same through a seq_file, but
//! kernels may refuse them (this project's VMs answer EPERM for every iterator over map
//! elements while loading task and tcp iterators), and a raw tracepoint program needs no
//! attach point and no kernel BTF at load.
//!
//! A record is written before its entry is deleted, and nothing is deleted once the array is
//! full: an entry is never removed without its last reading reaching the daemon.
use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::bpf_for_each_map_elem, macros::raw_tracepoint,
    programs::RawTracePointContext, EbpfContext as _,
};
use probe_ebpf::{pick, walk_bucket, ConnKey, ConnStats, FlowKey, FlowStats, TCP_CLOSE, WALK_HIST};

use crate::maps::{CONNS, CONN_PICKS, CONN_WALK, FLOWS, FLOW_PICKS, FLOW_WALK};

/// walk_bucket, masked where the verifier can see it: LLVM knows the bucket is in range and
/// drops a mask, but the verifier's bounds of the expanded leading-zeros count are looser,
/// so a volatile read hides the value from LLVM.
#[inline(always)]
fn moved_bucket(moved: u64) -> usize {
    let mut hidden = walk_bucket(moved);
    // SAFETY: a read of a local.
    let b = unsafe { core::ptr::read_volatile(&mut hidden) };
    b & (WALK_HIST - 1)
}

/// Copies a `T` a u32 at a time. A plain assignment of a record this size becomes a call
/// to the object's memmove, which copies a byte at a time: a third of a walk's cost.
///
/// # Safety
/// Both pointers are valid for a `T` and 4-byte aligned (every map key and value is).
#[inline(always)]
unsafe fn copy<T: Copy>(dst: *mut T, src: *const T) {
    let (d, s) = (dst as *mut u32, src as *const u32);
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 4 {
        // SAFETY: within both values (the caller's promise); volatile, so LLVM does not
        // turn the loop back into a memmove.
        unsafe { core::ptr::write_volatile(d.add(i), core::ptr::read_volatile(s.add(i))) };
        i += 1;
    }
}

extern "C" fn flow_pick(
    _map: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    _ctx: *mut c_void,
) -> u64 {
    // SAFETY: the kernel passes FLOWS' key and value; FLOW_WALK's one value is this walk's
    // (the daemon runs one walk at a time). Too large for the stack, hence the map.
    unsafe {
        let Some(w) = FLOW_WALK.get_ptr_mut(0) else {
            return 1;
        };
        let w = &mut *w;
        let k = &*(key as *const FlowKey);
        let v = &*(value as *const FlowStats);
        w.visited += 1;
        // Marked in this epoch: it moved since the last walk; else it did not (flows.rs).
        let moved = if v.mark_epoch == w.epoch {
            v.bytes.saturating_sub(v.mark_bytes)
        } else {
            0
        };
        let mut kind = 0;
        if moved > 0 {
            w.hist[moved_bucket(moved)] += 1;
            if moved > w.min_moved {
                kind |= pick::TOP;
            }
        }
        if w.now_ns.saturating_sub(v.last_seen_ns) > w.idle_timeout_ns {
            kind |= pick::IDLE;
        }
        if kind == 0 {
            return 0;
        }
        let Some(rec) = FLOW_PICKS.get_ptr_mut(w.written) else {
            w.full = 1;
            return 0;
        };
        (*rec).kind = kind;
        copy(&raw mut (*rec).key, k);
        copy(&raw mut (*rec).stats, v);
        w.written += 1;
        if kind & pick::IDLE != 0 {
            let _ = FLOWS.remove(k);
        }
    }
    0
}

/// Args (the test run's context): now_ns, idle_timeout_ns, min_moved, epoch. Writes the
/// picked flows to FLOW_PICKS and the walk's summary to FLOW_WALK.
#[raw_tracepoint]
pub fn select_flows(ctx: RawTracePointContext) -> i32 {
    let args = ctx.as_ptr() as *const u64;
    let Some(w) = FLOW_WALK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: the run's context holds four u64s (the kernel checks its size against the
    // reads); w is FLOW_WALK's value, which the daemon zeroed before the run (its histogram
    // is too large to zero here).
    unsafe {
        let w = &mut *w;
        w.now_ns = *args;
        w.idle_timeout_ns = *args.add(1);
        w.min_moved = *args.add(2);
        w.epoch = *args.add(3) as u32;
        bpf_for_each_map_elem(
            &FLOWS as *const _ as *mut c_void,
            flow_pick as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
    0
}

extern "C" fn conn_pick(
    _map: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    _ctx: *mut c_void,
) -> u64 {
    // SAFETY: the kernel passes CONNS' key and value; CONN_WALK's value is this walk's.
    unsafe {
        let Some(w) = CONN_WALK.get_ptr_mut(0) else {
            return 1;
        };
        let w = &mut *w;
        let k = &*(key as *const ConnKey);
        let c = &*(value as *const ConnStats);
        // As the batch walk (conns.rs): closed connections and those below the floor are
        // stale: written as GONE (key only), then deleted.
        let kind = if c.state == TCP_CLOSE || c.srtt_us < w.floor {
            pick::GONE
        } else {
            pick::SLOW
        };
        let Some(rec) = CONN_PICKS.get_ptr_mut(w.written) else {
            w.full = 1;
            return 0;
        };
        (*rec).kind = kind;
        copy(&raw mut (*rec).key, k);
        if kind == pick::SLOW {
            copy(&raw mut (*rec).stats, c);
        }
        w.written += 1;
        if kind == pick::GONE {
            let _ = CONNS.remove(k);
        }
    }
    0
}

/// Args: floor (us). Writes the connections at or above the floor (SLOW) and the stale
/// ones it deleted (GONE) to CONN_PICKS, and the walk's summary to CONN_WALK.
#[raw_tracepoint]
pub fn select_conns(ctx: RawTracePointContext) -> i32 {
    let args = ctx.as_ptr() as *const u64;
    let Some(w) = CONN_WALK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: the run's context holds one u64; w is CONN_WALK's value.
    unsafe {
        let w = &mut *w;
        w.floor = *args as u32;
        w.written = 0;
        w.full = 0;
        bpf_for_each_map_elem(
            &CONNS as *const _ as *mut c_void,
            conn_pick as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
    0
}
