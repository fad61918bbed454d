//! Per-peer burst histograms (sizes and durations of ended bursts), folded here from the
//! BURST_EVENTS records the TC programs write when a burst ends. A burst the full ring had no
//! room for is folded by the program itself into PEER_BURSTS, which is read every tick and
//! added in, so the histograms stay exact while events are lost. (The programs used to
//! update PEER_BURSTS on every burst end: a second hash lookup and five atomic adds on lines
//! that every CPU sending to the peer writes. docs/benchmarks-history.md has the cost measured.)
use std::net::IpAddr;

use aya::maps::{HashMap, MapData};
use probe_ebpf::{BurstHist, BurstKey, LOG2_BUCKETS};

use super::readings::{ip_from_abi, Histogram};
use super::{batch::MapReader, burst_records::BurstRecords, delta::DeltaTotals};

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

    /// Adds the ring's records of this tick (their per-peer folds) and what the programs
    /// folded in PEER_BURSTS (the bursts the full ring refused), and returns every series'
    /// totals.
    pub fn tick(&mut self, records: &BurstRecords) -> Vec<(BurstSeriesKey, Bursts)> {
        for (k, h) in records.folds() {
            let Some(series) = series_of(k) else {
                continue;
            };
            self.totals.add_delta(series, &flatten(h));
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
