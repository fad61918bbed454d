//! Plays the schedule while the ranks train: turns each episode on at its planned offset,
//! applies the steps of a gradual one as they fall due, turns it off at its end, and writes
//! its ground truth then, with the retransmits counted while it was on.
use super::episodes::{self, Active, Truth};
use super::schedule::Episode;
use super::topo::Lab;
use super::{retrans_total, JsonLines};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

pub struct Timeline<'a> {
    sched: &'a [Episode],
    next: usize,
    active: Option<Active>,
    log: JsonLines,
    out: &'a Path,
    congestion: &'a str,
    ranks: usize,
    /// Unix time the traffic started, for the progress lines.
    t0: f64,
    retrans_at_start: Option<u64>,
    /// The ground truth of every episode that has ended.
    pub truths: Vec<Truth>,
    /// RetransSegs over every rank's namespace while each episode was on, by seq.
    pub retrans: BTreeMap<usize, u64>,
}

impl<'a> Timeline<'a> {
    /// A timeline writing `out/ground_truth.jsonl`.
    pub fn new(
        sched: &'a [Episode],
        out: &'a Path,
        congestion: &'a str,
        ranks: usize,
        t0: f64,
    ) -> Result<Self> {
        Ok(Self {
            sched,
            next: 0,
            active: None,
            log: JsonLines::create(&out.join("ground_truth.jsonl"))?,
            out,
            congestion,
            ranks,
            t0,
            retrans_at_start: None,
            truths: Vec::new(),
            retrans: BTreeMap::new(),
        })
    }

    /// Does what is due `now_s` seconds after the start of the traffic.
    pub fn tick(&mut self, lab: &mut Lab, now_s: f64) -> Result<()> {
        self.step_active(lab, now_s)?;
        if self.active.as_ref().is_some_and(|a| now_s >= a.ep.end_s) {
            self.end_active(lab)?;
        }
        self.start_due(lab, now_s)
    }

    /// Undoes the episode that is on, if any, and records it as aborted (the lab was
    /// interrupted or failed).
    pub fn abort(&mut self, lab: &mut Lab) -> Result<()> {
        let Some(a) = self.active.take() else {
            return Ok(());
        };
        match episodes::revert(lab, a, self.out, true) {
            Ok(t) => self.record(t),
            Err(e) => {
                eprintln!("lab: undoing the last episode: {e:#}");
                Ok(())
            }
        }
    }

    fn step_active(&mut self, lab: &mut Lab, now_s: f64) -> Result<()> {
        let Some(a) = self.active.as_mut() else {
            return Ok(());
        };
        let (seq, kind) = (a.ep.seq, a.ep.kind);
        let done = episodes::advance(lab, a, now_s, self.out, self.congestion)
            .with_context(|| format!("stepping episode {seq} ({kind})"))?;
        for s in done {
            eprintln!(
                "lab: {:6.1} s  episode {seq} ({kind}) step: {}",
                s.t - self.t0,
                serde_json::to_string(&s.level)?
            );
        }
        Ok(())
    }

    fn end_active(&mut self, lab: &mut Lab) -> Result<()> {
        let Some(a) = self.active.take() else {
            return Ok(());
        };
        let t = episodes::revert(lab, a, self.out, false)?;
        if let (Some(a), Some(b)) = (self.retrans_at_start, retrans_total(lab, self.ranks)) {
            self.retrans.insert(t.seq, b.saturating_sub(a));
        }
        eprintln!(
            "lab: {:6.1} s  episode {} ({}) off",
            t.t_end - self.t0,
            t.seq,
            t.kind
        );
        self.record(t)
    }

    fn start_due(&mut self, lab: &mut Lab, now_s: f64) -> Result<()> {
        let Some(ep) = self.sched.get(self.next) else {
            return Ok(());
        };
        if self.active.is_some() || now_s < ep.start_s {
            return Ok(());
        }
        self.next += 1;
        self.retrans_at_start = retrans_total(lab, self.ranks);
        let a = episodes::apply(lab, ep, self.out, self.congestion)
            .with_context(|| format!("starting episode {} ({})", ep.seq, ep.kind))?;
        let first = match ep.steps.first() {
            Some(s) => format!(", first step {}", serde_json::to_string(&s.level)?),
            None => String::new(),
        };
        eprintln!(
            "lab: {:6.1} s  episode {} ({}, {}) on rank {}: {}{first}",
            a.t_start - self.t0,
            ep.seq,
            ep.kind,
            ep.kind.onset().name(),
            ep.rank,
            serde_json::to_string(&ep.params)?
        );
        self.active = Some(a);
        Ok(())
    }

    fn record(&mut self, t: Truth) -> Result<()> {
        self.log.write(&t)?;
        self.truths.push(t);
        Ok(())
    }
}
