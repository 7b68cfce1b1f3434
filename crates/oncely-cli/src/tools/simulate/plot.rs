//! The `--plot` SVG of `oncely simulate`, written by hand: three grouped bar charts stacked in
//! one 960 x 1140 px document (mean calls and mean completion time per strategy and clients
//! value, on a logarithmic axis; load amplification without and with the budget per failure
//! rate, on a linear axis from 0).

use super::{ContentionBlock, OutageRow, label};
use oncely_client::simulate::Strategy;
use std::fmt::Write as _;

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 370.0;
const MARGIN_LEFT: f64 = 90.0;
const MARGIN_RIGHT: f64 = 30.0;
const PLOT_TOP: f64 = 80.0;
const PLOT_HEIGHT: f64 = 230.0;

/// One color per strategy, in [`Strategy::ALL`] order.
const STRATEGY_COLORS: [&str; 5] = ["#d62728", "#7f7f7f", "#ff7f0e", "#2ca02c", "#1f77b4"];
/// Without, with the budget.
const BUDGET_COLORS: [&str; 2] = ["#d62728", "#2ca02c"];

#[derive(Clone, Copy)]
enum Scale {
    /// Logarithmic, from the power of ten at or below the smallest value.
    Log,
    /// Linear from 0.
    Linear,
}

/// One grouped bar chart: `groups[i].1[j]` is series `j`'s value in group `i`.
struct Chart<'a> {
    title: String,
    y_label: &'a str,
    series: Vec<(&'a str, &'a str)>,
    groups: Vec<(String, Vec<f64>)>,
    scale: Scale,
    value_fmt: fn(f64) -> String,
    /// How axis ticks are printed.
    tick_fmt: fn(f64) -> String,
    /// A dashed horizontal reference line, with its label.
    reference: Option<(f64, &'a str)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" linear tick step (1, 2 or 5 times a power of ten) giving about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

impl Chart<'_> {
    fn render(&self, out: &mut String, top: f64) {
        let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
        let y0 = top + PLOT_TOP;
        let y1 = y0 + PLOT_HEIGHT;
        let values = self
            .groups
            .iter()
            .flat_map(|g| g.1.iter().copied())
            .filter(|v| v.is_finite());
        let max = values.clone().fold(0.0f64, f64::max);
        let min_pos = values.filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);

        // The axis: a map from value to y, and the ticks.
        let (lo, hi, ticks): (f64, f64, Vec<f64>) = match self.scale {
            Scale::Log => {
                let lo_exp = if min_pos.is_finite() {
                    min_pos.log10().floor() as i32
                } else {
                    0
                };
                let hi_exp = (if max > 0.0 {
                    max.log10().ceil() as i32
                } else {
                    1
                })
                .max(lo_exp + 1);
                let ticks = (lo_exp..=hi_exp).map(|e| 10f64.powi(e)).collect();
                (10f64.powi(lo_exp), 10f64.powi(hi_exp), ticks)
            }
            Scale::Linear => {
                let step = nice_step(max.max(1e-9));
                // One step of headroom above the tallest bar, for its value label.
                let n = (max / step).floor() as usize + 1;
                let ticks = (0..=n).map(|i| i as f64 * step).collect();
                (0.0, n as f64 * step, ticks)
            }
        };
        let y_of = |v: f64| -> f64 {
            let f = match self.scale {
                Scale::Log => {
                    if v <= lo {
                        0.0
                    } else {
                        (v.log10() - lo.log10()) / (hi.log10() - lo.log10())
                    }
                }
                Scale::Linear => v / hi,
            };
            y1 - f.clamp(0.0, 1.0) * PLOT_HEIGHT
        };

        let _ = writeln!(
            out,
            r#"<text x="{x}" y="{y}" font-size="17" font-weight="bold" text-anchor="middle">{t}</text>"#,
            x = WIDTH / 2.0,
            y = top + 28.0,
            t = esc(&self.title)
        );
        // Legend.
        let mut lx = MARGIN_LEFT;
        for (name, color) in &self.series {
            let _ = writeln!(
                out,
                r#"<rect x="{lx}" y="{y}" width="12" height="12" fill="{color}"/><text x="{tx}" y="{ty}" font-size="12">{n}</text>"#,
                y = top + 44.0,
                tx = lx + 16.0,
                ty = top + 54.0,
                n = esc(name)
            );
            lx += 30.0 + 7.0 * name.len() as f64;
        }
        if let Some((_, l)) = self.reference {
            let _ = writeln!(
                out,
                r##"<line x1="{lx}" y1="{y}" x2="{x2}" y2="{y}" stroke="#000000" stroke-dasharray="6 4"/><text x="{tx}" y="{ty}" font-size="12">{l}</text>"##,
                y = top + 50.0,
                x2 = lx + 24.0,
                tx = lx + 30.0,
                ty = top + 54.0,
                l = esc(l)
            );
        }
        // Grid and ticks.
        for t in &ticks {
            let y = y_of(*t);
            let _ = writeln!(
                out,
                r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#dddddd"/><text x="{tx}" y="{ty:.1}" font-size="11" text-anchor="end">{l}</text>"##,
                x2 = WIDTH - MARGIN_RIGHT,
                tx = MARGIN_LEFT - 6.0,
                ty = y + 4.0,
                l = esc(&(self.tick_fmt)(*t))
            );
        }
        // Y label, rotated.
        let _ = writeln!(
            out,
            r#"<text x="{x}" y="{y}" font-size="12" text-anchor="middle" transform="rotate(-90 {x} {y})">{l}</text>"#,
            x = 22.0,
            y = (y0 + y1) / 2.0,
            l = esc(self.y_label)
        );
        // Bars.
        let groups = self.groups.len().max(1) as f64;
        let group_w = plot_w / groups;
        let n_series = self.series.len().max(1) as f64;
        let bar_w = group_w * 0.8 / n_series;
        for (gi, (glabel, vals)) in self.groups.iter().enumerate() {
            let gx = MARGIN_LEFT + gi as f64 * group_w + group_w * 0.1;
            for (si, v) in vals.iter().enumerate() {
                let color = self.series.get(si).map_or("#000000", |s| s.1);
                let x = gx + si as f64 * bar_w;
                let y = y_of(*v);
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{color}"><title>{t}</title></rect>"#,
                    w = (bar_w - 2.0).max(1.0),
                    h = (y1 - y).max(0.0),
                    t = esc(&format!(
                        "{glabel}, {}: {}",
                        self.series.get(si).map_or("", |s| s.0),
                        (self.value_fmt)(*v)
                    ))
                );
                if bar_w >= 22.0 {
                    let _ = writeln!(
                        out,
                        r#"<text x="{tx:.1}" y="{ty:.1}" font-size="10" text-anchor="middle">{l}</text>"#,
                        tx = x + (bar_w - 2.0) / 2.0,
                        ty = y - 3.0,
                        l = esc(&(self.value_fmt)(*v))
                    );
                }
            }
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{y}" font-size="13" text-anchor="middle">{l}</text>"#,
                x = MARGIN_LEFT + (gi as f64 + 0.5) * group_w,
                y = y1 + 20.0,
                l = esc(glabel)
            );
        }
        if let Some((v, _)) = self.reference {
            let y = y_of(v);
            let _ = writeln!(
                out,
                r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#000000" stroke-dasharray="6 4"/>"##,
                x2 = WIDTH - MARGIN_RIGHT,
            );
        }
        // Axes.
        let _ = writeln!(
            out,
            r##"<line x1="{MARGIN_LEFT}" y1="{y0}" x2="{MARGIN_LEFT}" y2="{y1}" stroke="#000000"/><line x1="{MARGIN_LEFT}" y1="{y1}" x2="{x2}" y2="{y1}" stroke="#000000"/>"##,
            x2 = WIDTH - MARGIN_RIGHT
        );
    }
}

fn fmt_count(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn fmt_tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn fmt_amp(v: f64) -> String {
    format!("{v:.2}x")
}

/// The whole SVG document.
pub(crate) fn render(blocks: &[ContentionBlock], rows: &[OutageRow], instances: usize) -> String {
    let series: Vec<(&str, &str)> = Strategy::ALL
        .iter()
        .zip(STRATEGY_COLORS)
        .map(|(s, c)| (label(*s), c))
        .collect();
    let per_strategy = |f: fn(&oncely_client::simulate::ContentionReport) -> f64| {
        blocks
            .iter()
            .map(|b| {
                let vals = Strategy::ALL
                    .iter()
                    .map(|s| b.reports.iter().find(|r| r.strategy == *s).map_or(0.0, f))
                    .collect();
                (format!("{} clients", b.clients), vals)
            })
            .collect::<Vec<_>>()
    };
    let charts = [
        Chart {
            title: "(a) Contention: mean write calls per strategy (less is better)".into(),
            y_label: "write calls (log scale)",
            series: series.clone(),
            groups: per_strategy(|r| r.mean_calls),
            scale: Scale::Log,
            value_fmt: fmt_count,
            tick_fmt: fmt_tick,
            reference: None,
        },
        Chart {
            title: "(a) Contention: mean completion time per strategy (less is better)".into(),
            y_label: "milliseconds (log scale)",
            series,
            groups: per_strategy(|r| r.mean_completion.as_secs_f64() * 1000.0),
            scale: Scale::Log,
            value_fmt: fmt_count,
            tick_fmt: fmt_tick,
            reference: None,
        },
        Chart {
            title: format!(
                "(b) Fleet outage, {instances} instances: load amplification (requests / logical calls)"
            ),
            y_label: "amplification",
            series: vec![
                ("without the retry budget", BUDGET_COLORS[0]),
                ("with the retry budget", BUDGET_COLORS[1]),
            ],
            groups: rows
                .iter()
                .map(|r| {
                    (
                        format!("{:.0}% of requests failing", r.failure_rate * 100.0),
                        vec![r.without.amplification, r.with.amplification],
                    )
                })
                .collect(),
            scale: Scale::Linear,
            value_fmt: fmt_amp,
            tick_fmt: fmt_amp,
            reference: Some((1.0, "1.0x: no retry load")),
        },
    ];
    let height = PANEL_HEIGHT * charts.len() as f64 + 30.0;
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="#ffffff"/>
"##
    );
    for (i, c) in charts.iter().enumerate() {
        c.render(&mut out, 10.0 + i as f64 * PANEL_HEIGHT);
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        for (max, step) in [(3.0, 1.0), (1.1, 0.5), (100.0, 20.0), (2500.0, 500.0)] {
            assert!(
                (nice_step(max) - step).abs() < 1e-9,
                "{max}: {}",
                nice_step(max)
            );
        }
        assert_eq!(esc("a<b&c"), "a&lt;b&amp;c");
    }
}
