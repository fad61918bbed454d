//! Each stage's place in the tick: what it takes from the snapshot and where its product
//! goes. The stages themselves know nothing of the snapshot.
use super::Stage;
use crate::{
    features::Features,
    fold::Fold,
    model::{job::Job, score::Model},
    observe::Observe,
    snapshot::Snapshot,
};

impl Stage for Observe {
    fn name(&self) -> &'static str {
        "observe"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        snap.observations = self.observe(&mut snap.readings);
    }
}

impl Stage for Features {
    fn name(&self) -> &'static str {
        "features"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        let r = &snap.readings;
        if let Some(out) = self.tick(r.time_unix, &snap.observations, &r.burst_events) {
            snap.features = out.rows;
            snap.features_untracked = out.untracked;
            snap.features_entities = out.entities;
            snap.features_state_bytes = out.state_bytes;
        }
    }
}

impl Stage for Model {
    fn name(&self) -> &'static str {
        "model"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        if let Some(s) = self.score(&snap.features) {
            snap.forecasts = s.forecasts;
            snap.model = Some(s.model);
            snap.model_entities = s.entities;
            snap.model_seconds = s.seconds;
        }
    }
}

impl Stage for Job {
    fn name(&self) -> &'static str {
        "job"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        let r = &snap.readings;
        snap.job = self.tick(r.time_unix, &snap.observations, &r.burst_events);
    }
}

impl Stage for Fold {
    fn name(&self) -> &'static str {
        "fold"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        self.fold(&mut snap.readings, &mut snap.observations);
    }
}
