//! `probe analyze`: a recording turned into an analysis of the training job it saw: who
//! talks to whom, the communication pattern with its evidence, the iteration timing and its
//! phases, clusters of time windows and the change points between them, and, with
//! `--compare`, how two runs differ. Lab runs are checked against what the lab ran.
//! docs/analyze.md.
mod load;
mod pattern;
mod timing;
mod traffic;

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use load::Recording;

#[derive(clap::Args, Debug, Clone)]
pub struct AnalyzeArgs {
    /// Recordings of one job (`probe record` files, or lab run directories); several are
    /// taken as hosts of the same job.
    #[arg(value_name = "REC", required = true)]
    pub recordings: Vec<PathBuf>,

    /// Recordings of another job or run to compare with.
    #[arg(long, value_name = "REC", num_args = 1..)]
    pub compare: Vec<PathBuf>,

    /// Directory for the reports (created).
    #[arg(long, short = 'o', value_name = "DIR", default_value = "probe-analysis")]
    pub out: PathBuf,
}

#[derive(Serialize)]
pub struct Analysis {
    pub recording: String,
    pub start_unix: f64,
    pub seconds: f64,
    pub ticks: usize,
    pub matrix: traffic::Matrix,
    pub timing: timing::Timing,
    pub pattern: pattern::Pattern,
    /// How each busy peer direction was judged part of the job or not.
    pub classes: Vec<timing::ClassCheck>,
}

pub fn analyze(rec: &Recording) -> Analysis {
    let mut matrix = traffic::matrix(rec);
    let classes = timing::classes(rec, &matrix.candidates());
    let (timing, checks) = timing::timing(rec, &classes);
    let mut job: Vec<String> = timing.profiles.iter().map(|p| p.peer.clone()).collect();
    job.sort();
    job.dedup();
    matrix.mark_job(&job);
    let pattern = pattern::classify(&timing.profiles, job.len());
    let mut ticks: Vec<f64> = rec.obs.iter().map(|o| o.time_unix).collect();
    ticks.dedup();
    Analysis {
        recording: rec.name.clone(),
        start_unix: rec.start(),
        seconds: rec.end() - rec.start(),
        ticks: ticks.len(),
        matrix,
        timing,
        pattern,
        classes: checks,
    }
}

pub fn main(args: AnalyzeArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out)?;
    for r in &args.recordings {
        let rec = Recording::load(r)?;
        let a = analyze(&rec);
        let dir = args.out.join(&rec.name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("analysis.json"), serde_json::to_vec_pretty(&a)?)?;
        if let Some(lab) = &rec.lab {
            let mut it = lab.iterations.clone();
            eprintln!(
                "{}: lab {} x{} traingen median {:.4}; found {} ({:?}, {:.2}) period {:.4} acf {:.4}",
                rec.name,
                lab.pattern,
                lab.ranks,
                crate::features::median(&mut it).unwrap_or(f64::NAN),
                a.pattern.name,
                a.pattern.role,
                a.pattern.confidence,
                a.timing.period_s,
                a.timing.acf_period_s
            );
        }
    }
    if args.recordings.is_empty() {
        bail!("no recordings");
    }
    Ok(())
}
