//! Per-peer burst histograms (sizes and durations of ended bursts), written by the TC
//! programs when a burst ends.
use std::net::IpAddr;

use aya::maps::{HashMap, MapData};
use probe_ebpf::{BurstHist, BurstKey, LOG2_BUCKETS};

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

fn flatten(h: &BurstHist) -> Vec<u64> {
    let mut v = Vec::with_capacity(2 * LOG2_BUCKETS + 3);
    v.extend_from_slice(&h.size_buckets);
    v.extend_from_slice(&h.duration_buckets);
    v.extend([h.count, h.bytes, h.duration_ns]);
    v
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

    pub fn tick(&mut self) -> Vec<(BurstSeriesKey, Bursts)> {
        let map = &self.map;
        let entries = self
            .reader
            .read(|| map.iter().filter_map(Result::ok).collect());
        for &(k, v) in entries {
            let Some(peer) = ip_from_abi(k.family, &k.addr) else {
                continue;
            };
            let series = BurstSeriesKey {
                ifindex: k.ifindex,
                direction: k.direction,
                peer,
            };
            self.totals.add(k, series, flatten(&v));
        }
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
