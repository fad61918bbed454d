//! The soak's figures (a markdown table) and its growth verdict.
//!
//! Growth is judged on the last daemon lifetime (restarts stop before it, so it is most of
//! the run): its first third is warm-up, and the median of its last third must not exceed
//! the median of its middle third by more than a tolerance. A leak grows without bound, so
//! it shows between the two thirds; a cache that fills and stays full does not.
use super::monotonic::Monotonic;
use super::{Failures, Row, SoakArgs, Tally};
use std::fmt::Write as _;

/// RSS may grow this much between the middle and last thirds: 5 % or 2 MiB, the larger.
const RSS_FRAC: f64 = 0.05;
const RSS_MIN_KIB: f64 = 2048.0;
/// fds may grow this much (scrapers' connections come and go): 10 % or 8, the larger.
/// Judged on the fds other than the TCX links: those follow the interfaces alive at the
/// moment (two per interface), which the churn moves by dozens within a minute. A link the
/// daemon failed to drop turns defunct, and the leftover check fails on that.
const FD_FRAC: f64 = 0.10;
const FD_MIN: f64 = 8.0;
/// Fewer samples than this in the last lifetime: too short to judge growth.
const MIN_GROWTH_SAMPLES: usize = 30;

pub struct Growth {
    pub samples: usize,
    pub span_s: f64,
    pub warm_rss: u64,
    pub end_rss: u64,
    pub mid_rss: f64,
    pub last_rss: f64,
    pub warm_fds: u64,
    pub end_fds: u64,
    pub mid_fds: f64,
    pub last_fds: f64,
    /// Least-squares slope of RSS over the middle and last thirds, KiB per minute.
    pub rss_slope_kib_min: f64,
}

fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// The last lifetime's samples that read /proc.
fn last_life(rows: &[Row]) -> Vec<&Row> {
    let Some(life) = rows.iter().map(|r| r.life).max() else {
        return Vec::new();
    };
    rows.iter()
        .filter(|r| r.life == life && r.rss_kib > 0)
        .collect()
}

/// Open fds other than the daemon's TCX links.
fn own_fds(r: &Row) -> u64 {
    r.fds.saturating_sub(r.tcx_links as u64)
}

pub fn growth(rows: &[Row]) -> Option<Growth> {
    let last = last_life(rows);
    if last.len() < MIN_GROWTH_SAMPLES {
        return None;
    }
    let w = last.len() / 3;
    let (mid, tail) = (&last[w..2 * w], &last[2 * w..]);
    let med = |rs: &[&Row], f: fn(&Row) -> f64| {
        let v: Vec<f64> = rs.iter().map(|r| f(r)).collect();
        probe_tests::median(&v).unwrap_or(0.0)
    };
    let pts: Vec<(f64, f64)> = last[w..]
        .iter()
        .map(|r| (r.t / 60.0, r.rss_kib as f64))
        .collect();
    Some(Growth {
        samples: last.len(),
        span_s: last[last.len() - 1].t - last[0].t,
        warm_rss: last[w].rss_kib,
        end_rss: last[last.len() - 1].rss_kib,
        mid_rss: med(mid, |r| r.rss_kib as f64),
        last_rss: med(tail, |r| r.rss_kib as f64),
        warm_fds: own_fds(last[w]),
        end_fds: own_fds(last[last.len() - 1]),
        mid_fds: med(mid, |r| own_fds(r) as f64),
        last_fds: med(tail, |r| own_fds(r) as f64),
        rss_slope_kib_min: slope(&pts),
    })
}

pub fn growth_failures(rows: &[Row]) -> Vec<String> {
    let Some(g) = growth(rows) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let rss_tol = (g.mid_rss * RSS_FRAC).max(RSS_MIN_KIB);
    if g.last_rss - g.mid_rss > rss_tol {
        out.push(format!(
            "RSS kept growing in the last lifetime: median {:.0} KiB in its middle third, \
             {:.0} KiB in its last (tolerance {rss_tol:.0} KiB; slope {:.0} KiB/min)",
            g.mid_rss, g.last_rss, g.rss_slope_kib_min
        ));
    }
    let fd_tol = (g.mid_fds * FD_FRAC).max(FD_MIN);
    if g.last_fds - g.mid_fds > fd_tol {
        out.push(format!(
            "open fds (less TCX links) kept growing in the last lifetime: median {:.0} in its middle third, \
             {:.0} in its last (tolerance {fd_tol:.0})",
            g.mid_fds, g.last_fds
        ));
    }
    out
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

fn max_of(rows: &[&Row], f: impl Fn(&Row) -> Option<f64>) -> Option<f64> {
    rows.iter().filter_map(|r| f(r)).reduce(f64::max)
}

fn min_of(rows: &[&Row], f: impl Fn(&Row) -> Option<f64>) -> Option<f64> {
    rows.iter().filter_map(|r| f(r)).reduce(f64::min)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

pub fn summary(
    args: &SoakArgs,
    rows: &[Row],
    t: &Tally,
    mono: &Monotonic,
    failures: &Failures,
    lives: usize,
) -> String {
    let all: Vec<&Row> = rows.iter().collect();
    let last = last_life(rows);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Soak: {} min, seed {}\n\n| figure | value |\n|---|---|",
        args.minutes, args.seed
    );
    let mut row = |k: &str, v: String| {
        let _ = writeln!(s, "| {k} | {v} |");
    };
    row(
        "daemon lifetimes",
        format!(
            "{lives} ({} SIGTERM + restart, {} SIGKILL + restart, {} crashes)",
            t.sigterm.saturating_sub(1),
            t.sigkill,
            t.crashes
        ),
    );
    if let Some(g) = growth(rows) {
        row(
            "last lifetime",
            format!("{:.0} s, {} samples", g.span_s, g.samples),
        );
        row(
            "RSS at warm-up end -> end (last lifetime)",
            format!(
                "{} -> {} (median middle third {}, last third {}; slope {:.0} KiB/min)",
                mib(g.warm_rss as f64),
                mib(g.end_rss as f64),
                mib(g.mid_rss),
                mib(g.last_rss),
                g.rss_slope_kib_min
            ),
        );
        row(
            "open fds other than TCX links, at warm-up end -> end (last lifetime)",
            format!(
                "{} -> {} (median middle third {:.0}, last third {:.0})",
                g.warm_fds, g.end_fds, g.mid_fds, g.last_fds
            ),
        );
    } else {
        row(
            "growth",
            format!("not judged: the last lifetime has fewer than {MIN_GROWTH_SAMPLES} samples"),
        );
    }
    row(
        "RSS max, fds max (all lifetimes)",
        format!(
            "{}, {}",
            mib(max_of(&all, |r| Some(r.rss_kib as f64)).unwrap_or(0.0)),
            max_of(&all, |r| Some(r.fds as f64)).unwrap_or(0.0)
        ),
    );
    let cpu: Vec<f64> = all.iter().map(|r| r.cpu_pct).collect();
    row(
        "CPU, % of one core (mean / max of 1 s samples)",
        format!(
            "{:.1} / {:.1}",
            cpu.iter().sum::<f64>() / cpu.len().max(1) as f64,
            cpu.iter().copied().fold(0.0, f64::max)
        ),
    );
    row(
        "tick duration, daemon's own (max)",
        format!("{} s", opt(max_of(&all, |r| r.tick_s), 3)),
    );
    row(
        "time since the last tick when scraped (max)",
        format!("{} s (limit 2 s)", opt(max_of(&all, |r| r.since_tick_s), 3)),
    );
    row(
        "series on /metrics (last lifetime, min - max)",
        format!(
            "{} - {}",
            opt(min_of(&last, |r| r.series.map(|n| n as f64)), 0),
            opt(max_of(&last, |r| r.series.map(|n| n as f64)), 0)
        ),
    );
    row(
        "flow map fill (max of probe_flows_tracked / maps.flows)",
        format!(
            "{} / {}",
            opt(max_of(&all, |r| r.flows_tracked), 0),
            super::MAP_FLOWS
        ),
    );
    row(
        "flow evictions, refused inserts (last lifetime, end)",
        format!(
            "{}, {}",
            opt(last.last().and_then(|r| r.flow_evictions), 0),
            opt(last.last().and_then(|r| r.map_full), 0)
        ),
    );
    row(
        "peers folded into \"other\" (max; top_peers)",
        format!(
            "{}; {}",
            opt(max_of(&all, |r| r.peers_folded), 0),
            super::TOP_PEERS
        ),
    );
    row(
        "feature entities (max; features.max_entities), untracked observations (last lifetime, end)",
        format!(
            "{}; {}, {}",
            opt(max_of(&all, |r| r.feature_entities), 0),
            super::MAX_ENTITIES,
            opt(last.last().and_then(|r| r.feature_untracked), 0)
        ),
    );
    row(
        "TCX links held, of them defunct (max)",
        format!(
            "{}, {}",
            opt(max_of(&all, |r| Some(r.tcx_links as f64)), 0),
            opt(max_of(&all, |r| Some(r.defunct_links as f64)), 0)
        ),
    );
    row(
        "interfaces created / deleted",
        format!("{} / {}", t.ifaces_created, t.ifaces_deleted),
    );
    let generations = (args.minutes * 60.0 / super::churn_threads::GENERATION.as_secs_f64())
        .ceil()
        .max(1.0) as u32;
    row(
        "peers (at a time; generations, each new)",
        format!(
            "{}; {generations} ({} distinct addresses)",
            super::churn_threads::PEERS,
            generations * super::churn_threads::PEERS
        ),
    );
    row(
        "short TCP connections (failed)",
        format!("{} ({})", t.conns_ok + t.conns_failed, t.conns_failed),
    );
    row(
        "RDMA devices added / removed; counter files broken / repaired",
        format!(
            "{} / {}; {} / {}",
            t.rdma_added, t.rdma_removed, t.rdma_broken, t.rdma_repaired
        ),
    );
    row(
        "bad scrapers: cut mid-response / silent / half request / refused (daemon down)",
        format!(
            "{} / {} / {} / {}",
            t.scrapes_cut, t.scrapes_silent, t.scrapes_half_request, t.scrapes_refused
        ),
    );
    row("SIGHUP", t.sighup.to_string());
    row(
        "stops checked for leftovers (tc, BPF ids, /sys/fs/bpf)",
        t.stops_checked.to_string(),
    );
    row(
        "sampling scrapes (failed)",
        format!("{} ({})", t.scrapes, t.scrape_errors),
    );
    row(
        "counter samples checked / went backwards",
        format!("{} / {}", mono.checked, mono.backwards.len()),
    );
    row("failures", failures.lines().len().to_string());
    s
}

pub fn verdict_section(lines: &[String], mono: &Monotonic) -> String {
    let mut s = String::new();
    if !mono.reappeared_lower.is_empty() {
        let (k, a, b) = &mono.reappeared_lower[0];
        let _ = writeln!(
            s,
            "Note: {} series vanished and came back lower within a lifetime (first: {k} {a} -> {b}).\n",
            mono.reappeared_lower.len()
        );
    }
    if lines.is_empty() {
        let _ = writeln!(s, "Verdict: passed.");
    } else {
        let _ = writeln!(s, "Verdict: FAILED");
        for l in lines {
            let _ = writeln!(s, "- {l}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(rss: impl Fn(usize) -> u64, fds: impl Fn(usize) -> u64) -> Vec<Row> {
        (0..90)
            .map(|i| Row {
                t: i as f64,
                life: 1,
                rss_kib: rss(i),
                fds: fds(i),
                ..Row::default()
            })
            .collect()
    }

    #[test]
    fn fds_that_follow_the_tcx_links_are_not_growth() {
        // The shape of a CI soak that failed this check: interfaces (two TCX links each)
        // piled up late in the lifetime, fds rose from ~58 to ~80 with them, and the rest
        // stayed at ~48.
        let links = |i: usize| {
            if i < 60 {
                10
            } else {
                10 + 2 * (i - 60).min(11)
            }
        };
        let mut followed = rows(|_| 50_000, |i| 48 + links(i) as u64);
        for (i, r) in followed.iter_mut().enumerate() {
            r.tcx_links = links(i);
        }
        assert!(growth_failures(&followed).is_empty());
        // The same fds with no links to explain them are growth.
        let unexplained = rows(|_| 50_000, |i| 48 + links(i) as u64);
        let f = growth_failures(&unexplained);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].starts_with("open fds (less TCX links) kept growing"),
            "{f:?}"
        );
    }

    #[test]
    fn flat_passes_and_leaks_fail() {
        // Warm-up growth, then flat with noise.
        let flat = rows(
            |i| 30_000 + (i.min(20) as u64) * 500 + (i as u64 % 3) * 100,
            |_| 40,
        );
        assert!(growth_failures(&flat).is_empty());
        let leak = rows(|i| 30_000 + i as u64 * 200, |i| 40 + i as u64);
        let f = growth_failures(&leak);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].starts_with("RSS kept growing"));
        // Too short to judge.
        assert!(growth(&leak[..20]).is_none());
        assert!((slope(&[(0.0, 1.0), (1.0, 3.0)]) - 2.0).abs() < 1e-9);
    }
}
