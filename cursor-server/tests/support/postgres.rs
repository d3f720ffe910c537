//! A real PostgreSQL for the tests: Debian's server binaries (`apt-get install postgresql`), a
//! cluster initialized in a temporary directory and listening on a free loopback port (its unix
//! socket in the same directory), one fresh database per test. One cluster serves a whole test
//! binary (`shared`), started on first use and stopped when the process exits; a test that stops
//! and restarts PostgreSQL under a running server gets a cluster of its own (`Cluster::start`).
//!
//! PostgreSQL refuses to run as root: as root (CI, this machine) the cluster belongs to `nobody`
//! and its programs run under `setpriv`. The server process gets a parent-death signal, so a test
//! binary killed outright takes its PostgreSQL with it; a normal exit stops it and removes its
//! directory (`atexit`). A machine without PostgreSQL fails, with the command that installs it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The uid and gid the cluster runs as when the tests run as root (`nobody` / `nogroup`).
const UNPRIVILEGED: u32 = 65534;

/// Where the tests' clusters live: `<tmp>/cursor-byok-pg-<pid>-<n>`.
const DIR_PREFIX: &str = "cursor-byok-pg-";

/// A running PostgreSQL cluster of the tests.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// Whether `Drop` stops it (a cluster of one test; the shared one is stopped at exit).
    owned: bool,
}

/// The directory of Debian's PostgreSQL server binaries (the newest installed version).
fn binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "these tests need a PostgreSQL server and found none under /usr/lib/postgresql/*/bin: \
             install Debian's package with `apt-get install postgresql` (CI's .ci/run does this)"
        ),
    }
}

fn is_root() -> bool {
    // The effective uid without a libc binding: /proc/self/status's `Uid:` line.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// `program args…` as the cluster's user: under `setpriv` as `nobody` when root, and with a
/// parent-death signal when `pdeathsig` is given.
fn as_cluster_user(program: &Path, pdeathsig: Option<&str>) -> Command {
    let root = is_root();
    if !root && pdeathsig.is_none() {
        return Command::new(program);
    }
    let mut command = Command::new("setpriv");
    if root {
        command.args([
            format!("--reuid={UNPRIVILEGED}"),
            format!("--regid={UNPRIVILEGED}"),
            "--clear-groups".to_owned(),
        ]);
    }
    if let Some(signal) = pdeathsig {
        command.args(["--pdeathsig", signal]);
    }
    command.arg("--").arg(program);
    command
}

/// Removes the directories of clusters whose test process is gone (killed before its `atexit`).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next() else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A name part no other copy of this module in the process picks (std's random hash keys).
fn unique() -> String {
    use std::hash::BuildHasher as _;
    format!(
        "{:016x}",
        std::collections::hash_map::RandomState::new().hash_one(Instant::now())
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

fn run(command: &mut Command, what: &str) {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Cluster {
    /// Initializes and starts a cluster of the caller's own, stopped (and removed) on drop.
    pub fn start() -> Cluster {
        sweep_stale();
        let dir =
            std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{}", std::process::id(), unique()));
        let mut cluster = Self::init(dir);
        cluster.owned = true;
        cluster.run_server();
        cluster
    }

    /// The cluster of this test binary. A binary may hold several copies of this module (each
    /// suite of `suites_postgres.rs` includes the fixtures), so the copies meet in the file system:
    /// the first to create `<tmp>/cursor-byok-pg-<pid>-shared` starts the cluster and writes its
    /// port there, the others wait for that file.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("{DIR_PREFIX}{}-shared", std::process::id()));
            let port_file = dir.join("port");
            if std::fs::create_dir(&dir).is_ok() {
                sweep_stale();
                let cluster = Self::init(dir);
                cluster.run_server();
                register_stop_at_exit(&cluster);
                let written = cluster.dir.join("port.new");
                std::fs::write(&written, cluster.port.to_string()).expect("port written");
                std::fs::rename(&written, &port_file).expect("port published");
                return cluster;
            }
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if let Ok(port) = std::fs::read_to_string(&port_file) {
                    return Cluster {
                        dir,
                        bin: binaries(),
                        port: port.trim().parse().expect("a port"),
                        owned: false,
                    };
                }
                assert!(
                    Instant::now() < deadline,
                    "the shared cluster did not start"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    }

    /// Initializes a cluster in `dir` (created, and given to `nobody` when root).
    fn init(dir: PathBuf) -> Cluster {
        let bin = binaries();
        let _ = std::fs::create_dir(&dir);
        if is_root() {
            std::os::unix::fs::chown(&dir, Some(UNPRIVILEGED), Some(UNPRIVILEGED))
                .expect("the cluster directory given to nobody");
        }
        run(
            as_cluster_user(&bin.join("initdb"), None)
                .current_dir(&dir)
                .args(["-D", "data", "-U", "postgres", "-A", "trust", "-E", "UTF8"])
                .args(["--no-sync", "--no-instructions"]),
            "initdb",
        );
        Cluster {
            dir,
            bin,
            port: free_port(),
            owned: false,
        }
    }

    /// Starts the server process from a thread that outlives every test, so its parent-death
    /// signal (SIGINT, a fast shutdown) fires when the test process ends, not when a test thread
    /// does; then waits until it accepts connections.
    fn run_server(&self) {
        let mut command = as_cluster_user(&self.bin.join("postgres"), Some("INT"));
        command
            .current_dir(&self.dir)
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-k")
            .arg(&self.dir)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            // Throwaway data: durability off, room for many servers' pools at once.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=400"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(self.dir.join("postgres.log")).expect("log file"),
            ));
        let (sent, started) = std::sync::mpsc::channel();
        std::thread::spawn(move || match command.spawn() {
            Ok(mut child) => {
                let _ = sent.send(Ok(()));
                // Waits for the life of the server: the parent-death signal follows this thread,
                // and the server is reaped here once stopped.
                let _ = child.wait();
            }
            Err(e) => {
                let _ = sent.send(Err(e.to_string()));
            }
        });
        started
            .recv()
            .expect("the spawning thread answers")
            .unwrap_or_else(|e| panic!("starting postgres: {e}"));
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
                panic!("postgres did not start within 60 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates database `name` (letters, digits, `_`) and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        run(
            Command::new(self.bin.join("createdb"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", name]),
            "createdb",
        );
        self.url(name)
    }

    /// A fresh database with a random name.
    pub fn fresh_database(&self) -> String {
        let name = format!("t_fresh_{}", unique());
        self.create_database(&name)
    }

    /// Stops the server (`pg_ctl stop`, fast: sessions are ended, as when an operator restarts it).
    pub fn stop(&self) {
        run(
            as_cluster_user(&self.bin.join("pg_ctl"), None)
                .current_dir(&self.dir)
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["stop", "-m", "fast", "-w"]),
            "pg_ctl stop",
        );
    }

    /// Starts it again on the same port and data after `stop`.
    pub fn restart(&self) {
        self.run_server();
    }

    fn stop_and_remove(&self) {
        let _ = as_cluster_user(&self.bin.join("pg_ctl"), None)
            .current_dir(&self.dir)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["stop", "-m", "immediate", "-w"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.owned {
            self.stop_and_remove();
        }
    }
}

/// Stops the shared cluster and removes its directory when the test process exits normally
/// (libtest returns from `main` or calls `exit`, both of which run `atexit` handlers).
fn register_stop_at_exit(cluster: &Cluster) {
    static AT_EXIT: Mutex<Option<(PathBuf, PathBuf)>> = Mutex::new(None);
    unsafe extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn stop() {
        if let Ok(mut slot) = AT_EXIT.lock()
            && let Some((bin, dir)) = slot.take()
        {
            let cluster = Cluster {
                dir,
                bin,
                port: 0,
                owned: false,
            };
            cluster.stop_and_remove();
        }
    }
    *AT_EXIT.lock().expect("at-exit slot") = Some((cluster.bin.clone(), cluster.dir.clone()));
    // SAFETY: `stop` is a plain function that lives for the whole process.
    unsafe {
        atexit(stop);
    }
}
