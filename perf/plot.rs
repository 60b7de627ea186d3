//! The harness's plots, drawn with `plotters` as SVG: grouped bars and lines, each point a
//! median with its spread over rounds (the lowest and highest round) as an error bar, a log
//! axis where the values span decades, and under the plot the date, machine and command
//! that produced it, so a figure read alone says where it came from.

use plotters::coord::Shift;
use plotters::prelude::*;

const SIZE: (u32, u32) = (820, 460);
const COLORS: [RGBColor; 8] = [
    RGBColor(0x42, 0x69, 0xd0),
    RGBColor(0xef, 0xb1, 0x18),
    RGBColor(0xff, 0x72, 0x5c),
    RGBColor(0x6c, 0xc5, 0xb0),
    RGBColor(0x3c, 0xa9, 0x51),
    RGBColor(0xa4, 0x63, 0xf2),
    RGBColor(0x97, 0xbb, 0xf5),
    RGBColor(0x9c, 0x6b, 0x4e),
];

/// One value of a plot: the median over rounds, and the lowest and highest round.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Point {
    pub median: f64,
    pub low: f64,
    pub high: f64,
}

impl Point {
    /// The median of `rounds` with their spread (one round: no spread).
    pub(crate) fn of(rounds: &[f64]) -> Point {
        let mut v: Vec<f64> = rounds.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Point { median: 0.0, low: 0.0, high: 0.0 };
        }
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Point { median, low: v[0], high: v[n - 1] }
    }

    /// Every figure times `k` (a change of unit).
    pub(crate) fn scaled(self, k: f64) -> Point {
        Point { median: self.median * k, low: self.low * k, high: self.high * k }
    }
}

/// A named line or set of bars.
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

/// Where a figure came from: printed under it.
pub(crate) struct Stamp(pub String);

impl Stamp {
    /// The date, this machine (cores, load) and the command line.
    pub(crate) fn here(date: &str) -> Stamp {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let load = std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into());
        let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
        let bench = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().split('-').next().unwrap_or("").to_string()))
            .unwrap_or_default();
        Stamp(format!("{date} · {cores} cores, load {load} · cargo bench --bench {bench} -- {}", args.join(" ")))
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The series' names and colours, top right.
macro_rules! legend {
    ($chart:expr) => {
        $chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?
    };
}

/// Whether values from `low` to `high` span more than two decades (a log axis shows them).
fn spans_decades(low: f64, high: f64) -> bool {
    low > 0.0 && high / low > 100.0
}

fn bounds(series: &[Series]) -> (f64, f64) {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let low = all().map(|p| p.low).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let high = all().map(|p| p.high).fold(0.0, f64::max);
    (if low.is_finite() { low } else { 1.0 }, high.max(1e-9))
}

/// A white image at `path` with `stamp` along its foot: the area above it, to plot in.
fn framed<'a>(path: &'a std::path::Path, stamp: &Stamp) -> Result<DrawingArea<SVGBackend<'a>, Shift>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, footer) = root.split_vertically(SIZE.1 - 24);
    footer.draw(&Text::new(stamp.0.as_str(), (10, 6), ("sans-serif", 11).into_font().color(&BLACK.mix(0.7))))?;
    Ok(plot)
}

/// Bars of each series side by side per category, with error bars for the spread; a log
/// axis if the values span decades.
pub(crate) fn grouped_bars(
    path: &std::path::Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    stamp: &Stamp,
) -> Result<()> {
    let plot = framed(path, stamp)?;
    let (low, high) = bounds(series);
    let n = categories.len().max(1);
    let width = 0.8 / series.len().max(1) as f64;
    let x_range = -0.5f64..n as f64 - 0.5;
    let label = |x: &f64| categories.get(x.round() as usize).cloned().unwrap_or_default();
    let mut builder = ChartBuilder::on(&plot);
    builder.caption(title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(70);
    // Bars need a floor: a log axis starts a decade under the lowest value.
    macro_rules! bars {
        ($chart:expr, $floor:expr) => {{
            let (chart, floor) = (&mut $chart, $floor);
            for (k, s) in series.iter().enumerate() {
                let color = COLORS[k % COLORS.len()];
                let offset = -0.4 + width * k as f64;
                chart
                    .draw_series(s.points.iter().enumerate().map(|(i, p)| {
                        let x0 = i as f64 + offset;
                        Rectangle::new([(x0, floor), (x0 + width * 0.9, p.median.max(floor))], color.filled())
                    }))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
                chart.draw_series(s.points.iter().enumerate().filter(|(_, p)| p.high > p.low).map(|(i, p)| {
                    let x = i as f64 + offset + width * 0.45;
                    let (low, mid, high) = (p.low.max(floor), p.median.max(floor), p.high.max(floor));
                    ErrorBar::new_vertical(x, low, mid, high, BLACK.stroke_width(1), 6)
                }))?;
            }
            legend!(chart);
        }};
    }
    if spans_decades(low, high) {
        let floor = low / 10.0;
        let mut chart = builder.build_cartesian_2d(x_range, (floor..high * 1.5).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&label)
            .y_desc(format!("{y_label} (log)"))
            .draw()?;
        bars!(chart, floor);
    } else {
        let mut chart = builder.build_cartesian_2d(x_range, 0f64..high * 1.15)?;
        chart.configure_mesh().disable_x_mesh().x_labels(n).x_label_formatter(&label).y_desc(y_label).draw()?;
        bars!(chart, 0.0);
    }
    plot.present()?;
    Ok(())
}

/// A line per series over categories `xs`, on a log axis (checkpoint durations and bytes span
/// decades), each point with its spread.
pub(crate) fn log_lines(
    path: &std::path::Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    xs: &[String],
    series: &[Series],
    stamp: &Stamp,
) -> Result<()> {
    let plot = framed(path, stamp)?;
    let (low, high) = bounds(series);
    let n = xs.len().max(1);
    let label = |x: &f64| xs.get(x.round() as usize).cloned().unwrap_or_default();
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..n as f64 - 0.7, (low / 2.0..high * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .x_desc(x_label)
        .y_desc(format!("{y_label} (log)"))
        .draw()?;
    for (k, s) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let at = |i: usize| i as f64;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().enumerate().filter(|(_, p)| p.median > 0.0).map(|(i, p)| (at(i), p.median)),
                color.stroke_width(2),
            ))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(
            s.points
                .iter()
                .enumerate()
                .filter(|(_, p)| p.low > 0.0)
                .map(|(i, p)| ErrorBar::new_vertical(at(i), p.low, p.median, p.high, color.stroke_width(1), 6)),
        )?;
    }
    legend!(chart);
    plot.present()?;
    Ok(())
}
