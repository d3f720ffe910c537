//! The console's charts, drawn as inline SVG on the server: no script, no asset, no library; and
//! the HTML escaping the charts and the page templates share (askama.toml names `Html`).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use super::api::UsageLine;

/// `&`, `<`, `>`, `"` and `'` as entities: the workspace's one escaper, shared with the debugger.
pub use cursor_wire::html::escape as esc;
use cursor_wire::html::write_escaped;

/// The templates' escaper: every value a template shows goes through `esc`'s rules, unless the
/// template marks it `|safe` (markup built here or in `pages.rs` from escaped parts).
#[derive(Debug, Clone, Copy, Default)]
pub struct Html;

impl askama::filters::Escaper for Html {
    fn write_escaped_str<W: fmt::Write>(&self, dest: W, text: &str) -> fmt::Result {
        write_escaped(dest, text)
    }
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 200.0;
const MARGIN: f64 = 40.0;

/// Stacked bars of input, cache-read and output tokens per day, from `/api/usage` rows. Markup
/// whose every text is escaped here, so the usage template shows it as it is.
pub fn tokens_per_day(rows: &[UsageLine]) -> String {
    let mut days: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
    for row in rows {
        let entry = days.entry(row.day.as_str()).or_default();
        entry[0] += row.usage.input.unwrap_or(0);
        entry[1] += row.usage.cache_read.unwrap_or(0);
        entry[2] += row.usage.output.unwrap_or(0);
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
        let row = |day: &str, input: u64| UsageLine {
            day: day.to_owned(),
            provider: "fake".to_owned(),
            model: "m".to_owned(),
            calls: 1,
            usage: super::super::api::Tokens {
                input: Some(input),
                output: Some(0),
                cache_read: Some(0),
                cache_write: None,
                reasoning: None,
            },
            cache_hit_rate: None,
            cost_usd: None,
        };
        let rows = vec![row("2026-12-03", 100), row("2026-12-04", 300)];
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
