//! `cursor-server`: loads the config, starts the server, stops cleanly on Ctrl-C / SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cursor_server::app::App;
use cursor_server::config::{Config, ConfigError, DEFAULT_CONFIG_PATH};
use cursor_server::store::Store;
use cursor_server::sync::projection;
use tracing_subscriber::EnvFilter;

/// The process's allocator, for C code (SQLite) as much as for Rust (issue 33): jemalloc with one
/// arena, small per-thread caches, and freed pages given back after a second by its background
/// thread. With glibc's malloc, memory freed after a burst of 500 runs stayed with the process
/// (RSS 1.9x idle 15 s after a `Run` burst, 2.1x after a RunSSE one, with a live heap of 5.6 MB),
/// and trimming when idle gave back little. Thread caches off would keep 5 MB less after a burst
/// but cost a fifth more CPU per streamed chunk; these small ones cost nothing measurable. The
/// figures are in the README ("Memory after a burst"). `MALLOC_CONF` in the environment overrides
/// any of these options. A runtime worker that goes idle hands its thread cache back
/// (`idle_allocator_hint`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options (its `malloc_conf` symbol: a C string it reads at start-up).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[unsafe(export_name = "malloc_conf")]
static MALLOC_CONF: AllocatorOptions = AllocatorOptions(
    c"narenas:1,tcache_max:8192,tcache_nslots_small_max:32,tcache_nslots_large:4,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
        .as_ptr(),
);

/// A C string pointer jemalloc reads: the text is a literal, never written.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[repr(transparent)]
struct AllocatorOptions(*const std::ffi::c_char);

// SAFETY: the pointer is to an immutable 'static literal.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe impl Sync for AllocatorOptions {}

#[derive(Parser)]
#[command(
    version,
    about = "Self-hosted backend for the Cursor agent, on your own LLM provider"
)]
struct Args {
    /// Path of the TOML configuration file.
    #[arg(long, global = true, default_value = DEFAULT_CONFIG_PATH, env = "CURSOR_BYOK_CONFIG")]
    config: PathBuf,
    /// Log filter: a level (error, warn, info, debug, trace, off) or directives such as
    /// `info,cursor_server=debug` (the server's own detail without sqlx's and h2's).
    #[arg(long, global = true, default_value = "info", env = "CURSOR_BYOK_LOG")]
    log_level: String,
    /// Log lines as text (coloured only on a terminal, and never with NO_COLOR) or one JSON
    /// object per line.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "CURSOR_BYOK_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Address to listen on, overriding the file's `listen`.
    #[arg(long, global = true, env = "CURSOR_BYOK_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// Database URL (`sqlite://FILE` or `postgres://…`), overriding the file's `database_url`.
    #[arg(long, global = true, env = "CURSOR_BYOK_DATABASE_URL")]
    database_url: Option<String>,
    /// The model used when Cursor names none (and for Auto), overriding `default_model`.
    #[arg(long, global = true, env = "CURSOR_BYOK_DEFAULT_MODEL")]
    default_model: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
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
    /// Manage the people of a shared server ([auth]) in the database. Needs only the database
    /// setting.
    Users {
        #[command(subcommand)]
        action: UsersCommand,
    },
}

#[derive(clap::Subcommand)]
enum UsersCommand {
    /// Issue a token to EMAIL (recording them if new); the token is printed once.
    Add { email: String },
    /// Everyone the database knows, with team, role, state and limits.
    List,
    /// Refuse EMAIL's requests from now on.
    Disable { email: String },
    /// Let EMAIL in again.
    Enable { email: String },
    /// Set EMAIL's limits: a JSON object such as '{"daily_cost_usd": 5, "requests_per_minute": 30}'.
    SetBudget { email: String, limits: String },
}

impl From<UsersCommand> for cursor_server::auth::admin::UsersAction {
    fn from(command: UsersCommand) -> Self {
        use cursor_server::auth::admin::UsersAction as A;
        match command {
            UsersCommand::Add { email } => A::Add { email },
            UsersCommand::List => A::List,
            UsersCommand::Disable { email } => A::Disable { email },
            UsersCommand::Enable { email } => A::Enable { email },
            UsersCommand::SetBudget { email, limits } => A::SetBudget { email, limits },
        }
    }
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

/// The `--log-level` filter. A word that is not a level is an error rather than a target name
/// (`EnvFilter` would read `verbose` as "everything from a module named verbose", silencing the
/// server).
fn log_filter(text: &str) -> Result<EnvFilter, String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains(['=', ':', '[']);
        if bare && !LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{directive:?} is not a level ({}) or a target=level directive",
                LEVELS.join(", ")
            ));
        }
    }
    EnvFilter::try_new(text).map_err(|e| e.to_string())
}

/// Logs to stdout: text, coloured only on a terminal (and never with `NO_COLOR`), or JSON lines.
fn init_logs(filter: EnvFilter, format: LogFormat) {
    use std::io::IsTerminal as _;
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    use tracing_subscriber::prelude::*;
    // Beside the output, the console's logs page keeps the last warnings and errors.
    let logs = tracing_subscriber::registry()
        .with(filter)
        .with(cursor_server::console::logs::layer());
    match format {
        LogFormat::Text => logs
            .with(tracing_subscriber::fmt::layer().with_ansi(colour))
            .init(),
        // Every span's fields (the run's ids, the call's model_call_id) on each line.
        LogFormat::Json => logs
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(false)
                    .with_span_list(true),
            )
            .init(),
    }
}

/// The file's configuration with the command line's (or environment's) overrides.
fn overridden(mut config: Config, args: &Args) -> Result<Config, ConfigError> {
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(url) = &args.database_url {
        config.database_url.clone_from(url);
    }
    if let Some(model) = &args.default_model {
        if !config.model_ids().any(|id| id == model) {
            return Err(ConfigError::UnknownDefaultModel {
                model: model.clone(),
                configured: config.model_ids().collect::<Vec<_>>().join(", "),
            });
        }
        config.default_model.clone_from(model);
    }
    Ok(config)
}

/// What the server runs with, said once at start: enough to tell from the log alone which
/// providers, models, database, pass-through and schema a problem happened with.
fn log_banner(config: &Config) {
    for provider in &config.providers {
        tracing::info!(
            provider = %provider.name,
            kind = ?provider.kind,
            url = %provider.base_url,
            route = %provider.route.shown(),
            "provider"
        );
        for model in &provider.models {
            tracing::info!(
                provider = %provider.name,
                model = %model.id,
                upstream_id = %model.upstream_id,
                vision = model.vision,
                reasoning = model.reasoning,
                context_window = model.context_window,
                default = model.id == config.default_model,
                "model"
            );
        }
    }
    tracing::info!(
        database = %cursor_server::store::postgres::redacted(&config.database_url),
        "database"
    );
    match &config.upstream {
        Some(upstream) => {
            tracing::info!(target = %upstream.url, proxy = upstream.proxy.is_some(), "pass-through to Cursor's backend")
        }
        None => tracing::info!(
            "pass-through is off: routes this server does not serve get unimplemented"
        ),
    }
    use cursor_server::cursor::proto;
    tracing::info!(
        fingerprint = proto::SCHEMA_FINGERPRINT,
        source = proto::SCHEMA_SOURCE,
        cursor_version = proto::schema_cursor_version().unwrap_or("unknown"),
        "Cursor schema"
    );
    // An install on this machine (the standard places; only its version is read, nothing is extracted) that
    // is not the one the schema came from may speak fields the schema lacks: say so once, with the fix.
    let installed = cursor_proto::install::locate(None).ok();
    if let Some(found) = &installed
        && let Some(note) =
            proto::version_note(proto::schema_cursor_version(), found.version.as_deref())
    {
        tracing::warn!(
            install = %found.bundle.display(),
            "{note}: run `cursor-server schema-check` to see whether a rebuild is needed"
        );
    }
}

async fn manage_users(
    config_path: &std::path::Path,
    database_url: Option<&str>,
    action: cursor_server::auth::admin::UsersAction,
) -> ExitCode {
    let database_url = match database_url.map_or_else(
        || Config::load_database_url(config_path),
        |url| Ok(url.to_owned()),
    ) {
        Ok(url) => url,
        Err(e) => {
            eprintln!("cursor-server users: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match Store::open(&database_url).await {
        Ok(store) => {
            let result = cursor_server::auth::admin::run(&store, action).await;
            store.close().await;
            result.map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(out) => {
            println!("{}", out.trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cursor-server users: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn collect_garbage(config_path: &std::path::Path, database_url: Option<&str>) -> ExitCode {
    let database_url = match database_url.map_or_else(
        || Config::load_database_url(config_path),
        |url| Ok(url.to_owned()),
    ) {
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

/// What a runtime worker that has allocated since it last did gives back when it parks: the
/// objects its jemalloc thread cache holds (up to 32 per size class), returned to the arena, whose
/// emptied pages the background thread then releases. A worker's cache otherwise stays as a burst
/// left it until the thread allocates again: 15 s after bursts of 500 runs on each transport, RSS
/// was 1.96-2.01x idle without this, 1.77-1.78x with it, 1.69x with thread caches off (which costs
/// a fifth more CPU per streamed chunk; this costs none measurable). A park is frequent under
/// load, so the flush waits for `FLUSH_AFTER` bytes allocated or freed since the last one: the
/// check reads the thread's own two counters.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn idle_allocator_hint() {
    use std::cell::Cell;
    /// Bytes a worker allocates and frees between two flushes of its cache, at most: a freed
    /// object goes to the freeing thread's cache, wherever it was allocated. With 1 MB (and the
    /// server's own future on the main thread, whose cache is never flushed) RSS was 1.85x.
    const FLUSH_AFTER: u64 = 64 << 10;
    thread_local! {
        /// The thread's allocated- and freed-bytes counters (read once) and their sum at the
        /// last flush.
        static COUNTERS: Cell<Option<(Counters, u64)>> = const { Cell::new(None) };
    }
    COUNTERS.with(|cell| {
        let Some((counters, flushed_at)) = cell.get().or_else(|| Some((Counters::of_thread()?, 0)))
        else {
            return;
        };
        let moved = counters.sum();
        if moved.wrapping_sub(flushed_at) >= FLUSH_AFTER {
            flush_thread_cache();
            cell.set(Some((counters, moved)));
        } else {
            cell.set(Some((counters, flushed_at)));
        }
    });
}

/// Returns what the calling thread's jemalloc cache holds to the arena; `false` if jemalloc
/// refused (it does not when thread caches are on, as they are unless `MALLOC_CONF` turns them
/// off).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn flush_thread_cache() -> bool {
    // SAFETY: `thread.tcache.flush` reads and writes nothing.
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.flush".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    status == 0
}

/// jemalloc's counters of the bytes the calling thread allocated and freed (`thread.allocatedp`,
/// `thread.deallocatedp`): pointers into the thread's own state, valid for its life.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[derive(Clone, Copy)]
struct Counters {
    allocated: *const u64,
    freed: *const u64,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl Counters {
    fn of_thread() -> Option<Counters> {
        let read = |name: &std::ffi::CStr| {
            let mut pointer: *const u64 = std::ptr::null();
            let mut size = std::mem::size_of::<*const u64>();
            // SAFETY: both names are `uint64_t *` values, read into a pointer of that size.
            let status = unsafe {
                tikv_jemalloc_sys::mallctl(
                    name.as_ptr(),
                    (&raw mut pointer).cast(),
                    &mut size,
                    std::ptr::null_mut(),
                    0,
                )
            };
            (status == 0 && !pointer.is_null()).then_some(pointer)
        };
        Some(Counters {
            allocated: read(c"thread.allocatedp")?,
            freed: read(c"thread.deallocatedp")?,
        })
    }

    /// Bytes allocated and freed by the thread so far. Called only on the thread they belong to.
    fn sum(self) -> u64 {
        // SAFETY: the thread's own counters, read on that thread while it lives.
        unsafe { self.allocated.read().wrapping_add(self.freed.read()) }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn idle_allocator_hint() {}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(idle_allocator_hint)
        .build();
    match runtime {
        // On a worker, so that what the server itself allocates is in a cache flushed when idle.
        Ok(runtime) => runtime.block_on(async {
            tokio::spawn(serve()).await.unwrap_or_else(|e| {
                eprintln!("cursor-server: {e}");
                ExitCode::FAILURE
            })
        }),
        Err(e) => {
            eprintln!("cursor-server: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> ExitCode {
    let args = Args::parse();
    let filter = match log_filter(&args.log_level) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!(
                "cursor-server: invalid --log-level {:?}: {e}",
                args.log_level
            );
            return ExitCode::FAILURE;
        }
    };
    init_logs(filter, args.log_format);
    // Needs no configuration: it only compares schemas.
    if let Some(Command::SchemaCheck { path }) = &args.command {
        return schema_check(path.as_deref());
    }

    if let Some(Command::Users { action }) = args.command {
        return manage_users(&args.config, args.database_url.as_deref(), action.into()).await;
    }
    if let Some(Command::Gc) = args.command {
        return collect_garbage(&args.config, args.database_url.as_deref()).await;
    }
    let config = match Config::load(&args.config).and_then(|config| overridden(config, &args)) {
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
    log_banner(app.state().config.as_ref());
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

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The hook reads jemalloc's counters and flushes by name: a wrong name would leave every
    /// thread cache as a burst left it, silently.
    #[test]
    fn a_thread_reads_its_allocation_counters_and_can_flush_its_cache() {
        let counters = Counters::of_thread().expect("jemalloc's per-thread counters");
        let before = counters.sum();
        let buffer = std::hint::black_box(vec![1u8; 1 << 20]);
        drop(buffer);
        assert!(
            counters.sum().wrapping_sub(before) >= 2 << 20,
            "a MB allocated and freed moves the counters by two"
        );
        assert!(flush_thread_cache(), "jemalloc flushed the thread's cache");
    }
}
