//! Interface lifecycle: each tick, attach to monitored interfaces that appeared (or matched
//! the include patterns only now) and detach from those that went away.
use std::collections::HashSet;

use aya::Ebpf;

use crate::{
    bpf::TcAttacher,
    collect::Collector,
    config::Config,
    host::iface::{self, Iface},
};

/// Remembers interfaces that could not be attached, so a broken one is reported once per
/// appearance instead of every tick.
#[derive(Default)]
pub struct Lifecycle {
    failed: HashSet<(u32, String)>,
}

impl Lifecycle {
    /// Returns the names of the interfaces that went away (later stages forget them).
    pub fn reconcile(
        &mut self,
        cfg: &Config,
        all: &[Iface],
        ebpf: &mut Ebpf,
        tc: &mut TcAttacher,
        collector: &mut Collector,
    ) -> Vec<String> {
        let present: HashSet<u32> = all.iter().map(|i| i.index).collect();
        let gone: Vec<Iface> = tc
            .attached()
            .filter(|i| !present.contains(&i.index))
            .cloned()
            .collect();
        let mut removed = Vec::with_capacity(gone.len());
        for i in gone {
            tracing::info!("interface {} went away", i.name);
            tc.detach(ebpf, i.index, true);
            collector.forget_interface(i.index);
            removed.push(i.name);
        }
        self.failed.retain(|(idx, _)| present.contains(idx));
        for i in all
            .iter()
            .filter(|i| i.l2.is_some() && iface::wanted(cfg, i))
        {
            if tc.is_attached(i.index) || self.failed.contains(&(i.index, i.name.clone())) {
                continue;
            }
            if let Err(e) = tc.attach(ebpf, i) {
                tracing::warn!("cannot monitor {}: {e:#}", i.name);
                self.failed.insert((i.index, i.name.clone()));
            }
        }
        removed
    }
}
