//! The console's charts, drawn as inline SVG on the server: no script, no asset, no library; and
//! the HTML escaping the charts and the pages share.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

/// `&`, `<`, `>`, `"` and `'` as entities: the workspace's one escaper, shared with the debugger.
pub use cursor_wire::html::escape as esc;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 200.0;
const MARGIN: f64 = 40.0;

/// Stacked bars of input, cache-read and output tokens per day, from `/api/usage` rows.
pub fn tokens_per_day(rows: &[Value]) -> String {
    let mut days: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
    for row in rows {
        let day = row["day"].as_str().unwrap_or_default();
        let bucket = |name: &str| row["usage"][name].as_u64().unwrap_or(0);
        let entry = days.entry(day).or_default();
        entry[0] += bucket("input");
        entry[1] += bucket("cache_read");
        entry[2] += bucket("output");
    }
    if days.is_empty() {
        return "<p class=\"muted\">No provider calls in this period.</p>".to_owned();
    }
    let most = days
        .values()
        .map(|b| b.iter().sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let plot = HEIGHT - 2.0 * MARGIN;
    let step = (WIDTH - 2.0 * MARGIN) / days.len() as f64;
    let bar = (step * 0.7).clamp(1.0, 40.0);
    const COLOURS: [(&str, &str); 3] = [
        ("input", "#4a7bd0"),
        ("cache read", "#9ab8ea"),
        ("output", "#e0883a"),
    ];
    let mut svg = format!(
        "<svg class=\"chart\" role=\"img\" aria-label=\"tokens per day\" width=\"{WIDTH}\" \
         height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"{MARGIN}\" y=\"16\" font-size=\"12\">tokens per day (max {most:.0})</text>"
    );
    for (i, (day, buckets)) in days.iter().enumerate() {
        let x = MARGIN + i as f64 * step;
        let mut top = HEIGHT - MARGIN;
        for (value, (name, colour)) in buckets.iter().zip(COLOURS) {
            let height = *value as f64 / most * plot;
            top -= height;
            let _ = write!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{top:.1}\" width=\"{bar:.1}\" height=\"{height:.1}\" fill=\"{colour}\">\
                 <title>{} {name}: {value}</title></rect>",
                esc(day)
            );
        }
        if days.len() <= 14 || i % (days.len() / 7).max(1) == 0 {
            let _ = write!(
                svg,
                "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
                HEIGHT - MARGIN + 14.0,
                esc(day.get(5..).unwrap_or(day))
            );
        }
    }
    for (i, (name, colour)) in COLOURS.iter().enumerate() {
        let x = MARGIN + i as f64 * 110.0;
        let _ = write!(
            svg,
            "<rect x=\"{x}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{name}</text>",
            HEIGHT - 14.0,
            x + 14.0,
            HEIGHT - 5.0
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_with_more_tokens_gets_a_taller_bar() {
        let rows = vec![
            serde_json::json!({"day": "2026-12-03", "usage": {"input": 100, "cache_read": 0, "output": 0}}),
            serde_json::json!({"day": "2026-12-04", "usage": {"input": 300, "cache_read": 0, "output": 0}}),
        ];
        let svg = tokens_per_day(&rows);
        let heights: Vec<f64> = svg
            .split("height=\"")
            .skip(2)
            .filter_map(|rest| rest.split('"').next()?.parse().ok())
            .filter(|h| *h > 0.0 && *h < HEIGHT)
            .collect();
        assert!(heights.len() >= 2, "{svg}");
        assert!((heights.iter().cloned().fold(0.0, f64::max) / heights[0] - 3.0).abs() < 1e-6);
        assert!(tokens_per_day(&[]).contains("No provider calls"));
    }
}
