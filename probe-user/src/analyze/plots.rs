//! The figures of `probe analyze`, as SVG text (inlined in the HTML page, and written beside
//! it): the timeline (throughput, RTT, iteration length; clusters as a band, change points
//! as lines, a lab's episodes shaded), the phases of one iteration, and burst sizes.
use std::error::Error;

use plotters::prelude::*;

use super::{timing::Timing, Analysis};

use crate::eval::plots::{COLOURS, FONT};

const EPISODE: RGBColor = RGBColor(250, 128, 114);
const CHANGE: RGBColor = RGBColor(214, 39, 40);

type R = Result<(), Box<dyn Error>>;

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

fn range(v: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = v
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    if lo > hi {
        return 0.0..1.0;
    }
    let d = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.1
    };
    (lo - d).min(0.0_f64.max(lo - d))..hi + d
}

/// Lines through the finite stretches of (t, v).
fn gappy<DB: DrawingBackend>(
    c: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    t: &[f64],
    v: &[f64],
    style: ShapeStyle,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut run: Vec<(f64, f64)> = Vec::new();
    for (x, y) in t.iter().zip(v) {
        if y.is_finite() {
            run.push((*x, *y));
        } else if !run.is_empty() {
            c.draw_series(LineSeries::new(std::mem::take(&mut run), style))?;
        }
    }
    if !run.is_empty() {
        c.draw_series(LineSeries::new(run, style))?;
    }
    Ok(())
}

/// Episodes of a lab run, seconds from the start: (from, to, label).
pub type Spans = Vec<(f64, f64, String)>;

pub fn timeline(a: &Analysis, episodes: &Spans) -> Result<String, Box<dyn Error>> {
    let mut out = String::new();
    draw_timeline(a, episodes, &mut out)?;
    Ok(out)
}

fn draw_timeline(a: &Analysis, episodes: &Spans, out: &mut String) -> R {
    let s = &a.series;
    let t0 = s.t.first().copied().unwrap_or(0.0);
    let t: Vec<f64> = s.t.iter().map(|x| x - t0).collect();
    let xr = 0.0..t.last().copied().unwrap_or(1.0).max(1.0);
    let root = SVGBackend::with_string(out, (1000, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&format!("{}: the job over time", a.recording), (FONT, 20))?;
    let areas = root.split_by_breakpoints::<i32, i32, _, _>([], [180, 360, 540]);
    let panels: [(&str, Vec<f64>); 3] = [
        (
            "throughput (MB/s)",
            s.throughput.iter().map(|x| x / 1e6).collect(),
        ),
        (
            "largest srtt (ms)",
            s.srtt.iter().map(|x| x * 1e3).collect(),
        ),
        ("iteration (s)", s.iteration.clone()),
    ];
    for (i, (label, v)) in panels.iter().enumerate() {
        let yr = range(v.iter().copied());
        let mut c = ChartBuilder::on(&areas[i])
            .margin_left(10)
            .margin_right(20)
            .margin_top(6)
            .y_label_area_size(90)
            .x_label_area_size(if i == 2 { 30 } else { 0 })
            .build_cartesian_2d(xr.clone(), yr.clone())?;
        c.configure_mesh()
            .y_desc(*label)
            .y_labels(4)
            .x_labels(10)
            .x_desc(if i == 2 { "seconds from the start" } else { "" })
            .draw()?;
        c.draw_series(episodes.iter().map(|(a, b, _)| {
            Rectangle::new([(*a, yr.start), (*b, yr.end)], EPISODE.mix(0.25).filled())
        }))?;
        for ch in &a.changes {
            c.draw_series(LineSeries::new(
                [(ch.at_s, yr.start), (ch.at_s, yr.end)],
                CHANGE.stroke_width(1),
            ))?;
        }
        gappy(&mut c, &t, v, colour(0).stroke_width(1))?;
    }
    // The cluster of each tick as a coloured band.
    let mut c = ChartBuilder::on(&areas[3])
        .margin_left(10)
        .margin_right(20)
        .margin_top(10)
        .y_label_area_size(90)
        .x_label_area_size(20)
        .build_cartesian_2d(xr.clone(), 0.0..1.0)?;
    c.configure_mesh()
        .y_desc("cluster")
        .y_labels(0)
        .disable_mesh()
        .draw()?;
    if let Some(cl) = &a.clusters {
        let tick = a.series.tick_s;
        c.draw_series(cl.of_tick.iter().zip(&t).filter_map(|(k, x)| {
            let k = (*k)?;
            // The band below, the legend above it.
            Some(Rectangle::new(
                [(*x, 0.02), (*x + tick, 0.3)],
                colour(k + 1).filled(),
            ))
        }))?;
        for (i, k) in cl.clusters.iter().enumerate() {
            c.draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                colour(k.id + 1).filled(),
            )))?
            .label(format!("{}: {}", k.id, k.description))
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour(i + 1).filled())
            });
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE)
            .label_font((FONT, 11))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

pub fn phases(name: &str, tm: &Timing) -> Result<String, Box<dyn Error>> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1000, 380)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut c = ChartBuilder::on(&root)
            .caption(
                format!("{name}: one iteration, each direction of each job peer (median over iterations)"),
                (FONT, 16),
            )
            .margin(10)
            .y_label_area_size(60)
            .x_label_area_size(35)
            .build_cartesian_2d(0.0..100.0, 0.0..1.05)?;
        c.configure_mesh()
            .x_desc("% of the iteration")
            .y_desc("share of time in a burst")
            .draw()?;
        for (i, p) in tm.profiles.iter().enumerate() {
            let n = p.occupancy.len() as f64;
            let pts: Vec<(f64, f64)> = p
                .occupancy
                .iter()
                .enumerate()
                .map(|(b, v)| ((b as f64 + 0.5) / n * 100.0, *v))
                .collect();
            c.draw_series(LineSeries::new(pts, colour(i).stroke_width(2)))?
                .label(p.class.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], colour(i).stroke_width(2))
                });
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .label_font((FONT, 12))
            .draw()?;
        root.present()?;
    }
    Ok(out)
}

pub fn burst_sizes(name: &str, tm: &Timing) -> Result<String, Box<dyn Error>> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1000, 340)).into_drawing_area();
        root.fill(&WHITE)?;
        let h = &tm.size_histogram;
        let top = h.iter().map(|x| x.1.max(x.2)).max().unwrap_or(1).max(1) as f64;
        let lo = h.first().map_or(6.0, |x| x.0.log2());
        let hi = h.last().map_or(30.0, |x| x.0.log2() + 1.0);
        let mut c = ChartBuilder::on(&root)
            .caption(format!("{name}: job bursts by size"), (FONT, 16))
            .margin(10)
            .y_label_area_size(60)
            .x_label_area_size(35)
            .build_cartesian_2d(lo..hi, 0.0..top * 1.05)?;
        c.configure_mesh()
            .x_desc("bytes per burst (log2)")
            .y_desc("bursts")
            .x_label_formatter(&|v| {
                let b = v.exp2();
                if b >= 1e6 {
                    format!("{:.0}M", b / 1e6)
                } else if b >= 1e3 {
                    format!("{:.0}k", b / 1e3)
                } else {
                    format!("{b:.0}")
                }
            })
            .draw()?;
        for (k, tx) in [(0usize, true), (1, false)] {
            c.draw_series(h.iter().map(|(b, s, r)| {
                let x = b.log2() + if tx { 0.05 } else { 0.5 };
                let v = if tx { *s } else { *r } as f64;
                Rectangle::new([(x, 0.0), (x + 0.45, v)], colour(k).filled())
            }))?
            .label(if tx { "sent" } else { "received" })
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour(k).filled())
            });
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .draw()?;
        root.present()?;
    }
    Ok(out)
}

/// The colour of an srtt ratio: white at its calm level (1), deepening to red at 8x and
/// more, to blue below it; grey where the host sends nothing to that host.
fn ratio_colour(r: f64) -> RGBColor {
    if !r.is_finite() {
        return RGBColor(235, 235, 235);
    }
    let x = r.log2().clamp(-3.0, 3.0) / 3.0;
    let fade = |c: u8, k: f64| (255.0 - (255.0 - c as f64) * k).round() as u8;
    if x >= 0.0 {
        RGBColor(fade(214, x), fade(39, x), fade(40, x))
    } else {
        RGBColor(fade(31, -x), fade(119, -x), fade(180, -x))
    }
}

/// A host x host heat map of each host's srtt towards each other over its calm level: the
/// row of the culprit's egress and the column of its ingress stand out.
pub fn heat_map(title: &str, hosts: &[String], m: &[Vec<f64>]) -> Result<String, Box<dyn Error>> {
    let n = hosts.len();
    let cell = (480 / n.max(1)).clamp(40, 90) as i32;
    let (left, top) = (130, 70);
    let size = (
        (left + cell * n as i32 + 30) as u32,
        (top + cell * n as i32 + 40) as u32,
    );
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)?;
        let text = |s: &str, at: (i32, i32), size: i32| {
            Text::new(s.to_owned(), at, (FONT, size).into_font().color(&BLACK))
        };
        root.draw(&text(title, (10, 8), 15))?;
        root.draw(&text(
            "rows: the host sending; columns: the host it sends to; x calm srtt",
            (10, 30),
            12,
        ))?;
        for (i, h) in hosts.iter().enumerate() {
            let y = top + cell * i as i32;
            root.draw(&text(h, (8, y + cell / 2 - 6), 12))?;
            let x = left + cell * i as i32;
            root.draw(&text(h, (x + 2, top - 16), 10))?;
            for (j, r) in m.get(i).into_iter().flatten().enumerate() {
                let x = left + cell * j as i32;
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell - 2, y + cell - 2)],
                    ratio_colour(*r).filled(),
                ))?;
                if r.is_finite() {
                    root.draw(&text(&format!("{r:.1}"), (x + 6, y + cell / 2 - 6), 13))?;
                }
            }
        }
        root.present()?;
    }
    Ok(out)
}
