//! Plots as SVG text, written by the harness itself (no plotting tool needed): grouped bars
//! and lines on a log axis, with axes, ticks and a legend.

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 6] = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#a463f2"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Tick values for an axis from 0 to `max`: about five round steps.
fn ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0, 1.0];
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// `1234567` as `1.2M`.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

struct Frame {
    out: String,
}

impl Frame {
    fn new(title: &str, y_label: &str, x_label: &str) -> Frame {
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        out +=
            &format!("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", LEFT, escape(title));
        out += &format!(
            "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
            TOP + (H - TOP - BOTTOM) / 2.0,
            escape(y_label)
        );
        out += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            LEFT + (W - LEFT - RIGHT) / 2.0,
            H - 14.0,
            escape(x_label)
        );
        Frame { out }
    }

    /// Horizontal grid lines and labels for values 0..=max; returns the y of a value.
    fn y_axis(&mut self, max: f64) -> impl Fn(f64) -> f64 {
        let ticks = ticks(max);
        let top = *ticks.last().expect("at least two ticks");
        let y = move |v: f64| H - BOTTOM - (v / top) * (H - TOP - BOTTOM);
        for t in &ticks {
            self.out += &format!(
                "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                W - RIGHT,
                LEFT - 6.0,
                y(*t) + 4.0,
                short(*t),
                y = y(*t)
            );
        }
        self.axes();
        y
    }

    /// Grid lines and labels at every power of ten from below `min` to above `max` (a log
    /// axis); returns the y of a value (values at or below 0 sit on the axis).
    fn log_y_axis(&mut self, min: f64, max: f64) -> impl Fn(f64) -> f64 {
        let lo = min.max(f64::MIN_POSITIVE).log10().floor();
        let hi = max.max(min * 10.0).log10().ceil().max(lo + 1.0);
        let y = move |v: f64| {
            let l = if v > 0.0 { v.log10().clamp(lo, hi) } else { lo };
            H - BOTTOM - (l - lo) / (hi - lo) * (H - TOP - BOTTOM)
        };
        for e in lo as i32..=hi as i32 {
            let t = 10f64.powi(e);
            self.out += &format!(
                "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                W - RIGHT,
                LEFT - 6.0,
                y(t) + 4.0,
                short(t),
                y = y(t)
            );
        }
        self.axes();
        y
    }

    fn axes(&mut self) {
        self.out += &format!(
            "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"#333\"/><line x1=\"{LEFT}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n",
            H - BOTTOM,
            W - RIGHT,
            H - BOTTOM,
            H - BOTTOM
        );
    }

    fn legend(&mut self, names: &[&str]) {
        for (i, name) in names.iter().enumerate() {
            let y = TOP + 10.0 + i as f64 * 20.0;
            self.out += &format!(
                "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                W - RIGHT + 16.0,
                y - 10.0,
                COLORS[i % COLORS.len()],
                W - RIGHT + 34.0,
                y,
                escape(name)
            );
        }
    }

    fn finish(mut self) -> String {
        self.out += "</svg>\n";
        self.out
    }
}

/// Grouped bars: one group per category, one bar per series.
pub fn grouped_bars(title: &str, y_label: &str, categories: &[String], series: &[(String, Vec<f64>)]) -> String {
    let mut f = Frame::new(title, y_label, "");
    let max = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0, f64::max);
    let y = f.y_axis(max);
    let group_w = (W - LEFT - RIGHT) / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (c, name) in categories.iter().enumerate() {
        let x0 = LEFT + c as f64 * group_w + group_w * 0.1;
        for (s, (_, values)) in series.iter().enumerate() {
            let v = values.get(c).copied().unwrap_or(0.0);
            let (top, x) = (y(v), x0 + s as f64 * bar_w);
            f.out += &format!(
                "<rect x=\"{x:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>\n",
                bar_w - 2.0,
                (H - BOTTOM - top).max(0.0),
                COLORS[s % COLORS.len()],
                short(v)
            );
        }
        // One word a line, so long labels of narrow groups do not run into each other.
        let cx = x0 + group_w * 0.4;
        let words: Vec<String> =
            name.split(' ').map(|w| format!("<tspan x=\"{cx:.1}\" dy=\"14\">{}</tspan>", escape(w))).collect();
        f.out += &format!(
            "<text x=\"{cx:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            H - BOTTOM + 4.0,
            words.concat()
        );
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    f.legend(&names);
    f.finish()
}

/// Lines over categorical x positions (labelled by `xs`), one per series, with points, on a
/// log y axis (the figures it plots span orders of magnitude).
pub fn log_lines(title: &str, x_label: &str, y_label: &str, xs: &[String], series: &[(String, Vec<f64>)]) -> String {
    let mut f = Frame::new(title, y_label, x_label);
    let values = || series.iter().flat_map(|(_, v)| v.iter().copied());
    let max = values().fold(0.0, f64::max);
    let y = f.log_y_axis(values().filter(|v| *v > 0.0).fold(max, f64::min), max);
    let step = (W - LEFT - RIGHT) / xs.len().max(1) as f64;
    let x = |i: usize| LEFT + step * (i as f64 + 0.5);
    for (i, label) in xs.iter().enumerate() {
        f.out += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            x(i),
            H - BOTTOM + 18.0,
            escape(label)
        );
    }
    for (s, (_, values)) in series.iter().enumerate() {
        let color = COLORS[s % COLORS.len()];
        let points: Vec<String> = values.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
        f.out += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>\n",
            points.join(" ")
        );
        for (i, v) in values.iter().enumerate() {
            f.out += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\"><title>{}</title></circle>\n",
                x(i),
                y(*v),
                short(*v)
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    f.legend(&names);
    f.finish()
}
