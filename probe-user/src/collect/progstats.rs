//! The kernel's own accounting of probe's programs: cumulative run time and run count, kept
//! while BPF run-time statistics are enabled (see bpf::load).
use aya::Ebpf;

use crate::snapshot::ProgramStats;

pub fn read(ebpf: &Ebpf) -> Vec<ProgramStats> {
    let mut out: Vec<ProgramStats> = ebpf
        .programs()
        .filter_map(|(name, p)| {
            // Programs that were never loaded (none today) have no info.
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
