//! `cursor-backend diff`: two captured runs side by side. Each direction's frames (leaving out one
//! transport's plumbing) are run-length grouped by type and aligned by their longest common
//! subsequence; the report names frames only one side sent, frames sent in a different order, counts
//! that differ, and fields set in one side's frames and not the other's.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};

use serde_json::Value;

use crate::store::FrameRow;

/// One captured run.
#[derive(Debug, Clone)]
pub struct Capture {
    pub label: String,
    pub frames: Vec<FrameRow>,
}

/// Consecutive frames of one type.
#[derive(Debug, Clone)]
struct Group {
    type_path: String,
    count: usize,
    fields: BTreeSet<String>,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Same {
        type_path: String,
        count: usize,
    },
    Count {
        type_path: String,
        a: usize,
        b: usize,
    },
    Fields {
        type_path: String,
        only_a: Vec<String>,
        only_b: Vec<String>,
    },
    OnlyA {
        type_path: String,
        count: usize,
    },
    OnlyB {
        type_path: String,
        count: usize,
    },
    /// Sent by both, at different places.
    Moved {
        type_path: String,
        in_a: bool,
        count: usize,
    },
}

impl Line {
    /// Whether this line is a difference (a different count of a streamed type is not: deltas are
    /// chunked as the provider streams).
    pub fn differs(&self) -> bool {
        !matches!(self, Line::Same { .. } | Line::Count { .. })
    }
}

/// The comparison of two captures, per direction.
#[derive(Debug, Clone)]
pub struct Report {
    pub a: String,
    pub b: String,
    pub client: Vec<Line>,
    pub server: Vec<Line>,
}

impl Report {
    pub fn differences(&self) -> usize {
        self.client
            .iter()
            .chain(&self.server)
            .filter(|l| l.differs())
            .count()
    }
}

pub fn diff(a: &Capture, b: &Capture) -> Report {
    let side = |capture: &Capture, direction: &str| -> Vec<Group> {
        groups(
            capture
                .frames
                .iter()
                .filter(|f| f.direction == direction && !f.transport),
        )
    };
    Report {
        a: a.label.clone(),
        b: b.label.clone(),
        client: align(&side(a, "client"), &side(b, "client")),
        server: align(&side(a, "server"), &side(b, "server")),
    }
}

fn groups<'a>(frames: impl Iterator<Item = &'a FrameRow>) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for frame in frames {
        let mut fields = BTreeSet::new();
        if let Some(json) = &frame.json {
            field_paths(json, "", &mut fields, 0);
        }
        match out.last_mut() {
            Some(last) if last.type_path == frame.type_path => {
                last.count += 1;
                last.fields.extend(fields);
            }
            _ => out.push(Group {
                type_path: frame.type_path.clone(),
                count: 1,
                fields,
            }),
        }
    }
    out
}

/// The paths of the fields set in a JSON message (`interaction_update.turn_ended.input_tokens`).
fn field_paths(json: &Value, at: &str, out: &mut BTreeSet<String>, depth: usize) {
    let join = |key: &str| {
        if at.is_empty() {
            key.to_owned()
        } else {
            format!("{at}.{key}")
        }
    };
    match json {
        Value::Object(map) if depth < 8 => {
            for (key, value) in map {
                field_paths(value, &join(key), out, depth + 1);
            }
        }
        Value::Array(items) if depth < 8 => {
            let here = format!("{at}[]");
            if items.is_empty() {
                out.insert(here.clone());
            }
            for item in items {
                field_paths(item, &here, out, depth + 1);
            }
        }
        _ => {
            out.insert(at.to_owned());
        }
    }
}

enum Step {
    Both(usize, usize),
    A(usize),
    B(usize),
}

fn align(a: &[Group], b: &[Group]) -> Vec<Line> {
    let steps = lcs(a, b);
    let only_a: BTreeSet<&str> = steps
        .iter()
        .filter_map(|s| match s {
            Step::A(i) => Some(a[*i].type_path.as_str()),
            _ => None,
        })
        .collect();
    let only_b: BTreeSet<&str> = steps
        .iter()
        .filter_map(|s| match s {
            Step::B(j) => Some(b[*j].type_path.as_str()),
            _ => None,
        })
        .collect();
    let mut lines = Vec::new();
    for step in steps {
        match step {
            Step::Both(i, j) => {
                let (x, y) = (&a[i], &b[j]);
                let fields_a: Vec<String> = x.fields.difference(&y.fields).cloned().collect();
                let fields_b: Vec<String> = y.fields.difference(&x.fields).cloned().collect();
                lines.push(if x.count != y.count {
                    Line::Count {
                        type_path: x.type_path.clone(),
                        a: x.count,
                        b: y.count,
                    }
                } else {
                    Line::Same {
                        type_path: x.type_path.clone(),
                        count: x.count,
                    }
                });
                if !fields_a.is_empty() || !fields_b.is_empty() {
                    lines.push(Line::Fields {
                        type_path: x.type_path.clone(),
                        only_a: fields_a,
                        only_b: fields_b,
                    });
                }
            }
            Step::A(i) if only_b.contains(a[i].type_path.as_str()) => lines.push(Line::Moved {
                type_path: a[i].type_path.clone(),
                in_a: true,
                count: a[i].count,
            }),
            Step::B(j) if only_a.contains(b[j].type_path.as_str()) => lines.push(Line::Moved {
                type_path: b[j].type_path.clone(),
                in_a: false,
                count: b[j].count,
            }),
            Step::A(i) => lines.push(Line::OnlyA {
                type_path: a[i].type_path.clone(),
                count: a[i].count,
            }),
            Step::B(j) => lines.push(Line::OnlyB {
                type_path: b[j].type_path.clone(),
                count: b[j].count,
            }),
        }
    }
    lines
}

/// Above this many table cells (two runs of thousands of distinct groups each) the exact alignment
/// would take too much memory; a bounded look-ahead aligns them instead.
const MAX_LCS_CELLS: usize = 16 * 1024 * 1024;
/// How far the look-ahead searches for the next common type.
const LOOK_AHEAD: usize = 64;

/// Longest common subsequence of the two type sequences, as steps through both.
fn lcs(a: &[Group], b: &[Group]) -> Vec<Step> {
    let (n, m) = (a.len(), b.len());
    if (n + 1).saturating_mul(m + 1) > MAX_LCS_CELLS {
        return look_ahead(a, b);
    }
    // table[i][j] = LCS length of a[i..] and b[j..]
    let mut table = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            table[at(i, j)] = if a[i].type_path == b[j].type_path {
                table[at(i + 1, j + 1)] + 1
            } else {
                table[at(i + 1, j)].max(table[at(i, j + 1)])
            };
        }
    }
    let (mut i, mut j, mut steps) = (0, 0, Vec::new());
    while i < n && j < m {
        if a[i].type_path == b[j].type_path {
            steps.push(Step::Both(i, j));
            i += 1;
            j += 1;
        } else if table[at(i + 1, j)] >= table[at(i, j + 1)] {
            steps.push(Step::A(i));
            i += 1;
        } else {
            steps.push(Step::B(j));
            j += 1;
        }
    }
    steps.extend((i..n).map(Step::A));
    steps.extend((j..m).map(Step::B));
    steps
}

/// A linear alignment: equal types step together; otherwise the side whose next match is nearer
/// (within `LOOK_AHEAD`) gives up the frames before it.
fn look_ahead(a: &[Group], b: &[Group]) -> Vec<Step> {
    let (mut i, mut j, mut steps) = (0, 0, Vec::new());
    let find = |groups: &[Group], from: usize, type_path: &str| {
        groups[from..]
            .iter()
            .take(LOOK_AHEAD)
            .position(|g| g.type_path == type_path)
    };
    while i < a.len() && j < b.len() {
        if a[i].type_path == b[j].type_path {
            steps.push(Step::Both(i, j));
            i += 1;
            j += 1;
            continue;
        }
        match (find(b, j, &a[i].type_path), find(a, i, &b[j].type_path)) {
            (Some(skip_b), Some(skip_a)) if skip_b <= skip_a => {
                steps.extend((j..j + skip_b).map(Step::B));
                j += skip_b;
            }
            (Some(skip_b), None) => {
                steps.extend((j..j + skip_b).map(Step::B));
                j += skip_b;
            }
            (_, Some(skip_a)) => {
                steps.extend((i..i + skip_a).map(Step::A));
                i += skip_a;
            }
            (None, None) => {
                steps.push(Step::A(i));
                steps.push(Step::B(j));
                i += 1;
                j += 1;
            }
        }
    }
    steps.extend((i..a.len()).map(Step::A));
    steps.extend((j..b.len()).map(Step::B));
    steps
}

fn times(count: usize) -> String {
    if count == 1 {
        String::new()
    } else {
        format!(" ×{count}")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "A = {}", self.a)?;
        writeln!(f, "B = {}", self.b)?;
        for (title, lines) in [
            ("client → server", &self.client),
            ("server → client", &self.server),
        ] {
            writeln!(f, "\n{title}:")?;
            for line in lines {
                let mut text = String::new();
                let _ = match line {
                    Line::Same { type_path, count } => {
                        write!(text, "  = {type_path}{}", times(*count))
                    }
                    Line::Count { type_path, a, b } => {
                        write!(text, "  ≈ {type_path} ×{a} in A, ×{b} in B")
                    }
                    Line::Fields {
                        type_path,
                        only_a,
                        only_b,
                    } => {
                        let mut parts = Vec::new();
                        if !only_a.is_empty() {
                            parts.push(format!("set only in A: {}", only_a.join(", ")));
                        }
                        if !only_b.is_empty() {
                            parts.push(format!("set only in B: {}", only_b.join(", ")));
                        }
                        write!(text, "  ~ {type_path}: {}", parts.join("; "))
                    }
                    Line::OnlyA { type_path, count } => {
                        write!(text, "  - {type_path}{} (only in A)", times(*count))
                    }
                    Line::OnlyB { type_path, count } => {
                        write!(text, "  + {type_path}{} (only in B)", times(*count))
                    }
                    Line::Moved {
                        type_path,
                        in_a,
                        count,
                    } => write!(
                        text,
                        "  ↕ {type_path}{} out of order (here in {})",
                        times(*count),
                        if *in_a { "A" } else { "B" }
                    ),
                };
                writeln!(f, "{text}")?;
            }
        }
        let n = self.differences();
        writeln!(
            f,
            "\n{}",
            if n == 0 {
                "no differences in frame types, order or fields set".to_owned()
            } else {
                format!("{n} difference(s)")
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(direction: &str, type_path: &str, json: Value) -> FrameRow {
        FrameRow {
            id: 0,
            exchange_id: 0,
            route: String::new(),
            direction: direction.to_owned(),
            t_us: 0,
            size: 0,
            flags: None,
            kind: "message".to_owned(),
            type_path: type_path.to_owned(),
            json: Some(json),
            raw_hex: String::new(),
            error: None,
            transport: false,
        }
    }

    fn capture(types: &[(&str, Value)]) -> Capture {
        Capture {
            label: "x".to_owned(),
            frames: types
                .iter()
                .map(|(t, j)| frame("server", t, j.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_linear_alignment_agrees_with_the_exact_one_on_a_small_case() {
        let group = |t: &str| Group {
            type_path: t.to_owned(),
            count: 1,
            fields: BTreeSet::new(),
        };
        let a: Vec<Group> = ["s", "x", "t", "k", "e"].map(group).to_vec();
        let b: Vec<Group> = ["s", "t", "y", "k", "e"].map(group).to_vec();
        let render = |steps: Vec<Step>| -> Vec<String> {
            steps
                .into_iter()
                .map(|s| match s {
                    Step::Both(i, j) => format!("={i}{j}"),
                    Step::A(i) => format!("-{i}"),
                    Step::B(j) => format!("+{j}"),
                })
                .collect()
        };
        assert_eq!(render(look_ahead(&a, &b)), render(lcs(&a, &b)));
        assert_eq!(
            render(lcs(&a, &b)),
            ["=00", "-1", "=21", "+2", "=33", "=44"]
        );
    }

    #[test]
    fn long_runs_are_aligned_without_a_quadratic_table() {
        let group = |t: String| Group {
            type_path: t,
            count: 1,
            fields: BTreeSet::new(),
        };
        let a: Vec<Group> = (0..6000).map(|i| group(format!("t{i}"))).collect();
        let b: Vec<Group> = (0..6000)
            .filter(|i| *i != 100)
            .map(|i| group(format!("t{i}")))
            .collect();
        assert!(a.len() * b.len() > MAX_LCS_CELLS);
        let lines = align(&a, &b);
        let differing: Vec<&Line> = lines.iter().filter(|l| l.differs()).collect();
        assert_eq!(
            differing,
            [&Line::OnlyA {
                type_path: "t100".into(),
                count: 1
            }]
        );
    }

    #[test]
    fn missing_moved_and_field_differences_are_named_and_delta_counts_are_not() {
        let empty = serde_json::json!({});
        let a = capture(&[
            ("step_started", empty.clone()),
            ("text_delta", empty.clone()),
            ("text_delta", empty.clone()),
            ("heartbeat", empty.clone()),
            (
                "turn_ended",
                serde_json::json!({"turn_ended": {"input_tokens": 5}}),
            ),
            ("checkpoint", empty.clone()),
        ]);
        let b = capture(&[
            ("step_started", empty.clone()),
            ("checkpoint", empty.clone()),
            ("text_delta", empty.clone()),
            (
                "turn_ended",
                serde_json::json!({"turn_ended": {"input_tokens": 5, "cache_read_tokens": 2}}),
            ),
        ]);
        let report = diff(&a, &b);
        let lines = &report.server;
        assert!(lines.contains(&Line::Count {
            type_path: "text_delta".into(),
            a: 2,
            b: 1
        }));
        assert!(lines.contains(&Line::OnlyA {
            type_path: "heartbeat".into(),
            count: 1
        }));
        assert!(
            lines
                .iter()
                .any(|l| matches!(l, Line::Moved { type_path, .. } if type_path == "checkpoint"))
        );
        assert!(lines.contains(&Line::Fields {
            type_path: "turn_ended".into(),
            only_a: vec![],
            only_b: vec!["turn_ended.cache_read_tokens".into()]
        }));
        assert_eq!(report.differences(), 4, "{report}");
        assert_eq!(diff(&a, &a).differences(), 0);
    }
}
