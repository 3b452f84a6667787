//! The plots of `kvswitch bench`: line charts (linear or logarithmic axes, solid or dashed
//! series) and grouped bar charts, each written as an SVG file and a PNG file from one drawing.
//!
//! Text is set in DejaVu Sans, read at run time from Debian's fonts-dejavu-core package, so the
//! binary carries no font and the PNG needs no system font library. Draws only what it is given.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Where fonts-dejavu-core puts the font, and its old location.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];
/// The family name the charts ask for; the font above is registered under it.
const FAMILY: &str = "sans-serif";
/// Pixels of every plot.
pub const SIZE: (u32, u32) = (1200, 640);

/// Colours of the series, in order: distinct for readers with the common colour deficiencies
/// (Okabe and Ito's palette).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// One line of a line chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    /// (x, y), drawn in this order; points not finite (or not positive on a log axis) are
    /// left out.
    pub points: Vec<(f64, f64)>,
    /// Index into the palette: series of one system share a colour.
    pub color: usize,
    pub dashed: bool,
}

/// A line chart with a legend.
#[derive(Clone, Debug)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    /// Start the y axis at zero (linear axis only) rather than at the smallest value.
    pub y_from_zero: bool,
    pub series: Vec<Series>,
}

/// Bars grouped by category (one bar per group member), with an optional horizontal line.
#[derive(Clone, Debug)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (name, one value per category).
    pub groups: Vec<(String, Vec<f64>)>,
    /// (label, y): e.g. a server's capacity.
    pub line: Option<(String, f64)>,
    /// One bar per category with the groups stacked in order, rather than side by side.
    pub stacked: bool,
}

/// A chart of either kind.
#[derive(Clone, Debug)]
pub enum Chart {
    Line(LineChart),
    Bars(BarChart),
}

/// Draws `chart` into `<stem>.svg` and `<stem>.png` and returns both paths.
pub fn write(chart: &Chart, stem: &Path) -> anyhow::Result<[PathBuf; 2]> {
    load_font()?;
    let svg_path = stem.with_extension("svg");
    let png_path = stem.with_extension("png");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw(chart, &root)?;
        root.present()
            .map_err(|e| anyhow!("drawing the SVG: {e}"))?;
    }
    std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
    let mut rgb = vec![0u8; SIZE.0 as usize * SIZE.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
        draw(chart, &root)?;
        root.present()
            .map_err(|e| anyhow!("drawing the PNG: {e}"))?;
    }
    let png = encode_png(SIZE.0, SIZE.1, &rgb).context("encoding the PNG")?;
    std::fs::write(&png_path, png).with_context(|| format!("writing {}", png_path.display()))?;
    Ok([svg_path, png_path])
}

/// Why the plots' font could not be loaded; every later plot of the run fails the same way.
#[derive(Debug, Clone, Copy, thiserror::Error)]
enum FontError {
    #[error(
        "no DejaVu Sans font at {}: install fonts-dejavu-core (bash scripts/setup.sh)",
        FONT_PATHS.join(" or ")
    )]
    Missing,
    /// The file at this path did not load as a font.
    #[error("{0} is not a TrueType font")]
    NotTrueType(&'static str),
}

/// Reads DejaVu Sans once and registers it for both backends.
fn load_font() -> Result<(), FontError> {
    static LOADED: OnceLock<Result<(), FontError>> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let Some((path, bytes)) = FONT_PATHS
            .iter()
            .find_map(|p| std::fs::read(p).ok().map(|b| (*p, b)))
        else {
            return Err(FontError::Missing);
        };
        // Registered fonts live as long as the process: leaked once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FAMILY, FontStyle::Normal, bytes)
            .map_err(|_| FontError::NotTrueType(path))
    })
}

fn draw<DB: DrawingBackend>(chart: &Chart, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    match chart {
        Chart::Line(c) => draw_line(c, root),
        Chart::Bars(c) => draw_bars(c, root),
    }
}

/// The range of the values drawn on one axis, widened so no point sits on the frame: by a
/// factor on a log axis, by 5% on a linear one.
fn span(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Option<Range<f64>> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return None;
    }
    if log {
        if hi / lo < 10.0 {
            let mid = (hi * lo).sqrt();
            return Some(mid / 3.5..mid * 3.5);
        }
        return Some(lo / 1.3..hi * 1.3);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        hi.abs().max(1.0) * 0.1
    };
    let lo = if from_zero && lo >= 0.0 {
        0.0
    } else {
        lo - pad
    };
    Some(lo..hi + pad)
}

fn drawable(c: &LineChart) -> impl Iterator<Item = (f64, f64)> + '_ {
    c.series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|&(x, y)| {
            x.is_finite() && y.is_finite() && (!c.x_log || x > 0.0) && (!c.y_log || y > 0.0)
        })
}

fn draw_line<DB: DrawingBackend>(
    c: &LineChart,
    root: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let Some(xr) = span(drawable(c).map(|p| p.0), c.x_log, false) else {
        bail!("{}: nothing to plot", c.title);
    };
    let yr = span(drawable(c).map(|p| p.1), c.y_log, c.y_from_zero)
        .ok_or_else(|| anyhow!("{}: nothing to plot", c.title))?;
    // The legend gets a panel of its own on the right, so it never hides a curve.
    let (plot, legend) = root.split_horizontally(SIZE.0 * 72 / 100);
    match (c.x_log, c.y_log) {
        (false, false) => line_in(c, &plot, xr, yr)?,
        (true, false) => line_in(c, &plot, xr.log_scale(), yr)?,
        (false, true) => line_in(c, &plot, xr, yr.log_scale())?,
        (true, true) => line_in(c, &plot, xr.log_scale(), yr.log_scale())?,
    }
    draw_legend(c, &legend)
}

/// One row per series: a stretch of its line (dashed if it is), its marker and its name.
fn draw_legend<DB: DrawingBackend>(
    c: &LineChart,
    area: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {}: {e}", c.title);
    let font = (FAMILY, 15).into_font().color(&BLACK);
    for (i, s) in c.series.iter().enumerate() {
        let y = 70 + 24 * i as i32;
        let color = PALETTE[s.color % PALETTE.len()];
        let style = color.stroke_width(2);
        if s.dashed {
            for x in [4, 17, 30] {
                area.draw(&PathElement::new(vec![(x, y), (x + 8, y)], style))
                    .map_err(e)?;
            }
            area.draw(&TriangleMarker::new((21, y), 4, color.filled()))
                .map_err(e)?;
        } else {
            area.draw(&PathElement::new(vec![(4, y), (38, y)], style))
                .map_err(e)?;
            area.draw(&Circle::new((21, y), 3, color.filled()))
                .map_err(e)?;
        }
        area.draw(&Text::new(
            s.name.clone(),
            (46, y),
            font.pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(e)?;
    }
    Ok(())
}

fn line_in<DB, X, Y>(c: &LineChart, root: &DrawingArea<DB, Shift>, x: X, y: Y) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {}: {e}", c.title);
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x, y)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .axis_desc_style((FAMILY, 18))
        .label_style((FAMILY, 15))
        .x_label_formatter(&|v| number(*v))
        .y_label_formatter(&|v| number(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    for s in &c.series {
        let color = PALETTE[s.color % PALETTE.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| {
                x.is_finite() && y.is_finite() && (!c.x_log || x > 0.0) && (!c.y_log || y > 0.0)
            })
            .collect();
        let style = color.stroke_width(2);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(points.clone(), 8, 5, style))
                .map_err(e)?;
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(e)?;
        }
        let dashed = s.dashed;
        let marker = |p: (f64, f64)| -> DynElement<DB, (f64, f64)> {
            if dashed {
                TriangleMarker::new(p, 4, color.filled()).into_dyn()
            } else {
                Circle::new(p, 3, color.filled()).into_dyn()
            }
        };
        chart
            .draw_series(points.into_iter().map(marker))
            .map_err(e)?;
    }
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(
    c: &BarChart,
    root: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {}: {e}", c.title);
    if c.categories.is_empty() || c.groups.is_empty() {
        bail!("{}: nothing to plot", c.title);
    }
    let n = c.categories.len();
    let value = |g: usize, i: usize| {
        c.groups[g]
            .1
            .get(i)
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .unwrap_or(0.0)
    };
    let tallest = if c.stacked {
        (0..n)
            .map(|i| (0..c.groups.len()).map(|g| value(g, i)).sum::<f64>())
            .fold(0.0, f64::max)
    } else {
        (0..n)
            .flat_map(|i| (0..c.groups.len()).map(move |g| (g, i)))
            .map(|(g, i)| value(g, i))
            .fold(0.0, f64::max)
    };
    let top = c.line.iter().map(|l| l.1).fold(tallest, f64::max);
    let top = if top > 0.0 { top * 1.25 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, 24))
        .margin(16)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top)
        .map_err(e)?;
    let categories = c.categories.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .axis_desc_style((FAMILY, 18))
        .label_style((FAMILY, 15))
        .x_labels(n)
        .x_label_formatter(&move |v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < categories.len() {
                categories[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| number(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    let members = c.groups.len();
    let width = if c.stacked { 0.6 } else { 0.8 / members as f64 };
    for (g, (name, _)) in c.groups.iter().enumerate() {
        let color = PALETTE[g % PALETTE.len()];
        let bars = (0..n).map(|i| {
            let v = value(g, i);
            if c.stacked {
                let below: f64 = (0..g).map(|h| value(h, i)).sum();
                let x0 = i as f64 - width / 2.0;
                Rectangle::new([(x0, below), (x0 + width, below + v)], color.filled())
            } else {
                let x0 = i as f64 - 0.4 + g as f64 * width;
                Rectangle::new(
                    [(x0 + width * 0.05, 0.0), (x0 + width * 0.95, v)],
                    color.filled(),
                )
            }
        });
        chart
            .draw_series(bars)
            .map_err(e)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    if let Some((label, y)) = &c.line {
        let style = RGBColor(90, 90, 90).stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(-0.5, *y), (n as f64 - 0.5, *y)],
                8,
                5,
                style,
            ))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 7, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 15))
        .draw()
        .map_err(e)?;
    Ok(())
}

/// An axis label: 12,000 as "12k", 0.5 as "0.5", 1,500,000 as "1.5M".
fn number(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 1e3 {
        format!("{}k", trim(format!("{:.2}", v / 1e3)))
    } else if a >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.1}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

/// A PNG of 8-bit RGB pixels, row by row.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers() {
        assert_eq!(number(12_000.0), "12k");
        assert_eq!(number(2_500.0), "2.5k");
        assert_eq!(number(1_500_000.0), "1.5M");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(250.0), "250");
        assert_eq!(number(2.25), "2.2");
        assert_eq!(number(7.0), "7");
    }

    #[test]
    fn spans_leave_room() {
        let r = span([1.0, 1000.0].into_iter(), true, false).unwrap();
        assert!(r.start < 1.0 && r.end > 1000.0);
        let r = span([5.0, 10.0].into_iter(), false, true).unwrap();
        assert_eq!(r.start, 0.0);
        assert!(r.end > 10.0);
        assert!(span([f64::NAN, -1.0].into_iter(), true, false).is_none());
        let one = span([3.0].into_iter(), false, false).unwrap();
        assert!(one.start < 3.0 && one.end > 3.0);
    }

    #[test]
    fn png_chunks_are_well_formed() {
        let png = encode_png(2, 1, &[255, 0, 0, 0, 0, 255]).unwrap();
        // The eight bytes every PNG file starts with.
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
        // IEND's CRC is a constant of the format.
        assert_eq!(&png[png.len() - 4..], &[0xae, 0x42, 0x60, 0x82]);
    }
}
