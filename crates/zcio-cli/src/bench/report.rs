//! Terminal tables and the HTML report with one SVG chart per suite.

use super::{Results, Row, SuiteReport};
use anyhow::Result;

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

/// The suite's steal, when there was any worth a line (over 0.5 % of the machine).
fn steal_line(steal: f64) -> Option<String> {
    (steal > 0.005).then(|| {
        format!(
            "virtual machine: the hypervisor took {:.1} % of this machine's CPU time while the \
             suite ran (steal, /proc/stat); runs that lost much are named in the notes",
            steal * 100.0
        )
    })
}

/// Prints one suite's table to stdout.
pub fn print_suite(r: &SuiteReport) {
    println!("\n== {} — {} ({:.0} s)", r.name, r.about, r.seconds);
    if let Some(why) = &r.skipped {
        println!("   SKIPPED: {why}");
    }
    if let Some(s) = steal_line(r.steal) {
        println!("   {s}");
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
    h.push_str(&format!(
        "<p>CPU time the hypervisor took during the run (steal, /proc/stat): {:.1} %</p>",
        res.steal * 100.0
    ));
    if let Some(p) = &res.peer {
        h.push_str(&format!(
            "<p><b>Two-host run</b> against peer {}: this host {} (kernel {}, NIC {}) · peer \
             {} (kernel {}, NIC {}, {} CPUs). The suites that cross a network ran over that \
             link; each host measured its own side's CPU.</p>",
            esc(&p.host),
            esc(&p.local.hostname),
            esc(&p.local.kernel),
            esc(&p.local.nic),
            esc(&p.remote.hostname),
            esc(&p.remote.kernel),
            esc(&p.remote.nic),
            p.remote.cpus
        ));
    }
    for s in &res.suites {
        h.push_str(&format!(
            "<h2>{}</h2><p>{}</p>",
            esc(&s.name),
            esc(&s.about)
        ));
        if let Some(why) = &s.skipped {
            h.push_str(&format!("<p class=note><b>skipped:</b> {}</p>", esc(why)));
        }
        if let Some(line) = steal_line(s.steal) {
            h.push_str(&format!("<p class=note>{}</p>", esc(&line)));
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

/// Horizontal grouped bars: one row per case (full label on the left), baseline and zcio
/// medians as bars with min–max whiskers, a linear axis from 0, and a legend.
///
/// Written as plain SVG rather than through a chart library: case names are long
/// (`variant loopback split-cores: 256x64K bundles …`), and rows with labels beside them are
/// the only layout in which every one stays readable.
fn chart(suite: &str, metric: &str, rows: &[&Row]) -> Result<String> {
    let label_w = rows
        .iter()
        .map(|r| r.case.chars().count())
        .max()
        .unwrap_or(4) as f64
        * 6.6
        + 16.0;
    let plot_w = 560.0;
    let row_h = 30.0;
    let top = 46.0;
    let width = label_w + plot_w + 40.0;
    let height = top + rows.len() as f64 * row_h + 46.0;
    let vmax = rows
        .iter()
        .flat_map(|r| [r.baseline_range[1], r.zcio_range[1], r.baseline, r.zcio])
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let (step, axis_max) = nice_axis(vmax);
    let x = |v: f64| label_w + (v / axis_max).clamp(0.0, 1.0) * plot_w;
    let unit = &rows[0].unit;
    let mut o = String::new();
    o.push_str(&format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0}' height='{height:.0}' \
         font-family='sans-serif' font-size='11'><rect width='100%' height='100%' fill='white'/>"
    ));
    o.push_str(&format!(
        "<text x='{:.0}' y='18' font-size='14' text-anchor='middle'>{}: {} ({})</text>",
        width / 2.0,
        esc(suite),
        esc(metric),
        esc(unit)
    ));
    // Grid and axis labels.
    let mut t = 0.0;
    while t <= axis_max * 1.0001 {
        let gx = x(t);
        o.push_str(&format!(
            "<line x1='{gx:.1}' y1='{top}' x2='{gx:.1}' y2='{:.1}' stroke='#ddd'/>\
             <text x='{gx:.1}' y='{:.1}' text-anchor='middle' fill='#444'>{}</text>",
            top + rows.len() as f64 * row_h,
            top + rows.len() as f64 * row_h + 14.0,
            tick_label(t)
        ));
        t += step;
    }
    let colors = [("#999999", "baseline"), ("#1f77b4", "zcio")];
    for (i, r) in rows.iter().enumerate() {
        let y0 = top + i as f64 * row_h;
        o.push_str(&format!(
            "<text x='{:.1}' y='{:.1}' text-anchor='end'>{}</text>",
            label_w - 8.0,
            y0 + row_h / 2.0 + 4.0,
            esc(&r.case)
        ));
        for (k, (v, range)) in [(r.baseline, r.baseline_range), (r.zcio, r.zcio_range)]
            .into_iter()
            .enumerate()
        {
            if !v.is_finite() {
                continue;
            }
            let by = y0 + 4.0 + k as f64 * 11.0;
            o.push_str(&format!(
                "<rect x='{:.1}' y='{by:.1}' width='{:.1}' height='10' fill='{}'><title>{}: {} {}</title></rect>",
                label_w,
                (x(v) - label_w).max(0.5),
                colors[k].0,
                if k == 0 { esc(&r.baseline_label) } else { esc(&r.zcio_label) },
                fmt_num(v),
                esc(unit)
            ));
            if range[0].is_finite() && range[1].is_finite() && range[1] > range[0] {
                o.push_str(&format!(
                    "<line x1='{:.1}' y1='{:.1}' x2='{:.1}' y2='{:.1}' stroke='black'/>",
                    x(range[0]),
                    by + 5.0,
                    x(range[1]),
                    by + 5.0
                ));
            }
        }
    }
    let ly = height - 16.0;
    let labels = [&rows[0].baseline_label, &rows[0].zcio_label];
    let mut lx = label_w;
    for (k, l) in labels.iter().enumerate() {
        o.push_str(&format!(
            "<rect x='{lx:.1}' y='{:.1}' width='12' height='10' fill='{}'/><text x='{:.1}' y='{ly:.1}'>{}</text>",
            ly - 9.0,
            colors[k].0,
            lx + 16.0,
            esc(l)
        ));
        lx += 40.0 + l.chars().count() as f64 * 6.6;
    }
    o.push_str("</svg>");
    Ok(o)
}

/// A tick value without trailing zeros (`0.1`, `2.5`, `40`).
fn tick_label(v: f64) -> String {
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A tick step of 1, 2 or 5 × 10^k giving about five ticks, and the axis end.
fn nice_axis(vmax: f64) -> (f64, f64) {
    if vmax <= 0.0 || !vmax.is_finite() {
        return (1.0, 1.0);
    }
    let raw = vmax / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(mag * 10.0);
    (step, (vmax / step).ceil() * step)
}

#[cfg(test)]
mod tests {
    use super::nice_axis;

    #[test]
    fn axis_steps_are_round_and_cover_the_maximum() {
        assert_eq!(nice_axis(0.93), (0.2, 1.0));
        assert_eq!(nice_axis(31.2), (10.0, 40.0));
        assert_eq!(nice_axis(0.0), (1.0, 1.0));
        let (s, m) = nice_axis(1234.0);
        assert!(s == 500.0 && m >= 1234.0);
    }
}
