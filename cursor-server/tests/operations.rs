//! The operator's view: `/healthz`, `/readyz` and `/metrics` are answered by the server itself (never
//! passed through, even with pass-through on), readiness says why it is not ready, and a tool turn
//! shows up in the metrics (run, provider call, tokens, tool exec, KV blobs, checkpoint latency).
//!
//! Metrics are process-wide: only one scenario in this file runs turns, so its deltas are exact.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::exec_server_message as args;
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{TestServer, exec_result, read_success, run_request_with_env};

/// A loopback address nothing listens on.
async fn unreachable_addr() -> std::net::SocketAddr {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    closed.local_addr().unwrap()
}

async fn get(server: &TestServer, path: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("http://{}{path}", server.addr))
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The value of the series `name` whose labels include every one of `labels` (0 when absent).
fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn health_and_readiness_are_answered_here_even_with_pass_through_on() {
    let provider = FakeProvider::start().await;
    // Pass-through to an address nothing listens on: a forwarded probe would fail.
    let upstream = unreachable_addr().await;
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        &format!("upstream_url = \"http://{upstream}\""),
    )
    .await;

    let (status, body) = get(&server, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "ok");

    let (status, body) = get(&server, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["checks"]["database"]["ok"], true);

    let (status, body) = get(&server, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("cursor_byok_runs_active"), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_database_that_takes_no_writes_makes_the_server_not_ready_and_says_why() {
    let provider = FakeProvider::start().await;
    let server = TestServer::start(&provider.base_url()).await;
    let db = server.db_dir.path().join("test.db");
    // Another connection holds the write lock: the probe cannot write and says so.
    let blocker = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let mut locked = blocker.begin().await.unwrap();
    sqlx::query("CREATE TABLE held (x INTEGER)")
        .execute(&mut *locked)
        .await
        .unwrap();

    let (status, body) = get(&server, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["ready"], false);
    assert_eq!(ready["checks"]["database"]["ok"], false);
    assert_eq!(ready["checks"]["prompts"]["ok"], true);

    locked.rollback().await.unwrap();
    let (status, body) = get(&server, "/readyz").await;
    assert_eq!(status, 200, "ready again once the lock is gone: {body}");
    server.stop().await;
}

#[tokio::test]
async fn a_tool_turn_is_counted_in_the_metrics() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_m1", "Read", r#"{"path":"src/lib.rs"}"#)],
        (100, 10, 0),
    )));
    provider.push(Reply::sse(text_events(&["done"], (150, 5, 100))));
    let server = TestServer::start(&provider.base_url()).await;
    let (_, before) = get(&server, "/metrics").await;

    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-metrics",
        &run_request_with_env("conv-metrics", "read it"),
    )
    .await;
    let exec = session.next_exec().await;
    assert!(matches!(exec.message, Some(args::Message::ReadArgs(_))));
    session
        .send(&exec_result(
            exec.id,
            read_success("src/lib.rs", "pub fn f() {}\n"),
        ))
        .await;
    let transcript = session.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);

    // The run's end is counted after its stream closes: wait for it, not for a guess.
    let mut after = String::new();
    for _ in 0..1500 {
        after = get(&server, "/metrics").await.1;
        let ended = metric(
            &after,
            "cursor_byok_runs_ended_total",
            &["transport=\"run_sse\"", "status=\"succeeded\""],
        );
        let was = metric(
            &before,
            "cursor_byok_runs_ended_total",
            &["transport=\"run_sse\"", "status=\"succeeded\""],
        );
        if ended > was {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let delta =
        |name: &str, labels: &[&str]| metric(&after, name, labels) - metric(&before, name, labels);
    assert_eq!(
        delta(
            "cursor_byok_runs_ended_total",
            &["transport=\"run_sse\"", "status=\"succeeded\""]
        ),
        1.0,
        "{after}"
    );
    assert_eq!(
        delta(
            "cursor_byok_provider_calls_total",
            &["provider=\"fake\"", "outcome=\"success\""]
        ),
        2.0,
        "{after}"
    );
    assert_eq!(
        delta("cursor_byok_tokens_total", &["bucket=\"input\""]),
        250.0
    );
    assert_eq!(
        delta("cursor_byok_tokens_total", &["bucket=\"output\""]),
        15.0
    );
    assert_eq!(
        delta("cursor_byok_tokens_total", &["bucket=\"cache_read\""]),
        100.0
    );
    assert_eq!(
        delta(
            "cursor_byok_tool_execs_total",
            &["tool=\"Read\"", "outcome=\"success\""]
        ),
        1.0
    );
    assert!(delta("cursor_byok_kv_blobs_total", &["event=\"sent\""]) >= 1.0);
    assert!(delta("cursor_byok_kv_blobs_total", &["event=\"acknowledged\""]) >= 1.0);
    assert!(
        delta(
            "cursor_byok_provider_call_seconds_count",
            &["provider=\"fake\""]
        ) == 2.0
    );
    assert!(delta("cursor_byok_provider_first_event_seconds_count", &[]) == 2.0);
    assert!(delta("cursor_byok_checkpoint_publish_seconds_count", &[]) >= 1.0);
    server.stop().await;
}

/// A TOML configuration for a server whose provider is `provider`, with `provider_lines` added to
/// its `[[providers]]` table, read with `env` as the environment.
async fn server_with_env(
    provider: &FakeProvider,
    provider_lines: &str,
    env: &'static [(&'static str, String)],
) -> TestServer {
    let db_dir = tempfile::tempdir().unwrap();
    let text = fixtures::config_text(
        &provider.base_url(),
        &db_dir.path().join("test.db"),
        "",
        "openai-chat",
    )
    .replace(
        "[[providers.models]]",
        &format!("{provider_lines}\n[[providers.models]]"),
    );
    let config = cursor_server::config::Config::from_toml(
        &text,
        std::path::Path::new("test.toml"),
        &|name| env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()),
    )
    .expect("valid config");
    TestServer::start_with(config, db_dir).await
}

async fn one_turn(server: &TestServer, request_id: &str) -> fake_cursor::Transcript {
    let cursor = FakeCursor::new(server.addr);
    Session::start(
        &cursor,
        request_id,
        &fixtures::run_request(&format!("conv-{request_id}"), "hi"),
    )
    .await
    .finish()
    .await
}

#[tokio::test]
async fn a_provider_on_loopback_is_called_directly_even_with_a_proxy_in_the_environment() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["direct"], (1, 1, 0))));
    let dead = unreachable_addr().await;
    let env: &'static [(&'static str, String)] = Box::leak(Box::new([
        ("HTTP_PROXY", format!("http://{dead}")),
        ("http_proxy", format!("http://{dead}")),
        ("ALL_PROXY", format!("http://{dead}")),
    ]));
    let server = server_with_env(&provider, "", env).await;
    let transcript = one_turn(&server, "req-direct").await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "direct");
    server.stop().await;
}

#[tokio::test]
async fn a_providers_own_proxy_is_used_and_named_when_it_fails() {
    let provider = FakeProvider::start().await;
    let dead = unreachable_addr().await;
    let server = server_with_env(
        &provider,
        &format!("proxy = \"http://user:hunter2@{dead}\""),
        &[],
    )
    .await;
    let transcript = one_turn(&server, "req-proxied").await;
    assert_eq!(transcript.error_code(), Some("unavailable"));
    let message = transcript.error_message().unwrap_or_default().to_owned();
    assert!(
        message.contains(&format!("via proxy http://{dead}"))
            && message.contains("proxy key")
            && message.contains("127.0.0.1"),
        "{message}"
    );
    assert!(
        !message.contains("hunter2"),
        "credentials are never shown: {message}"
    );
    assert!(
        provider.requests().is_empty(),
        "nothing went around the proxy"
    );
    server.stop().await;
}

/// `cursor-server check --config <file>` run as a user runs it: its exit status and what it printed.
async fn check(provider_base_url: &str) -> (bool, String) {
    check_edited(provider_base_url, |text| text, &[]).await
}

/// `check` on the test configuration as `edit` makes it, with `env` set for the process.
async fn check_edited(
    provider_base_url: &str,
    edit: impl FnOnce(String) -> String,
    env: &[(&str, &str)],
) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cursor-byok.toml");
    let text = fixtures::config_text(
        provider_base_url,
        &dir.path().join("test.db"),
        "",
        "openai-chat",
    );
    std::fs::write(&config, edit(text)).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .envs(env.iter().copied())
        .arg("check")
        .arg("--config")
        .arg(&config)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .output()
        .await
        .expect("cursor-server check runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), printed)
}

#[tokio::test]
async fn check_passes_against_a_working_provider_and_explains_each_failure() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Status {
        status: 200,
        body: r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"OK"},"finish_reason":"stop"}]}"#.into(),
    });
    let (ok, printed) = check(&provider.base_url()).await;
    assert!(ok, "{printed}");
    assert!(
        printed.contains("/chat/completions"),
        "the resolved URL: {printed}"
    );
    assert!(printed.contains("direct"), "the route: {printed}");
    assert!(printed.contains(": ok ("), "{printed}");
    let probe = &provider.requests()[0];
    assert_eq!(probe["model"], "upstream-test-model");

    let dead = unreachable_addr().await;
    let (ok, printed) = check(&format!("http://{dead}/v1")).await;
    assert!(!ok, "{printed}");
    assert!(
        printed.contains("connection refused") && printed.contains(&dead.to_string()),
        "{printed}"
    );

    for (status, body, cause) in [
        (
            401,
            r#"{"error":{"message":"Incorrect API key"}}"#,
            "API key was refused",
        ),
        (404, "Not Found", "base_url should end"),
        (
            404,
            r#"{"error":{"message":"The model `upstream-test-model` does not exist"}}"#,
            "does not know the model id",
        ),
    ] {
        provider.push(Reply::Status {
            status,
            body: body.into(),
        });
        let (ok, printed) = check(&provider.base_url()).await;
        assert!(!ok, "{printed}");
        assert!(printed.contains(cause), "HTTP {status}: {printed}");
    }
}

#[tokio::test]
async fn check_lists_each_key_by_its_variable_and_probes_each_on_its_own() {
    let provider = FakeProvider::start().await;
    let ok = || {
        Reply::Status {
        status: 200,
        body: r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"OK"},"finish_reason":"stop"}]}"#.into(),
    }
    };
    provider.push(ok());
    provider.push(Reply::Status {
        status: 401,
        body: r#"{"error":{"message":"Incorrect API key"}}"#.into(),
    });
    provider.push(ok());
    let (passed, printed) = check_edited(
        &provider.base_url(),
        |text| {
            text.replace(
                &format!("api_key = \"{}\"", fixtures::API_KEY),
                "api_key_envs = [\"KEY_ONE\", \"KEY_TWO\"]",
            )
        },
        &[("KEY_ONE", "sk-one"), ("KEY_TWO", "sk-two")],
    )
    .await;
    assert!(!passed, "a refused key fails the check: {printed}");
    assert!(
        printed.contains("keys: key 1 (KEY_ONE), key 2 (KEY_TWO)"),
        "{printed}"
    );
    assert!(printed.contains("key 1 (KEY_ONE): ok ("), "{printed}");
    assert!(
        printed.contains(
            "key 2 (KEY_TWO): FAILED: HTTP 401: the API key was refused: key 2 (KEY_TWO)"
        ) && printed.contains("leaves this key out for 300 s"),
        "{printed}"
    );
    // The model is probed with the key that works.
    assert!(printed.contains("model \"test-model\": ok ("), "{printed}");
    assert_eq!(
        provider.authorizations(),
        ["Bearer sk-one", "Bearer sk-two", "Bearer sk-one"]
    );
    assert!(
        !printed.contains("sk-one") && !printed.contains("sk-two"),
        "keys are never printed: {printed}"
    );
}

#[tokio::test]
async fn gc_needs_no_provider_keys_and_takes_options_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cursor-byok.toml");
    let text = fixtures::config_text(
        "http://127.0.0.1:9/v1",
        &dir.path().join("gc.db"),
        "",
        "openai-chat",
    )
    .replace(
        &format!("api_key = \"{}\"", fixtures::API_KEY),
        "api_key_env = \"A_VARIABLE_THAT_IS_NOT_SET\"",
    );
    std::fs::write(&config, text).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .args(["gc", "--config"])
        .arg(&config)
        .env_remove("A_VARIABLE_THAT_IS_NOT_SET")
        .output()
        .await
        .expect("cursor-server gc runs");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("deleted 0 unreachable blobs"), "{printed}");
    assert!(dir.path().join("gc.db").exists(), "the configured database");
}

/// The real binary started with `args` on a config for `provider_base_url`: its stdout lines as
/// they come, and the address once it listens.
async fn spawn_logging(
    provider_base_url: &str,
    dir: &std::path::Path,
    args: &[&str],
) -> (
    tokio::process::Child,
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let config = dir.join("cursor-byok.toml");
    let text = fixtures::config_text(provider_base_url, &dir.join("test.db"), "", "openai-chat");
    std::fs::write(&config, text).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .args(args)
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("cursor-server starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let addr = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = rx.recv().await {
            seen.push(line.clone());
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                    .collect();
                return addr.parse().expect("socket address");
            }
        }
        panic!("cursor-server exited before listening: {seen:#?}");
    })
    .await
    .expect("cursor-server listens");
    // Hand back what came before the listening line too.
    let (again, rest) = tokio::sync::mpsc::unbounded_channel();
    for line in seen {
        let _ = again.send(line);
    }
    tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            if again.send(line).is_err() {
                return;
            }
        }
    });
    (child, addr, rest)
}

/// Lines from `logs` until one satisfies `done` (bounded by a generous deadline).
async fn lines_until(
    logs: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    done: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = logs.recv().await {
            let finished = done(&line);
            lines.push(line);
            if finished {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the awaited log line never came: {lines:#?}"));
    lines
}

#[tokio::test]
async fn logs_name_the_run_provider_and_model_and_each_call_only_its_own_id() {
    let provider = FakeProvider::start().await;
    // The first call is refused once (a retry WARN), then asks for a tool; the second answers.
    provider.push(Reply::Status {
        status: 503,
        body: r#"{"error":{"message":"loading"}}"#.into(),
    });
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_l1", "Read", r#"{"path":"a.rs"}"#)],
        (10, 1, 0),
    )));
    provider.push(Reply::sse(text_events(&["done"], (12, 1, 0))));
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr, mut logs) = spawn_logging(&provider.base_url(), dir.path(), &[]).await;
    let banner = lines_until(&mut logs, |_| true).await;
    let _ = banner;

    let cursor = FakeCursor::new(addr);
    let mut session = Session::start(
        &cursor,
        "req-logs",
        &run_request_with_env("conv-logs", "go"),
    )
    .await;
    let exec = session.next_exec().await;
    session
        .send(&exec_result(exec.id, read_success("a.rs", "x\n")))
        .await;
    assert!(session.finish().await.is_success());
    let lines = lines_until(&mut logs, |line| {
        line.contains("provider call ended") && line.contains("finish_reason=\"stop\"")
            || line.contains("provider call ended") && line.contains("finish_reason=stop")
    })
    .await;

    assert!(
        lines.iter().all(|line| !line.contains('\u{1b}')),
        "no colour codes when stdout is not a terminal"
    );
    let retry = lines
        .iter()
        .find(|line| line.contains("retrying"))
        .expect("the retry WARN");
    assert!(
        retry.contains("request_id=req-logs") && retry.contains("model_call_id="),
        "{retry}"
    );
    let ended: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains("provider call ended"))
        .collect();
    assert_eq!(ended.len(), 2, "{lines:#?}");
    for line in &ended {
        assert!(
            line.contains("provider=fake") && line.contains("model=test-model"),
            "{line}"
        );
        assert_eq!(
            line.matches("model_call_id=").count(),
            1,
            "only the call's own id: {line}"
        );
        assert_eq!(
            line.matches("request_id=").count(),
            1,
            "no field twice: {line}"
        );
    }
    // The console's logs page keeps the warning.
    let logs: serde_json::Value = reqwest::get(format!("http://{addr}/api/logs"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        logs["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["level"] == "WARN" && e["message"].as_str().unwrap().contains("retrying")),
        "{logs}"
    );
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_with_the_start_up_banner() {
    let provider = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_child, _addr, mut logs) =
        spawn_logging(&provider.base_url(), dir.path(), &["--log-format", "json"]).await;
    let lines = lines_until(&mut logs, |line| line.contains("listening on")).await;
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let model = parsed
        .iter()
        .find(|l| l["fields"]["message"] == "model")
        .expect("a banner line per model");
    assert_eq!(model["fields"]["model"], "test-model");
    assert_eq!(model["fields"]["vision"], true);
    let provider_line = parsed
        .iter()
        .find(|l| l["fields"]["message"] == "provider")
        .expect("a banner line per provider");
    assert!(
        provider_line["fields"]["route"]
            .as_str()
            .is_some_and(|r| r.starts_with("direct")),
        "{provider_line}"
    );
    assert!(
        parsed
            .iter()
            .any(|l| l["fields"]["message"] == "Cursor schema")
    );
}

#[tokio::test]
async fn help_lists_every_environment_variable_and_a_wrong_log_level_is_an_error() {
    let help = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .arg("--help")
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for var in [
        "CURSOR_BYOK_CONFIG",
        "CURSOR_BYOK_LOG",
        "CURSOR_BYOK_LOG_FORMAT",
        "CURSOR_BYOK_LISTEN",
        "CURSOR_BYOK_DATABASE_URL",
        "CURSOR_BYOK_DEFAULT_MODEL",
    ] {
        assert!(text.contains(var), "{var} missing from --help: {text}");
    }
    let wrong = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .args(["--log-level", "verbose", "gc"])
        .output()
        .await
        .unwrap();
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("\"verbose\" is not a level"));
}
