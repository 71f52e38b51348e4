//! The report's plots, drawn with `plotters` into SVG strings that the HTML
//! page inlines.
//!
//! Only the SVG backend is built (no `font-kit`, no system fonts): text is
//! written as SVG `<text>` elements in `sans-serif` and laid out by the
//! browser; plotters only estimates label widths to place them. (Its SVG
//! backend writes font sizes as `size / 1.24`, hence the sizes below.)
//! Ticks are chosen here, not by plotters: powers of two on thread and CPU
//! axes, 1-2-5 steps elsewhere. Colors are fixed per case name, so a design
//! has the same color in every plot; the legend sits right of the plot, so
//! it never hides data.

use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Pixel size of a line chart, legend included.
const SIZE: (u32, u32) = (900, 420);

/// Width kept right of a line chart's plotting area for its legend.
const LEGEND_WIDTH: u32 = 230;

/// Font sizes as plotters takes them (drawn at about 0.8 of these).
const TITLE_FONT: u32 = 21;
const LABEL_FONT: u32 = 15;
const AXIS_FONT: u32 = 16;

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Axis {
    /// Linear, from 0 (or the smallest value, if negative).
    #[default]
    Linear,
    /// Logarithmic with ticks at 1-2-5 or decades; values ≤ 0 are left out.
    Log,
    /// Logarithmic with a tick at every power of two (thread and CPU
    /// counts); values ≤ 0 are left out.
    Log2,
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A solid line.
    Line,
    /// A solid line with a dot on each point.
    LinePoints,
    /// A dashed line.
    Dashed,
    /// Hollow circles, no line.
    Points,
}

/// One series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// The legend entry (`None`: not in the legend).
    pub name: Option<String>,
    /// Whose color it takes (a case name; series of one case share it).
    pub color_of: String,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub style: Style,
}

/// A point measured elsewhere, drawn as a black marker; its label goes in
/// the legend (never beside the point, where it would cover the lines).
/// Marks with the same label share a marker shape.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Its legend entry.
    pub label: String,
    /// Position on the x axis.
    pub x: f64,
    /// Position on the y axis.
    pub y: f64,
}

/// A line chart.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// The title above it.
    pub title: String,
    /// The x axis' description.
    pub x_label: String,
    /// The y axis' description.
    pub y_label: String,
    /// How x values map.
    pub x_axis: Axis,
    /// How y values map.
    pub y_axis: Axis,
    /// The series.
    pub series: Vec<Series>,
    /// Published points.
    pub marks: Vec<Mark>,
    /// Extra legend lines that explain the styles (e.g. "dashed: ...").
    pub key: Vec<String>,
}

/// One bar of a bar chart.
#[derive(Debug, Clone)]
pub struct Bar {
    /// The label under it.
    pub label: String,
    /// Its height.
    pub value: f64,
    /// A note above it (e.g. the ratio).
    pub note: String,
    /// Whose color it takes.
    pub color_of: String,
}

/// Known case names and their colors; other names take the palette in
/// order of first appearance.
const NAMED: [(&str, RGBColor); 13] = [
    ("atomic", RGBColor(127, 127, 127)),
    ("batched", RGBColor(214, 39, 40)),
    ("pernode", RGBColor(255, 127, 14)),
    ("tree", RGBColor(31, 119, 180)),
    ("thread-local", RGBColor(44, 160, 44)),
    ("shared-atomic", RGBColor(0, 0, 0)),
    ("striped", RGBColor(148, 103, 189)),
    ("fast-counter", RGBColor(140, 86, 75)),
    ("padded-reader", RGBColor(31, 119, 180)),
    ("packed-reader", RGBColor(214, 39, 40)),
    ("padded-writer", RGBColor(120, 170, 210)),
    ("packed-writer", RGBColor(240, 140, 140)),
    ("truth", RGBColor(0, 0, 0)),
];

/// Colors for other names, in order: enough that the largest chart (the
/// `charge` suite's 11 cases) repeats none.
const PALETTE: [RGBColor; 16] = [
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(227, 119, 194),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(127, 127, 127),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(0, 0, 0),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
];

fn colors(names: &[&str]) -> Vec<RGBColor> {
    let mut next = 0;
    let mut seen: Vec<(&str, RGBColor)> = Vec::new();
    names
        .iter()
        .map(|&n| {
            if let Some(&(_, c)) = NAMED.iter().chain(seen.iter()).find(|(k, _)| *k == n) {
                return c;
            }
            let c = PALETTE[next % PALETTE.len()];
            next += 1;
            seen.push((n, c));
            c
        })
        .collect()
}

/// `1234` as `1.2K`, `3e6` as `3M`: short tick labels.
pub fn compact(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "K")
    } else {
        (v, "")
    };
    let s = if scaled.abs() >= 100.0 || scaled.fract().abs() < 1e-9 {
        format!("{scaled:.0}")
    } else if scaled.abs() >= 10.0 {
        format!("{scaled:.1}")
    } else {
        format!("{scaled:.2}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    };
    format!("{s}{suffix}")
}

impl Axis {
    /// The label of a tick at `v`: counts on a log2 axis in full (`4096`),
    /// other values compact (`10K`).
    fn label(self, v: f64) -> String {
        if self == Axis::Log2 && v.fract() == 0.0 && v < 1e5 {
            format!("{v:.0}")
        } else {
            compact(v)
        }
    }

    fn is_log(self) -> bool {
        self != Axis::Linear
    }

    /// Whether `v` can be drawn on this axis.
    fn admits(self, v: f64) -> bool {
        v.is_finite() && (!self.is_log() || v > 0.0)
    }

    /// The range covering `values`, with `room` (a factor of the span, or
    /// of the top on a log axis) above the data.
    fn range(self, values: &[f64], room: f64) -> (f64, f64) {
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo > hi {
            return if self.is_log() {
                (1.0, 10.0)
            } else {
                (0.0, 1.0)
            };
        }
        match self {
            Axis::Log | Axis::Log2 => (lo / 1.25, (hi * room).max(lo * 2.0)),
            Axis::Linear => {
                let lo = lo.min(0.0);
                (lo, hi + ((hi - lo) * room).max(1.0))
            }
        }
    }

    /// Tick positions inside `(lo, hi)` on a log axis (none on a linear
    /// one, whose ticks plotters places).
    fn ticks(self, (lo, hi): (f64, f64)) -> Vec<f64> {
        let mut ticks = Vec::new();
        match self {
            Axis::Log2 => {
                let mut v = lo.log2().ceil().exp2();
                while v <= hi {
                    ticks.push(v);
                    v *= 2.0;
                }
            }
            Axis::Log => {
                // 1-2-5 per decade when the range is short, decades otherwise.
                let steps: &[f64] = if hi / lo <= 1e3 {
                    &[1.0, 2.0, 5.0]
                } else {
                    &[1.0]
                };
                let mut decade = 10f64.powf(lo.log10().floor());
                while decade <= hi {
                    ticks.extend(
                        steps
                            .iter()
                            .map(|s| s * decade)
                            .filter(|v| (lo..=hi).contains(v)),
                    );
                    decade *= 10.0;
                }
            }
            // Plotters' own linear ticks are used.
            Axis::Linear => {}
        }
        ticks
    }
}

fn svg_error(e: impl std::fmt::Display) -> String {
    format!("drawing a plot: {e}")
}

/// Draw `chart` as an SVG document.
pub fn line_chart(chart: &Chart) -> Result<String, String> {
    let (xa, ya) = (chart.x_axis, chart.y_axis);
    let keep = |&(x, y): &(f64, f64)| xa.admits(x) && ya.admits(y);
    let series: Vec<Vec<(f64, f64)>> = chart
        .series
        .iter()
        .map(|s| s.points.iter().copied().filter(keep).collect())
        .collect();
    let marks: Vec<(&Mark, (f64, f64))> = chart
        .marks
        .iter()
        .map(|m| (m, (m.x, m.y)))
        .filter(|(_, p)| keep(p))
        .collect();
    let all: Vec<(f64, f64)> = series
        .iter()
        .flatten()
        .copied()
        .chain(marks.iter().map(|m| m.1))
        .collect();
    let xs: Vec<f64> = all.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = all.iter().map(|p| p.1).collect();
    let x = if xa.is_log() {
        xa.range(&xs, 1.25)
    } else {
        // Linear x axes (time) start at their first point, not at 0.
        let (lo, hi) = xa.range(&xs, 0.0);
        let first = xs.iter().copied().fold(hi, f64::min);
        (if first < hi { first } else { lo }, hi)
    };
    let y = ya.range(&ys, if ya.is_log() { 1.6 } else { 0.06 });
    // Log axes get their ticks from here; plotters' own linear ticks are
    // already 1-2-5 steps.
    let (x_ticks, y_ticks) = (xa.ticks(x), ya.ticks(y));
    let data = Data {
        chart,
        series,
        marks,
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(svg_error)?;
        let (x0, x1, y0, y1) = (x.0, x.1, y.0, y.1);
        let plot = match (xa.is_log(), ya.is_log()) {
            (false, false) => draw(&root, &data, x0..x1, y0..y1)?,
            (true, false) => draw(
                &root,
                &data,
                (x0..x1).log_scale().with_key_points(x_ticks),
                y0..y1,
            )?,
            (false, true) => draw(
                &root,
                &data,
                x0..x1,
                (y0..y1).log_scale().with_key_points(y_ticks),
            )?,
            (true, true) => draw(
                &root,
                &data,
                (x0..x1).log_scale().with_key_points(x_ticks),
                (y0..y1).log_scale().with_key_points(y_ticks),
            )?,
        };
        legend(&root, chart, plot)?;
        root.present().map_err(svg_error)?;
    }
    Ok(svg)
}

/// What a chart draws, after leaving out what its axes cannot show.
struct Data<'a> {
    chart: &'a Chart,
    series: Vec<Vec<(f64, f64)>>,
    marks: Vec<(&'a Mark, (f64, f64))>,
}

/// Draw axes, series and marks; returns the plotting area's pixel box
/// (right edge, top edge) for the legend.
fn draw<XS, YS>(
    root: &DrawingArea<SVGBackend, Shift>,
    data: &Data,
    x: XS,
    y: YS,
) -> Result<(i32, i32), String>
where
    XS: AsRangedCoord<Value = f64>,
    YS: AsRangedCoord<Value = f64>,
    XS::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    YS::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let chart = data.chart;
    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", TITLE_FONT))
        .margin(10)
        .margin_right(LEGEND_WIDTH)
        .x_label_area_size(46)
        .y_label_area_size(66)
        .build_cartesian_2d(x, y)
        .map_err(svg_error)?;
    let (xa, ya) = (chart.x_axis, chart.y_axis);
    let x_fmt = |v: &f64| xa.label(*v);
    let y_fmt = |v: &f64| ya.label(*v);
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", AXIS_FONT))
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(svg_error)?;

    let names: Vec<&str> = chart.series.iter().map(|s| s.color_of.as_str()).collect();
    for ((s, points), color) in chart.series.iter().zip(&data.series).zip(colors(&names)) {
        let line = color.stroke_width(2);
        let points = points.clone();
        match s.style {
            Style::Line | Style::LinePoints => {
                if s.style == Style::LinePoints {
                    ctx.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(svg_error)?;
                }
                ctx.draw_series(LineSeries::new(points, line))
                    .map_err(svg_error)?;
            }
            Style::Dashed => {
                ctx.draw_series(DashedLineSeries::new(points, 6, 4, line))
                    .map_err(svg_error)?;
            }
            Style::Points => {
                ctx.draw_series(points.into_iter().map(|p| Circle::new(p, 5, line)))
                    .map_err(svg_error)?;
            }
        }
    }
    let labels = mark_labels(&chart.marks);
    for (m, p) in &data.marks {
        let shape = labels.iter().position(|l| *l == m.label).unwrap_or(0);
        ctx.draw_series(std::iter::once(EmptyElement::at(*p) + marker(shape, 7)))
            .map_err(svg_error)?;
    }
    let (xr, yr) = ctx.plotting_area().get_pixel_range();
    Ok((xr.end, yr.start))
}

/// The legend, right of the plotting area whose top-right corner is
/// `(right, top)`: one line per named series, then the marks, then the key.
fn legend(
    root: &DrawingArea<SVGBackend, Shift>,
    chart: &Chart,
    (right, top): (i32, i32),
) -> Result<(), String> {
    let x = right + 16;
    let mut y = top + 8;
    let text = TextStyle::from(("sans-serif", LABEL_FONT).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    let names: Vec<&str> = chart.series.iter().map(|s| s.color_of.as_str()).collect();
    for (s, color) in chart.series.iter().zip(colors(&names)) {
        let Some(name) = &s.name else { continue };
        let line = color.stroke_width(2);
        match s.style {
            Style::Line | Style::LinePoints => {
                root.draw(&PathElement::new(vec![(x, y), (x + 24, y)], line))
                    .map_err(svg_error)?;
                if s.style == Style::LinePoints {
                    root.draw(&Circle::new((x + 12, y), 3, color.filled()))
                        .map_err(svg_error)?;
                }
            }
            Style::Dashed => {
                for (a, b) in [(0, 8), (14, 24)] {
                    root.draw(&PathElement::new(vec![(x + a, y), (x + b, y)], line))
                        .map_err(svg_error)?;
                }
            }
            Style::Points => {
                root.draw(&Circle::new((x + 12, y), 5, line))
                    .map_err(svg_error)?;
            }
        }
        root.draw(&Text::new(name.clone(), (x + 32, y), text.clone()))
            .map_err(svg_error)?;
        y += 20;
    }
    let labels = mark_labels(&chart.marks);
    if !labels.is_empty() {
        y += 4;
        root.draw(&Text::new(
            "published, measured elsewhere:",
            (x, y),
            text.clone(),
        ))
        .map_err(svg_error)?;
        y += 20;
        for (shape, label) in labels.iter().enumerate() {
            root.draw(&(EmptyElement::at((x + 12, y)) + marker(shape, 6)))
                .map_err(svg_error)?;
            root.draw(&Text::new(label.to_string(), (x + 32, y), text.clone()))
                .map_err(svg_error)?;
            y += 20;
        }
    }
    for line in &chart.key {
        y += 4;
        root.draw(&Text::new(line.clone(), (x, y), text.clone()))
            .map_err(svg_error)?;
        y += 16;
    }
    Ok(())
}

/// The distinct labels of `marks`, in order: marker shape `i` is label `i`'s.
fn mark_labels(marks: &[Mark]) -> Vec<&str> {
    let mut labels: Vec<&str> = Vec::new();
    for m in marks {
        if !labels.contains(&m.label.as_str()) {
            labels.push(&m.label);
        }
    }
    labels
}

/// Marker `shape` (a filled triangle, square, then circle), `size` pixels.
fn marker<DB: DrawingBackend>(shape: usize, size: i32) -> DynElement<'static, DB, (i32, i32)> {
    let style = BLACK.filled();
    match shape % 3 {
        0 => TriangleMarker::new((0, 0), size, style).into_dyn(),
        1 => Rectangle::new([(-size + 2, -size + 2), (size - 2, size - 2)], style).into_dyn(),
        _ => Circle::new((0, 0), size - 2, style).into_dyn(),
    }
}

/// Draw vertical bars, each with its note above it, as an SVG document.
/// On a log axis ([`Axis::Log`]) bars rise from below the smallest value,
/// so values that differ by orders of magnitude all stay visible.
pub fn bar_chart(title: &str, y_label: &str, y_axis: Axis, bars: &[Bar]) -> Result<String, String> {
    let values: Vec<f64> = bars
        .iter()
        .map(|b| b.value)
        .filter(|&v| y_axis.admits(v))
        .collect();
    let mut svg = String::new();
    {
        let height = 380 + labels_below(bars).map_or(0, |room| room - 40);
        let root =
            SVGBackend::with_string(&mut svg, (SIZE.0 - LEGEND_WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(svg_error)?;
        if y_axis.is_log() {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let (lo, hi) = if lo <= hi {
                (lo / 3.0, hi * 4.0)
            } else {
                (1.0, 10.0)
            };
            let ticks = Axis::Log.ticks((lo, hi));
            let y = (lo..hi).log_scale().with_key_points(ticks);
            draw_bars(&root, title, y_label, bars, y, lo, |v| v * 1.15)?;
        } else {
            let top = values.iter().copied().fold(0.0f64, f64::max).max(1e-9) * 1.2;
            draw_bars(&root, title, y_label, bars, 0.0..top, 0.0, |v| {
                v + top * 0.02
            })?;
        }
        root.present().map_err(svg_error)?;
    }
    Ok(svg)
}

/// Bars a chart sets side by side with their labels across; more get
/// their labels turned upright, each in the room under its bar.
const ACROSS: usize = 6;

/// The room (pixels) under a chart of `bars` for labels turned upright, if
/// it has more than [`ACROSS`] bars: enough for the longest label.
fn labels_below(bars: &[Bar]) -> Option<u32> {
    (bars.len() > ACROSS).then(|| {
        let longest = bars
            .iter()
            .map(|b| b.label.chars().count())
            .max()
            .unwrap_or(0);
        // About 8 px a character at the label size, and a gap.
        (longest as u32 * 8 + 16).clamp(40, 240)
    })
}

/// The space left and right of each bar in its segment: a quarter of the
/// segment, at most 24 px (a chart of many bars has narrow segments, and a
/// fixed margin wider than half a segment drew no bar at all).
fn bar_margin(bars: usize) -> u32 {
    let plot = f64::from(SIZE.0 - LEGEND_WIDTH - 66 - 24);
    let segment = plot / bars.max(1) as f64;
    ((segment / 4.0) as u32).min(24)
}

/// Bars from `base` to each value on the y axis `y`; each note at
/// `note_at(value)`.
fn draw_bars<YS>(
    root: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    y_label: &str,
    bars: &[Bar],
    y: YS,
    base: f64,
    note_at: impl Fn(f64) -> f64,
) -> Result<(), String>
where
    YS: AsRangedCoord<Value = f64>,
    YS::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    // Integer ranges are inclusive here: 0..n−1 is n segments.
    let last = bars.len().saturating_sub(1) as u32;
    let names: Vec<&str> = bars.iter().map(|b| b.color_of.as_str()).collect();
    {
        let mut ctx = ChartBuilder::on(root)
            .caption(title, ("sans-serif", TITLE_FONT))
            .margin(12)
            .x_label_area_size(labels_below(bars).unwrap_or(40))
            .y_label_area_size(66)
            .build_cartesian_2d((0u32..last).into_segmented(), y)
            .map_err(svg_error)?;
        // Upright labels are drawn below, each from the axis down (the
        // mesh centres a label on its tick, which would put half of an
        // upright one inside the plot).
        let upright = labels_below(bars).is_some();
        let label = |v: &SegmentValue<u32>| match v {
            SegmentValue::CenterOf(i) if !upright => bars
                .get(*i as usize)
                .map_or_else(String::new, |b| b.label.clone()),
            _ => String::new(),
        };
        let fmt = |v: &f64| compact(*v);
        ctx.configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len())
            .x_label_formatter(&label)
            .y_label_formatter(&fmt)
            .y_desc(y_label)
            .label_style(("sans-serif", LABEL_FONT))
            .axis_desc_style(("sans-serif", AXIS_FONT))
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(225, 225, 225))
            .draw()
            .map_err(svg_error)?;
        for (i, (b, color)) in bars.iter().zip(colors(&names)).enumerate() {
            if !(b.value.is_finite() && b.value > base) {
                continue;
            }
            let i = i as u32;
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), base),
                    (SegmentValue::Exact(i + 1), b.value),
                ],
                color.filled(),
            );
            let margin = bar_margin(bars.len());
            bar.set_margin(0, 0, margin, margin);
            ctx.draw_series(std::iter::once(bar)).map_err(svg_error)?;
            ctx.draw_series(std::iter::once(Text::new(
                b.note.clone(),
                (SegmentValue::CenterOf(i), note_at(b.value)),
                TextStyle::from(("sans-serif", LABEL_FONT).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))
            .map_err(svg_error)?;
        }
        if upright {
            let style = TextStyle::from(("sans-serif", LABEL_FONT).into_font())
                .transform(FontTransform::Rotate90)
                .pos(Pos::new(HPos::Left, VPos::Center));
            for (i, b) in bars.iter().enumerate() {
                let (x, y) = ctx.backend_coord(&(SegmentValue::CenterOf(i as u32), base));
                root.draw(&Text::new(b.label.clone(), (x, y + 8), style.clone()))
                    .map_err(svg_error)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contents of the SVG's `<text>` elements, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_owned())
            })
            .collect()
    }

    #[test]
    fn sixteen_names_take_sixteen_colors() {
        let names: Vec<String> = (0..16).map(|i| format!("case-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let c = colors(&names);
        for (i, a) in c.iter().enumerate() {
            assert!(!c[..i].contains(a), "{} repeats a color", names[i]);
        }
    }

    #[test]
    fn compact_labels_are_short() {
        assert_eq!(compact(1.0), "1");
        assert_eq!(compact(0.5), "0.5");
        assert_eq!(compact(1500.0), "1.5K");
        assert_eq!(compact(49_152.0), "49.2K");
        assert_eq!(compact(33_550_336.0), "33.6M");
        assert_eq!(compact(4096.0), "4.1K");
        assert_eq!(compact(100.0), "100");
    }

    #[test]
    fn a_log_log_chart_with_marks_renders_text_as_svg() {
        let chart = Chart {
            title: "bound vs CPUs".into(),
            x_label: "CPUs".into(),
            y_label: "units".into(),
            x_axis: Axis::Log2,
            y_axis: Axis::Log,
            series: vec![Series {
                name: Some("tree".into()),
                color_of: "tree".into(),
                points: vec![(2.0, 0.0), (8.0, 504.0), (4096.0, 372_736.0)],
                style: Style::Line,
            }],
            marks: vec![
                Mark {
                    label: "kernel".into(),
                    x: 384.0,
                    y: 49_152.0,
                },
                Mark {
                    label: "kernel".into(),
                    x: 512.0,
                    y: 49_152.0,
                },
            ],
            key: vec!["line: bound".into()],
        };
        let svg = line_chart(&chart).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        let texts = texts(&svg);
        for t in [
            "bound vs CPUs",
            "kernel",
            "tree",
            "line: bound",
            "4096",
            "10K",
        ] {
            assert!(texts.iter().any(|x| x == t), "{t:?} not in {texts:?}");
        }
        // A mark's label is written once, in the legend, not beside each
        // point where it would cover the lines.
        assert_eq!(texts.iter().filter(|x| *x == "kernel").count(), 1);
    }

    #[test]
    fn ticks_fall_on_powers_of_two_and_one_two_five() {
        assert_eq!(Axis::Log2.ticks((0.8, 10.0)), [1.0, 2.0, 4.0, 8.0]);
        assert_eq!(Axis::Log.ticks((0.15, 3.0)), [0.2, 0.5, 1.0, 2.0]);
        assert_eq!(
            Axis::Log.ticks((1.0, 1e6)),
            [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
        );
    }

    #[test]
    fn bars_carry_their_labels_and_notes() {
        let bars = [
            Bar {
                label: "padded".into(),
                value: 2.0,
                note: "×1.00".into(),
                color_of: "padded-reader".into(),
            },
            Bar {
                label: "packed".into(),
                value: 5.0,
                note: "×2.50".into(),
                color_of: "packed-reader".into(),
            },
        ];
        let svg = bar_chart("layout", "ns/op", Axis::Linear, &bars).unwrap();
        let texts = texts(&svg);
        assert!(texts.iter().any(|t| t == "packed"), "{texts:?}");
        assert!(texts.iter().any(|t| t == "×2.50"), "{texts:?}");
    }

    /// An attribute (`height`, `width`) of a bar chart's bars, in pixels
    /// (its filled rects other than the white background).
    fn bar_sizes(svg: &str, attr: &str) -> Vec<f64> {
        let key = format!("{attr}=\"");
        svg.split("<rect")
            .skip(1)
            .filter(|r| !r.contains("fill=\"#FFFFFF\""))
            .filter_map(|r| {
                let v = r.split(key.as_str()).nth(1)?;
                v[..v.find('"')?].parse().ok()
            })
            .collect()
    }

    /// The heights of a bar chart's bars.
    fn bar_heights(svg: &str) -> Vec<f64> {
        bar_sizes(svg, "height")
    }

    /// The widths of a bar chart's bars.
    fn bar_widths(svg: &str) -> Vec<f64> {
        bar_sizes(svg, "width")
    }

    #[test]
    fn a_chart_of_many_bars_draws_every_bar_with_its_label_upright() {
        let bars: Vec<Bar> = (0..22)
            .map(|i| Bar {
                label: format!("small-preload-jemalloc-{i}"),
                value: 1.0 + i as f64 / 10.0,
                note: format!("×{i}"),
                color_of: format!("case-{i}"),
            })
            .collect();
        let svg = bar_chart("preload", "ratio", Axis::Linear, &bars).unwrap();
        let widths = bar_widths(&svg);
        assert_eq!(widths.len(), 22, "{svg}");
        assert!(widths.iter().all(|&w| w >= 4.0), "{widths:?}");
        assert!(svg.contains("rotate(90"), "labels upright");
        // A short chart keeps its labels across.
        let few = bar_chart("layout", "ns", Axis::Linear, &bars[..3]).unwrap();
        assert!(!few.contains("rotate(90"), "{few}");
    }

    #[test]
    fn on_a_log_scale_bars_orders_of_magnitude_apart_all_show() {
        let bar = |label: &str, value: f64| Bar {
            label: label.into(),
            value,
            note: String::new(),
            color_of: label.into(),
        };
        let bars = [
            bar("walk", 120_000.0),
            bar("flush", 3_000.0),
            bar("idle", 80.0),
            bar("add", 1.5),
        ];
        let log = bar_heights(&bar_chart("stats", "ns", Axis::Log, &bars).unwrap());
        assert_eq!(log.len(), 4, "{log:?}");
        assert!(log.iter().all(|&h| h >= 20.0), "every bar visible: {log:?}");
        let linear = bar_heights(&bar_chart("stats", "ns", Axis::Linear, &bars).unwrap());
        assert!(
            linear.iter().filter(|&&h| h < 2.0).count() >= 2,
            "{linear:?}"
        );
    }

    #[test]
    fn an_empty_chart_still_draws() {
        let svg = line_chart(&Chart::default()).unwrap();
        assert!(svg.contains("<svg"));
    }
}
