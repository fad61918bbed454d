//! `probe train`: LightGBM models from `probe features` tables, one per (entity kind,
//! target, horizon), into a model directory `probe run --model` loads (docs/model.md).
//!
//! Splits are by recording in time order (never shuffled across time): the earliest
//! recordings train, the next validate (early stopping, thresholds, baseline thresholds),
//! the last test (the figures in the manifest, and the check that the Rust evaluator
//! scores exactly as LightGBM). A single recording is split by time instead.
#[cfg(feature = "train")]
mod bag;
#[cfg(feature = "train")]
mod crossfit;
#[cfg(feature = "train")]
mod fit;
#[cfg(feature = "train")]
mod job;
pub mod split;

use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Tables written by `probe features`.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,

    /// The model directory to write.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: PathBuf,

    /// Name of the model (`probe_model_info{model}`).
    #[arg(long, default_value = "probe-spike")]
    pub name: String,

    /// What the data is, in one line (`probe_model_info{trained_on}`); default: the files.
    #[arg(long, value_name = "TEXT")]
    pub trained_on: Option<String>,

    /// Boosting rounds of the spike classifiers (all of them: no early stopping). With
    /// --leaves, this bounds a model file to ~1 KB per round.
    #[arg(long, default_value_t = 30)]
    pub rounds: u32,

    /// Spike classifiers: boosters fitted with seeds 1..=N and averaged into one model (N x
    /// --rounds trees to score). One by default: on the corpus, five moved held-out PR-AUC
    /// by less than its interval (docs/model.md) and cost the daemon 3.4x the scoring time.
    #[arg(long, default_value_t = 1)]
    pub seeds: u32,

    /// Boosting rounds of the forecasts at most (early stopping on validation).
    #[arg(long, default_value_t = 25)]
    pub forecast_rounds: u32,

    /// Leaves per tree.
    #[arg(long, default_value_t = 7)]
    pub leaves: u32,

    /// Share of the recordings (or of the time of a single one) for validation and for test.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.15)]
    pub holdout: f64,

    /// Train on the features whose names contain one of these (comma-separated), e.g.
    /// `_rel,_z` for scale-free inputs only; default: every feature of the entity's kind.
    #[arg(long, value_name = "PARTS", value_delimiter = ',')]
    pub only: Vec<String>,

    /// Write every model that trains, even one the ship gate refuses (a single tree, a
    /// ROC-AUC below 0.6, a baseline not beaten outside the bootstrap interval, on the
    /// out-of-fold or test rows); for experiments only: the built-in model is always gated.
    #[arg(long)]
    pub no_gate: bool,

    /// The job's early warning instead (docs/job.md): --data and --heldout are per-rank lab
    /// runs (the job corpus's directories); writes the job models, job.json and report.md
    /// (held-out figures against the baselines) into DIR.
    #[arg(long, requires = "heldout")]
    pub job: bool,

    /// With --job: the held-out runs the models are judged on once.
    #[arg(long, value_name = "RUN", num_args = 1.., requires = "job")]
    pub heldout: Vec<PathBuf>,

    /// Overwrite DIR's model files if it exists.
    #[arg(long)]
    pub force: bool,
}

#[cfg(feature = "train")]
pub fn main(args: TrainArgs) -> anyhow::Result<()> {
    if args.job {
        return job::main(&args);
    }
    fit::main(args)
}

#[cfg(not(feature = "train"))]
pub fn main(_: TrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("this build of probe has no training (LightGBM is left out of the daemon): build it with `cargo build -p probe-user --features train`, or let `cargo xtask model` build one")
}
