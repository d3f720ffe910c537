//! The store's invariants on both backends, each scenario run once on SQLite and once on a real
//! PostgreSQL (`support/postgres.rs`): one writer per conversation (NotOwner), a gap-free sequence
//! under concurrent writers, runtime events consumed once, content-addressed and deduplicated
//! blobs and their collection, the outbox, a tool result's commit whole or not at all, and a database newer than the binary or left
//! half-migrated refused with a message; `[auth]`: a run's start claims its conversation for its
//! person in the same transaction (another person's refused), a per-minute call limit counts
//! concurrent calls exactly up to it; the cluster's node registry (a run claimed once, a silent
//! node taken over by one node, its runs ended and its conversations refused to it; a run
//! superseded on another node without being told has every late write refused). On
//! PostgreSQL also: the database restarted under several running turns ends each with
//! `unavailable` and a message for people, writes nothing half, records each run's end once it is
//! back, and the server serves the next turns without a restart.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::time::Duration;

use cursor_server::model::conversation::{BlobId, Mode};
use cursor_server::model::message::{CanonicalMessage, Origin, UserMessage};
use cursor_server::model::runtime_tag::{RuntimeEvent, RuntimeTag};
use cursor_server::store::blobs::{self, Edge};
use cursor_server::store::{
    Store, StoreError, budgets, commit, messages, nodes, outbox, runs, users,
};
use fixtures::postgres::Cluster;

/// A store on a fresh database of one backend, and what keeps that database alive.
struct TestDb {
    store: Store,
    url: String,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> TestDb {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    TestDb {
        store: Store::open(&url).await.unwrap(),
        url,
        _dir: Some(dir),
    }
}

async fn postgres() -> TestDb {
    let url = Cluster::shared().fresh_database();
    TestDb {
        store: Store::open(&url).await.unwrap(),
        url,
        _dir: None,
    }
}

/// Each scenario `name(db: TestDb)` as two tests, `sqlite::name` and `postgres::name`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::sqlite().await).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::postgres().await).await
                }
            )*
        }
    };
}

on_both_backends!(
    the_database_refuses_history_from_a_run_that_no_longer_owns_the_conversation,
    a_refused_tool_result_commit_leaves_nothing_half_written,
    concurrent_appends_to_one_conversation_get_every_sequence_number_once,
    writes_of_several_statements_each_land_whole,
    concurrent_runs_never_fail_with_a_locked_database,
    a_consumed_runtime_event_is_never_appended_again,
    concurrent_writers_consume_a_runtime_event_once,
    blobs_are_hash_checked_and_stored_once,
    gc_keeps_what_a_head_reaches_and_drops_the_rest,
    acks_and_publication_clear_what_is_owed,
    runs_and_provider_calls_read_back,
    a_database_newer_than_the_binary_is_refused,
    a_half_migrated_database_is_refused,
    nodes_claim_a_run_once_and_one_node_takes_a_silent_one_over,
    a_run_its_node_was_not_told_to_stop_has_its_late_writes_refused,
    a_nodes_name_is_taken_only_once_its_lease_ran_out,
    a_run_start_claims_a_new_conversation_for_its_person_and_refuses_anothers,
    concurrent_calls_on_a_per_minute_limit_are_counted_up_to_it_and_no_further,
    a_persons_standing_reads_their_teams_counters_running_runs_and_live_nodes_in_one_query,
);

/// A user message typed in `mode`.
fn user_in(mode: Option<Mode>, text: &str) -> CanonicalMessage {
    CanonicalMessage::User(UserMessage {
        images: Vec::new(),
        shown_as: None,
        state_before: None,
        origin: Origin::User,
        text: text.into(),
        client_message_id: String::new(),
        mode,
        runtime: None,
    })
}

fn texts(history: &[CanonicalMessage]) -> Vec<String> {
    history
        .iter()
        .filter_map(|m| match m {
            CanonicalMessage::User(u) => Some(u.text.clone()),
            _ => None,
        })
        .collect()
}

async fn the_database_refuses_history_from_a_run_that_no_longer_owns_the_conversation(db: TestDb) {
    let store = &db.store;
    let user = |text: &str| user_in(None, text);
    runs::start(store, "old", "c", "m", "m").await.unwrap();
    messages::append(store, "c", "old", &[user("first")])
        .await
        .unwrap();
    // A new message takes the conversation over while the old run is still working.
    runs::start(store, "new", "c", "m", "m").await.unwrap();
    messages::append(store, "c", "new", &[user("second")])
        .await
        .unwrap();
    // The old run's late answer is refused by the database itself.
    let refused = messages::append(store, "c", "old", &[user("late answer")]).await;
    assert!(
        matches!(&refused, Err(StoreError::NotOwner { conversation_id, request_id })
            if conversation_id == "c" && request_id == "old"),
        "{refused:?}"
    );
    assert_eq!(
        texts(&messages::load(store, "c").await.unwrap()),
        ["first", "second"]
    );
}

/// A tool result's commit (its card and image blobs, the console's record, the call and result,
/// the checkpoint showing it and what it sends the client) is one transaction: refused at its last write, it leaves none of the earlier ones behind —
/// unlike the same writes made one by one, which leave the card stored for a result that is not.
async fn a_refused_tool_result_commit_leaves_nothing_half_written(db: TestDb) {
    use cursor_server::model::message::{ToolCallRecord, ToolResultRecord};
    use cursor_server::model::tool::{ToolCall, ToolResult};
    let store = &db.store;
    runs::start(store, "old", "c", "m", "m").await.unwrap();
    messages::append(store, "c", "old", &[user_in(None, "read it")])
        .await
        .unwrap();
    // A new message takes the conversation over while the old run's tool is still running.
    runs::start(store, "new", "c", "m", "m").await.unwrap();
    let call = ToolCall {
        call_id: "call-1".into(),
        provider_call_id: "p-1".into(),
        name: "Read".into(),
        arguments: r#"{"path":"a"}"#.into(),
    };
    let card: &[u8] = b"the Read card";
    let image: &[u8] = b"an image the result shows";
    let state: &[u8] = b"the checkpoint showing the result";
    let (card_id, image_id, state_id) = (BlobId::of(card), BlobId::of(image), BlobId::of(state));
    let pair = [
        CanonicalMessage::ToolCall(ToolCallRecord {
            model_call_id: "mc".into(),
            index: 0,
            call: call.clone(),
        }),
        CanonicalMessage::ToolResult(ToolResultRecord {
            card: Some(card_id),
            model_call_id: "mc".into(),
            index: 0,
            result: ToolResult {
                call_id: call.call_id.clone(),
                content: "fn main() {}".into(),
                is_error: false,
                meta: None,
                images: Vec::new(),
            },
        }),
    ];
    let execution = runs::ToolExecution {
        request_id: "old".into(),
        call_id: "call-1".into(),
        tool: "Read".into(),
        summary: "a".into(),
        started_at_ms: 1,
        duration_ms: 2,
        outcome: "success",
    };
    let refused = commit::tool_result(
        store,
        &commit::ToolResultCommit {
            conversation_id: "c",
            request_id: "old",
            blobs: &[(card_id, card), (image_id, image)],
            messages: &pair,
            after: &[],
            execution: &execution,
            graph: &[(state_id, state, &[])],
            sent: &[card_id, state_id],
            built: Some(state_id),
        },
    )
    .await;
    assert!(
        matches!(&refused, Err(StoreError::NotOwner { request_id, .. }) if request_id == "old"),
        "{refused:?}"
    );
    assert_eq!(blobs::get(store, card_id).await.unwrap(), None, "the card");
    assert_eq!(
        blobs::get(store, image_id).await.unwrap(),
        None,
        "the image"
    );
    assert!(
        runs::tool_executions(store, "old")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        texts(&messages::load(store, "c").await.unwrap()),
        ["read it"]
    );

    // The same writes one transaction each (as a tool result was committed before): the card
    // outlives the refused result.
    blobs::put_all(store, &[(card_id, card, &[])])
        .await
        .unwrap();
    let refused = messages::append(store, "c", "old", &pair).await;
    assert!(
        matches!(refused, Err(StoreError::NotOwner { .. })),
        "{refused:?}"
    );
    assert!(blobs::get(store, card_id).await.unwrap().is_some());
}

async fn concurrent_appends_to_one_conversation_get_every_sequence_number_once(db: TestDb) {
    // Many tasks of one run append to one conversation at once, some two messages at a time: each
    // append reads the end of history and writes after it, so without a lock two of them would
    // take the same sequence number (a duplicate key, a failed append).
    runs::start(&db.store, "r", "c", "m", "m").await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..64 {
        let store = db.store.clone();
        tasks.spawn(async move {
            let batch: Vec<_> = (0..1 + n % 2)
                .map(|i| user_in(None, &format!("m{n}-{i}")))
                .collect();
            messages::append(&store, "c", "r", &batch).await
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap().unwrap();
    }
    let history = texts(&messages::load(&db.store, "c").await.unwrap());
    assert_eq!(history.len(), 96, "every message stored once");
    let mut sorted = history.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 96, "no message twice");
    // A batch's messages are adjacent: nothing of another writer lands between them.
    for (at, text) in history.iter().enumerate() {
        if let Some(first) = text.strip_suffix("-0")
            && first[1..].parse::<usize>().unwrap() % 2 == 1
        {
            assert_eq!(history[at + 1], format!("{first}-1"), "{history:?}");
        }
    }
}

async fn writes_of_several_statements_each_land_whole(db: TestDb) {
    // More rows than one statement takes (256): each write below sends several statements, and the
    // transaction's COMMIT (on SQLite riding on its last statement) comes after all of them.
    runs::start(&db.store, "r", "c", "m", "m").await.unwrap();
    let batch: Vec<_> = (0..600).map(|i| user_in(None, &format!("m{i}"))).collect();
    messages::append(&db.store, "c", "r", &batch).await.unwrap();
    let history = texts(&messages::load(&db.store, "c").await.unwrap());
    let expected: Vec<String> = (0..600).map(|i| format!("m{i}")).collect();
    assert_eq!(history, expected);

    let sent: Vec<BlobId> = (0..600u32).map(|i| BlobId::of(&i.to_be_bytes())).collect();
    blobs::put_and_send(&db.store, &[], ("c", "r", &sent), None)
        .await
        .unwrap();
    let pending = outbox::pending(&db.store, "c").await.unwrap();
    assert_eq!(pending.blobs.len(), 600, "every sent blob owed");
    let mut owed = pending.blobs;
    owed.sort();
    let mut all = sent.clone();
    all.sort();
    assert_eq!(owed, all);

    blobs::acknowledge(&db.store, "c", &sent).await.unwrap();
    assert_eq!(
        outbox::pending(&db.store, "c").await.unwrap(),
        outbox::Pending::default(),
        "nothing owed once acknowledged"
    );
    let mut acked = blobs::acked(&db.store, "c").await.unwrap();
    acked.sort();
    assert_eq!(acked, all);
}

async fn concurrent_runs_never_fail_with_a_locked_database(db: TestDb) {
    // Many runs at once, each reading before it writes in one transaction (a runtime event is
    // checked, then appended): the pattern that made deferred SQLite transactions fail with
    // SQLITE_BUSY_SNAPSHOT under load, and that needs the conversation's lock on PostgreSQL.
    let mut tasks = tokio::task::JoinSet::new();
    for run in 0..200 {
        let store = db.store.clone();
        tasks.spawn(async move {
            let (request, conversation) = (format!("r{run}"), format!("c{}", run % 20));
            runs::start(&store, &request, &conversation, "m", "m").await?;
            for turn in 0..5 {
                let tag = RuntimeTag::new(
                    RuntimeEvent::ModeReminder { mode: Mode::Agent },
                    &format!("{request}-{turn}"),
                    "reminder".into(),
                );
                let appended = messages::append_with_tags(
                    &store,
                    &conversation,
                    &request,
                    &[tag],
                    &[user_in(None, "hello")],
                    &[],
                )
                .await;
                match appended {
                    // A newer run took the conversation over: the refusal this test allows.
                    Err(StoreError::NotOwner { .. }) => break,
                    other => other?,
                };
            }
            Ok::<(), StoreError>(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap().unwrap();
    }
}

async fn a_consumed_runtime_event_is_never_appended_again(db: TestDb) {
    let store = &db.store;
    let user = |text: &str| user_in(Some(Mode::Plan), text);
    let reminder = RuntimeTag::new(
        RuntimeEvent::ModeReminder { mode: Mode::Plan },
        "req-1",
        "plan only".into(),
    );
    let first = messages::append_with_tags(
        store,
        "c",
        "req-1",
        &[],
        &[user("a")],
        std::slice::from_ref(&reminder),
    )
    .await
    .unwrap();
    assert_eq!(first.len(), 2);
    let again = messages::append_with_tags(
        store,
        "c",
        "req-1",
        std::slice::from_ref(&reminder),
        &[user("b")],
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        again,
        vec![user("b")],
        "the event was consumed by the first append"
    );
    // Another conversation has its own events.
    let other = messages::append_with_tags(store, "d", "req-1", &[reminder], &[], &[])
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(messages::load(store, "c").await.unwrap().len(), 3);
}

async fn concurrent_writers_consume_a_runtime_event_once(db: TestDb) {
    let reminder = RuntimeTag::new(
        RuntimeEvent::ModeReminder { mode: Mode::Plan },
        "req-1",
        "plan only".into(),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..16 {
        let (store, reminder) = (db.store.clone(), reminder.clone());
        tasks.spawn(async move {
            messages::append_with_tags(
                &store,
                "c",
                "req-1",
                &[reminder],
                &[user_in(None, &format!("u{n}"))],
                &[],
            )
            .await
        });
    }
    let mut consumed = 0;
    while let Some(result) = tasks.join_next().await {
        consumed += result.unwrap().unwrap().len() - 1;
    }
    assert_eq!(consumed, 1, "exactly one writer appended the event");
    let history = messages::load(&db.store, "c").await.unwrap();
    assert_eq!(history.len(), 17);
}

async fn blobs_are_hash_checked_and_stored_once(db: TestDb) {
    let store = &db.store;
    let data: &[u8] = b"hello blob";
    let id = BlobId::of(data);
    blobs::put_all(store, &[(id, data, &[])]).await.unwrap();
    // The same content again (alone, and twice in one transaction) is one blob.
    blobs::put_all(store, &[(id, data, &[]), (id, data, &[])])
        .await
        .unwrap();
    assert_eq!(blobs::get(store, id).await.unwrap().as_deref(), Some(data));
    let wrong = BlobId::of(b"other");
    let err = blobs::put_all(store, &[(wrong, data, &[])])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not match its data"), "{err}");
    assert!(blobs::get(store, wrong).await.unwrap().is_none());
    // Concurrent writers of the same blob all succeed.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let store = store.clone();
        tasks.spawn(async move {
            let shared: &[u8] = b"shared";
            blobs::put_all(&store, &[(BlobId::of(shared), shared, &[])]).await
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap().unwrap();
    }
    assert_eq!(
        blobs::collect_garbage(store, &[], Duration::ZERO)
            .await
            .unwrap(),
        2,
        "two blobs stored, once each, reachable from nothing"
    );
}

async fn gc_keeps_what_a_head_reaches_and_drops_the_rest(db: TestDb) {
    let store = &db.store;
    let leaf = BlobId::of(b"leaf");
    let head = BlobId::of(b"head");
    let orphan = BlobId::of(b"orphan");
    let kept = BlobId::of(b"kept by the caller");
    let edges = [Edge {
        kind: "turns",
        ordinal: 0,
        child: leaf,
    }];
    blobs::put_all(
        store,
        &[
            (leaf, b"leaf", &[]),
            (head, b"head", &edges),
            (orphan, b"orphan", &[]),
            (kept, b"kept by the caller", &[]),
        ],
    )
    .await
    .unwrap();
    runs::start(store, "r", "c", "m", "m").await.unwrap();
    assert!(
        blobs::acknowledge_and_publish(store, ("c", "r"), &[], head, 1)
            .await
            .unwrap()
    );
    // Within the grace period nothing goes.
    assert_eq!(
        blobs::collect_garbage(store, &[], Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        blobs::collect_garbage(store, &[kept], Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    assert!(blobs::get(store, orphan).await.unwrap().is_none());
    assert!(blobs::get(store, leaf).await.unwrap().is_some());
    assert!(blobs::get(store, kept).await.unwrap().is_some());
    assert_eq!(
        blobs::children(store, head, "turns").await.unwrap(),
        vec![leaf]
    );
}

async fn acks_and_publication_clear_what_is_owed(db: TestDb) {
    let store = &db.store;
    let (a, b, s1, s2) = (
        BlobId::of(b"a"),
        BlobId::of(b"b"),
        BlobId::of(b"s1"),
        BlobId::of(b"s2"),
    );
    blobs::put_and_send(store, &[], ("c", "r1", &[a, b]), None)
        .await
        .unwrap();
    outbox::checkpoint_built(store, "c", "r1", s1)
        .await
        .unwrap();
    outbox::checkpoint_built(store, "c", "r1", s2)
        .await
        .unwrap();
    blobs::acknowledge(store, "c", &[a]).await.unwrap();
    assert_eq!(
        outbox::pending(store, "c").await.unwrap(),
        outbox::Pending {
            checkpoint: Some(s2),
            blobs: vec![b]
        }
    );
    assert_eq!(blobs::acked(store, "c").await.unwrap(), vec![a]);
    assert!(
        blobs::acknowledge_and_publish(store, ("c", "r1"), &[b], s2, 1)
            .await
            .unwrap()
    );
    assert_eq!(
        outbox::pending(store, "c").await.unwrap(),
        outbox::Pending::default()
    );
    // An older revision never moves a newer head.
    assert!(
        !blobs::acknowledge_and_publish(store, ("c", "r1"), &[], s1, 1)
            .await
            .unwrap()
    );
    assert_eq!(
        cursor_server::store::conversations::head(store, "c")
            .await
            .unwrap(),
        Some((s2, 1))
    );
}

async fn runs_and_provider_calls_read_back(db: TestDb) {
    use cursor_server::model::usage::Usage;
    let store = &db.store;
    runs::start(store, "r1", "c", "m", "auto").await.unwrap();
    let usage = Usage {
        input_tokens: Some(10),
        output_tokens: Some(5),
        ..Usage::default()
    };
    for (n, started) in [(1, 1_000_i64), (2, 1_000)] {
        runs::record_provider_call(
            store,
            &runs::ProviderCallRecord {
                model_call_id: format!("mc{n}"),
                request_id: "r1".into(),
                conversation_id: "c".into(),
                provider: "p".into(),
                model_id: "m".into(),
                purpose: runs::CallPurpose::Turn,
                request_bytes: 100,
                started_at_ms: started,
                first_event_ms: Some(7),
                total_ms: 20,
                usage,
                finish_reason: Some("stop".into()),
                error: None,
                retries: Vec::new(),
                fallback_from: None,
                key_index: Some(0),
            },
        )
        .await
        .unwrap();
    }
    let outcome = runs::RunOutcome {
        status: runs::RunStatus::Succeeded,
        provider_calls: 2,
        usage,
        error: None,
    };
    runs::finish(store, "r1", &outcome, (Some("agent"), "run_sse"))
        .await
        .unwrap();
    // Same start time: the order they were recorded in decides.
    let calls = runs::provider_calls(store, "r1").await.unwrap();
    assert_eq!(
        calls
            .iter()
            .map(|c| c.model_call_id.as_str())
            .collect::<Vec<_>>(),
        ["mc1", "mc2"]
    );
    let run = runs::get(store, "r1").await.unwrap().unwrap();
    assert_eq!(run.outcome.status, runs::RunStatus::Succeeded);
    assert_eq!(run.requested_model.as_deref(), Some("auto"));
    let usage_rows = runs::usage_by_day(store, 0).await.unwrap();
    assert_eq!(usage_rows.len(), 1);
    assert_eq!(usage_rows[0].day, "1970-01-01");
    assert_eq!(usage_rows[0].calls, 2);
    assert_eq!(usage_rows[0].usage.input_tokens, Some(20));
    let last = runs::last_calls(store).await.unwrap();
    assert_eq!(last, vec![("m".to_owned(), 1_000, None)]);
    let conversations = cursor_server::store::conversations::list(store, None, 10)
        .await
        .unwrap();
    assert_eq!(conversations.len(), 1);
    assert_eq!(conversations[0].runs, 1);
}

/// Runs `sql` on the database at `url` outside the store (what another binary would have done).
async fn execute(url: &str, sql: &str) {
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    } else {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
}

async fn a_database_newer_than_the_binary_is_refused(db: TestDb) {
    db.store.close().await;
    // A later release applied a migration this binary has never heard of.
    let checksum = if db.url.starts_with("postgres") {
        "'\\x00'::bytea"
    } else {
        "x'00'"
    };
    execute(
        &db.url,
        &format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (9999, 'from the future', TRUE, {checksum}, 1)"
        ),
    )
    .await;
    let refused = Store::open(&db.url).await.unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::NewerSchema {
                applied: 9999,
                known: 11..
            }
        ),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("newer than this cursor-server knows"),
        "{refused}"
    );
    let inspected = Store::inspect(&db.url).await.unwrap_err();
    assert!(matches!(inspected, StoreError::NewerSchema { .. }));
}

async fn a_half_migrated_database_is_refused(db: TestDb) {
    db.store.close().await;
    execute(
        &db.url,
        "UPDATE _sqlx_migrations SET success = FALSE
         WHERE version = (SELECT MAX(version) FROM _sqlx_migrations)",
    )
    .await;
    let refused = Store::open(&db.url).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::HalfMigrated { .. }),
        "{refused:?}"
    );
}

#[tokio::test]
async fn the_store_reports_its_schema_and_creates_nothing_twice() {
    for db in [sqlite().await, postgres().await] {
        let status = Store::inspect(&db.url).await.unwrap();
        assert_eq!(status.pending, 0, "{status:?}");
        assert_eq!(status.applied, status.known);
        // Opening again applies nothing and refuses nothing.
        Store::open(&db.url).await.unwrap();
    }
}

/// Turns a restarted PostgreSQL leaves in flight.
const IN_FLIGHT: usize = 4;

/// PostgreSQL restarted under load: several turns in flight (each has sent its tool call, the
/// client's result is not stored yet) when the database stops. Each turn ends with `unavailable`
/// and a message for people (not the driver's text); nothing of any turn is half-written (no
/// result, sequences without gaps); each run's ending is recorded once the database is back (the
/// server keeps trying); and the same server process runs the next turn of every conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load_fails_the_runs_in_flight_as_unavailable_and_recovers() {
    use fake_cursor::{FakeCursor, Session};
    use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
    use fixtures::{exec_result, read_success, run_request};

    let cluster = Cluster::start();
    let url = cluster.create_database("restarts");
    let provider = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A short acquire timeout: a statement waiting for the stopped database fails within a second.
    let config = fixtures::config_text(
        &provider.base_url(),
        &dir.path().join("x"),
        "database_acquire_timeout_ms = 1000",
        "openai-chat",
    )
    .replace(
        &format!(
            "database_url = \"{}\"",
            fixtures::database_url(&dir.path().join("x"))
        ),
        &format!("database_url = \"{url}\""),
    );
    let config = cursor_server::config::Config::from_toml(
        &config,
        std::path::Path::new("test.toml"),
        &|_| None,
    )
    .unwrap();
    let server = fixtures::TestServer::start_with(config, dir).await;
    let cursor = FakeCursor::new(server.addr);
    let conversation = |n: usize| format!("conv-pg-{n}");

    let mut turns = Vec::new();
    for n in 0..IN_FLIGHT {
        provider.push(Reply::sse(tool_call_events(
            None,
            &[(&format!("call_{n}"), "Read", r#"{"path":"src/lib.rs"}"#)],
            (20, 2, 0),
        )));
        let mut turn = Session::start(
            &cursor,
            &format!("req-{n}"),
            &run_request(&conversation(n), "read it"),
        )
        .await;
        let read = turn.next_exec().await;
        turns.push((turn, read.id));
    }
    cluster.stop();
    let ended =
        futures_util::future::join_all(turns.into_iter().map(|(mut turn, id)| async move {
            turn.send(&exec_result(id, read_success("src/lib.rs", "fn main() {}")))
                .await;
            turn.finish().await
        }))
        .await;
    for transcript in &ended {
        assert_eq!(
            transcript.error_code(),
            Some("unavailable"),
            "{transcript:?}"
        );
        let message = transcript.error_message().unwrap_or_default();
        assert!(
            message.contains("database is unavailable")
                && message.contains("send the message again"),
            "{message}"
        );
        for raw in [
            "sqlx",
            "communicating",
            "refused",
            "timed out",
            "127.0.0.1",
            "pool",
        ] {
            assert!(
                !message.contains(raw),
                "the driver's text reached the client: {message}"
            );
        }
    }

    cluster.restart();
    let store = Store::open(&url).await.unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    // The endings the database could not take are written once it is back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for n in 0..IN_FLIGHT {
        let run = loop {
            let run = runs::get(&store, &format!("req-{n}"))
                .await
                .unwrap()
                .unwrap();
            if run.outcome.status != runs::RunStatus::Running {
                break run;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "req-{n} is still running"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(run.outcome.status, runs::RunStatus::Failed);
        assert_eq!(
            run.outcome.error.map(|(code, _)| code).as_deref(),
            Some("unavailable")
        );
        // The user's message and the model's call are stored, gap-free; the result the database
        // refused is not, and nothing after it.
        let seqs: Vec<i64> =
            sqlx::query_scalar("SELECT seq FROM messages WHERE conversation_id = $1 ORDER BY seq")
                .bind(conversation(n))
                .fetch_all(&pool)
                .await
                .unwrap();
        assert!(!seqs.is_empty());
        assert_eq!(seqs, (0..seqs.len() as i64).collect::<Vec<_>>());
        let before = messages::load(&store, &conversation(n)).await.unwrap();
        assert!(
            !before
                .iter()
                .any(|m| matches!(m, CanonicalMessage::ToolResult(_))),
            "{before:?}"
        );
        assert!(
            before.iter().any(
                |m| matches!(m, CanonicalMessage::Assistant(a) if !a.planned_calls.is_empty())
            ),
            "{before:?}"
        );
    }
    // The same process serves the next turn of every conversation.
    for _ in 0..IN_FLIGHT {
        provider.push(Reply::sse(text_events(&["back"], (40, 4, 0))));
    }
    let again = futures_util::future::join_all((0..IN_FLIGHT).map(|n| {
        let cursor = &cursor;
        async move {
            Session::start(
                cursor,
                &format!("req-again-{n}"),
                &run_request(&conversation(n), "again"),
            )
            .await
            .finish()
            .await
        }
    }))
    .await;
    for (n, done) in again.iter().enumerate() {
        assert!(done.is_success(), "{done:?}");
        assert!(done.text().contains("back"));
        let after = texts(&messages::load(&store, &conversation(n)).await.unwrap());
        assert_eq!(after, ["read it", "again"]);
    }
    server.stop().await;
}

/// `name`'s registration as the registry lists it.
async fn instance(store: &Store, name: &str) -> i64 {
    nodes::list(store)
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.name == name)
        .unwrap()
        .instance
}

async fn nodes_claim_a_run_once_and_one_node_takes_a_silent_one_over(db: TestDb) {
    let store = &db.store;
    for name in ["a", "b", "c"] {
        nodes::register(store, name, &format!("http://{name}"))
            .await
            .unwrap();
    }
    // Nodes racing to claim one request id: the first claimer owns it, and every node hears so.
    let claims: Vec<_> = ["a", "b", "c", "a", "b", "c"]
        .into_iter()
        .map(|node| {
            let store = store.clone();
            tokio::spawn(async move { nodes::claim_run(&store, "r1", node).await.unwrap() })
        })
        .collect();
    let mut owners = Vec::new();
    for claim in claims {
        owners.push(claim.await.unwrap());
    }
    owners.dedup();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = owners.remove(0);
    let seen = nodes::run_owner(store, "r1", 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.node, owner);
    assert!(seen.live);
    assert_eq!(seen.internal_url, Some(format!("http://{owner}")));
    assert_eq!(nodes::run_owner(store, "nope", 60_000).await.unwrap(), None);
    let listed = nodes::list(store).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(
        listed
            .iter()
            .all(|n| n.stopped.is_none() && n.lease_age_ms >= 0)
    );

    runs::start_on(store, "r1", "c1", ("m", "m"), Some(&owner))
        .await
        .unwrap();
    let others: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .filter(|n| *n != owner)
        .collect();
    assert_eq!(
        nodes::conversation_run_elsewhere(store, "c1", others[0])
            .await
            .unwrap(),
        Some(("r1".into(), owner.clone(), format!("http://{owner}")))
    );
    // Within its lease nobody takes the owner over.
    assert_eq!(
        nodes::take_over_stopped(store, &owner, others[0], 60_000)
            .await
            .unwrap(),
        None
    );
    assert!(
        nodes::silent(store, others[0], 60_000)
            .await
            .unwrap()
            .is_empty()
    );
    // Past it (a lease of -1 ms: any heartbeat is too old) the survivors race, and one wins.
    let takeovers: Vec<_> = [others[0], others[1], others[0], others[1]]
        .into_iter()
        .map(|by| {
            let (store, dead) = (store.clone(), owner.clone());
            tokio::spawn(async move {
                nodes::take_over_stopped(&store, &dead, by, -1)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut ended = Vec::new();
    for takeover in takeovers {
        ended.extend(takeover.await.unwrap());
    }
    assert_eq!(ended, [1], "exactly one survivor ends the run");
    let run = runs::get(store, "r1").await.unwrap().unwrap();
    assert_eq!(run.outcome.status, runs::RunStatus::Failed);
    assert_eq!(
        run.outcome.error.map(|(_, m)| m).as_deref(),
        Some(nodes::NODE_STOPPED)
    );
    let summary = runs::list(
        store,
        &runs::RunFilter {
            request_id: Some("r1".into()),
            limit: 1,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(summary[0].node.as_deref(), Some(owner.as_str()));
    assert!(
        !nodes::renew(store, &owner, instance(store, &owner).await)
            .await
            .unwrap(),
        "taken as stopped"
    );
    assert!(
        !nodes::run_owner(store, "r1", 60_000)
            .await
            .unwrap()
            .unwrap()
            .live
    );
    // The stopped node's run may not write any more; the next run may.
    assert!(matches!(
        messages::append(store, "c1", "r1", &[user_in(None, "late")]).await,
        Err(StoreError::NotOwner { .. })
    ));
    runs::start(store, "r2", "c1", "m", "m").await.unwrap();
    messages::append(store, "c1", "r2", &[user_in(None, "next")])
        .await
        .unwrap();
    // Joining again clears the stop; a clean shutdown sets it; old claims are forgotten.
    let again = nodes::register(store, &owner, "http://again")
        .await
        .unwrap();
    assert!(nodes::renew(store, &owner, again).await.unwrap());
    nodes::leave(store, &owner, again).await.unwrap();
    let stopped = nodes::list(store).await.unwrap();
    let me = stopped.iter().find(|n| n.name == owner).unwrap();
    assert_eq!(me.stopped.as_deref(), Some("shut down"));
    assert_eq!(nodes::forget_claims(store, 60_000).await.unwrap(), 0);
    assert_eq!(nodes::forget_claims(store, -1).await.unwrap(), 1);
    // A node restarted under its name ends what it left running itself.
    runs::start_on(store, "r3", "c3", ("m", "m"), Some(others[1]))
        .await
        .unwrap();
    assert_eq!(nodes::reconcile_own(store, others[1]).await.unwrap(), 1);
    let run = runs::get(store, "r3").await.unwrap().unwrap();
    assert_eq!(run.outcome.status, runs::RunStatus::Failed);
}

/// Node a's run keeps working after node b's new message took its conversation over, and a was
/// never told (the stop request lost): every write it still makes — a message, blobs sent, a
/// checkpoint built, a checkpoint published — is refused by the database, and b's are not.
async fn a_run_its_node_was_not_told_to_stop_has_its_late_writes_refused(db: TestDb) {
    let store = &db.store;
    for name in ["a", "b"] {
        nodes::register(store, name, &format!("http://{name}"))
            .await
            .unwrap();
    }
    let (sent, built, newer) = (
        BlobId::of(b"a's blob"),
        BlobId::of(b"a's checkpoint"),
        BlobId::of(b"b's checkpoint"),
    );
    runs::start_on(store, "ra", "c", ("m", "m"), Some("a"))
        .await
        .unwrap();
    messages::append(store, "c", "ra", &[user_in(None, "first")])
        .await
        .unwrap();
    blobs::put_and_send(store, &[], ("c", "ra", &[sent]), None)
        .await
        .unwrap();
    assert!(
        blobs::acknowledge_and_publish(store, ("c", "ra"), &[sent], built, 1)
            .await
            .unwrap()
    );

    // b takes the conversation over; a hears nothing of it.
    runs::start_on(store, "rb", "c", ("m", "m"), Some("b"))
        .await
        .unwrap();
    let refused = |result: Result<(), StoreError>, what: &str| {
        assert!(
            matches!(&result, Err(StoreError::NotOwner { conversation_id, request_id })
                if conversation_id == "c" && request_id == "ra"),
            "{what}: {result:?}"
        );
    };
    refused(
        messages::append(store, "c", "ra", &[user_in(None, "late answer")]).await,
        "a late message",
    );
    refused(
        blobs::put_and_send(store, &[], ("c", "ra", &[BlobId::of(b"late")]), None).await,
        "late blobs sent",
    );
    refused(
        outbox::checkpoint_built(store, "c", "ra", BlobId::of(b"late checkpoint")).await,
        "a late checkpoint built",
    );
    refused(
        blobs::acknowledge_and_publish(store, ("c", "ra"), &[], BlobId::of(b"late"), 2)
            .await
            .map(|_| ()),
        "a late publication",
    );
    // Nothing of a's late work is owed to the client or shown as the head.
    assert_eq!(
        outbox::pending(store, "c").await.unwrap(),
        outbox::Pending::default()
    );
    assert_eq!(
        cursor_server::store::conversations::head(store, "c")
            .await
            .unwrap(),
        Some((built, 1))
    );

    // b, the owner, writes as usual.
    messages::append(store, "c", "rb", &[user_in(None, "second")])
        .await
        .unwrap();
    outbox::checkpoint_built(store, "c", "rb", newer)
        .await
        .unwrap();
    assert!(
        blobs::acknowledge_and_publish(store, ("c", "rb"), &[], newer, 2)
            .await
            .unwrap()
    );
    assert_eq!(
        texts(&messages::load(store, "c").await.unwrap()),
        ["first", "second"]
    );
    assert_eq!(
        cursor_server::store::conversations::head(store, "c")
            .await
            .unwrap(),
        Some((newer, 2))
    );
}

/// A name held by a lease that has not run out is not taken; once it ran out it is, and the
/// earlier holder can neither renew nor leave with the later holder's lease.
async fn a_nodes_name_is_taken_only_once_its_lease_ran_out(db: TestDb) {
    let store = &db.store;
    let first = match nodes::register_if_free(store, ("a", "http://first"), 60_000)
        .await
        .unwrap()
    {
        nodes::Joined::Registered { instance } => instance,
        held => panic!("a free name is taken: {held:?}"),
    };
    let held = nodes::register_if_free(store, ("a", "http://second"), 60_000)
        .await
        .unwrap();
    assert!(
        matches!(&held, nodes::Joined::Held { internal_url, age_ms, .. }
            if internal_url == "http://first" && *age_ms < 60_000),
        "{held:?}"
    );
    assert!(nodes::renew(store, "a", first).await.unwrap());
    // Past the lease (-1 ms: any heartbeat is too old) the name goes to the new process.
    let second = match nodes::register_if_free(store, ("a", "http://second"), -1)
        .await
        .unwrap()
    {
        nodes::Joined::Registered { instance } => instance,
        held => panic!("a lapsed name is taken: {held:?}"),
    };
    assert!(!nodes::renew(store, "a", first).await.unwrap());
    nodes::leave(store, "a", first).await.unwrap();
    assert!(nodes::renew(store, "a", second).await.unwrap());
    let listed = nodes::list(store).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].internal_url, "http://second");
    assert_eq!(listed[0].stopped, None);
    assert_eq!(listed[0].instance, second);
    // A stopped node's name is free at once.
    nodes::leave(store, "a", second).await.unwrap();
    assert!(matches!(
        nodes::register_if_free(store, ("a", "http://third"), 60_000)
            .await
            .unwrap(),
        nodes::Joined::Registered { .. }
    ));
}

/// `[auth]`: the run's start claims a conversation nobody has for its person, in its own
/// transaction; a start for another person on it is refused and leaves no run behind, while
/// the owner's next run takes it over as before.
async fn a_run_start_claims_a_new_conversation_for_its_person_and_refuses_anothers(db: TestDb) {
    let store = &db.store;
    let start = |request_id, person| runs::RunStart {
        request_id,
        conversation_id: "c",
        model_id: "m",
        requested_model: "m",
        node: None,
        person,
    };
    runs::start_as(store, &start("r-a1", Some("a@example.com")))
        .await
        .unwrap();
    assert_eq!(
        users::conversation_owner(store, "c")
            .await
            .unwrap()
            .as_deref(),
        Some("a@example.com")
    );
    let refused = runs::start_as(store, &start("r-b1", Some("b@example.com"))).await;
    assert!(
        matches!(&refused, Err(StoreError::NotYours { conversation_id }) if conversation_id == "c"),
        "{refused:?}"
    );
    assert!(
        runs::get(store, "r-b1").await.unwrap().is_none(),
        "the refused start recorded nothing"
    );
    // The first run still owns the conversation's history; the owner's next run takes it.
    messages::append(store, "c", "r-a1", &[user_in(None, "first")])
        .await
        .unwrap();
    runs::start_as(store, &start("r-a2", Some("a@example.com")))
        .await
        .unwrap();
    messages::append(store, "c", "r-a2", &[user_in(None, "second")])
        .await
        .unwrap();
    assert_eq!(
        texts(&messages::load(store, "c").await.unwrap()),
        ["first", "second"]
    );
    assert_eq!(
        users::conversation_owner(store, "c")
            .await
            .unwrap()
            .as_deref(),
        Some("a@example.com")
    );
}

/// Twenty calls racing on a limit of five a minute (as on several nodes): exactly five are
/// counted, the rest refused, and the counter says five.
async fn concurrent_calls_on_a_per_minute_limit_are_counted_up_to_it_and_no_further(db: TestDb) {
    let store = &db.store;
    let calls = (0..20).map(|_| budgets::count_call(store, "user:a@example.com", "minute:7", 5));
    let counted = futures_util::future::join_all(calls).await;
    let passed = counted
        .into_iter()
        .map(|c| c.expect("counting"))
        .filter(|counted| *counted)
        .count();
    assert_eq!(passed, 5);
    let [_, _, minute] = budgets::read(
        store,
        "user:a@example.com",
        &[
            "day:x".to_owned(),
            "month:x".to_owned(),
            "minute:7".to_owned(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(minute.calls, 5);
    // Another minute starts from nothing.
    assert!(
        budgets::count_call(store, "user:a@example.com", "minute:8", 5)
            .await
            .unwrap()
    );
}

/// The budget check's one read: the person's counters and their team's per period (another
/// person's and another team's never), and the person's runs in progress (not ended ones, not
/// another person's), or no count when the limits do not need it.
async fn a_persons_standing_reads_their_teams_counters_running_runs_and_live_nodes_in_one_query(
    db: TestDb,
) {
    let store = &db.store;
    let periods = [
        "day:d".to_owned(),
        "month:m".to_owned(),
        "minute:1".to_owned(),
    ];
    let spent = |cost, tokens| budgets::Spent {
        cost_micro_usd: cost,
        tokens,
        calls: 1,
    };
    let charge = |scopes: &[&str], periods: &[String], spent| budgets::Charge {
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        periods: periods.to_vec(),
        spent,
    };
    for (scopes, periods, spent) in [
        (
            &["user:a@example.com", "team:t"][..],
            &periods[..2],
            spent(10, 100),
        ),
        (
            &["user:b@example.com", "team:u"][..],
            &periods[..2],
            spent(1_000, 5),
        ),
        (&["team:t"][..], &periods[..1], spent(7, 3)),
    ] {
        budgets::charge(store, &charge(scopes, periods, spent))
            .await
            .unwrap();
    }
    let start = |request_id, conversation_id, person| runs::RunStart {
        request_id,
        conversation_id,
        model_id: "m",
        requested_model: "m",
        node: None,
        person,
    };
    for (run, conversation, person) in [
        ("r-a1", "ca1", "a@example.com"),
        ("r-a2", "ca2", "a@example.com"),
        ("r-a3", "ca3", "a@example.com"),
        ("r-b1", "cb1", "b@example.com"),
    ] {
        runs::start_as(store, &start(run, conversation, Some(person)))
            .await
            .unwrap();
    }
    let ended = runs::RunOutcome {
        status: runs::RunStatus::Succeeded,
        provider_calls: 0,
        usage: Default::default(),
        error: None,
    };
    runs::finish(store, "r-a3", &ended, (None, "run"))
        .await
        .unwrap();

    // Two nodes hold a lease; a third left.
    for name in ["n1", "n2", "n3"] {
        let instance = cursor_server::store::nodes::register(store, name, "http://127.0.0.1:1")
            .await
            .unwrap();
        if name == "n3" {
            cursor_server::store::nodes::leave(store, name, instance)
                .await
                .unwrap();
        }
    }

    let asked = budgets::Asked {
        team: Some("t"),
        runs: true,
        lease_ms: Some(60_000),
    };
    let standing = budgets::standing(store, "a@example.com", &periods, asked)
        .await
        .unwrap();
    assert_eq!(
        standing.person,
        [spent(10, 100), spent(10, 100), Default::default()]
    );
    let team_day = budgets::Spent {
        cost_micro_usd: 17,
        tokens: 103,
        calls: 2,
    };
    assert_eq!(
        standing.team,
        [team_day, spent(10, 100), Default::default()]
    );
    assert_eq!(
        standing.running, 2,
        "a's two running runs, not the ended one nor b's"
    );
    assert_eq!(
        standing.live_nodes, 2,
        "the nodes holding a lease, not the one that left"
    );

    let without = budgets::standing(store, "a@example.com", &periods, budgets::Asked::default())
        .await
        .unwrap();
    assert_eq!(without.person, standing.person);
    assert_eq!(without.team, [budgets::Spent::default(); 3]);
    assert_eq!(without.running, 0, "not counted when not asked");
    assert_eq!(without.live_nodes, 0, "not counted without [cluster]");
}

/// SQLite's WAL is checkpointed in the background (`Store::checkpoint`, every second in the
/// server), never by the commit that happens to fill it: that commit used to wait for the copy and
/// its fsync. Writes well past SQLite's automatic checkpoint size (1,000 pages, 4 MB) stay in the
/// WAL until the checkpoint, which then moves every frame into the database.
#[tokio::test]
async fn sqlite_commits_leave_the_wal_to_the_background_checkpoint() {
    let db = sqlite().await;
    let dir = db._dir.as_ref().expect("a SQLite directory").path();
    for i in 0..24u8 {
        let data = vec![i; 256 * 1024];
        blobs::put_all(&db.store, &[(BlobId::of(&data), &data[..], &[])])
            .await
            .unwrap();
    }
    let wal = std::fs::metadata(dir.join("s.db-wal")).unwrap().len();
    assert!(
        wal > 6_000_000,
        "6 MB of commits are all still in the WAL ({wal} bytes): no commit checkpointed"
    );
    let (frames, moved) = db
        .store
        .checkpoint()
        .await
        .unwrap()
        .expect("SQLite checkpoints");
    assert!(frames >= 1_500, "{frames} frames");
    assert_eq!(moved, frames, "the checkpoint moved every frame");
    let (_, again) = db
        .store
        .checkpoint()
        .await
        .unwrap()
        .expect("SQLite checkpoints");
    assert_eq!(again, frames, "nothing new to move");
    assert_eq!(
        blobs::get(&db.store, BlobId::of(&[23; 256 * 1024]))
            .await
            .unwrap()
            .map(|b| b.len()),
        Some(256 * 1024)
    );
}
