//! Several nodes on one database (issue 27), as real `cursor-server` processes on loopback sharing
//! one database (a SQLite file here; a PostgreSQL database in `suites_postgres`) and one secret: a run's RunSSE and BidiAppends reaching either node (forwarded
//! to the run's node, a reconnect included), runs whose first BidiAppend overtook their RunSSE to
//! the other node, more at once than `max_unattached_runs`, a CLI turn on the other node afterwards, a node killed
//! with SIGKILL while its run waits on the provider, the shared secret, and a new message on one
//! node superseding a run on the other, the console's live list on either node showing both
//! nodes' runs, a second process given a live node's name refused and a
//! restarted node waiting out its old lease, and people with a budget (`[auth]`) running many runs
//! at once through both nodes. Every wait is for an event (a frame, a log line, a row).

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cursor_server::model::message::CanonicalMessage;
use cursor_server::store::{Store, messages, runs};
use fake_cursor::{FakeCursor, Session, Transcript, read_transcript};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{CLUSTER_SECRET, exec_result, read_success, run_request, run_request_with_env};

/// Test leases: short, so a killed node is noticed within seconds.
const LEASE_SECS: f64 = 2.0;
/// The reconnect grace of these tests: room for a RunSSE to come back through another node.
const EXTRA: &str = "reconnect_grace_ms = 5000\nclient_idle_timeout_secs = 20";

struct Node {
    process: tokio::process::Child,
    addr: SocketAddr,
    log: fixtures::NodeLog,
}

async fn node(provider: &FakeProvider, db: &Path, name: &str, secret: &str) -> Node {
    let (process, addr, log) =
        fixtures::spawn_node(&provider.base_url(), db, (name, secret), EXTRA, LEASE_SECS).await;
    Node { process, addr, log }
}

async fn open_store(db: &Path) -> Store {
    fixtures::open_store(&db.join("test.db")).await
}

/// The provider's script of scenario (a): a Read, the answer after it, then the CLI turn's text.
fn script_a(provider: &FakeProvider) {
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_read", "Read", r#"{"path":"notes.txt"}"#)],
        (10, 2, 0),
    )));
    provider.push(Reply::sse(text_events(&["read ", "it"], (12, 2, 0))));
    provider.push(Reply::sse(text_events(&["second ", "turn"], (14, 2, 0))));
}

/// What scenario (a) shows: the first turn's kinds up to its exec and after the reconnect, the
/// CLI turn's transcript kinds and text, the model's messages in each request, the stored history.
#[derive(Debug, PartialEq)]
struct Outcome {
    before_exec: Vec<&'static str>,
    first_text: String,
    first_success: bool,
    cli_kinds: Vec<&'static str>,
    cli_text: String,
    model_messages: Vec<serde_json::Value>,
    history: Vec<String>,
}

/// Scenario (a) against `sse` (where the RunSSE opens), `appends` (where BidiAppends go in turn),
/// `reconnect` (where the RunSSE comes back) and `cli` (where the CLI turn runs).
async fn scenario_a(
    (sse, appends, reconnect, cli): (SocketAddr, &[SocketAddr], SocketAddr, SocketAddr),
) -> (Transcript, Transcript, Transcript) {
    let mut order = vec![sse];
    order.extend(appends.iter().copied().filter(|a| *a != sse));
    let first = FakeCursor::alternating(&order);
    let mut session = Session::start(
        &first,
        "req-a1",
        &run_request_with_env("conv-a", "read notes"),
    )
    .await;
    let exec = session.next_exec().await;
    // The client reconnects its RunSSE (here to another node) and goes on appending.
    let seqno = session.seqno();
    let before = std::mem::replace(
        &mut session.transcript,
        Transcript {
            messages: Vec::new(),
            end: None,
            end_frame: None,
        },
    );
    drop(session);
    let mut back: Vec<SocketAddr> = vec![reconnect];
    back.extend(appends.iter().copied().filter(|a| *a != reconnect));
    let second = FakeCursor::alternating(&back);
    let mut session = Session::reattach(&second, "req-a1", seqno).await;
    session
        .send(&exec_result(
            exec.id,
            read_success("notes.txt", "kept line"),
        ))
        .await;
    let after = session.finish().await;
    let (uplink, response) = FakeCursor::new(cli).open_run_h2("req-a2").await;
    uplink
        .send(run_request("conv-a", "and again"))
        .await
        .expect("send");
    let cli_turn = read_transcript(response).await;
    drop(uplink);
    (before, after, cli_turn)
}

async fn outcome(
    provider: &FakeProvider,
    db: &Path,
    (before, after, cli): (Transcript, Transcript, Transcript),
) -> Outcome {
    let store = open_store(db).await;
    let history = messages::load(&store, "conv-a")
        .await
        .expect("history")
        .iter()
        .map(describe)
        .collect();
    Outcome {
        before_exec: merged_deltas(before.kinds()),
        first_text: after.text(),
        first_success: after.is_success(),
        cli_kinds: merged_deltas(cli.kinds()),
        cli_text: cli.text(),
        model_messages: provider
            .requests()
            .iter()
            .map(|r| r["messages"].clone())
            .collect(),
        history,
    }
}

/// A stored message, without what differs between two runs of the same scenario (times).
fn describe(message: &CanonicalMessage) -> String {
    match message {
        CanonicalMessage::User(u) => format!("user: {}", u.text),
        CanonicalMessage::Assistant(a) => format!(
            "assistant: {:?} calls {:?}",
            a.text,
            a.planned_calls
                .iter()
                .map(|c| c.provider_call_id.clone())
                .collect::<Vec<_>>()
        ),
        CanonicalMessage::ToolCall(c) => format!("tool call {}", c.call.provider_call_id),
        CanonicalMessage::ToolResult(r) => format!("tool result {}", r.result.content),
    }
}

#[tokio::test]
async fn a_run_served_through_both_nodes_reads_as_on_a_single_node() {
    // The single node: the same binary, no [cluster].
    let single_provider = FakeProvider::start().await;
    script_a(&single_provider);
    let single_db = tempfile::tempdir().expect("tempdir");
    let (mut single, addr) =
        fixtures::spawn_process(&single_provider.base_url(), single_db.path()).await;
    let single_run = scenario_a((addr, &[addr], addr, addr)).await;
    let expected = outcome(&single_provider, single_db.path(), single_run).await;
    single.kill().await.expect("stopped");

    let provider = FakeProvider::start().await;
    script_a(&provider);
    let db = tempfile::tempdir().expect("tempdir");
    let a = node(&provider, db.path(), "a", CLUSTER_SECRET).await;
    let b = node(&provider, db.path(), "b", CLUSTER_SECRET).await;
    // RunSSE on a; appends alternate b, a, b, …; the RunSSE reconnects to b; the CLI turn runs on b.
    let cluster_run = scenario_a((a.addr, &[a.addr, b.addr], b.addr, b.addr)).await;
    let got = outcome(&provider, db.path(), cluster_run).await;
    assert!(got.first_success, "{got:?}");
    assert_eq!(got.first_text, "read it");
    assert_eq!(got.cli_text, "second turn");
    assert_eq!(got, expected);

    // The appends that reached b were forwarded to a, the run's node (b never opened a run of
    // its own for them, or the turn would not have completed); the CLI run stayed on b.
    let store = open_store(db.path()).await;
    let node_of = |id: &'static str| {
        let store = store.clone();
        async move {
            let filter = runs::RunFilter {
                request_id: Some(id.to_owned()),
                limit: 1,
                ..Default::default()
            };
            let listed = runs::list(&store, &filter).await.expect("run row");
            listed.into_iter().next().expect("run row").node
        }
    };
    assert_eq!(node_of("req-a1").await.as_deref(), Some("a"));
    assert_eq!(node_of("req-a2").await.as_deref(), Some("b"));
    // Either node's console shows every node's runs, each with its node.
    let list: serde_json::Value = reqwest::get(format!("http://{}/api/runs", b.addr))
        .await
        .expect("runs")
        .json()
        .await
        .expect("JSON");
    let node_in_list = |id: &str| {
        list["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .find(|r| r["request_id"] == id)
            .map(|r| r["node"].clone())
    };
    assert_eq!(node_in_list("req-a1"), Some(serde_json::json!("a")));
    assert_eq!(node_in_list("req-a2"), Some(serde_json::json!("b")));
    let page = reqwest::get(format!("http://{}/console/runs/req-a1", b.addr))
        .await
        .expect("run page")
        .text()
        .await
        .expect("HTML");
    assert!(page.contains("node a"), "{page}");
    drop((a, b));
}

/// Round robin sends a run's first BidiAppend (its run_request) to one node and its RunSSE to the
/// other, and the append can arrive first: its node claims the run and opens it without a RunSSE,
/// which the other node forwards there on its way. More such runs at once than that node's
/// `max_unattached_runs` are not refused: each append past the limit waits for a place (its own
/// RunSSE arriving through the other node, or a place another run's RunSSE freed), and every run
/// reads as one whose RunSSE came first.
#[tokio::test]
async fn first_appends_that_overtake_their_run_sse_through_the_other_node_are_not_refused() {
    const OVERTAKEN: usize = 4;
    let provider = FakeProvider::start().await;
    for _ in 0..=OVERTAKEN {
        provider.push(Reply::sse(text_events(&["all ", "there"], (10, 2, 0))));
    }
    let db = tempfile::tempdir().expect("tempdir");
    let a = node(&provider, db.path(), "a", CLUSTER_SECRET).await;
    // b holds one run without its RunSSE at most.
    let (_b_process, b_addr, b_log) = fixtures::spawn_node(
        &provider.base_url(),
        db.path(),
        ("b", CLUSTER_SECRET),
        &format!("{EXTRA}\nmax_unattached_runs = 1"),
        LEASE_SECS,
    )
    .await;
    let round_robin = FakeCursor::alternating(&[a.addr, b_addr]);

    // The usual order first: the RunSSE on a, then the appends alternating.
    let expected = Session::start(
        &round_robin,
        "req-o-ref",
        &run_request_with_env("conv-o-ref", "hello"),
    )
    .await
    .finish()
    .await;
    assert!(expected.is_success(), "{:?}", expected.end);

    // Every run's run_request reaches b before its RunSSE reaches a. The first takes b's one
    // place; the others wait for one (they were refused at once before).
    let to_b = FakeCursor::new(b_addr);
    let id = |n: usize| format!("req-o{n}");
    let first = to_b
        .append(&id(0), 0, &run_request_with_env("conv-o0", "hello"))
        .await;
    assert_eq!(first.status(), 200, "the first takes b's place");
    let mut appends = Vec::new();
    for n in 1..OVERTAKEN {
        let (to_b, request_id) = (to_b.clone(), id(n));
        let message = run_request_with_env(&format!("conv-o{n}"), "hello");
        appends.push(tokio::spawn(async move {
            to_b.append(&request_id, 0, &message)
                .await
                .status()
                .as_u16()
        }));
    }
    for n in 1..OVERTAKEN {
        b_log
            .wait_for(
                &format!("run {} waits for a place", id(n)),
                Duration::from_secs(10),
            )
            .await;
    }

    // The RunSSEs reach a, which forwards them to b: the first run's frees b's place for one
    // waiting run; the others' own RunSSEs open theirs.
    let mut sessions = Vec::new();
    for n in std::iter::once(0).chain((1..OVERTAKEN).rev()) {
        sessions.push((n, Session::reattach(&round_robin, &id(n), 1).await));
    }
    for append in appends {
        assert_eq!(append.await.expect("append task"), 200, "no run is refused");
    }
    let store = open_store(db.path()).await;
    for (n, session) in sessions {
        let transcript = session.finish().await;
        assert!(transcript.is_success(), "{}: {:?}", id(n), transcript.end);
        assert_eq!(transcript.text(), "all there");
        assert_eq!(
            merged_deltas(transcript.kinds()),
            merged_deltas(expected.kinds()),
            "{}",
            id(n)
        );
        let filter = runs::RunFilter {
            request_id: Some(id(n)),
            limit: 1,
            ..Default::default()
        };
        let listed = runs::list(&store, &filter).await.expect("run row");
        let node = listed.into_iter().next().expect("run row").node;
        assert_eq!(node.as_deref(), Some("b"), "the append's node runs it");
    }
    let refused = reqwest::get(format!("http://{b_addr}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        !refused.contains("cursor_byok_runs_refused_total"),
        "{refused}"
    );
    drop(a);
}

/// Waits until `request_id`'s run has ended; returns its record.
async fn ended(store: &Store, request_id: &str, within: Duration) -> runs::RunRecord {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(run) = runs::get(store, request_id).await.expect("run read")
            && run.outcome.status != runs::RunStatus::Running
        {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{request_id} did not end within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the provider has received `count` requests.
async fn provider_requests(provider: &FakeProvider, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while provider.requests().len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the provider got {} requests, not {count}",
            provider.requests().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_killed_nodes_run_is_ended_within_the_lease_and_the_conversation_goes_on_elsewhere() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_keep", "Read", r#"{"path":"notes.txt"}"#)],
        (10, 2, 0),
    )));
    // The run's next call never answers: the node dies while its run waits on it.
    provider.push(Reply::Hang {
        events: Vec::new(),
        sent: Default::default(),
    });
    provider.push(Reply::sse(text_events(&["continued"], (12, 1, 0))));
    let db = tempfile::tempdir().expect("tempdir");
    let mut a = node(&provider, db.path(), "a", CLUSTER_SECRET).await;
    let b = node(&provider, db.path(), "b", CLUSTER_SECRET).await;

    let cursor = FakeCursor::new(a.addr);
    let mut session = Session::start(
        &cursor,
        "req-b1",
        &run_request_with_env("conv-b", "read notes"),
    )
    .await;
    let exec = session.next_exec().await;
    session
        .send(&exec_result(
            exec.id,
            read_success("notes.txt", "kept line"),
        ))
        .await;
    provider_requests(&provider, 2).await;
    // An append through b: forwarded to a (b now knows where the run is).
    let via_b = FakeCursor::new(b.addr);
    let seqno = session.seqno();
    let forwarded = via_b.append("req-b1", seqno, &fixtures::heartbeat()).await;
    assert_eq!(forwarded.status(), 200);
    a.process.kill().await.expect("SIGKILL");
    let killed = tokio::time::Instant::now();
    drop(session);

    let store = open_store(db.path()).await;
    let lease = Duration::from_secs_f64(LEASE_SECS);
    let run = ended(&store, "req-b1", lease * 4).await;
    let took = killed.elapsed();
    assert_eq!(run.outcome.status, runs::RunStatus::Failed);
    let (_, message) = run.outcome.error.clone().expect("a reason");
    assert!(message.contains("the node running it stopped"), "{message}");
    // Noticed within the lease, plus one renewal period of the node that noticed.
    assert!(
        took < lease + lease / 2 + Duration::from_millis(700),
        "{took:?}"
    );
    b.log
        .wait_for("taken as stopped", Duration::from_secs(5))
        .await;
    // b's next forward of the run fails (at most once: b then forgets where the run was) and
    // the database says its node stopped.
    let first = via_b
        .append("req-b1", seqno + 1, &fixtures::heartbeat())
        .await;
    assert!(
        matches!(first.status().as_u16(), 503 | 404),
        "{}",
        first.status()
    );
    let next = via_b
        .append("req-b1", seqno + 2, &fixtures::heartbeat())
        .await;
    assert_eq!(next.status(), 404);
    let body: serde_json::Value = next.json().await.expect("a Connect error");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("which stopped")),
        "{body}"
    );

    // The next message on b continues from history: the tool is not run again, nothing doubled.
    let cursor_b = FakeCursor::new(b.addr);
    let next = Session::start(
        &cursor_b,
        "req-b2",
        &run_request_with_env("conv-b", "go on"),
    )
    .await
    .finish()
    .await;
    assert!(next.is_success(), "{:?}", next.end);
    assert!(!next.kinds().contains(&"exec"), "{:?}", next.kinds());
    assert_eq!(next.text(), "continued");
    let history: Vec<String> = messages::load(&store, "conv-b")
        .await
        .expect("history")
        .iter()
        .map(describe)
        .collect();
    let count = |wanted: &str| history.iter().filter(|m| m.starts_with(wanted)).count();
    assert_eq!(count("user: read notes"), 1, "{history:?}");
    assert_eq!(count("tool call call_keep"), 1, "{history:?}");
    assert_eq!(count("tool result"), 1, "{history:?}");
    assert!(
        history
            .iter()
            .any(|m| m.starts_with("tool result") && m.contains("kept line")),
        "{history:?}"
    );
    assert_eq!(count("user: go on"), 1, "{history:?}");
    let last = provider.requests().last().expect("a request").to_string();
    assert!(last.contains("kept line"), "{last}");
}

#[tokio::test]
async fn internal_routes_need_the_secret_and_a_forward_for_an_unknown_run_is_not_found() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Hang {
        events: Vec::new(),
        sent: Default::default(),
    });
    let db = tempfile::tempdir().expect("tempdir");
    let a = node(&provider, db.path(), "a", CLUSTER_SECRET).await;
    // A node configured with another secret, on the same database.
    let c = node(&provider, db.path(), "c", "a-different-secret-0123456789").await;
    let cursor = FakeCursor::new(a.addr);
    let mut session =
        Session::start(&cursor, "req-c1", &run_request_with_env("conv-c", "hello")).await;
    provider_requests(&provider, 1).await;

    // An append for a's run reaching c is forwarded with c's secret, and a refuses it.
    let wrong = FakeCursor::new(c.addr)
        .append("req-c1", session.seqno(), &fixtures::heartbeat())
        .await;
    assert_eq!(wrong.status(), 403);
    let body: serde_json::Value = wrong.json().await.expect("a Connect error");
    assert_eq!(body["code"], "permission_denied");
    a.log.wait_for("wrong secret", Duration::from_secs(5)).await;

    let http = reqwest::Client::new();
    let internal = |path: &str| format!("http://{}{path}", a.addr);
    let append = |request_id: &str| {
        use prost::Message as _;
        cursor_server::cursor::proto::aiserver::BidiAppendRequest {
            data: String::new(),
            request_id: Some(cursor_server::cursor::proto::aiserver::BidiRequestId {
                request_id: request_id.to_owned(),
            }),
            append_seqno: 1,
        }
        .encode_to_vec()
    };
    // No secret at all: unauthenticated.
    let missing = http
        .post(internal("/internal/cluster/v1/BidiAppend"))
        .header("content-type", "application/proto")
        .body(append("req-c1"))
        .send()
        .await
        .expect("sent");
    assert_eq!(missing.status(), 401);
    // The right secret, a run nobody has: not_found, and no run is opened for it.
    let unknown = http
        .post(internal("/internal/cluster/v1/BidiAppend"))
        .header("content-type", "application/proto")
        .header("x-cursor-byok-cluster-secret", CLUSTER_SECRET)
        .body(append("req-nobody"))
        .send()
        .await
        .expect("sent");
    assert_eq!(unknown.status(), 404);
    let body: serde_json::Value = unknown.json().await.expect("a Connect error");
    assert_eq!(body["code"], "not_found");

    // a's run was never disturbed: it still takes the client's input.
    session.send(&fixtures::heartbeat()).await;

    // Readiness includes this node's lease; the metrics name the node once.
    let ready: serde_json::Value = reqwest::get(format!("http://{}/readyz", a.addr))
        .await
        .expect("readyz")
        .json()
        .await
        .expect("JSON");
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["checks"]["lease"]["ok"], true, "{ready}");
    let metrics = reqwest::get(format!("http://{}/metrics", a.addr))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("cursor_byok_node_info{node=\"a\"} 1"),
        "{metrics}"
    );
    drop((a, c));
}

#[tokio::test]
async fn a_new_message_on_one_node_supersedes_the_run_on_the_other() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Hang {
        events: Vec::new(),
        sent: Default::default(),
    });
    provider.push(Reply::sse(text_events(&["newer"], (12, 1, 0))));
    let db = tempfile::tempdir().expect("tempdir");
    let a = node(&provider, db.path(), "a", CLUSTER_SECRET).await;
    let b = node(&provider, db.path(), "b", CLUSTER_SECRET).await;
    let cursor_a = FakeCursor::new(a.addr);
    let old = Session::start(
        &cursor_a,
        "req-d1",
        &run_request_with_env("conv-d", "first"),
    )
    .await;
    provider_requests(&provider, 1).await;

    let cursor_b = FakeCursor::new(b.addr);
    let newer = Session::start(
        &cursor_b,
        "req-d2",
        &run_request_with_env("conv-d", "second"),
    )
    .await
    .finish()
    .await;
    assert!(newer.is_success(), "{:?}", newer.end);
    assert_eq!(newer.text(), "newer");
    let old = old.finish().await;
    assert_eq!(old.error_code(), Some("canceled"), "{:?}", old.end);
    assert!(
        old.error_message().is_some_and(|m| m.contains("req-d2")),
        "{:?}",
        old.end
    );
    let store = open_store(db.path()).await;
    let record = ended(&store, "req-d1", Duration::from_secs(5)).await;
    assert_eq!(record.outcome.status, runs::RunStatus::Canceled);
    a.log
        .wait_for(
            "another node took the conversation over",
            Duration::from_secs(5),
        )
        .await;

    // `check` on a's configuration lists both nodes and their leases' ages.
    provider.push(Reply::sse(text_events(&["ok"], (1, 1, 0))));
    let check = tokio::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .arg("--config")
        .arg(db.path().join("node-a.toml"))
        .arg("check")
        .env("TEST_CLUSTER_SECRET", CLUSTER_SECRET)
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("check runs");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{out}");
    assert!(out.contains("node \"a\" (this node) at"), "{out}");
    assert!(
        out.contains("node \"b\" at") && out.contains("ms old, live"),
        "{out}"
    );
    drop((a, b));
}

/// Reads `/api/live` of the node at `addr` until a `runs` event satisfies `wanted`; returns its
/// runs as (request id, node).
async fn live_until(
    addr: SocketAddr,
    wanted: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let mut response = reqwest::get(format!("http://{addr}/api/live"))
        .await
        .expect("the live list");
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let read = async {
        loop {
            let chunk = response.chunk().await.expect("read").expect("open");
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                    continue;
                };
                let body: serde_json::Value = serde_json::from_str(data.trim()).expect("JSON");
                let runs: Vec<(String, String)> = body["runs"]
                    .as_array()
                    .expect("runs")
                    .iter()
                    .map(|r| {
                        (
                            r["request_id"].as_str().unwrap_or_default().to_owned(),
                            r["node"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect();
                if wanted(&runs) {
                    return runs;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the live list shows what was expected")
}

#[tokio::test]
async fn the_console_of_either_node_lists_the_live_runs_of_both() {
    let provider = FakeProvider::start().await;
    for _ in 0..2 {
        provider.push(Reply::Hang {
            events: Vec::new(),
            sent: Default::default(),
        });
    }
    let db = tempfile::tempdir().expect("tempdir");
    let a = node(&provider, db.path(), "a", CLUSTER_SECRET).await;
    let mut b = node(&provider, db.path(), "b", CLUSTER_SECRET).await;
    let (cursor_a, cursor_b) = (FakeCursor::new(a.addr), FakeCursor::new(b.addr));
    let _on_a = Session::start(
        &cursor_a,
        "req-f1",
        &run_request_with_env("conv-f1", "on a"),
    )
    .await;
    let _on_b = Session::start(
        &cursor_b,
        "req-f2",
        &run_request_with_env("conv-f2", "on b"),
    )
    .await;
    provider_requests(&provider, 2).await;
    let both = |runs: &[(String, String)]| {
        runs.contains(&("req-f1".into(), "a".into()))
            && runs.contains(&("req-f2".into(), "b".into()))
    };
    for addr in [a.addr, b.addr] {
        let runs = live_until(addr, both).await;
        assert_eq!(runs.len(), 2, "{runs:?}");
    }
    // b dies: once a has ended b's run, a's list no longer shows it.
    b.process.kill().await.expect("SIGKILL");
    let runs = live_until(a.addr, |runs| !runs.iter().any(|(id, _)| id == "req-f2")).await;
    assert_eq!(runs, [("req-f1".to_owned(), "a".to_owned())]);
}

/// The lease of the name test: long enough that a process restarted right after a kill finds its
/// old lease still held, whatever the machine's load.
const NAME_LEASE_SECS: f64 = 8.0;

#[tokio::test]
async fn a_second_process_given_a_live_nodes_name_is_refused_and_a_restarted_one_waits_its_lease() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::Hang {
        events: Vec::new(),
        sent: Default::default(),
    });
    provider.push(Reply::sse(text_events(&["after the restart"], (12, 1, 0))));
    let db = tempfile::tempdir().expect("tempdir");
    let (process, addr, _) = fixtures::spawn_node(
        &provider.base_url(),
        db.path(),
        ("a", CLUSTER_SECRET),
        EXTRA,
        NAME_LEASE_SECS,
    )
    .await;
    let mut a = Node {
        process,
        addr,
        log: fixtures::NodeLog::default(),
    };
    let cursor = FakeCursor::new(a.addr);
    let mut session =
        Session::start(&cursor, "req-e1", &run_request_with_env("conv-e", "first")).await;
    provider_requests(&provider, 1).await;

    // A second process configured with a's name: refused at start, with the reason.
    let twin = fixtures::node_config(&provider.base_url(), db.path(), "a", EXTRA, NAME_LEASE_SECS);
    let (status, printed) =
        fixtures::run_to_exit(&twin, CLUSTER_SECRET, Duration::from_secs(60)).await;
    assert!(!status.success(), "{printed}");
    assert!(
        printed.contains("node name \"a\" is in use by a live node"),
        "{printed}"
    );
    // It ended nothing of the live node's: a's run is running and takes its client's input.
    let store = open_store(db.path()).await;
    let run = runs::get(&store, "req-e1")
        .await
        .expect("read")
        .expect("run");
    assert_eq!(run.outcome.status, runs::RunStatus::Running);
    session.send(&fixtures::heartbeat()).await;

    // a killed and started again under its name: it waits for its old lease to run out, then
    // ends the run its previous process left and serves the conversation.
    a.process.kill().await.expect("SIGKILL");
    drop(session);
    let (_process, addr, log) = fixtures::spawn_node(
        &provider.base_url(),
        db.path(),
        ("a", CLUSTER_SECRET),
        EXTRA,
        NAME_LEASE_SECS,
    )
    .await;
    log.wait_for(
        "held by a lease that has not run out",
        Duration::from_secs(1),
    )
    .await;
    let run = ended(&store, "req-e1", Duration::from_secs(5)).await;
    assert_eq!(run.outcome.status, runs::RunStatus::Failed);
    let (_, message) = run.outcome.error.expect("a reason");
    assert!(message.contains("the server stopped"), "{message}");
    let next = Session::start(
        &FakeCursor::new(addr),
        "req-e2",
        &run_request_with_env("conv-e", "again"),
    )
    .await
    .finish()
    .await;
    assert!(next.is_success(), "{:?}", next.end);
    assert_eq!(next.text(), "after the restart");
    let ready: serde_json::Value = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .expect("readyz")
        .json()
        .await
        .expect("JSON");
    assert_eq!(ready["checks"]["lease"]["ok"], true, "{ready}");
}

/// Frame kinds with each run of consecutive deltas (text, or a tool card's streamed arguments)
/// counted once: deltas the provider sent close together may reach the client merged into one
/// (a call merges what it has read together or what is already waiting), so how many there are
/// depends on timing, not on the node that served them.
fn merged_deltas(mut kinds: Vec<&'static str>) -> Vec<&'static str> {
    kinds.dedup_by(|a, b| a == b && matches!(*a, "text_delta" | "partial_tool_call"));
    kinds
}

/// Budgets across nodes (issue 28): three people with a daily token limit each start many runs at
/// once through both nodes (round robin, runs owned by either). Nobody spends more than the limit
/// plus one call per node, the calls past it are refused with `resource_exhausted` naming the
/// limit, and each person's counter adds up exactly to their recorded provider calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn people_running_at_once_on_two_nodes_spend_at_most_their_limit_plus_one_call_per_node() {
    use cursor_server::auth::admin::{self, UsersAction};
    use cursor_server::auth::budget::{spent_now, tokens_of};
    use cursor_server::store::budgets;

    const PEOPLE: [&str; 3] = ["a@example.com", "b@example.com", "c@example.com"];
    const RUNS_EACH: usize = 12;
    const DAILY_TOKENS: i64 = 60;
    // The nodes' lease loops do not look at each other during the test: the first node learns
    // of the second only through its budget checks' own reads.
    const LONG_LEASE_SECS: f64 = 120.0;
    let provider = FakeProvider::start().await;
    // More replies than calls can be made: each call spends 12 tokens.
    for _ in 0..PEOPLE.len() * RUNS_EACH {
        provider.push(Reply::sse(text_events(&["within ", "budget"], (10, 2, 0))));
    }
    let members = PEOPLE.map(|p| format!("{p:?}")).join(", ");
    let extra = format!(
        "{EXTRA}\n\n[auth]\nmode = \"tokens\"\n\n[[teams]]\nname = \"t\"\nmembers = [{members}]\ndaily_tokens = {DAILY_TOKENS}\n"
    );
    let db = tempfile::tempdir().expect("tempdir");
    let (_a, a_addr, _a_log) = fixtures::spawn_node(
        &provider.base_url(),
        db.path(),
        ("a", CLUSTER_SECRET),
        &extra,
        LONG_LEASE_SECS,
    )
    .await;
    let (_b, b_addr, _b_log) = fixtures::spawn_node(
        &provider.base_url(),
        db.path(),
        ("b", CLUSTER_SECRET),
        &extra,
        LONG_LEASE_SECS,
    )
    .await;
    let store = open_store(db.path()).await;
    let mut runs = Vec::new();
    for (p, person) in PEOPLE.iter().enumerate() {
        let printed = admin::run(
            &store,
            UsersAction::Add {
                email: (*person).to_owned(),
            },
        )
        .await
        .expect("users add");
        let token = printed.lines().last().expect("a token").to_owned();
        let header = [("x-cursor-byok-token", token.as_str())];
        let cursors = [
            FakeCursor::alternating_with_headers(&[a_addr, b_addr], &header),
            FakeCursor::alternating_with_headers(&[b_addr, a_addr], &header),
        ];
        for n in 0..RUNS_EACH {
            let cursor = cursors[n % 2].clone();
            runs.push(tokio::spawn(async move {
                let request_id = format!("req-budget-{p}-{n}");
                let message = run_request_with_env(&format!("conv-budget-{p}-{n}"), "spend");
                (
                    p,
                    Session::start(&cursor, &request_id, &message)
                        .await
                        .finish()
                        .await,
                )
            }));
        }
    }
    let mut succeeded = [0usize; PEOPLE.len()];
    let mut refused = [0usize; PEOPLE.len()];
    for run in runs {
        let (p, transcript) = run.await.expect("run task");
        if transcript.is_success() {
            succeeded[p] += 1;
        } else {
            assert_eq!(
                transcript.error_code(),
                Some("resource_exhausted"),
                "{:?}",
                transcript.end
            );
            let message = transcript.error_message().unwrap_or_default();
            assert!(message.contains("daily_tokens"), "{message}");
            refused[p] += 1;
        }
    }
    for (p, person) in PEOPLE.iter().enumerate() {
        let recorded = budgets::usage_by_person(&store, 0, Some(person))
            .await
            .expect("usage");
        let calls: u64 = recorded.iter().map(|u| u.calls).sum();
        let tokens: u64 = recorded.iter().map(|u| tokens_of(&u.usage)).sum();
        let [today, _] = spent_now(&store, &format!("user:{person}"))
            .await
            .expect("counters");
        assert_eq!(
            (today.calls, today.tokens),
            (calls as i64, tokens as i64),
            "{person}: the counter is the sum of the recorded calls"
        );
        // Each call spends 12 tokens; a node may start one call past the limit.
        assert!(
            today.tokens <= DAILY_TOKENS + 2 * 12,
            "{person} spent {} tokens of {DAILY_TOKENS} in {calls} calls",
            today.tokens
        );
        assert!(today.tokens >= DAILY_TOKENS, "{person} reached the limit");
        assert!(
            refused[p] > 0,
            "{person}: the calls past the limit are refused"
        );
        assert!(succeeded[p] > 0, "{person}: the runs within the limit ran");
    }
}
