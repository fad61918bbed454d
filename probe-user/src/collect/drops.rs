//! Dropped packets by the kernel's drop reason (skb:kfree_skb), named as the kernel names
//! them in the tracepoint's print format.
use std::collections::HashMap as StdHashMap;

use aya::maps::{MapData, PerCpuHashMap};

pub struct DropCollector {
    map: PerCpuHashMap<MapData, u32, u64>,
    names: StdHashMap<u32, String>,
}

impl DropCollector {
    pub fn new(map: PerCpuHashMap<MapData, u32, u64>, names: StdHashMap<u32, String>) -> Self {
        Self { map, names }
    }

    /// (reason name, packets) for every reason seen since start. The map is never evicted
    /// (one entry per reason), so its sums are already monotonic.
    pub fn tick(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .map
            .iter()
            .filter_map(Result::ok)
            .map(|(reason, per_cpu)| (self.name(reason), per_cpu.iter().sum()))
            .collect();
        out.sort();
        out
    }

    fn name(&self, reason: u32) -> String {
        match self.names.get(&reason) {
            Some(n) => n.clone(),
            // Subsystem reasons (upper 16 bits) and values newer than the table.
            None => format!("REASON_{reason}"),
        }
    }
}
