//! The stages of a tick, in the order they run over one per-tick snapshot, after the collect
//! stage (`collect::assemble`, async because it talks to the kernel) has produced it:
//!
//! observe -> features -> fold
//!
//! Export reads the result. Adding a stage: a module with one `impl Stage` and one line in
//! [`Pipeline::new`].
use std::time::Instant;

use crate::{config::Config, fold, observe, snapshot::Snapshot, snapshot::StageTime};

/// One stage: reads and extends the tick's snapshot. Stages keep their own state between
/// ticks; none reaches back into an earlier one.
pub trait Stage: Send {
    fn name(&self) -> &'static str;
    fn run(&mut self, snap: &mut Snapshot);
}

pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
}

impl Pipeline {
    pub fn new(cfg: &Config) -> Self {
        Self {
            stages: vec![
                Box::new(observe::Observe::default()),
                Box::new(fold::Fold::new(cfg)),
            ],
        }
    }

    /// Runs every stage, recording how long each took in `snap.stages`.
    pub fn run(&mut self, snap: &mut Snapshot) {
        for s in &mut self.stages {
            let t = Instant::now();
            s.run(snap);
            snap.stages.push(StageTime {
                stage: s.name(),
                seconds: t.elapsed().as_secs_f64(),
            });
        }
    }
}
