//! Test fixtures: a real cursor-server on an ephemeral loopback port with its own database, wired
//! to a fake provider; and builders for the client messages tests send.
//!
//! The database is a SQLite file in the test's directory, or, in a test binary whose name ends in
//! `_postgres` (a second `[[test]]` target of the same file, see Cargo.toml), a database of its
//! own on the binary's PostgreSQL cluster (`postgres.rs`): the same scenarios on both backends.
#![allow(dead_code)]

#[path = "postgres.rs"]
pub mod postgres;

use std::net::SocketAddr;
use std::path::Path;

use cursor_server::app::App;
use cursor_server::config::Config;
use cursor_server::cursor::proto::agent::{
    AgentClientMessage, AgentRunRequest, ClientHeartbeat, ConversationAction, RequestContext,
    RequestedModel, UserMessage, UserMessageAction, agent_client_message, conversation_action,
};
use tokio_util::sync::CancellationToken;

pub const MODEL: &str = "test-model";
pub const API_KEY: &str = "sk-test-secret";

/// Whether this test binary runs its scenarios on PostgreSQL (its target name ends in
/// `_postgres`) rather than SQLite.
pub fn on_postgres() -> bool {
    env!("CARGO_CRATE_NAME").ends_with("_postgres")
}

/// The database URL of the test database `db` names: the SQLite file itself, or on PostgreSQL a
/// database of the shared cluster named after that path (created on first use), so a test that
/// stops a server and opens its database again finds the same one.
pub fn database_url(db: &Path) -> String {
    if !on_postgres() {
        return format!("sqlite://{}", db.display());
    }
    use std::hash::{Hash as _, Hasher as _};
    static CREATED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    db.hash(&mut hasher);
    let name = format!("t_{:016x}", hasher.finish());
    let cluster = postgres::Cluster::shared();
    let mut created = CREATED.lock().unwrap_or_else(|e| e.into_inner());
    if created.contains(&name) {
        return cluster.url(&name);
    }
    created.push(name.clone());
    cluster.create_database(&name)
}

/// Opens the store of the test database `db` names (see `database_url`).
pub async fn open_store(db: &Path) -> cursor_server::store::Store {
    cursor_server::store::Store::open(&database_url(db))
        .await
        .expect("the test database opens")
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub db_dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
    /// The server's state, not kept alive by the test (`stop` waits until its store is closed).
    state: std::sync::Weak<cursor_server::state::AppState>,
}

impl TestServer {
    /// Starts a server with a fresh database, talking to `provider_base_url`.
    pub async fn start(provider_base_url: &str) -> TestServer {
        let db_dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(provider_base_url, db_dir, "").await
    }

    /// Starts a server on the database inside `db_dir`, with extra top-level TOML lines.
    pub async fn start_in(
        provider_base_url: &str,
        db_dir: tempfile::TempDir,
        extra: &str,
    ) -> TestServer {
        let config = config_for(provider_base_url, &db_dir.path().join("test.db"), extra);
        Self::start_with(config, db_dir).await
    }

    /// Starts a server with a fresh database whose provider is of `kind`.
    pub async fn start_kind(provider_base_url: &str, kind: &str) -> TestServer {
        let db_dir = tempfile::tempdir().expect("tempdir");
        let config = config_for_kind(provider_base_url, &db_dir.path().join("test.db"), "", kind);
        Self::start_with(config, db_dir).await
    }

    /// Starts a server with a fresh database and the configuration `edit` makes of the default
    /// test configuration's TOML (for model settings `extra` cannot reach).
    pub async fn start_edited(
        provider_base_url: &str,
        kind: &str,
        edit: impl FnOnce(String) -> String,
    ) -> TestServer {
        let db_dir = tempfile::tempdir().expect("tempdir");
        let text = edit(config_text(
            provider_base_url,
            &db_dir.path().join("test.db"),
            "",
            kind,
        ));
        let config = Config::from_toml(&text, Path::new("test.toml"), &|_| None)
            .expect("edited test config is valid");
        Self::start_with(config, db_dir).await
    }

    /// Starts a server with `config`, whose database is inside `db_dir`.
    pub async fn start_with(config: Config, db_dir: tempfile::TempDir) -> TestServer {
        // `TEST_LOG=debug cargo test ...` shows the server's logs for a failing scenario.
        if let Ok(filter) = std::env::var("TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let app = App::bind(config).await.expect("server starts");
        let addr = app.local_addr().expect("addr");
        let shutdown = app.shutdown_token();
        let state = std::sync::Arc::downgrade(app.state());
        let task = tokio::spawn(async move {
            app.serve().await.expect("server runs");
        });
        TestServer {
            addr,
            shutdown,
            db_dir,
            task,
            state,
        }
    }

    /// Waits until the server knows which conversations its store has (read in the background as
    /// it starts): from then on a conversation it has none of is opened without reading the store.
    pub async fn until_conversations_known(&self) {
        let state = self.state.upgrade().expect("the server runs");
        state.history.until_learned().await;
    }

    /// Stops the server and waits until it has closed its database.
    pub async fn stop(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        let _ = self.task.await;
        self.db_dir
    }
}

pub fn config_for(provider_base_url: &str, db: &Path, extra: &str) -> Config {
    config_for_kind(provider_base_url, db, extra, "openai-chat")
}

pub fn config_for_kind(provider_base_url: &str, db: &Path, extra: &str, kind: &str) -> Config {
    let text = config_text(provider_base_url, db, extra, kind);
    Config::from_toml(&text, Path::new("test.toml"), &|_| None).expect("test config is valid")
}

/// The TOML of a test configuration (see `config_for_kind`).
pub fn config_text(provider_base_url: &str, db: &Path, extra: &str, kind: &str) -> String {
    // Fake clients that do not answer KV requests should not hold every test for the default 10 s.
    let ack_timeout = if extra.contains("checkpoint_ack_timeout_ms") {
        ""
    } else {
        "checkpoint_ack_timeout_ms = 200"
    };
    // A dropped RunSSE is given a short grace to come back, unless a test says otherwise.
    let grace = if extra.contains("reconnect_grace_ms") {
        ""
    } else {
        "reconnect_grace_ms = 300"
    };
    // Tests never reach Cursor's real backend: pass-through is off unless a test names an upstream.
    let pass_through = if extra.contains("upstream_url") {
        ""
    } else {
        "pass_through = false"
    };
    format!(
        r#"
listen = "127.0.0.1:0"
database_url = "{db}"
provider_idle_timeout_secs = 5
provider_retry_base_delay_ms = 10
{ack_timeout}
{grace}
{pass_through}
{extra}

[[providers]]
name = "fake"
kind = "{kind}"
base_url = "{provider_base_url}"
api_key = "{API_KEY}"

[[providers.models]]
id = "{MODEL}"
upstream_id = "upstream-{MODEL}"
display_name = "Test Model"
reasoning = true
vision = true
"#,
        db = database_url(db)
    )
}

/// The real `cursor-server` binary as a child process on the database inside `db_dir` (so a test
/// can kill it with SIGKILL), and the address it listens on.
pub async fn spawn_process(
    provider_base_url: &str,
    db_dir: &Path,
) -> (tokio::process::Child, SocketAddr) {
    let config = db_dir.join("cursor-byok.toml");
    let text = config_text(
        provider_base_url,
        &db_dir.join("test.db"),
        "",
        "openai-chat",
    );
    std::fs::write(&config, text).expect("config written");
    let (child, addr, _) = spawn_binary(&config, &[]).await;
    (child, addr)
}

/// The shared secret of the test clusters.
pub const CLUSTER_SECRET: &str = "test-cluster-secret-0123456789";

/// A node of a test cluster: the real binary on the database inside `db_dir` (shared by every
/// node), named `name`, listening on a port of its own which is also its internal address, with
/// `secret` as the cluster secret, `extra` top-level lines and `lease_secs`. Its log lines are
/// kept (see `NodeLog`).
pub async fn spawn_node(
    provider_base_url: &str,
    db_dir: &Path,
    (name, secret): (&str, &str),
    extra: &str,
    lease_secs: f64,
) -> (tokio::process::Child, SocketAddr, NodeLog) {
    let config = node_config(provider_base_url, db_dir, name, extra, lease_secs);
    spawn_binary(&config, &[("TEST_CLUSTER_SECRET", secret)]).await
}

/// Writes the configuration of node `name` of a test cluster (see `spawn_node`) on a free port of
/// its own; returns its path.
pub fn node_config(
    provider_base_url: &str,
    db_dir: &Path,
    name: &str,
    extra: &str,
    lease_secs: f64,
) -> std::path::PathBuf {
    // A free port, so the node can name its internal address before it listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let text = config_text(
        provider_base_url,
        &db_dir.join("test.db"),
        extra,
        "openai-chat",
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let text = format!(
        "{text}\n[cluster]\nnode_name = \"{name}\"\ninternal_url = \"http://127.0.0.1:{port}\"\nsecret_env = \"TEST_CLUSTER_SECRET\"\nlease_secs = {lease_secs}\n"
    );
    let config = db_dir.join(format!("node-{name}.toml"));
    std::fs::write(&config, text).expect("config written");
    config
}

/// Runs the binary with `config` and the cluster `secret` to its exit (within `within`): how it
/// exited and what it printed (stdout, then stderr).
pub async fn run_to_exit(
    config: &Path,
    secret: &str,
    within: std::time::Duration,
) -> (std::process::ExitStatus, String) {
    let Some(binary) = option_env!("CARGO_BIN_EXE_cursor-server") else {
        panic!("cursor-server's binary is known only to cursor-server's own tests");
    };
    let run = tokio::process::Command::new(binary)
        .arg("--config")
        .arg(config)
        .env("TEST_CLUSTER_SECRET", secret)
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(within, run)
        .await
        .unwrap_or_else(|_| panic!("cursor-server did not exit within {within:?}"))
        .expect("cursor-server runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, printed)
}

/// A node's log lines so far, and a way to wait for one.
#[derive(Clone, Default)]
pub struct NodeLog {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    added: std::sync::Arc<tokio::sync::Notify>,
}

impl NodeLog {
    /// Waits (up to `within`) for a log line containing `needle`; returns it.
    pub async fn wait_for(&self, needle: &str, within: std::time::Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let added = self.added.notified();
            if let Some(line) = self
                .lines
                .lock()
                .expect("log lock")
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                panic!("no log line with {needle:?} within {within:?}");
            }
        }
    }
}

/// Starts the binary with `config` and `envs`; its address once it listens, and its log.
async fn spawn_binary(
    config: &Path,
    envs: &[(&str, &str)],
) -> (tokio::process::Child, SocketAddr, NodeLog) {
    use tokio::io::AsyncBufReadExt as _;
    // Defined for cursor-server's own tests; cursor-backend's tests share these fixtures but never
    // start the binary.
    let Some(binary) = option_env!("CARGO_BIN_EXE_cursor-server") else {
        panic!("cursor-server's binary is known only to cursor-server's own tests");
    };
    let mut child = tokio::process::Command::new(binary)
        .arg("--config")
        .arg(config)
        .envs(envs.iter().copied())
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cursor-server starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // Every line is kept, those before it listens too.
    let log = NodeLog::default();
    let addr = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("log line") {
            log.lines.lock().expect("log lock").push(line.clone());
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().expect("address");
                return addr.parse::<SocketAddr>().expect("socket address");
            }
        }
        panic!("cursor-server exited before listening");
    })
    .await
    .expect("cursor-server listens");
    // Keep draining its output so it never blocks on a full pipe, keeping the lines.
    let kept = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            kept.lines.lock().expect("log lock").push(line);
            kept.added.notify_waiters();
        }
    });
    (child, addr, log)
}

/// A user message as the IDE sends it (with a request context, here an empty one).
pub fn run_request(conversation_id: &str, text: &str) -> AgentClientMessage {
    let mut message = cli_run_request(conversation_id, text);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
    {
        action.request_context = Some(RequestContext::default());
    }
    message
}

/// A user message as a CLI client sends it: no request context (the server asks for it).
pub fn cli_run_request(conversation_id: &str, text: &str) -> AgentClientMessage {
    AgentClientMessage {
        message: Some(agent_client_message::Message::RunRequest(AgentRunRequest {
            conversation_id: Some(conversation_id.to_owned()),
            requested_model: Some(RequestedModel {
                model_id: MODEL.to_owned(),
                ..RequestedModel::default()
            }),
            action: Some(ConversationAction {
                action: Some(conversation_action::Action::UserMessageAction(
                    UserMessageAction {
                        user_message: Some(UserMessage {
                            text: text.to_owned(),
                            message_id: format!("msg-{text}"),
                            ..UserMessage::default()
                        }),
                        ..UserMessageAction::default()
                    },
                )),
                ..ConversationAction::default()
            }),
            ..AgentRunRequest::default()
        })),
    }
}

pub fn run_request_for_model(conversation_id: &str, text: &str, model: &str) -> AgentClientMessage {
    let mut message = run_request(conversation_id, text);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.requested_model = Some(RequestedModel {
            model_id: model.to_owned(),
            ..RequestedModel::default()
        });
    }
    message
}

pub fn heartbeat() -> AgentClientMessage {
    AgentClientMessage {
        message: Some(agent_client_message::Message::ClientHeartbeat(
            ClientHeartbeat {},
        )),
    }
}

pub const TERMINALS_FOLDER: &str = "/home/user/.cursor/projects/demo/terminals";

/// A run_request whose request context names the terminals folder (as the IDE sends it).
pub fn run_request_with_env(conversation_id: &str, text: &str) -> AgentClientMessage {
    use cursor_server::cursor::proto::agent::{RequestContext, RequestContextEnv};
    let mut message = run_request(conversation_id, text);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
    {
        action.request_context = Some(RequestContext {
            env: Some(RequestContextEnv {
                terminals_folder: TERMINALS_FOLDER.to_owned(),
                workspace_paths: vec!["/home/user/demo".to_owned()],
                ..RequestContextEnv::default()
            }),
            ..RequestContext::default()
        });
    }
    message
}

/// `exec_client_message{id, <result>}`.
pub fn exec_result(
    id: u32,
    result: cursor_server::cursor::proto::agent::exec_client_message::Message,
) -> AgentClientMessage {
    use cursor_server::cursor::proto::agent::ExecClientMessage;
    AgentClientMessage {
        message: Some(agent_client_message::Message::ExecClientMessage(
            ExecClientMessage {
                id,
                message: Some(result),
                ..ExecClientMessage::default()
            },
        )),
    }
}

pub fn stream_close(id: u32) -> AgentClientMessage {
    use cursor_server::cursor::proto::agent::{
        ExecClientControlMessage, ExecClientStreamClose, exec_client_control_message,
    };
    AgentClientMessage {
        message: Some(agent_client_message::Message::ExecClientControlMessage(
            ExecClientControlMessage {
                message: Some(exec_client_control_message::Message::StreamClose(
                    ExecClientStreamClose { id },
                )),
            },
        )),
    }
}

pub fn throw(id: u32, error: &str) -> AgentClientMessage {
    use cursor_server::cursor::proto::agent::{
        ExecClientControlMessage, ExecClientThrow, exec_client_control_message,
    };
    AgentClientMessage {
        message: Some(agent_client_message::Message::ExecClientControlMessage(
            ExecClientControlMessage {
                message: Some(exec_client_control_message::Message::Throw(
                    ExecClientThrow {
                        id,
                        error: error.to_owned(),
                        ..ExecClientThrow::default()
                    },
                )),
            },
        )),
    }
}

/// A run_request with `resume_action`: continue the conversation without a new message.
pub fn resume_request(conversation_id: &str) -> AgentClientMessage {
    use cursor_server::cursor::proto::agent::ResumeAction;
    let mut message = run_request(conversation_id, "");
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message {
        request.action = Some(ConversationAction {
            action: Some(conversation_action::Action::ResumeAction(
                ResumeAction::default(),
            )),
            ..ConversationAction::default()
        });
    }
    message
}

/// A successful `read_result` carrying `content` (its line count and size filled in).
pub fn read_success(
    path: &str,
    content: &str,
) -> cursor_server::cursor::proto::agent::exec_client_message::Message {
    use cursor_server::cursor::proto::agent::{self as pb, exec_client_message};
    exec_client_message::Message::ReadResult(pb::ReadResult {
        result: Some(pb::read_result::Result::Success(pb::ReadSuccess {
            path: path.to_owned(),
            total_lines: i32::try_from(content.lines().count()).unwrap_or(i32::MAX),
            file_size: i64::try_from(content.len()).unwrap_or(i64::MAX),
            output: Some(pb::read_success::Output::Content(content.to_owned())),
            ..pb::ReadSuccess::default()
        })),
    })
}

/// A run_request (with the IDE's request context) whose user message was sent in `mode`.
pub fn run_request_in_mode(
    conversation_id: &str,
    text: &str,
    mode: cursor_server::cursor::proto::agent::AgentMode,
) -> AgentClientMessage {
    let mut message = run_request_with_env(conversation_id, text);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut message.message
        && let Some(conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
        && let Some(user) = action.user_message.as_mut()
    {
        user.mode = mode as i32;
    }
    message
}

/// The first tool message a Chat request carries back to the model.
pub fn tool_result_text(request: &serde_json::Value) -> String {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("a tool result")
        .to_owned()
}

/// The names of the tools a Chat request offered.
pub fn offered_tools(request: &serde_json::Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The client's acknowledgement of `set_blob_args` KV request `id`.
pub fn kv_ack(id: u32) -> AgentClientMessage {
    use cursor_server::cursor::proto::agent::{KvClientMessage, SetBlobResult, kv_client_message};
    AgentClientMessage {
        message: Some(agent_client_message::Message::KvClientMessage(
            KvClientMessage {
                id,
                message: Some(kv_client_message::Message::SetBlobResult(SetBlobResult {
                    error: None,
                })),
            },
        )),
    }
}
