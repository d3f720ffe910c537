//! `cursor-proto`: extract the Cursor schema from an install, and compare two schemas.
//!
//! Owns the command line only: finding, extracting, writing and comparing live in the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use cursor_proto::compare::{compare, summary};
use cursor_proto::extract::{Extraction, extract_files};
use cursor_proto::fingerprint::fingerprint;
use cursor_proto::install::{self, Located, load};
use cursor_proto::write::write_schema;

#[derive(Parser)]
#[command(
    name = "cursor-proto",
    version,
    about = "Extract the Cursor protobuf schema from your own Cursor install, and compare two schemas"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Extract the schema into `.proto` files (one per package, plus the well-known types they import).
    Extract {
        /// A Cursor install (Cursor.app, /usr/share/cursor, /opt/Cursor, an extracted AppImage,
        /// %LOCALAPPDATA%\Programs\cursor), its `extensions` directory or one `.js` bundle. Default: the
        /// standard places for this OS, `CURSOR_APP_DIR` first.
        path: Option<PathBuf>,
        /// Where to write the schema (replaced atomically).
        #[arg(long)]
        out: PathBuf,
        /// Fail, writing nothing, when any field, enum value, method or type could not be read, instead of
        /// leaving it out with a warning.
        #[arg(long)]
        strict: bool,
    },
    /// List what differs between two schemas (schema directories, installs or bundles), marking what the
    /// server uses. Exits 1 when they differ.
    Diff { old: PathBuf, new: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Extract { path, out, strict } => run_extract(path.as_deref(), &out, strict),
        Command::Diff { old, new } => run_diff(&old, &new),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("cursor-proto: {message}");
            ExitCode::from(2)
        }
    }
}

fn run_extract(path: Option<&Path>, out: &Path, strict: bool) -> Result<ExitCode, String> {
    let found = install::locate(path).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let extraction = extract_files(&found.bundles).map_err(|e| e.to_string())?;
    let took = started.elapsed();
    print_extraction(&found, &extraction, took.as_secs_f64());
    if strict && !extraction.unresolved.is_empty() {
        return Err(format!(
            "{}: {} could not be read (--strict); nothing written to {}",
            found.bundle.display(),
            items(extraction.unresolved.len()),
            out.display()
        ));
    }
    let mut files = extraction.files.clone();
    files.push((
        install::RECORD_FILE.to_owned(),
        install::record(&found, &fingerprint(&extraction.descriptors)),
    ));
    write_schema(out, &files).map_err(|e| e.to_string())?;
    println!("wrote {} files to {}", files.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

fn print_extraction(found: &Located, extraction: &Extraction, seconds: f64) {
    print_sources(extraction);
    match &found.version {
        Some(version) => println!("Cursor version {version}"),
        None => {
            println!("Cursor version unknown (no product.json or package.json above the bundle)")
        }
    }
    for (package, counts) in &extraction.counts {
        println!(
            "  {package}: {} messages, {} fields, {} enums, {} services",
            counts.messages, counts.fields, counts.enums, counts.services
        );
    }
    if extraction.duplicates > 0 {
        println!(
            "  {} identical duplicate declarations merged",
            extraction.duplicates
        );
    }
    println!(
        "fingerprint {} ({seconds:.2} s)",
        fingerprint(&extraction.descriptors)
    );
    if extraction.unresolved.is_empty() {
        println!("every field and method resolved");
    } else {
        let count = extraction.unresolved.len();
        let (verb, them) = if count == 1 {
            ("was", "it")
        } else {
            ("were", "them")
        };
        eprintln!(
            "warning: {}: {} could not be read and {verb} left out (the rest of the schema stands without {them}):",
            found.bundle.display(),
            items(count),
        );
        for unresolved in &extraction.unresolved {
            eprintln!("  {unresolved}");
        }
    }
}

/// Which files were read and what each gave: one line for a single v1 bundle (as before), one per file
/// otherwise, saying which protobuf-es generation each type came from.
fn print_sources(extraction: &Extraction) {
    let single = extraction.sources.len() == 1;
    for source in &extraction.sources {
        let what = match (source.v1_types, source.v2_types) {
            (0, 0) => "no protocol types".to_owned(),
            // One v1 bundle: the line stays as it always was.
            (_, 0) if single => String::new(),
            (v1, 0) => format!("{v1} types from protobuf-es v1 classes"),
            (0, v2) => format!("{v2} types from protobuf-es v2 embedded descriptors"),
            (v1, v2) => format!(
                "{v1} types from protobuf-es v1 classes and {v2} from v2 embedded descriptors (both generations: each type is taken from wherever it is)"
            ),
        };
        let used = if single {
            String::new()
        } else {
            format!("; {} used", source.used)
        };
        if what.is_empty() {
            println!("read {}", source.path.display());
        } else {
            println!("read {}: {what}{used}", source.path.display());
        }
    }
    for superseded in &extraction.superseded {
        eprintln!("warning: {superseded}");
    }
}

fn run_diff(old: &Path, new: &Path) -> Result<ExitCode, String> {
    let old = load(old).map_err(|e| e.to_string())?;
    let new = load(new).map_err(|e| e.to_string())?;
    println!("old: {}", old.origin);
    println!("new: {}", new.origin);
    let differences = compare(&old.descriptors, &new.descriptors);
    if differences.is_empty() {
        println!("the two schemas mean the same");
        return Ok(ExitCode::SUCCESS);
    }
    for difference in &differences {
        println!("{difference}");
    }
    println!("{}", summary(&differences));
    Ok(ExitCode::from(1))
}

/// "1 field, enum value, method or type" / "3 fields, enum values, methods or types".
fn items(count: usize) -> String {
    if count == 1 {
        "1 field, enum value, method or type".to_owned()
    } else {
        format!("{count} fields, enum values, methods or types")
    }
}
