//! The burst-event stream: records as the kernel's rings hand them over (any bytes: a newer
//! kernel side, a torn read), filed and folded as the drain does, named into events,
//! kept per peer, and the window statistics and training-iteration period computed from
//! them.
#![no_main]
use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use probe_ebpf::BurstEnd;
use probe_user::{
    collect::{burst_events, burst_records::BurstRecords},
    features::{
        bursts::{Burst, Bursts},
        period::PeriodFinder,
        schema::BURST_STATS,
    },
};

const WINDOW_S: f64 = 30.0;

/// A record from any bytes, as a ring slot's may be; None if too short.
fn parse(bytes: &[u8]) -> Option<BurstEnd> {
    if bytes.len() < std::mem::size_of::<BurstEnd>() {
        return None;
    }
    // SAFETY: long enough (checked above), and BurstEnd is Pod: any bytes are a valid value.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<BurstEnd>()) })
}

fuzz_target!(|data: &[u8]| {
    let records: Vec<BurstEnd> = data
        .chunks(std::mem::size_of::<BurstEnd>())
        .filter_map(parse)
        .collect();
    let ifnames = HashMap::from([(1, "eth0".to_owned()), (2, "ib0".to_owned())]);
    let events = burst_events::events(&BurstRecords::folded(&records), 0, &ifnames).to_events();
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
