//! `cursor-server`: loads the config, starts the server, stops cleanly on Ctrl-C / SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cursor_server::app::App;
use cursor_server::config::{Config, DEFAULT_CONFIG_PATH};
use cursor_server::cursor::projection;
use cursor_server::store::Store;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    version,
    about = "Self-hosted backend for the Cursor agent, on your own LLM provider"
)]
struct Args {
    /// Path of the TOML configuration file.
    #[arg(long, global = true, default_value = DEFAULT_CONFIG_PATH, env = "CURSOR_BYOK_CONFIG")]
    config: PathBuf,
    /// Log filter: a level (error, warn, info, debug, trace) or a tracing directive list.
    #[arg(long, global = true, default_value = "info", env = "CURSOR_BYOK_LOG")]
    log_level: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Delete stored blobs that no conversation references any more, then exit. Blobs younger than
    /// an hour are kept, so it is safe while the server runs. Needs only the database setting.
    Gc,
    /// Check the configuration (every problem at once), show each provider's URL and route
    /// (direct or which proxy), and probe each model with a minimal request. Exit status 0: all
    /// is well; 1: something needs fixing (each failure says what).
    Check,
    /// Compare the schema this server was built from with a Cursor install (or a schema directory or
    /// bundle; default: the standard places, CURSOR_APP_DIR first) and say in one line whether a rebuild is
    /// needed. Exit status 0: no rebuild needed, 1: rebuild needed, 2: the install could not be read.
    SchemaCheck {
        /// A Cursor install, its `extensions` directory, a bundle, or a schema directory.
        path: Option<PathBuf>,
    },
}

fn schema_check(path: Option<&std::path::Path>) -> ExitCode {
    match cursor_server::cursor::proto::check_schema(path) {
        Ok(check) => {
            println!("cursor-server schema-check: {}", check.verdict());
            if check.rebuild_needed() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("cursor-server schema-check: {e}");
            ExitCode::from(2)
        }
    }
}

async fn collect_garbage(config_path: &std::path::Path) -> ExitCode {
    let database_url = match Config::load_database_url(config_path) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("cursor-server gc: {e}");
            return ExitCode::FAILURE;
        }
    };
    let store = match Store::open(&database_url).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("cursor-server gc: {e}");
            return ExitCode::FAILURE;
        }
    };
    let grace = std::time::Duration::from_secs(3600);
    match projection::collect_garbage(&store, grace).await {
        Ok(deleted) => {
            println!("cursor-server gc: deleted {deleted} unreachable blobs");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cursor-server gc: {e}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = match EnvFilter::try_new(&args.log_level) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!("invalid --log-level {:?}: {e}", args.log_level);
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt().with_env_filter(filter).init();
    // Needs no configuration: it only compares schemas.
    if let Some(Command::SchemaCheck { path }) = &args.command {
        return schema_check(path.as_deref());
    }

    if let Some(Command::Gc) = args.command {
        return collect_garbage(&args.config).await;
    }
    let config = match Config::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("cursor-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::Check) = args.command {
        println!("configuration {}: valid", args.config.display());
        return if cursor_server::ops::check::run(&config).await {
            println!("all is well");
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    for warning in &config.warnings {
        tracing::warn!("config: {warning}");
    }
    let app = match App::bind(config).await {
        Ok(app) => app,
        Err(e) => {
            eprintln!("cursor-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        fingerprint = cursor_server::cursor::proto::SCHEMA_FINGERPRINT,
        source = cursor_server::cursor::proto::SCHEMA_SOURCE,
        "Cursor schema"
    );
    match app.local_addr() {
        Ok(addr) => tracing::info!("cursor-server listening on http://{addr} (HTTP/1.1 and h2c)"),
        Err(e) => tracing::warn!("listening address unknown: {e}"),
    }
    let shutdown = app.shutdown_token();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    match app.serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cursor-server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
