//! The stages of a tick, in the order they run: collect (`collect`, async because it talks
//! to the kernel) reads every source, then
//!
//! observe -> features -> model -> job -> fold
//!
//! each take what they need from the tick's snapshot and put their product into it (the
//! adapters in `stages`); export reads the result. Adding a stage: a type with a method that
//! returns its product, one `impl Stage` in `stages.rs` and one line in [`Pipeline::new`].
pub mod collect;
mod stages;

use std::time::Instant;

use crate::{
    config::Config,
    features, fold, model, observe,
    snapshot::{Snapshot, StageTime},
};

/// One stage: reads the tick's snapshot and adds its product. Stages keep their own state
/// between ticks; none reaches back into an earlier one.
pub trait Stage: Send {
    fn name(&self) -> &'static str;
    fn run(&mut self, snap: &mut Snapshot);
}

pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
    /// Seconds each stage (collect included) has taken since the daemon started.
    totals: Vec<StageTime>,
}

impl Pipeline {
    /// `model`: where the serving spike model sits (SIGHUP replaces it); `job_model`: the
    /// job's early-warning models (`--job-model`), loaded and checked at start.
    pub fn new(
        cfg: &Config,
        model: model::score::Slot,
        job_model: Option<model::job::JobModel>,
    ) -> Self {
        Self {
            stages: vec![
                Box::new(observe::Observe::default()),
                Box::new(features::Features::new(cfg.features.clone())),
                Box::new(model::score::Model::new(model)),
                Box::new(model::job::Job::new(job_model)),
                Box::new(fold::Fold::new(cfg)),
            ],
            totals: Vec::new(),
        }
    }

    /// Runs every stage, recording how long each took in `snap.stages`, and the running
    /// totals in `snap.stage_totals` (a rate of those is a stage's average cost).
    pub fn run(&mut self, snap: &mut Snapshot) {
        for s in &mut self.stages {
            let t = Instant::now();
            s.run(snap);
            snap.stages.push(StageTime {
                stage: s.name(),
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        for st in &snap.stages {
            match self.totals.iter_mut().find(|t| t.stage == st.stage) {
                Some(t) => t.seconds += st.seconds,
                None => self.totals.push(st.clone()),
            }
        }
        snap.stage_totals = self.totals.clone();
    }
}
