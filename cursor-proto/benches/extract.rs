//! How long extraction takes: the legacy (esbuild, assignments after the class), webpack (cross-module
//! exports) and v2-esbuild (protobuf-es v2 embedded descriptors) reference bundles, from file to compiled schema.
//!
//! A plain timing loop (no benchmark framework, so no extra dependencies): one warm-up, then `RUNS` timed runs of
//! [`extract_file`] per bundle, printed as min / median / max. Run it in release: `cargo bench --bench extract`
//! (`-- N` for another number of runs).

use std::path::Path;
use std::time::{Duration, Instant};

use cursor_proto::extract::extract_file;

/// `shared/` lives beside the repository checkout.
const BUNDLES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/reference/bundles"
);

const RUNS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary with no arguments, and timing
    // a debug build there would only slow the tests down (tests/known_answer.rs extracts the same bundles).
    if !args.iter().any(|arg| arg == "--bench") {
        println!("extract: not timed outside `cargo bench --bench extract`");
        return;
    }
    // A bare number is the run count.
    let runs = args
        .iter()
        .find_map(|arg| arg.parse::<usize>().ok())
        .unwrap_or(RUNS)
        .max(1);
    for shape in ["legacy", "webpack", "v2-esbuild"] {
        let path = Path::new(BUNDLES).join(shape).join("main.js");
        let bytes = match std::fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) => {
                eprintln!(
                    "{}: {e} (the reference bundles are expected in shared/ beside the checkout)",
                    path.display()
                );
                std::process::exit(1);
            }
        };
        let mut times: Vec<Duration> = Vec::with_capacity(runs);
        let mut summary = String::new();
        for run in 0..=runs {
            let started = Instant::now();
            let extraction = match extract_file(&path) {
                Ok(extraction) => extraction,
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
            };
            let took = started.elapsed();
            if run == 0 {
                let (messages, fields) = extraction
                    .counts
                    .values()
                    .fold((0, 0), |(m, f), c| (m + c.messages, f + c.fields));
                summary = format!(
                    "{messages} messages, {fields} fields, {} unresolved",
                    extraction.unresolved.len()
                );
            } else {
                times.push(took);
            }
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "extract {shape:<10} {:.1} MB ({summary}): min {:.0} ms, median {:.0} ms, max {:.0} ms over {runs} runs",
            bytes as f64 / 1e6,
            ms(times[0]),
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1]),
        );
    }
}
