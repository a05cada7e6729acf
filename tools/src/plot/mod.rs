//! Plots of memory over a trace's events (`flare-replay --plot`, issue 38): one line
//! of physical memory per reuse policy, the bytes live and the lower bound, drawn as
//! SVG or PNG with plotters. The text is laid out with DejaVu Sans, compiled in
//! (`assets/fonts/`, its licence beside it), so no system font is needed.
//!
//! Each line is drawn from runs of events (a few thousand per trace at most,
//! [`MAX_POINTS`]); a run is drawn at the largest value any of its events reached, so
//! no peak is lost to the sampling.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

mod series;

pub use series::live_bytes;

/// The most runs a line is drawn from: events are grouped in runs of
/// `ceil(events / MAX_POINTS)` (an SVG of a few hundred kilobytes at most).
pub const MAX_POINTS: u64 = 2000;

/// Width and height of the picture, pixels.
pub const SIZE: (u32, u32) = (1100, 620);

/// DejaVu Sans (Bitstream Vera licence: `assets/fonts/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// One line of the plot: runs of events `[first, end)` and the largest value, in
/// bytes, of each run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The legend's text (a policy's name, "live bytes").
    pub label: String,
    /// `(first event, end event, bytes)`, in event order.
    pub runs: Vec<(u64, u64, u64)>,
    /// The event at which the line stops because the replay ran out of memory there
    /// (drawn with a cross and "out of memory"), if it did.
    pub out_of_memory_at_event: Option<u64>,
}

/// What a memory plot shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlot {
    /// The title (the trace's name and its events).
    pub title: String,
    /// The trace's events: the x axis runs from 0 to this.
    pub events: u64,
    /// Physical memory, one line per policy (bytes).
    pub policies: Vec<Line>,
    /// The bytes live over the events.
    pub live: Line,
    /// The lower bound (bytes): the peak of live bytes rounded up to the
    /// granularity, drawn as a dashed level line.
    pub lower_bound_bytes: u64,
}

/// The picture formats, from the output path's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.svg`
    Svg,
    /// `.png`
    Png,
}

/// Errors of [`Format::of`] and [`write()`].
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The path does not end in `.svg` or `.png` (case-insensitive).
    #[error("{0}: a plot is written as .svg or .png (from the file's extension)")]
    Format(String),
    /// Drawing or writing the picture failed (the file cannot be created, say).
    #[error("{path}: {message}")]
    Draw {
        /// The output path.
        path: String,
        /// What plotters reported.
        message: String,
    },
}

impl Format {
    /// The format a path's extension names.
    ///
    /// Errors: [`PlotError::Format`] for any other extension, or none.
    pub fn of(path: &Path) -> Result<Self, PlotError> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("svg") => Ok(Self::Svg),
            Some("png") => Ok(Self::Png),
            _ => Err(PlotError::Format(path.display().to_string())),
        }
    }
}

/// Colour of a policy's line (by name; a name not listed gets grey).
fn color_of(label: &str) -> RGBColor {
    match label {
        "none" => RGBColor(214, 39, 40),
        "exact" => RGBColor(255, 127, 14),
        "best-fit" => RGBColor(31, 119, 180),
        "segments" => RGBColor(44, 160, 44),
        "as recorded" => RGBColor(148, 103, 189),
        _ => RGBColor(127, 127, 127),
    }
}

/// The y axis' unit: GiB from 1 GiB up, MiB below.
fn unit(max_bytes: u64) -> (f64, &'static str) {
    if max_bytes >= 1 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else {
        ((1u64 << 20) as f64, "MiB")
    }
}

/// The points of a line's runs: each run a level from its first to its end event.
fn steps(runs: &[(u64, u64, u64)], scale: f64) -> Vec<(f64, f64)> {
    runs.iter()
        .flat_map(|&(first, end, v)| {
            let y = v as f64 / scale;
            [(first as f64, y), (end as f64, y)]
        })
        .collect()
}

/// Writes `plot` to `path`, as its extension says.
///
/// Errors: [`PlotError::Format`] for an extension other than `.svg` or `.png`;
/// [`PlotError::Draw`] when drawing or writing fails.
pub fn write(plot: &MemoryPlot, path: &Path) -> Result<(), PlotError> {
    let format = Format::of(path)?;
    // Registering again replaces the same font: harmless.
    register_font("sans-serif", FontStyle::Normal, FONT).map_err(|_| PlotError::Draw {
        path: path.display().to_string(),
        message: "the compiled-in font is not a font".into(),
    })?;
    let result = match format {
        Format::Svg => draw(SVGBackend::new(path, SIZE).into_drawing_area(), plot),
        Format::Png => draw(BitMapBackend::new(path, SIZE).into_drawing_area(), plot),
    };
    result.map_err(|message| PlotError::Draw {
        path: path.display().to_string(),
        message,
    })
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, plot: &MemoryPlot) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |err: DrawingAreaErrorKind<DB::ErrorType>| err.to_string();
    root.fill(&WHITE).map_err(e)?;
    let max_bytes = plot
        .policies
        .iter()
        .chain(std::iter::once(&plot.live))
        .flat_map(|l| l.runs.iter().map(|r| r.2))
        .chain(std::iter::once(plot.lower_bound_bytes))
        .max()
        .unwrap_or(0);
    let (scale, unit_name) = unit(max_bytes);
    let y_max = (max_bytes as f64 / scale * 1.08).max(1.0);
    let x_max = (plot.events as f64).max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(&plot.title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("trace events")
        .y_desc(format!("memory ({unit_name})"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;

    let lb = plot.lower_bound_bytes as f64 / scale;
    let grey = RGBColor(90, 90, 90);
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, lb), (x_max, lb)],
            8,
            6,
            grey.stroke_width(2),
        ))
        .map_err(e)?
        .label(format!(
            "lower bound ({:.2} {unit_name})",
            plot.lower_bound_bytes as f64 / scale
        ))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2)));

    let black = RGBColor(0, 0, 0);
    chart
        .draw_series(LineSeries::new(
            steps(&plot.live.runs, scale),
            black.stroke_width(1),
        ))
        .map_err(e)?
        .label(plot.live.label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], black.stroke_width(1)));

    for line in &plot.policies {
        let color = color_of(&line.label);
        let peak = line.runs.iter().map(|r| r.2).max().unwrap_or(0);
        let label = match line.out_of_memory_at_event {
            Some(ev) => format!("{}: out of memory at event {ev}", line.label),
            None => format!(
                "{} (peak {:.2} {unit_name})",
                line.label,
                peak as f64 / scale
            ),
        };
        chart
            .draw_series(LineSeries::new(
                steps(&line.runs, scale),
                color.stroke_width(2),
            ))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if let (Some(ev), Some(last)) = (line.out_of_memory_at_event, line.runs.last()) {
            let at = (ev as f64, last.2 as f64 / scale);
            chart
                .draw_series([Cross::new(at, 8, color.stroke_width(3))])
                .map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_the_extension() {
        assert_eq!(Format::of(Path::new("a/b.svg")).ok(), Some(Format::Svg));
        assert_eq!(Format::of(Path::new("b.PNG")).ok(), Some(Format::Png));
        assert!(matches!(
            Format::of(Path::new("b.jpg")),
            Err(PlotError::Format(_))
        ));
        assert!(matches!(
            Format::of(Path::new("b")),
            Err(PlotError::Format(_))
        ));
    }

    #[test]
    fn units_switch_at_one_gib() {
        assert_eq!(unit((1 << 30) - 1).1, "MiB");
        assert_eq!(unit(1 << 30).1, "GiB");
    }

    #[test]
    fn a_run_is_a_level_from_its_first_to_its_end_event() {
        let pts = steps(&[(0, 4, 1 << 20), (4, 6, 3 << 20)], (1u64 << 20) as f64);
        assert_eq!(pts, vec![(0.0, 1.0), (4.0, 1.0), (4.0, 3.0), (6.0, 3.0)]);
    }
}
