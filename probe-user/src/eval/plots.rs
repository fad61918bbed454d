//! The SVG figures of `probe eval`: precision-recall curves of the model and the baselines,
//! and a timeline of one entity (signal with its events, model score against the
//! threshold, and who alarmed when).
//!
//! Plotters is built without `ttf`: text is laid out by its naive font estimate and the SVG
//! backend writes it as `<text>`, so titles, axis labels and legends need no font files.
//! Empty inputs draw an empty chart (axes, title, no lines) rather than failing.
use std::{error::Error, ops::Range, path::Path};

use anyhow::anyhow;
use plotters::{
    coord::{types::RangedCoordf64, Shift},
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

// Maximal runs of true: event spans, alarm marks, and the finite stretches of a line.
use super::metrics::alarm_episodes;

/// One precision-recall curve: (recall, precision) points, both in 0..1.
pub struct Curve {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// What `timeline` draws; all slices are per tick and of the same length.
pub struct Timeline<'a> {
    pub title: String,
    /// Seconds from the start.
    pub t: &'a [f64],
    /// The signal (e.g. RTT p99 in ms); NaN is a gap.
    pub value: &'a [f64],
    pub value_label: String,
    /// Event state per tick; these spans are shaded.
    pub events: &'a [bool],
    /// Model score, 0..1.
    pub score: &'a [f64],
    pub threshold: f64,
    /// Per baseline: its name and its alarm per tick.
    pub alarms: &'a [(String, Vec<bool>)],
}

type DrawResult = Result<(), Box<dyn Error>>;

pub const FONT: &str = "sans-serif";
/// Tableau's ten colours: distinct, and readable by most colour-blind readers.
pub const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
/// The model is series 0 everywhere (first PR curve, first alarm row): its score line too.
const SCORE_COLOUR: RGBColor = COLOURS[0];
const VALUE_COLOUR: RGBColor = RGBColor(60, 60, 60);
const THRESHOLD_COLOUR: RGBColor = COLOURS[3];
/// Outside the series palette, so that shading never reads as a series.
const EVENT_COLOUR: RGBColor = RGBColor(250, 128, 114);

/// The i-th series colour; past ten, plotters' 99-colour palette keeps them distinct.
fn colour(i: usize) -> RGBAColor {
    match COLOURS.get(i) {
        Some(c) => c.to_rgba(),
        None => Palette99::pick(i).to_rgba(),
    }
}

/// Precision-recall curves, one line per curve in its own colour with a legend, 800x600.
/// Non-finite points are skipped; an empty `curves` (or a curve without points) draws
/// the axes alone.
pub fn pr_curves(path: &Path, title: &str, curves: &[Curve]) -> anyhow::Result<()> {
    let axes = ("recall", "precision", SeriesLabelPosition::LowerLeft);
    draw_curves(path, title, axes, curves)
        .map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))
}

/// A reliability diagram: the observed share of positives against the mean predicted
/// probability per bin, beside the diagonal a calibrated model follows. 800x600.
pub fn reliability(path: &Path, title: &str, points: &[(f64, f64)]) -> anyhow::Result<()> {
    let curves = [
        Curve {
            name: "model".into(),
            points: points.to_vec(),
        },
        Curve {
            name: "calibrated".into(),
            points: vec![(0.0, 0.0), (1.0, 1.0)],
        },
    ];
    let axes = (
        "predicted probability",
        "observed share",
        SeriesLabelPosition::UpperLeft,
    );
    draw_curves(path, title, axes, &curves)
        .map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))
}

fn draw_curves(
    path: &Path,
    title: &str,
    (x_desc, y_desc, legend): (&str, &str, SeriesLabelPosition),
    curves: &[Curve],
) -> DrawResult {
    let root = SVGBackend::new(path, (800, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..1f64, 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()?;
    for (i, c) in curves.iter().enumerate() {
        let style = ShapeStyle::from(colour(i)).stroke_width(2);
        let points = c
            .points
            .iter()
            .copied()
            .filter(|(r, p)| r.is_finite() && p.is_finite());
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(c.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
    }
    if !curves.is_empty() {
        // PR curves start high on the left and fall to the right: their legend goes lower
        // left.
        chart
            .configure_series_labels()
            .position(legend)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    // Explicitly, so that a write error is reported (dropping the backend ignores it).
    root.present()?;
    Ok(())
}

/// Three stacked panels over one time axis (seconds), 1000x700: the value with the event
/// spans shaded; the model score with the threshold as a dashed line; one row of marks per
/// alarm series (the model's, score >= threshold, then each baseline), named on the left.
/// A tick's state covers [t_i, t_{i+1}) (the last tick as long as the one before). Errs if
/// the slices differ in length.
pub fn timeline(path: &Path, tl: &Timeline) -> anyhow::Result<()> {
    draw_timeline(path, tl).map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))
}

/// Where tick i's span ends: the next tick, or for the last one, as far as the previous
/// interval (so that a final one-tick run is still visible).
fn tick_end(t: &[f64], i: usize) -> f64 {
    match (t.get(i + 1), i.checked_sub(1).and_then(|p| t.get(p))) {
        (Some(&next), _) => next,
        (None, Some(&prev)) => t[i] + (t[i] - prev),
        (None, None) => t[i],
    }
}

/// The finite range of `v`, widened when degenerate or empty so that the axis exists,
/// with `pad` of its span added on both sides.
fn span(v: impl Iterator<Item = f64>, pad: f64) -> Range<f64> {
    let (lo, hi) = v
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if lo > hi {
        return 0.0..1.0;
    }
    if lo == hi {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return lo - d..hi + d;
    }
    let d = (hi - lo) * pad;
    lo - d..hi + d
}

/// Draws the finite stretches of (t, v) as lines (isolated points as dots), so that
/// NaN gaps stay gaps.
fn draw_gappy<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    t: &[f64],
    v: &[f64],
    style: ShapeStyle,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ok: Vec<bool> = t
        .iter()
        .zip(v)
        .map(|(t, v)| t.is_finite() && v.is_finite())
        .collect();
    for (a, b) in alarm_episodes(&ok) {
        if a == b {
            chart.draw_series(std::iter::once(Circle::new(
                (t[a], v[a]),
                2,
                style.filled(),
            )))?;
        } else {
            chart.draw_series(LineSeries::new((a..=b).map(|i| (t[i], v[i])), style))?;
        }
    }
    Ok(())
}

/// A timeline panel: the same left label area and margins in every panel keep their x
/// axes aligned.
fn panel<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    x_labels: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(area);
    b.margin_left(10)
        .margin_right(20)
        .margin_top(8)
        .y_label_area_size(120)
        .x_label_area_size(x_labels);
    b
}

/// A threshold for the legend: three decimals at most, trailing zeros dropped.
fn short(v: f64) -> String {
    let s = format!("{v:.3}");
    match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').to_owned(),
        false => s,
    }
}

/// The middle panel of a timeline: the score against the threshold. 0..1 unless the score
/// or the threshold leave it; a threshold that is not finite (no usable threshold) is not
/// drawn.
fn draw_score(
    mid: &DrawingArea<SVGBackend<'_>, Shift>,
    xr: Range<f64>,
    tl: &Timeline,
) -> DrawResult {
    let thr = tl.threshold.is_finite().then_some(tl.threshold);
    let (slo, shi) = tl
        .score
        .iter()
        .copied()
        .chain(thr)
        .filter(|s| s.is_finite())
        .fold((0f64, 1f64), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let pad = (shi - slo) * 0.05;
    let lo = if slo < 0.0 { slo - pad } else { 0.0 };
    let mut c = panel(mid, 0).build_cartesian_2d(xr.clone(), lo..shi + pad)?;
    c.configure_mesh().y_desc("score").y_labels(5).draw()?;
    let score_style = ShapeStyle::from(SCORE_COLOUR).stroke_width(1);
    draw_gappy(&mut c, tl.t, tl.score, score_style)?;
    let thr_style = ShapeStyle::from(THRESHOLD_COLOUR).stroke_width(1);
    if let Some(thr) = thr {
        c.draw_series(DashedLineSeries::new(
            [(xr.start, thr), (xr.end, thr)],
            6,
            4,
            thr_style,
        ))?;
    }
    // Legend entries stand on their own (empty series), so a gappy score still gets one.
    c.draw_series(std::iter::empty::<Circle<(f64, f64), u32>>())?
        .label("score")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], score_style));
    c.draw_series(std::iter::empty::<Circle<(f64, f64), u32>>())?
        .label(format!("threshold {}", short(tl.threshold)))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], thr_style));
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn draw_timeline(path: &Path, tl: &Timeline) -> DrawResult {
    let n = tl.t.len();
    let lengths = [
        ("value", tl.value.len()),
        ("events", tl.events.len()),
        ("score", tl.score.len()),
    ]
    .into_iter()
    .chain(tl.alarms.iter().map(|(name, a)| (name.as_str(), a.len())));
    for (what, len) in lengths {
        if len != n {
            return Err(format!("{what} has {len} ticks, t has {n}").into());
        }
    }
    let model_alarm: Vec<bool> = tl.score.iter().map(|&s| s >= tl.threshold).collect();
    let rows: Vec<(&str, &[bool])> = std::iter::once(("model", model_alarm.as_slice()))
        .chain(
            tl.alarms
                .iter()
                .map(|(name, a)| (name.as_str(), a.as_slice())),
        )
        .collect();

    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let body = root.titled(&tl.title, (FONT, 20))?;
    let h = body.dim_in_pixel().1;
    let (top, rest) = body.split_vertically(h * 45 / 100);
    let (mid, bottom) = rest.split_vertically(h * 28 / 100);

    // Up to the end of the last tick's span, so that a final alarm or event shows.
    let xr = span(
        tl.t.iter()
            .copied()
            .chain(n.checked_sub(1).map(|l| tick_end(tl.t, l))),
        0.0,
    );

    // Top: the value, events shaded behind it.
    let vr = span(tl.value.iter().copied(), 0.05);
    let mut c = panel(&top, 0).build_cartesian_2d(xr.clone(), vr.clone())?;
    c.configure_mesh()
        .y_desc(tl.value_label.as_str())
        .y_labels(6)
        .draw()?;
    let shade = EVENT_COLOUR.mix(0.25).filled();
    c.draw_series(
        alarm_episodes(tl.events).into_iter().map(|(a, b)| {
            Rectangle::new([(tl.t[a], vr.start), (tick_end(tl.t, b), vr.end)], shade)
        }),
    )?;
    draw_gappy(
        &mut c,
        tl.t,
        tl.value,
        ShapeStyle::from(VALUE_COLOUR).stroke_width(1),
    )?;

    draw_score(&mid, xr.clone(), tl)?;

    // Bottom: one row per alarm series, the first (model) on top; a row's y is centred on
    // rows - r - 0.5.
    let nr = rows.len() as f64;
    let mut c = panel(&bottom, 40).build_cartesian_2d(xr.clone(), 0f64..nr)?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_labels(0)
        .disable_y_mesh()
        .draw()?;
    for (r, (_, alarm)) in rows.iter().enumerate() {
        let y = nr - r as f64 - 0.5;
        let fill = colour(r).filled();
        c.draw_series(alarm_episodes(alarm).into_iter().map(|(a, b)| {
            Rectangle::new([(tl.t[a], y - 0.3), (tick_end(tl.t, b), y + 0.3)], fill)
        }))?;
    }
    // Row names in the label area, right-aligned against the axis: drawn on the root,
    // whose pixel coordinates are the backend's.
    let name_style = TextStyle::from((FONT, 13)).pos(Pos::new(HPos::Right, VPos::Center));
    for (r, (name, _)) in rows.iter().enumerate() {
        let (px, py) = c.backend_coord(&(xr.start, nr - r as f64 - 0.5));
        root.draw(&Text::new(
            name.to_string(),
            (px - 8, py),
            name_style.clone(),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    /// Elements of a kind whose attributes mention `needle` (e.g. a stroke colour).
    fn count(svg: &str, element: &str, needle: &str) -> usize {
        svg.split('<')
            .filter(|e| e.starts_with(element) && e.contains(needle))
            .count()
    }

    /// The contents of the `<text>` elements, trimmed.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|e| Some(e[e.find('>')? + 1..e.find("</text>")?].trim()))
            .collect()
    }

    fn has_text(svg: &str, text: &str) -> bool {
        texts(svg).contains(&text)
    }

    fn rgb(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    #[test]
    fn pr_curves_draws_one_line_per_curve_with_legend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pr.svg");
        let curves = vec![
            Curve {
                name: "model-xyz".into(),
                points: vec![(0.0, 1.0), (0.5, 0.8), (1.0, 0.3)],
            },
            Curve {
                name: "ewma-ratio".into(),
                points: vec![(0.0, 1.0), (f64::NAN, 0.5), (1.0, 0.2)],
            },
            Curve {
                name: "zscore".into(),
                points: vec![(0.2, 0.6), (1.0, 0.1)],
            },
        ];
        pr_curves(&path, "Precision vs recall", &curves).unwrap();
        let svg = read(&path);
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        for text in [
            "Precision vs recall",
            "model-xyz",
            "ewma-ratio",
            "zscore",
            "recall",
            "precision",
        ] {
            assert!(has_text(&svg, text), "no text {text}");
        }
        // Each curve: its line and its legend sample, in its own colour.
        for (i, c) in COLOURS.iter().take(3).enumerate() {
            assert_eq!(count(&svg, "polyline", &rgb(*c)), 2, "curve {i}");
        }
        // Nothing else but the black mesh lines.
        let black = count(&svg, "polyline", "#000000");
        assert_eq!(count(&svg, "polyline", "") - black, 6);
    }

    #[test]
    fn pr_curves_empty_inputs_draw_an_empty_chart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.svg");
        pr_curves(&path, "nothing", &[]).unwrap();
        let svg = read(&path);
        assert!(svg.starts_with("<svg") && has_text(&svg, "nothing"));
        assert_eq!(
            count(&svg, "polyline", ""),
            count(&svg, "polyline", "#000000")
        );
        // A curve without points is still named in the legend.
        pr_curves(
            &path,
            "t",
            &[Curve {
                name: "no-points".into(),
                points: vec![],
            }],
        )
        .unwrap();
        assert!(has_text(&read(&path), "no-points"));
    }

    #[test]
    fn write_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("pr.svg");
        let e = pr_curves(&path, "t", &[]).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn timeline_panels_and_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tl.svg");
        let t: Vec<f64> = (0..10).map(|i| i as f64 * 2.0).collect();
        // Two finite stretches (a NaN gap at tick 4) and one isolated point (tick 9).
        let value = [1.0, 2.0, 3.0, 2.0, f64::NAN, 5.0, 6.0, 4.0, f64::NAN, 3.0];
        let events = [
            false, false, true, true, false, false, true, false, false, false,
        ];
        let score = [0.1, 0.2, 0.7, 0.9, 0.4, 0.6, 0.8, 0.2, 0.1, 0.1];
        let alarms = vec![
            (
                "ewma-ratio".to_string(),
                vec![
                    false, true, true, false, false, false, false, false, false, true,
                ],
            ),
            ("zscore".to_string(), vec![false; 10]),
        ];
        let tl = Timeline {
            title: "rdma0 timeline".into(),
            t: &t,
            value: &value,
            value_label: "RTT p99 (ms)".into(),
            events: &events,
            score: &score,
            threshold: 0.5,
            alarms: &alarms,
        };
        timeline(&path, &tl).unwrap();
        let svg = read(&path);
        assert!(svg.starts_with("<svg"));
        for text in [
            "rdma0 timeline",
            "RTT p99 (ms)",
            "score",
            "threshold 0.5",
            "time (s)",
            "model",
            "ewma-ratio",
            "zscore",
        ] {
            assert!(has_text(&svg, text), "no text {text}");
        }
        // Value: two stretches as lines, the lone point as a circle.
        assert_eq!(count(&svg, "polyline", &rgb(VALUE_COLOUR)), 2);
        assert_eq!(count(&svg, "circle", &rgb(VALUE_COLOUR)), 1);
        // Score: no gaps -> one line, plus its legend sample; threshold: dashes + sample.
        assert_eq!(count(&svg, "polyline", &rgb(SCORE_COLOUR)), 2);
        assert!(count(&svg, "polyline", &rgb(THRESHOLD_COLOUR)) > 2);
        // Event spans: ticks 2-3 and 6.
        assert_eq!(count(&svg, "rect", &rgb(EVENT_COLOUR)), 2);
        // Model alarm row (score >= 0.5): ticks 2-3 and 5-6, in the first colour;
        // ewma-ratio: ticks 1-2 and 9, in the second; zscore: none, in the third.
        assert_eq!(count(&svg, "rect", &rgb(COLOURS[0])), 2);
        assert_eq!(count(&svg, "rect", &rgb(COLOURS[1])), 2);
        assert_eq!(count(&svg, "rect", &rgb(COLOURS[2])), 0);
    }

    #[test]
    fn timeline_without_a_finite_threshold() {
        // No usable threshold (e.g. no positives to pick one): no line, no model alarms,
        // and the score axis stays 0..1 rather than stretching to infinity.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tl.svg");
        let tl = Timeline {
            title: "no threshold".into(),
            t: &[0.0, 1.0, 2.0],
            value: &[1.0, 2.0, 3.0],
            value_label: "v".into(),
            events: &[false; 3],
            score: &[0.2, 0.4, 0.9],
            threshold: f64::INFINITY,
            alarms: &[],
        };
        timeline(&path, &tl).unwrap();
        let svg = read(&path);
        assert_eq!(count(&svg, "polyline", &rgb(THRESHOLD_COLOUR)), 1); // the legend sample
        assert_eq!(count(&svg, "rect", &rgb(COLOURS[0])), 0);
        let odd: Vec<&str> = texts(&svg)
            .into_iter()
            .filter(|t| t.contains("inf") || t.contains("NaN"))
            .collect();
        assert_eq!(odd, ["threshold inf"]);
    }

    #[test]
    fn short_thresholds() {
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(0.73456), "0.735");
        assert_eq!(short(2.0), "2");
        assert_eq!(short(f64::INFINITY), "inf");
    }

    #[test]
    fn timeline_empty_and_mismatched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tl.svg");
        let tl = Timeline {
            title: "empty".into(),
            t: &[],
            value: &[],
            value_label: "v".into(),
            events: &[],
            score: &[],
            threshold: 0.5,
            alarms: &[],
        };
        timeline(&path, &tl).unwrap();
        let svg = read(&path);
        assert!(svg.starts_with("<svg") && has_text(&svg, "empty") && has_text(&svg, "model"));
        let alarms = vec![("short".to_string(), vec![true])];
        let tl = Timeline {
            t: &[0.0, 1.0],
            value: &[1.0, 2.0],
            events: &[false, false],
            score: &[0.0, 1.0],
            alarms: &alarms,
            ..tl
        };
        let e = timeline(&path, &tl).unwrap_err().to_string();
        assert!(
            e.contains("short") && e.contains(&path.display().to_string()),
            "{e}"
        );
    }
}
