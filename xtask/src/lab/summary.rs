//! The lab's report: iteration times in calm periods versus during episodes (the training
//! slowdown congestion causes), with the RTT and retransmits the kernel saw meanwhile.
use super::episodes::Truth;
use super::schedule::{Kind, Onset};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One line of a traingen log (the fields the summary needs).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Iter {
    pub rank: usize,
    pub iter: u64,
    pub t_start: f64,
    pub t_end: f64,
    pub duration_s: f64,
}

/// One `ss` sample of a traingen connection (a line of `rtt.jsonl`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RttSample {
    pub t: f64,
    pub rank: usize,
    pub srtt_ms: f64,
    /// The connection carries this rank's outgoing data (its RTT is meaningful).
    pub sender: bool,
}

/// Reads a traingen log; a torn last line (a killed rank) is skipped.
pub fn read_iters(path: &Path) -> Result<Vec<Iter>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Iter>(l).ok())
        .collect())
}

pub fn median(xs: &mut [f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// The first episode whose interval overlaps [a, b], if any.
pub fn overlapping(truth: &[Truth], a: f64, b: f64) -> Option<usize> {
    truth.iter().position(|t| a < t.t_end && b > t.t_start)
}

/// Iteration times of a group of iterations.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Stat {
    pub n: usize,
    pub median_s: Option<f64>,
    /// The mean is what training throughput sees: a few stalled iterations (a retransmit
    /// timeout) barely move the median but cost the job their whole length.
    pub mean_s: Option<f64>,
    pub max_s: Option<f64>,
}

impl Stat {
    fn of(mut xs: Vec<f64>) -> Self {
        let n = xs.len();
        let mean_s = (n > 0).then(|| xs.iter().sum::<f64>() / n as f64);
        let max_s = xs.iter().copied().max_by(f64::total_cmp);
        Stat {
            n,
            median_s: median(&mut xs),
            mean_s,
            max_s,
        }
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[derive(Debug, Serialize)]
pub struct RankRow {
    pub rank: usize,
    pub iterations: usize,
    pub calm: Stat,
    pub episode: Stat,
    pub slowdown: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct KindRow {
    pub kind: Kind,
    pub episodes: usize,
    pub iterations: Stat,
    pub slowdown: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct EpisodeRow {
    pub seq: usize,
    pub kind: Kind,
    pub rank: usize,
    pub params: serde_json::Value,
    pub onset: Onset,
    /// Seconds from the start of the traffic.
    pub start_s: f64,
    pub end_s: f64,
    /// Gradual episodes: when the last step took effect (seconds from the start).
    pub full_s: Option<f64>,
    pub iterations: Stat,
    pub slowdown: Option<f64>,
    /// srtt of every rank's sending connections during the episode.
    pub srtt_median_ms: Option<f64>,
    /// srtt of the sending connections of the episode's rank only.
    pub srtt_rank_median_ms: Option<f64>,
    pub srtt_max_ms: Option<f64>,
    /// TCP RetransSegs over every rank's namespace during the episode (cross traffic's own
    /// retransmits included).
    pub retrans_segs: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Calm {
    pub iterations: Stat,
    pub srtt_median_ms: Option<f64>,
    pub srtt_max_ms: Option<f64>,
    pub retrans_segs: Option<u64>,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub t0: f64,
    pub ranks: Vec<RankRow>,
    pub calm: Calm,
    pub episodes: Vec<EpisodeRow>,
    pub kinds: Vec<KindRow>,
    /// Mean iteration time during any episode over the calm mean.
    pub slowdown: Option<f64>,
}

/// What the summary is computed from.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    /// Unix time the traffic started.
    pub t0: f64,
    /// Unix time the traffic ended.
    pub t_last: f64,
    pub ranks: usize,
    pub iters: &'a [Iter],
    pub truth: &'a [Truth],
    pub rtt: &'a [RttSample],
    /// RetransSegs delta over every rank's namespace, per episode seq.
    pub retrans: &'a BTreeMap<usize, u64>,
    /// RetransSegs over the rest of the run.
    pub calm_retrans: Option<u64>,
}

/// Builds the summary. Iteration 0 (connection set-up, slow start) counts nowhere.
pub fn summarize(inp: &Inputs) -> Summary {
    let Inputs {
        t0,
        t_last,
        ranks,
        iters: all,
        truth,
        rtt,
        retrans,
        calm_retrans,
    } = *inp;
    let iters: Vec<&Iter> = all.iter().filter(|i| i.iter > 0).collect();
    let class = |i: &Iter| overlapping(truth, i.t_start, i.t_end);
    let durs = |f: &dyn Fn(&Iter) -> bool| -> Vec<f64> {
        iters
            .iter()
            .filter(|i| f(i))
            .map(|i| i.duration_s)
            .collect()
    };
    let calm = Stat::of(durs(&|i| class(i).is_none()));
    let any_ep = Stat::of(durs(&|i| class(i).is_some()));
    let rank_rows = (0..ranks)
        .map(|r| {
            let c = Stat::of(durs(&|i| i.rank == r && class(i).is_none()));
            let e = Stat::of(durs(&|i| i.rank == r && class(i).is_some()));
            RankRow {
                rank: r,
                iterations: all.iter().filter(|i| i.rank == r).count(),
                slowdown: ratio(e.mean_s, c.mean_s),
                calm: c,
                episode: e,
            }
        })
        .collect();
    let senders: Vec<&RttSample> = rtt.iter().filter(|s| s.sender).collect();
    let rtt_in = |f: &dyn Fn(&RttSample) -> bool| -> (Option<f64>, Option<f64>) {
        let mut xs: Vec<f64> = senders.iter().filter(|s| f(s)).map(|s| s.srtt_ms).collect();
        let max = xs.iter().copied().max_by(f64::total_cmp);
        (median(&mut xs), max)
    };
    let episodes: Vec<EpisodeRow> = truth
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let it = Stat::of(durs(&|i| class(i) == Some(k)));
            let during = |x: &RttSample| x.t >= t.t_start && x.t <= t.t_end;
            let (srtt_median_ms, srtt_max_ms) = rtt_in(&during);
            let (srtt_rank_median_ms, _) = rtt_in(&|x| during(x) && x.rank == t.rank);
            EpisodeRow {
                seq: t.seq,
                kind: t.kind,
                rank: t.rank,
                params: serde_json::to_value(&t.params).unwrap_or_default(),
                onset: t.onset,
                start_s: t.t_start - t0,
                end_s: t.t_end - t0,
                full_s: t.gradual.as_ref().and_then(|g| g.t_full).map(|f| f - t0),
                slowdown: ratio(it.mean_s, calm.mean_s),
                iterations: it,
                srtt_median_ms,
                srtt_rank_median_ms,
                srtt_max_ms,
                retrans_segs: retrans.get(&t.seq).copied(),
            }
        })
        .collect();
    let mut kinds = Vec::new();
    for kind in Kind::ALL {
        let idx: Vec<usize> = (0..truth.len())
            .filter(|&k| truth[k].kind == kind)
            .collect();
        if idx.is_empty() {
            continue;
        }
        let it = Stat::of(durs(&|i| class(i).is_some_and(|k| idx.contains(&k))));
        kinds.push(KindRow {
            kind,
            episodes: idx.len(),
            slowdown: ratio(it.mean_s, calm.mean_s),
            iterations: it,
        });
    }
    let ep_secs: f64 = truth.iter().map(|t| t.t_end - t.t_start).sum();
    let (srtt_median_ms, srtt_max_ms) =
        rtt_in(&|x| !truth.iter().any(|t| x.t >= t.t_start && x.t <= t.t_end));
    Summary {
        t0,
        ranks: rank_rows,
        slowdown: ratio(any_ep.mean_s, calm.mean_s),
        calm: Calm {
            iterations: calm,
            srtt_median_ms,
            srtt_max_ms,
            retrans_segs: calm_retrans,
            seconds: (t_last - t0 - ep_secs).max(0.0),
        },
        episodes,
        kinds,
    }
}

fn opt(x: Option<f64>, scale: f64, prec: usize) -> String {
    x.map_or("-".into(), |v| format!("{:.*}", prec, v * scale))
}

fn times(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("x{v:.2}"))
}

fn params_text(p: &serde_json::Value) -> String {
    p.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// `start-end` in seconds, with `/full` after the start for gradual episodes.
fn episode_span(e: &EpisodeRow) -> String {
    match e.full_s {
        Some(f) => format!("{:.1}/{:.1}-{:.1}", e.start_s, f, e.end_s),
        None => format!("{:.1}-{:.1}", e.start_s, e.end_s),
    }
}

/// The human-readable report.
pub fn render(s: &Summary) -> String {
    let mut o = String::new();
    let c = &s.calm;
    let _ = writeln!(
        o,
        "calm: {} iterations, median {} ms, mean {} ms, max {} ms; sender srtt median {} ms (max {} ms); {} retransmits in {:.1} s",
        c.iterations.n,
        opt(c.iterations.median_s, 1e3, 1),
        opt(c.iterations.mean_s, 1e3, 1),
        opt(c.iterations.max_s, 1e3, 1),
        opt(c.srtt_median_ms, 1.0, 2),
        opt(c.srtt_max_ms, 1.0, 2),
        c.retrans_segs.map_or("-".into(), |r| r.to_string()),
        c.seconds
    );
    if s.episodes.is_empty() {
        let _ = writeln!(o, "episodes: none");
    } else {
        let _ = writeln!(
            o,
            "episodes (iterations overlapping each; slowdown = mean / calm mean):"
        );
        let _ = writeln!(
            o,
            "  {:>3} {:<7} {:>4} {:>16} {:>5} {:>7} {:>7} {:>7} {:>8} {:>7} {:>9} {:>8} {:>7}  params",
            "#",
            "kind",
            "rank",
            "time (s)",
            "iters",
            "med ms",
            "mean ms",
            "max ms",
            "slowdown",
            "srtt ms",
            "rank srtt",
            "srtt max",
            "retrans"
        );
        for e in &s.episodes {
            let it = &e.iterations;
            let _ = writeln!(
                o,
                "  {:>3} {:<7} {:>4} {:>16} {:>5} {:>7} {:>7} {:>7} {:>8} {:>7} {:>9} {:>8} {:>7}  {}",
                e.seq,
                e.kind.name(),
                e.rank,
                episode_span(e),
                it.n,
                opt(it.median_s, 1e3, 0),
                opt(it.mean_s, 1e3, 0),
                opt(it.max_s, 1e3, 0),
                times(e.slowdown),
                opt(e.srtt_median_ms, 1.0, 2),
                opt(e.srtt_rank_median_ms, 1.0, 2),
                opt(e.srtt_max_ms, 1.0, 2),
                e.retrans_segs.map_or("-".into(), |r| r.to_string()),
                params_text(&e.params)
            );
        }
        let kinds: Vec<String> = s
            .kinds
            .iter()
            .map(|k| {
                format!(
                    "{} {} (median {} ms, mean {} ms, {} iterations)",
                    k.kind.name(),
                    times(k.slowdown),
                    opt(k.iterations.median_s, 1e3, 1),
                    opt(k.iterations.mean_s, 1e3, 1),
                    k.iterations.n
                )
            })
            .collect();
        let _ = writeln!(o, "slowdown by kind: {}", kinds.join("; "));
    }
    let _ = writeln!(
        o,
        "per rank:\n  {:>4} {:>6} {:>15} {:>18} {:>16} {:>8}",
        "rank", "iters", "calm median ms", "episode median ms", "episode mean ms", "slowdown"
    );
    for r in &s.ranks {
        let _ = writeln!(
            o,
            "  {:>4} {:>6} {:>15} {:>18} {:>16} {:>8}",
            r.rank,
            r.iterations,
            opt(r.calm.median_s, 1e3, 1),
            opt(r.episode.median_s, 1e3, 1),
            opt(r.episode.mean_s, 1e3, 1),
            times(r.slowdown)
        );
    }
    let _ = writeln!(
        o,
        "training slowdown during episodes (mean iteration time over the calm mean): {}",
        times(s.slowdown)
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::schedule::Params;

    fn truth(seq: usize, kind: Kind, a: f64, b: f64) -> Truth {
        Truth {
            t_start: a,
            t_end: b,
            kind,
            rank: 0,
            params: Params::Loss { percent: 1 },
            seq,
            planned_start_s: a,
            planned_end_s: b,
            observed: serde_json::json!({}),
            aborted: false,
            onset: kind.onset(),
            gradual: None,
        }
    }

    fn it(rank: usize, iter: u64, a: f64, d: f64) -> Iter {
        Iter {
            rank,
            iter,
            t_start: a,
            t_end: a + d,
            duration_s: d,
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn overlap_rules() {
        let t = [
            truth(0, Kind::Tbf, 10.0, 12.0),
            truth(1, Kind::Loss, 20.0, 21.0),
        ];
        assert_eq!(overlapping(&t, 9.0, 10.0), None); // touches the start only
        assert_eq!(overlapping(&t, 9.0, 10.1), Some(0));
        assert_eq!(overlapping(&t, 11.0, 11.5), Some(0));
        assert_eq!(overlapping(&t, 11.9, 13.0), Some(0));
        assert_eq!(overlapping(&t, 12.0, 13.0), None);
        assert_eq!(overlapping(&t, 19.0, 25.0), Some(1));
    }

    #[test]
    fn slowdown_from_logs() {
        // Calm iterations take 0.25 s, those inside the tbf episode 0.5 s.
        let mut iters = Vec::new();
        for r in 0..2 {
            let mut t = 0.0;
            for k in 0..70 {
                let d = if (10.0..15.0).contains(&t) { 0.5 } else { 0.25 };
                iters.push(it(r, k, t, d));
                t += d;
            }
        }
        let tr = [truth(0, Kind::Tbf, 10.0, 15.0)];
        let rtt = [
            RttSample {
                t: 5.0,
                rank: 0,
                srtt_ms: 0.1,
                sender: true,
            },
            RttSample {
                t: 12.0,
                rank: 0,
                srtt_ms: 20.0,
                sender: true,
            },
            RttSample {
                t: 12.0,
                rank: 1,
                srtt_ms: 99.0,
                sender: false,
            },
        ];
        let s = summarize(&Inputs {
            t0: 0.0,
            t_last: 15.0,
            ranks: 2,
            iters: &iters,
            truth: &tr,
            rtt: &rtt,
            retrans: &BTreeMap::from([(0, 7)]),
            calm_retrans: Some(1),
        });
        assert_eq!(s.calm.iterations.median_s, Some(0.25));
        assert_eq!(s.episodes[0].iterations.median_s, Some(0.5));
        assert_eq!(s.episodes[0].iterations.mean_s, Some(0.5));
        assert_eq!(s.episodes[0].iterations.max_s, Some(0.5));
        assert_eq!(s.slowdown, Some(2.0));
        assert_eq!(s.ranks[1].slowdown, Some(2.0));
        assert_eq!(s.ranks[0].iterations, 70);
        assert_eq!(s.episodes[0].iterations.n, 2 * 10);
        assert_eq!(s.calm.iterations.n, 2 * (70 - 10 - 1));
        assert_eq!(s.episodes[0].srtt_median_ms, Some(20.0));
        assert_eq!(s.episodes[0].srtt_rank_median_ms, Some(20.0));
        assert_eq!(s.calm.srtt_median_ms, Some(0.1));
        assert_eq!(s.episodes[0].retrans_segs, Some(7));
        assert_eq!(s.kinds.len(), 1);
        assert!(render(&s).contains("x2.00"));
    }

    #[test]
    fn a_stall_moves_the_mean_not_the_median() {
        // A loss episode: three normal iterations and one 2 s retransmit-timeout stall.
        let mut iters = Vec::new();
        let mut t = 0.0;
        for k in 0..30 {
            let d = if k == 22 { 2.0 } else { 0.25 };
            iters.push(it(0, k, t, d));
            t += d;
        }
        let tr = [truth(0, Kind::Loss, 5.0, 6.0 + 2.0)];
        let s = summarize(&Inputs {
            t0: 0.0,
            t_last: t,
            ranks: 1,
            iters: &iters,
            truth: &tr,
            rtt: &[],
            retrans: &BTreeMap::new(),
            calm_retrans: None,
        });
        let e = &s.episodes[0].iterations;
        assert_eq!(e.median_s, Some(0.25));
        assert_eq!(e.max_s, Some(2.0));
        assert!(s.episodes[0].slowdown.unwrap() > 2.0, "{:?}", s.episodes[0]);
    }
}
