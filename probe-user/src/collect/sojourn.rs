//! Qdisc sojourn time per interface, from the qdisc enqueue/dequeue tracepoints.
use aya::maps::{HashMap, MapData};
use probe_ebpf::NsHist;

use super::delta::DeltaTotals;
use super::readings::Histogram;

pub struct SojournCollector {
    map: HashMap<MapData, u32, NsHist>,
    totals: DeltaTotals<u32, u32>,
}

impl SojournCollector {
    pub fn new(map: HashMap<MapData, u32, NsHist>) -> Self {
        Self {
            map,
            totals: DeltaTotals::default(),
        }
    }

    /// (ifindex, histogram in seconds).
    pub fn tick(&mut self) -> Vec<(u32, Histogram)> {
        for (ifindex, h) in self.map.iter().filter_map(Result::ok) {
            let mut v = h.buckets.to_vec();
            v.extend([h.count, h.sum_ns]);
            self.totals.add(ifindex, ifindex, v);
        }
        self.totals.finish();
        let n = probe_ebpf::LOG2_BUCKETS;
        self.totals
            .totals()
            .iter()
            .map(|(i, t)| (*i, Histogram::from_log2(&t[..n], t[n + 1], 1e-9)))
            .collect()
    }

    /// Drops an interface's histogram, in the kernel and here.
    pub fn forget_interface(&mut self, ifindex: u32) {
        let _ = self.map.remove(&ifindex);
        self.totals.retain(|i| *i != ifindex);
    }
}
