//! Terminal tables and the HTML report with one SVG chart per suite.

use super::{Results, Row, SuiteReport};
use anyhow::Result;
use plotters::prelude::*;

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// Prints one suite's table to stdout.
pub fn print_suite(r: &SuiteReport) {
    println!("\n== {} — {} ({:.0} s)", r.name, r.about, r.seconds);
    if let Some(why) = &r.skipped {
        println!("   SKIPPED: {why}");
    }
    for n in &r.notes {
        println!("   note: {n}");
    }
    if r.rows.is_empty() {
        return;
    }
    let w = r
        .rows
        .iter()
        .map(|x| x.case.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "   {:<w$}  {:<20} {:>12} {:>12} {:>7}  unit (runs)",
        "case", "metric", "baseline", "zcio", "ratio"
    );
    for row in &r.rows {
        println!(
            "   {:<w$}  {:<20} {:>12} {:>12} {:>7}  {} ({})",
            row.case,
            row.metric,
            fmt_num(row.baseline),
            fmt_num(row.zcio),
            fmt_num(row.ratio),
            row.unit,
            row.runs
        );
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The HTML report: machine, then per suite notes, chart and table.
pub fn html(res: &Results) -> Result<String> {
    let m = &res.machine;
    let mut h = String::new();
    h.push_str(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>zcio bench</title><style>",
    );
    h.push_str(
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}",
    );
    h.push_str("table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}");
    h.push_str("td:first-child,th:first-child,td:nth-child(2){text-align:left}.note{color:#555;font-size:14px}");
    h.push_str(".good{background:#e6f4e6}.bad{background:#fbe9e9}</style></head><body>");
    h.push_str("<h1>zcio bench</h1>");
    h.push_str(&format!(
        "<p>kernel {} · {} · {} cores · {} GiB · zcio {} · mode {:?} · root: {}</p>",
        esc(&m.kernel),
        esc(&m.cpu_model),
        m.cores,
        m.memory_gib,
        esc(&m.zcio_version),
        res.mode,
        m.root
    ));
    for s in &res.suites {
        h.push_str(&format!(
            "<h2>{}</h2><p>{}</p>",
            esc(&s.name),
            esc(&s.about)
        ));
        if let Some(why) = &s.skipped {
            h.push_str(&format!("<p class=note><b>skipped:</b> {}</p>", esc(why)));
        }
        for n in &s.notes {
            h.push_str(&format!("<p class=note>{}</p>", esc(n)));
        }
        if let Some(metric) = &s.chart_metric {
            let rows: Vec<&Row> = s.rows.iter().filter(|r| &r.metric == metric).collect();
            if !rows.is_empty() {
                h.push_str(&chart(&s.name, metric, &rows)?);
            }
        }
        if !s.rows.is_empty() {
            h.push_str("<table><tr><th>case</th><th>metric</th><th>baseline</th><th>zcio</th><th>ratio</th><th>unit</th><th>baseline range</th><th>zcio range</th><th>runs</th></tr>");
            for r in &s.rows {
                let better = match r.better {
                    super::Better::Higher => r.ratio > 1.0,
                    super::Better::Lower => r.ratio < 1.0,
                };
                let class = if !r.ratio.is_finite() || (r.ratio - 1.0).abs() < 0.03 {
                    ""
                } else if better {
                    "good"
                } else {
                    "bad"
                };
                h.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class='{class}'>{}</td><td>{}</td><td>{}–{}</td><td>{}–{}</td><td>{}</td></tr>",
                    esc(&r.case), esc(&r.metric), fmt_num(r.baseline), fmt_num(r.zcio), fmt_num(r.ratio),
                    esc(&r.unit), fmt_num(r.baseline_range[0]), fmt_num(r.baseline_range[1]),
                    fmt_num(r.zcio_range[0]), fmt_num(r.zcio_range[1]), r.runs
                ));
            }
            h.push_str("</table>");
        }
    }
    h.push_str("</body></html>\n");
    Ok(h)
}

/// Grouped bar chart: per case, baseline and zcio medians with min–max whiskers.
fn chart(suite: &str, metric: &str, rows: &[&Row]) -> Result<String> {
    let mut svg = String::new();
    let width = (160 + rows.len() as u32 * 70).clamp(500, 1100);
    {
        let root = SVGBackend::with_string(&mut svg, (width, 380)).into_drawing_area();
        root.fill(&WHITE)?;
        let ymax = rows
            .iter()
            .flat_map(|r| [r.baseline_range[1], r.zcio_range[1], r.baseline, r.zcio])
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.15;
        let unit = &rows[0].unit;
        let n = rows.len();
        let mut c = ChartBuilder::on(&root)
            .caption(format!("{suite}: {metric} ({unit})"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(90)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n as f64, 0f64..ymax)?;
        let labels: Vec<String> = rows.iter().map(|r| r.case.clone()).collect();
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(n.max(1))
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 0.01 || (x.fract() == 0.0 && i < labels.len()) {
                    labels.get(i).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_label_style(
                ("sans-serif", 11)
                    .into_font()
                    .transform(FontTransform::Rotate90),
            )
            .y_desc(unit.as_str())
            .draw()?;
        let base_color = RGBColor(150, 150, 150);
        let zc_color = RGBColor(31, 119, 180);
        for (i, r) in rows.iter().enumerate() {
            let x = i as f64;
            for (k, (v, range, color)) in [
                (r.baseline, r.baseline_range, base_color),
                (r.zcio, r.zcio_range, zc_color),
            ]
            .into_iter()
            .enumerate()
            {
                if !v.is_finite() {
                    continue;
                }
                let x0 = x + 0.12 + k as f64 * 0.38;
                let x1 = x0 + 0.36;
                c.draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x1, v)],
                    color.filled(),
                )))?;
                let xm = (x0 + x1) / 2.0;
                c.draw_series(std::iter::once(PathElement::new(
                    vec![(xm, range[0]), (xm, range[1])],
                    BLACK.stroke_width(1),
                )))?;
            }
        }
        c.draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (0.0, 0.0)],
            base_color.filled(),
        )))?
        .label(rows[0].baseline_label.clone())
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], base_color.filled()));
        c.draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (0.0, 0.0)],
            zc_color.filled(),
        )))?
        .label(rows[0].zcio_label.clone())
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], zc_color.filled()));
        c.configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
