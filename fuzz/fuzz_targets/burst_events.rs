//! The burst-event stream: records as the kernel's rings hand them over (any bytes: a newer
//! kernel side, a torn read), filed and folded as the drain does (by the slot's series hint,
//! which must file exactly as hashing each key does; past a small per-tick cap, only each
//! key's newest, in read order, every record counted), named into events,
//! kept per peer, and the window statistics and training-iteration period computed from
//! them.
#![no_main]
use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use probe_ebpf::{BurstEnd, BurstSlot};
use probe_user::{
    collect::{
        burst_events,
        burst_records::{BurstRecords, Limit},
    },
    features::{
        bursts::{Burst, Bursts},
        period::PeriodFinder,
        schema::BURST_STATS,
    },
};

const WINDOW_S: f64 = 30.0;

/// A ring slot from any bytes; None if too short.
fn parse(bytes: &[u8]) -> Option<BurstSlot> {
    if bytes.len() < std::mem::size_of::<BurstSlot>() {
        return None;
    }
    // SAFETY: long enough (checked above), and BurstSlot is Pod: any bytes are a valid value.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<BurstSlot>()) })
}

fuzz_target!(|data: &[u8]| {
    let slots: Vec<BurstSlot> = data
        .chunks(std::mem::size_of::<BurstSlot>())
        .filter_map(parse)
        .collect();
    let records: Vec<BurstEnd> = slots.iter().map(|s| s.end).collect();
    let by_key = BurstRecords::folded(&records);
    let mut by_slot = BurstRecords::default();
    for s in &slots {
        // The CPU from the slot's spare bytes: any, as a ring on a large host may be.
        by_slot.fold_slot(s._pad as usize, s, true);
    }
    assert_eq!(by_key.keys(), by_slot.keys());
    assert_eq!(by_key.rows(), by_slot.rows());
    assert!(by_key.folds().eq(by_slot.folds()));
    let mut limited = BurstRecords::limited(Limit { cap: 8, per_key: 3 });
    for s in &slots {
        limited.fold_slot(s._pad as usize, s, true);
    }
    limited.finish();
    assert!(limited.folds().eq(by_slot.folds()));
    let (all, kept) = (by_slot.rows(), limited.rows());
    assert_eq!(
        kept.len() as u64 + limited.thinned() + limited.lost(),
        all.len() as u64
    );
    assert_eq!(kept[..kept.len().min(8)], all[..kept.len().min(8)]);
    // The rest are some of the rest, in the order read.
    let mut rest = all.iter().skip(8);
    assert!(kept.iter().skip(8).all(|k| rest.any(|r| r == k)));

    let ifnames = HashMap::from([(1, "eth0".to_owned()), (2, "ib0".to_owned())]);
    let events = burst_events::events(&by_key, 0, &ifnames).to_events();
    assert!(events
        .windows(2)
        .all(|w| w[0].start_unix <= w[1].start_unix));

    let Some(first) = events.first() else {
        return;
    };
    // As the feature engine does: one ring per peer, here all in one, in arrival order.
    let mut bursts = Bursts::new(64, first.start_unix);
    let mut now = first.start_unix;
    for ev in &events {
        let end = ev.start_unix + ev.duration_s;
        bursts.add(Burst {
            start: ev.start_unix,
            end,
            bytes: ev.bytes as f64,
        });
        now = now.max(end);
    }
    let mut stats = vec![0.0; BURST_STATS.len()];
    bursts.window(now, WINDOW_S, &mut stats);
    let p = PeriodFinder::default().estimate(&bursts, now, WINDOW_S);
    assert!(
        p.seconds.is_nan() || (p.seconds > 0.0 && p.seconds <= WINDOW_S),
        "{p:?}"
    );
    assert!(p.confidence.is_nan() || p.confidence <= 1.0 + 1e-9, "{p:?}");
});
