//! `cursor-backend`: the capture proxy (the default command) and `cursor-backend diff`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cursor_backend::diff::{self, Capture};
use cursor_backend::schema::Schema;
use cursor_backend::store::Captures;
use cursor_backend::{DEFAULT_UPSTREAM, Debugger, Options};

#[derive(Debug, Parser)]
#[command(
    name = "cursor-backend",
    version,
    about = "A capture debugger between Cursor and any backend: every Connect frame recorded and decoded by request id"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where Cursor connects (HTTP/1.1 and h2c on one port).
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Where the UI and its JSON API are served.
    #[arg(long, default_value = "127.0.0.1:9091")]
    ui: SocketAddr,
    /// Where requests are forwarded: Cursor's backend, or cursor-server (e.g. http://127.0.0.1:3000).
    #[arg(long, default_value = DEFAULT_UPSTREAM)]
    upstream: String,
    /// Extra root certificates (PEM) trusted for a TLS upstream, beside the system's: a corporate
    /// TLS-inspecting proxy's, or a self-signed upstream's.
    #[arg(long)]
    upstream_ca: Option<PathBuf>,
    /// The Cursor schema: a directory of .proto files, a Cursor install, or its bundle. Without it the
    /// standard install places are searched; with none found, frames are kept raw.
    #[arg(long, env = "CURSOR_PROTO_DIR")]
    schema: Option<PathBuf>,
    /// The captures database.
    #[arg(long, default_value = "captures.db")]
    db: PathBuf,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compares two captured runs: frames missing, out of order, fields set in one and not the other.
    /// Each capture is `REQUEST_ID` (in --db) or `DATABASE#REQUEST_ID`. Exits 1 when they differ.
    Diff {
        a: String,
        b: String,
        #[arg(long, default_value = "captures.db")]
        db: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cursor-backend: cannot start the runtime: {error}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Some(Command::Diff { a, b, db }) => run_diff(&a, &b, &db).await,
            None => run_proxy(cli).await,
        }
    })
}

async fn run_proxy(cli: Cli) -> ExitCode {
    let schema = match Schema::load(cli.schema.as_deref()) {
        Ok(schema) => {
            tracing::info!(origin = %schema.origin, messages = schema.message_count(), "schema loaded");
            Some(schema)
        }
        Err(error) if cli.schema.is_some() => {
            eprintln!("cursor-backend: {error}");
            return ExitCode::from(2);
        }
        Err(error) => {
            tracing::warn!(%error, "no Cursor schema found: frames are recorded raw (name one with --schema)");
            None
        }
    };
    for (what, addr) in [("proxy", cli.listen), ("UI", cli.ui)] {
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the {what} listens beyond this machine: captures hold your code and prompts, and the UI has no login");
        }
    }
    let options = Options {
        listen: cli.listen,
        ui: cli.ui,
        upstream: cli.upstream.clone(),
        upstream_ca: cli.upstream_ca.clone(),
        db: cli.db.clone(),
        schema,
    };
    let debugger = match Debugger::start(options).await {
        Ok(debugger) => debugger,
        Err(error) => {
            eprintln!("cursor-backend: {error}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(
        proxy = %debugger.proxy_addr,
        ui = %format!("http://{}/", debugger.ui_addr),
        upstream = %cli.upstream,
        db = %cli.db.display(),
        "capturing: point Cursor at http://{} (docs/capture.md)",
        debugger.proxy_addr
    );
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("stopping: recording what is still queued");
    debugger.shutdown().await;
    ExitCode::SUCCESS
}

async fn load_capture(spec: &str, default_db: &Path) -> Result<Capture, String> {
    let (db, request_id) = match spec.rsplit_once('#') {
        Some((db, id)) => (PathBuf::from(db), id),
        None => (default_db.to_owned(), spec),
    };
    let captures = Captures::open_existing(&db)
        .await
        .map_err(|e| e.to_string())?;
    let frames = captures
        .frames(request_id)
        .await
        .map_err(|e| e.to_string())?;
    if frames.is_empty() {
        return Err(format!(
            "{}: no frames of request {request_id}",
            db.display()
        ));
    }
    Ok(Capture {
        label: format!("{}#{request_id} ({} frames)", db.display(), frames.len()),
        frames,
    })
}

async fn run_diff(a: &str, b: &str, db: &Path) -> ExitCode {
    let (a, b) = match (load_capture(a, db).await, load_capture(b, db).await) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("cursor-backend diff: {error}");
            return ExitCode::from(2);
        }
    };
    let report = diff::diff(&a, &b);
    print!("{report}");
    if report.differences() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
