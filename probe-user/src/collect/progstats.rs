//! probe's own cost and health as the kernel sees it: run time and run count of each
//! program (kept while BPF run-time statistics are on, see bpf::load), and inserts refused by
//! full maps.
use aya::{
    maps::{MapData, PerCpuArray},
    Ebpf,
};
use probe_ebpf::errors;

use super::readings::ProgramStats;

pub fn read(ebpf: &Ebpf) -> Vec<ProgramStats> {
    let mut out: Vec<ProgramStats> = ebpf
        .programs()
        .filter_map(|(name, p)| {
            // A program the kernel refused is not loaded and has no info.
            let info = p.info().ok()?;
            Some(ProgramStats {
                program: name.to_owned(),
                run_seconds: info.run_time().as_secs_f64(),
                runs: info.run_count(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.program.cmp(&b.program));
    out
}

/// (map name, refused inserts) for each map that can refuse one.
pub fn map_full(errors_map: &PerCpuArray<MapData, u64>) -> Vec<(&'static str, u64)> {
    errors::NAMES
        .iter()
        .enumerate()
        .map(|(slot, name)| {
            let n = errors_map
                .get(&(slot as u32), 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0);
            (*name, n)
        })
        .collect()
}
