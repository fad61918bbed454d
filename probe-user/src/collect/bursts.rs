//! Per-peer burst histograms (sizes and durations of ended bursts), folded here from the
//! BURST_EVENTS records the TC programs write when a burst ends. A burst the full ring had no
//! room for is folded by the program itself into PEER_BURSTS, which is read every tick and
//! added in, so the histograms stay exact while events are lost. (The programs used to
//! update PEER_BURSTS on every burst end: a second hash lookup and five atomic adds on lines
//! that every CPU sending to the peer writes. docs/benchmarks.md has the cost measured.)
use std::net::IpAddr;

use aya::maps::{HashMap, MapData};
use probe_ebpf::{log2_bucket, BurstEnd, BurstHist, BurstKey, LOG2_BUCKETS};
use rustc_hash::FxHashMap;

use super::{batch::MapReader, delta::DeltaTotals};
use crate::snapshot::{ip_from_abi, Histogram};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BurstSeriesKey {
    pub ifindex: u32,
    pub direction: u8,
    pub peer: IpAddr,
}

/// Totals of one series.
pub struct Bursts {
    pub count: u64,
    pub sizes: Histogram,
    pub durations: Histogram,
}

pub struct BurstCollector {
    map: HashMap<MapData, BurstKey, BurstHist>,
    reader: MapReader<BurstKey, BurstHist>,
    totals: DeltaTotals<BurstKey, BurstSeriesKey>,
}

/// Ring records summed per peer before they reach the series: one small-key lookup per
/// record (tens of thousands a tick at 10,000 flows) and one per peer at the tick. Filled
/// by the ring's drain (burst_events.rs), handed to `BurstCollector::tick`.
#[derive(Default)]
pub struct Folds(FxHashMap<BurstKey, BurstHist>);

impl Folds {
    /// Adds one ended burst, as streamed through the ring, to its peer's histograms.
    pub fn fold(&mut self, r: &BurstEnd) {
        let key = BurstKey {
            addr: r.addr,
            ifindex: r.ifindex,
            family: r.family,
            direction: r.direction,
            _pad: 0,
        };
        let h = self.0.entry(key).or_default();
        h.size_buckets[log2_bucket(r.bytes)] += 1;
        h.duration_buckets[log2_bucket(r.duration_ns)] += 1;
        h.count += 1;
        h.bytes += r.bytes;
        h.duration_ns += r.duration_ns;
    }
}

fn flatten(h: &BurstHist) -> Vec<u64> {
    let mut v = Vec::with_capacity(2 * LOG2_BUCKETS + 3);
    v.extend_from_slice(&h.size_buckets);
    v.extend_from_slice(&h.duration_buckets);
    v.extend([h.count, h.bytes, h.duration_ns]);
    v
}

fn series_of(k: &BurstKey) -> Option<BurstSeriesKey> {
    Some(BurstSeriesKey {
        ifindex: k.ifindex,
        direction: k.direction,
        peer: ip_from_abi(k.family, &k.addr)?,
    })
}

impl BurstCollector {
    pub fn new(
        map: HashMap<MapData, BurstKey, BurstHist>,
        reader: MapReader<BurstKey, BurstHist>,
    ) -> Self {
        Self {
            map,
            reader,
            totals: DeltaTotals::default(),
        }
    }

    /// Adds the ring's records of this tick (`folds`) and what the programs folded in
    /// PEER_BURSTS (the bursts the full ring refused), and returns every series' totals.
    pub fn tick(&mut self, folds: Folds) -> Vec<(BurstSeriesKey, Bursts)> {
        for (k, h) in folds.0 {
            let Some(series) = series_of(&k) else {
                continue;
            };
            self.totals.add_delta(series, &flatten(&h));
        }
        let map = &self.map;
        let totals = &mut self.totals;
        self.reader.for_each(
            || map.iter().filter_map(Result::ok).collect(),
            |k, v| {
                if let Some(series) = series_of(k) {
                    totals.add(*k, series, flatten(v));
                }
            },
        );
        self.totals.finish();
        let n = LOG2_BUCKETS;
        self.totals
            .totals()
            .iter()
            .map(|(k, t)| {
                (
                    *k,
                    Bursts {
                        count: t[2 * n],
                        sizes: Histogram::from_log2(&t[..n], t[2 * n + 1], 1.0),
                        durations: Histogram::from_log2(&t[n..2 * n], t[2 * n + 2], 1e-9),
                    },
                )
            })
            .collect()
    }

    /// Forgets an interface that went away, in the kernel map too: LRU would keep its
    /// entries until the map fills, and every tick reads the whole map.
    pub fn forget_interface(&mut self, ifindex: u32) {
        let gone: Vec<BurstKey> = self
            .totals
            .entries()
            .filter(|k| k.ifindex == ifindex)
            .copied()
            .collect();
        for k in gone {
            let _ = self.map.remove(&k);
        }
        self.totals.retain(|k| k.ifindex != ifindex);
    }
}
