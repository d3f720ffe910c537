//! A server a team shares (`[auth]`, issue 28), on the real transports: two people with their own
//! tokens each run in their own conversation; one cannot continue or append to the other's; a
//! forged trusted header from a non-proxy address is refused; a Cursor sign-in is verified once
//! against a fake Cursor backend (a real HTTP server speaking GetMe) and cached, an invalid one is
//! refused, and a cached one keeps working while that backend is down. Budgets: a person's daily
//! cost, a team's total (`[teams.total]`) over what its members spend together, requests per
//! minute, concurrent runs and allowed models, each refused before the call with the limit named.
//! Admin: the people page shows each person's and team's spending and changes a person's limits
//! or disables them (audited under the admin's name); a member cannot use it.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse as _;
use cursor_server::auth::admin::{UsersAction, run as admin};
use cursor_server::cursor::proto::aiserver::GetMeResponse;
use fake_cursor::{FakeCursor, Transcript, read_transcript};
use fake_provider::{FakeProvider, Reply, text_events};
use fixtures::{TestServer, run_request};
use prost::Message as _;

/// Issues a token to `email` on the server's database, as `cursor-server users add` does.
async fn issue_token(server: &TestServer, email: &str) -> String {
    let store = fixtures::open_store(&server.db_dir.path().join("test.db")).await;
    let printed = admin(
        &store,
        UsersAction::Add {
            email: email.to_owned(),
        },
    )
    .await
    .expect("users add");
    store.close().await;
    printed
        .lines()
        .last()
        .expect("the token is printed")
        .to_owned()
}

/// One turn over RunSSE + BidiAppend; returns what the client saw.
async fn sse_turn(cursor: &FakeCursor, request_id: &str, conversation: &str) -> Transcript {
    let sse = cursor.open_run_sse(request_id).await;
    let accepted = cursor
        .append(request_id, 0, &run_request(conversation, "hello"))
        .await;
    assert_eq!(accepted.status(), 200, "the run request is accepted");
    read_transcript(sse).await
}

/// One turn over the CLI's HTTP/2 `Run`.
async fn cli_turn(cursor: &FakeCursor, request_id: &str, conversation: &str) -> Transcript {
    let (uplink, response) = cursor.open_run_h2(request_id).await;
    // A refused stream ends before reading its uplink: the send may then find it closed.
    let _ = uplink
        .send(run_request(conversation, "hello from the CLI"))
        .await;
    read_transcript(response).await
}

async fn api_get(server: &TestServer, path: &str, token: &str) -> (StatusCode, serde_json::Value) {
    let response = reqwest::Client::new()
        .get(format!("http://{}{path}", server.addr))
        .bearer_auth(token)
        .send()
        .await
        .expect("api request");
    let status = response.status();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

fn conversation_ids(list: &serde_json::Value) -> Vec<String> {
    list["conversations"]
        .as_array()
        .expect("a conversation list")
        .iter()
        .map(|c| c["id"].as_str().expect("id").to_owned())
        .collect()
}

/// The audit log's refusals once there are at least `count` of them.
async fn wait_for_audit(server: &TestServer, token: &str, count: usize) -> Vec<serde_json::Value> {
    for _ in 0..200 {
        let (_, log) = api_get(server, "/api/audit", token).await;
        let refusals: Vec<serde_json::Value> = log["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["action"] == "refused")
            .cloned()
            .collect();
        if refusals.len() >= count {
            return refusals;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the audit log never had {count} refusals");
}

const TOKENS: &str = "[auth]\nmode = \"tokens\"\nadmins = [\"lead@example.com\"]";

#[tokio::test]
async fn with_tokens_each_person_runs_and_sees_only_their_own_conversations() {
    let provider = FakeProvider::start().await;
    let db_dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_in(&provider.base_url(), db_dir, TOKENS).await;
    let token_a = issue_token(&server, "a@example.com").await;
    let token_b = issue_token(&server, "B@Example.com").await;
    assert!(token_a.starts_with("cbk_") && token_a != token_b);
    let a = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_a)]);
    let bearer_b = format!("Bearer {token_b}");
    let b = FakeCursor::with_headers(server.addr, &[("authorization", &bearer_b)]);

    provider.push(Reply::sse(text_events(&["for A"], (10, 2, 0))));
    let turn = sse_turn(&a, "req-a1", "conv-a").await;
    assert!(turn.is_success(), "A's turn: {:?}", turn.error_message());
    provider.push(Reply::sse(text_events(&["for B"], (10, 2, 0))));
    let turn = cli_turn(&b, "req-b1", "conv-b").await;
    assert!(turn.is_success(), "B's turn: {:?}", turn.error_message());

    // B continuing A's conversation, on either transport, is refused before any provider call.
    let calls = provider.requests().len();
    let turn = cli_turn(&b, "req-b2", "conv-a").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));
    assert!(turn.error_message().unwrap_or_default().contains("conv-a"));
    let turn = sse_turn(&b, "req-b3", "conv-a").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));
    assert_eq!(
        provider.requests().len(),
        calls,
        "no provider call for B on A's conversation"
    );

    // B appending to A's run by its request id is refused too.
    let appended = b.append("req-a1", 1, &fixtures::heartbeat()).await;
    assert_eq!(appended.status(), StatusCode::FORBIDDEN);
    let error: serde_json::Value = appended.json().await.expect("Connect error JSON");
    assert_eq!(error["code"], "permission_denied");

    // A continues their own conversation.
    provider.push(Reply::sse(text_events(&["again"], (10, 2, 0))));
    let turn = sse_turn(&a, "req-a2", "conv-a").await;
    assert!(
        turn.is_success(),
        "A's second turn: {:?}",
        turn.error_message()
    );

    // The API shows each person their own conversations.
    let (status, list) = api_get(&server, "/api/conversations", &token_a).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(conversation_ids(&list), ["conv-a"]);
    let (_, list) = api_get(&server, "/api/conversations", &token_b).await;
    assert_eq!(conversation_ids(&list), ["conv-b"]);
    let (status, _) = api_get(&server, "/api/conversations/conv-a", &token_b).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "B cannot read A's history");
    let (status, _) = api_get(&server, "/api/conversations/conv-a/markdown", &token_b).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "nor export it");
    let (_, runs) = api_get(&server, "/api/runs", &token_b).await;
    let ids: Vec<&str> = runs["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.iter().all(|id| id.starts_with("req-b")),
        "B sees only B's runs: {ids:?}"
    );
    let (status, _) = api_get(&server, "/api/runs/req-a1", &token_b).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, usage) = api_get(&server, "/api/usage", &token_b).await;
    let people: Vec<&str> = usage["by_person"]
        .as_array()
        .expect("by_person")
        .iter()
        .map(|p| p["user"].as_str().unwrap())
        .collect();
    assert_eq!(people, ["b@example.com"], "B's usage is B's alone");
    let (status, _) = api_get(&server, "/api/audit", &token_b).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "the audit log is for admins");
    let (status, _) = api_get(&server, "/api/logs", &token_b).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the server's logs are for admins"
    );

    // An admin sees everyone's, with the person each run belongs to.
    let admin_token = issue_token(&server, "lead@example.com").await;
    let (_, list) = api_get(&server, "/api/conversations", &admin_token).await;
    let mut all = conversation_ids(&list);
    all.sort();
    assert_eq!(all, ["conv-a", "conv-b"]);
    let (status, _) = api_get(&server, "/api/logs", &admin_token).await;
    assert_eq!(status, StatusCode::OK);
    let (_, run) = api_get(&server, "/api/runs/req-a1", &admin_token).await;
    assert_eq!(run["user"], "a@example.com");
    let (_, usage) = api_get(&server, "/api/usage", &admin_token).await;
    let mut people: Vec<&str> = usage["by_person"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["user"].as_str().unwrap())
        .collect();
    people.sort();
    assert_eq!(people, ["a@example.com", "b@example.com"]);
    let csv = reqwest::Client::new()
        .get(format!("http://{}/api/usage.csv", server.addr))
        .bearer_auth(&admin_token)
        .send()
        .await
        .expect("csv")
        .text()
        .await
        .expect("csv text");
    assert!(
        csv.starts_with("day,user,team,provider,model,calls,"),
        "{csv}"
    );
    assert_eq!(
        csv.lines()
            .filter(|l| l.contains(",a@example.com,"))
            .count(),
        1,
        "{csv}"
    );
    // B's refusals are in the audit log (written without waiting: poll until they are there).
    let refusals = wait_for_audit(&server, &admin_token, 3).await;
    assert!(
        refusals
            .iter()
            .any(|e| e["subject"] == "conversation conv-a" && e["actor"] == "b@example.com"),
        "{refusals:?}"
    );
    assert!(
        refusals.iter().any(|e| e["subject"] == "run req-a1"),
        "{refusals:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn without_a_token_or_with_an_unknown_one_a_run_is_refused_unauthenticated() {
    let provider = FakeProvider::start().await;
    let db_dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_in(&provider.base_url(), db_dir, TOKENS).await;

    let nobody = FakeCursor::new(server.addr);
    let transcript = read_transcript(nobody.open_run_sse("req-x").await).await;
    assert_eq!(transcript.error_code(), Some("unauthenticated"));
    assert!(
        transcript
            .error_message()
            .unwrap_or_default()
            .contains("users add"),
        "the refusal says what to do"
    );
    let stranger = FakeCursor::with_headers(
        server.addr,
        &[("x-cursor-byok-token", "cbk_not-issued-by-this-server")],
    );
    let turn = cli_turn(&stranger, "req-y", "conv-y").await;
    assert_eq!(turn.error_code(), Some("unauthenticated"));
    let (status, _) = api_get(&server, "/api/runs", "cbk_not-issued").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A disabled person is refused with what to do.
    let token = issue_token(&server, "c@example.com").await;
    let store = fixtures::open_store(&server.db_dir.path().join("test.db")).await;
    admin(
        &store,
        UsersAction::Disable {
            email: "c@example.com".to_owned(),
        },
    )
    .await
    .expect("users disable");
    store.close().await;
    let disabled = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token)]);
    let turn = cli_turn(&disabled, "req-c", "conv-c").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("disabled")
    );
    assert!(provider.requests().is_empty());
    server.stop().await;
}

fn trusted_header(proxies: &str) -> String {
    format!(
        "[auth]\nmode = \"trusted_header\"\nheader = \"X-Forwarded-Email\"\ntrusted_proxies = [{proxies}]\ndomains = [\"example.com\"]"
    )
}

#[tokio::test]
async fn a_trusted_header_is_believed_from_the_proxy_and_refused_from_anywhere_else() {
    let provider = FakeProvider::start().await;
    // This test's client is on 127.0.0.1, which is not the configured proxy: a forged header.
    let db_dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_in(
        &provider.base_url(),
        db_dir,
        &trusted_header("\"10.9.9.9/32\""),
    )
    .await;
    let forger = FakeCursor::with_headers(server.addr, &[("x-forwarded-email", "a@example.com")]);
    let turn = cli_turn(&forger, "req-f", "conv-f").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("trusted_proxies")
    );
    assert!(provider.requests().is_empty());
    server.stop().await;

    // With the loopback address as the proxy, the same header is a person.
    let db_dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start_in(
        &provider.base_url(),
        db_dir,
        &trusted_header("\"127.0.0.1/32\""),
    )
    .await;
    let proxied = FakeCursor::with_headers(server.addr, &[("x-forwarded-email", "a@example.com")]);
    provider.push(Reply::sse(text_events(&["hi"], (10, 2, 0))));
    let turn = sse_turn(&proxied, "req-p", "conv-p").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    // A person of another domain, even through the proxy, is not a member.
    let outsider =
        FakeCursor::with_headers(server.addr, &[("x-forwarded-email", "x@elsewhere.org")]);
    let turn = cli_turn(&outsider, "req-o", "conv-o").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("ask an admin")
    );
    server.stop().await;
}

/// A fake Cursor backend: answers GetMe for the known tokens, 401 otherwise, counting the asks.
struct FakeCursorBackend {
    url: String,
    hits: Arc<AtomicUsize>,
    /// The headers of every other request (the pass-through's).
    passed: Arc<std::sync::Mutex<Vec<HeaderMap>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl FakeCursorBackend {
    async fn start() -> FakeCursorBackend {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let passed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&passed);
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(headers);
                (StatusCode::OK, "from Cursor")
            }
        });
        let app = app.route(
            "/aiserver.v1.DashboardService/GetMe",
            axum::routing::post(move |headers: HeaderMap| {
                let counted = Arc::clone(&counted);
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let email = match headers.get("authorization").and_then(|v| v.to_str().ok()) {
                        Some("Bearer cursor-token-a") => "a@example.com",
                        Some("Bearer cursor-token-b") => "b@example.com",
                        _ => {
                            return (
                                StatusCode::UNAUTHORIZED,
                                r#"{"code":"unauthenticated","message":"Not logged in"}"#,
                            )
                                .into_response();
                        }
                    };
                    let body = GetMeResponse {
                        email: Some(email.to_owned()),
                        ..Default::default()
                    }
                    .encode_to_vec();
                    (StatusCode::OK, body).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake Cursor backend");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
        });
        FakeCursorBackend {
            url,
            hits,
            passed,
            stop,
            task,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Stops answering (its port closes).
    async fn shut_down(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

#[tokio::test]
async fn a_cursor_sign_in_is_verified_once_cached_and_an_invalid_one_refused() {
    let provider = FakeProvider::start().await;
    let backend = FakeCursorBackend::start().await;
    let db_dir = tempfile::tempdir().expect("tempdir");
    let extra = format!(
        "upstream_url = \"{}\"\n[auth]\nmode = \"cursor_account\"\ndomains = [\"example.com\"]\ncursor_cache_secs = 600",
        backend.url
    );
    let server = TestServer::start_in(&provider.base_url(), db_dir, &extra).await;
    let a = FakeCursor::with_headers(server.addr, &[("authorization", "Bearer cursor-token-a")]);

    provider.push(Reply::sse(text_events(&["one"], (10, 2, 0))));
    let turn = sse_turn(&a, "req-ca1", "conv-ca").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    provider.push(Reply::sse(text_events(&["two"], (10, 2, 0))));
    let turn = cli_turn(&a, "req-ca2", "conv-ca").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    // RunSSE, BidiAppend and Run all carried the token: Cursor was asked once.
    assert_eq!(
        backend.hits(),
        1,
        "the sign-in is verified once, then cached"
    );

    let expired = FakeCursor::with_headers(server.addr, &[("authorization", "Bearer expired")]);
    let turn = cli_turn(&expired, "req-e", "conv-e").await;
    assert_eq!(turn.error_code(), Some("unauthenticated"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("sign in to Cursor again")
    );

    // B, verified too, cannot continue A's conversation.
    let b = FakeCursor::with_headers(server.addr, &[("authorization", "Bearer cursor-token-b")]);
    let turn = cli_turn(&b, "req-cb", "conv-ca").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));

    let asked = backend.hits();
    // A route this server does not serve passes through, unverified, with the person's own
    // credentials (Cursor judges them) and never this server's own headers.
    let passed = reqwest::Client::new()
        .post(format!(
            "http://{}/aiserver.v1.DashboardService/GetTeams",
            server.addr
        ))
        .header("authorization", "Bearer cursor-token-unverified")
        .header("x-cursor-byok-token", "cbk_should-not-leave")
        .header("x-cursor-byok-user", "forged@example.com")
        .send()
        .await
        .expect("pass-through");
    assert_eq!(passed.text().await.expect("body"), "from Cursor");
    let headers = backend
        .passed
        .lock()
        .unwrap()
        .pop()
        .expect("reached Cursor");
    assert_eq!(headers["authorization"], "Bearer cursor-token-unverified");
    assert!(
        headers.get("x-cursor-byok-token").is_none() && headers.get("x-cursor-byok-user").is_none()
    );
    assert_eq!(backend.hits(), asked, "pass-through is not verified");

    // Cursor's backend goes away: A (cached) keeps working; a new sign-in is refused, saying why.
    backend.shut_down().await;
    provider.push(Reply::sse(text_events(&["three"], (10, 2, 0))));
    let turn = cli_turn(&a, "req-ca3", "conv-ca").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    let newcomer =
        FakeCursor::with_headers(server.addr, &[("authorization", "Bearer cursor-token-c")]);
    let turn = cli_turn(&newcomer, "req-n", "conv-n").await;
    assert_eq!(turn.error_code(), Some("unavailable"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("could not be reached")
    );
    server.stop().await;
}

/// The test configuration with prices for its model and `auth` (tables) after it.
fn priced(auth: &'static str) -> impl FnOnce(String) -> String {
    move |text| {
        format!("{text}\n[providers.models.pricing]\ninput = 1000.0\noutput = 1000.0\n\n{auth}")
    }
}

#[tokio::test]
async fn a_person_over_their_daily_cost_is_refused_the_next_call_and_the_counters_add_up() {
    let provider = FakeProvider::start().await;
    let auth = "[auth]\nmode = \"tokens\"\nadmins = [\"lead@example.com\"]\n\n\
                [[teams]]\nname = \"platform\"\nmembers = [\"a@example.com\", \"b@example.com\"]\n\
                daily_cost_usd = 50.0\n\n[[users]]\nemail = \"b@example.com\"\ndaily_cost_usd = 0.01\n";
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", priced(auth)).await;
    let token_a = issue_token(&server, "a@example.com").await;
    let token_b = issue_token(&server, "b@example.com").await;
    let a = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_a)]);
    let b = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_b)]);

    // 10 + 2 tokens at $1000 per million: $0.012, past B's $0.01 for the day.
    provider.push(Reply::sse(text_events(&["first"], (10, 2, 0))));
    let turn = cli_turn(&b, "req-b1", "conv-b").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    let sent = provider.requests().len();
    let turn = sse_turn(&b, "req-b2", "conv-b").await;
    assert_eq!(turn.error_code(), Some("resource_exhausted"));
    let message = turn.error_message().unwrap_or_default().to_owned();
    assert!(message.contains("daily_cost_usd"), "{message}");
    assert!(
        message.contains("resets at") && message.contains("00:00 UTC"),
        "{message}"
    );
    assert!(
        message.contains("lead@example.com"),
        "who to ask: {message}"
    );
    assert_eq!(
        provider.requests().len(),
        sent,
        "the refused call was never sent"
    );

    // A, in the same team with the team's $50, goes on.
    provider.push(Reply::sse(text_events(&["for A"], (10, 2, 0))));
    let turn = cli_turn(&a, "req-a1", "conv-a").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());

    // The counters are the recorded provider calls' usage, to the token.
    let store = fixtures::open_store(&server.db_dir.path().join("test.db")).await;
    let mut recorded = std::collections::HashMap::<&str, (i64, i64)>::new();
    for (request_id, person) in [("req-b1", "b"), ("req-b2", "b"), ("req-a1", "a")] {
        for call in cursor_server::store::runs::provider_calls(&store, request_id)
            .await
            .expect("calls")
        {
            let entry = recorded.entry(person).or_default();
            entry.0 += cursor_server::auth::budget::tokens_of(&call.usage) as i64;
            entry.1 += 1;
        }
    }
    use cursor_server::store::budgets::total;
    let b_day = total(&store, "user:b@example.com", "day:")
        .await
        .expect("b");
    let a_day = total(&store, "user:a@example.com", "day:")
        .await
        .expect("a");
    let team = total(&store, "team:platform", "month:")
        .await
        .expect("team");
    assert_eq!((b_day.tokens, b_day.calls), recorded["b"]);
    assert_eq!((a_day.tokens, a_day.calls), recorded["a"]);
    assert_eq!(b_day.tokens, 12);
    assert_eq!(b_day.cost_micro_usd, 12_000);
    assert_eq!(team.tokens, b_day.tokens + a_day.tokens);
    store.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_teams_total_limits_what_its_members_spend_together() {
    let provider = FakeProvider::start().await;
    let auth = "[auth]\nmode = \"tokens\"\nadmins = [\"lead@example.com\"]\n\n\
                [[teams]]\nname = \"platform\"\nmembers = [\"a@example.com\", \"b@example.com\"]\n\
                daily_cost_usd = 50.0\n\n[teams.total]\ndaily_cost_usd = 0.02\n";
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", priced(auth)).await;
    let token_a = issue_token(&server, "a@example.com").await;
    let token_b = issue_token(&server, "b@example.com").await;
    let a = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_a)]);
    let b = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_b)]);

    // $0.012 each, far under each person's $50, but together past the team's $0.02.
    provider.push(Reply::sse(text_events(&["for A"], (10, 2, 0))));
    let turn = cli_turn(&a, "req-a1", "conv-a").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    provider.push(Reply::sse(text_events(&["for B"], (10, 2, 0))));
    let turn = sse_turn(&b, "req-b1", "conv-b").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());
    let sent = provider.requests().len();
    let turn = cli_turn(&a, "req-a2", "conv-a").await;
    assert_eq!(turn.error_code(), Some("resource_exhausted"));
    let message = turn.error_message().unwrap_or_default().to_owned();
    assert!(
        message.contains("team platform") && message.contains("daily_cost_usd"),
        "{message}"
    );
    assert!(message.contains("$0.0240 spent of $0.0200"), "{message}");
    assert!(message.contains("resets at"), "{message}");
    assert_eq!(
        provider.requests().len(),
        sent,
        "the refused call was never sent"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_second_call_in_the_same_minute_past_requests_per_minute_is_refused() {
    let provider = FakeProvider::start().await;
    let auth = "[auth]\nmode = \"tokens\"\nadmins = [\"lead@example.com\"]\n\n\
                [[users]]\nemail = \"a@example.com\"\nrequests_per_minute = 1\n";
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", priced(auth)).await;
    let token = issue_token(&server, "a@example.com").await;
    let a = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token)]);
    let minute = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            / 60
    };
    // Two turns inside one minute (tried again in the rare case a minute ends between them).
    for attempt in 0.. {
        let started = minute();
        provider.push(Reply::sse(text_events(&["one"], (1, 1, 0))));
        let first = cli_turn(&a, &format!("req-{attempt}-1"), &format!("conv-{attempt}")).await;
        assert!(
            attempt > 0 || first.is_success(),
            "{:?}",
            first.error_message()
        );
        let sent = provider.requests().len();
        let second = cli_turn(&a, &format!("req-{attempt}-2"), &format!("conv-{attempt}")).await;
        if minute() != started {
            assert!(attempt < 3, "four minutes ended during two turns each");
            continue;
        }
        assert_eq!(second.error_code(), Some("resource_exhausted"));
        let message = second.error_message().unwrap_or_default();
        assert!(
            message.contains("requests_per_minute") && message.contains("resets at"),
            "{message}"
        );
        assert_eq!(
            provider.requests().len(),
            sent,
            "the refused call was never sent"
        );
        break;
    }
    server.stop().await;
}

#[tokio::test]
async fn between_nodes_a_forwarded_request_carries_its_verified_person() {
    let provider = FakeProvider::start().await;
    let db_dir = tempfile::tempdir().expect("tempdir");
    let auth = trusted_header("\"127.0.0.1/32\"");
    let base_url = provider.base_url();
    let spawn = |name: &'static str| {
        fixtures::spawn_node(
            &base_url,
            db_dir.path(),
            (name, fixtures::CLUSTER_SECRET),
            &auth,
            5.0,
        )
    };
    let (mut one, addr_one, _) = spawn("one").await;
    let (mut two, addr_two, _) = spawn("two").await;

    // A's RunSSE on node one, the BidiAppend on node two: forwarded to one with A's person.
    let a = FakeCursor::alternating_with_headers(
        &[addr_one, addr_two],
        &[("x-forwarded-email", "a@example.com")],
    );
    provider.push(Reply::sse(text_events(&["across nodes"], (10, 2, 0))));
    let turn = sse_turn(&a, "req-n1", "conv-n").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());

    // B on node two cannot continue A's conversation.
    let b = FakeCursor::with_headers(addr_two, &[("x-forwarded-email", "b@example.com")]);
    let turn = cli_turn(&b, "req-n2", "conv-n").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));

    // A person named on an internal route without the cluster secret is not believed.
    let forged = reqwest::Client::new()
        .post(format!("http://{addr_one}/internal/cluster/v1/BidiAppend"))
        .header("x-cursor-byok-user", "a@example.com")
        .header("content-type", "application/proto")
        .body(Vec::new())
        .send()
        .await
        .expect("internal request");
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    let _ = one.kill().await;
    let _ = two.kill().await;
}

#[tokio::test]
async fn concurrent_runs_and_allowed_models_are_limits_too() {
    let provider = FakeProvider::start().await;
    let auth = "[auth]\nmode = \"tokens\"\nadmins = [\"lead@example.com\"]\n\n\
                [[teams]]\nname = \"solo\"\nmembers = [\"a@example.com\"]\nconcurrent_runs = 1\n\n\
                [[users]]\nemail = \"c@example.com\"\nmodels = [\"other-*\"]\n";
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", priced(auth)).await;
    let token_a = issue_token(&server, "a@example.com").await;
    let token_c = issue_token(&server, "c@example.com").await;
    let a = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_a)]);

    // A's first run waits on a tool on A's machine: it is in progress.
    provider.push(Reply::sse(fake_provider::tool_call_events(
        None,
        &[("call_read", "Read", r#"{"path":"notes.txt"}"#)],
        (10, 2, 0),
    )));
    let mut session = fake_cursor::Session::start(
        &a,
        "req-a1",
        &fixtures::run_request_with_env("conv-a1", "read notes"),
    )
    .await;
    let _exec = session.next_exec().await;
    let sent = provider.requests().len();
    let turn = cli_turn(&a, "req-a2", "conv-a2").await;
    assert_eq!(turn.error_code(), Some("resource_exhausted"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("concurrent_runs")
    );
    assert_eq!(provider.requests().len(), sent);

    // C may use only other-* models; the configured one is refused, naming the limit.
    let c = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_c)]);
    let turn = cli_turn(&c, "req-c1", "conv-c1").await;
    assert_eq!(turn.error_code(), Some("resource_exhausted"));
    let message = turn.error_message().unwrap_or_default();
    assert!(
        message.contains("models") && message.contains("test-model"),
        "{message}"
    );
    assert_eq!(provider.requests().len(), sent);
    drop(session);
    server.stop().await;
}

/// The admins' page of people: what each person and team spent, and the form that changes a
/// person's limits or disables them, audited under the admin's name; a member cannot use it.
#[tokio::test]
async fn an_admin_sets_a_persons_limits_and_disables_them_on_the_people_page() {
    let provider = FakeProvider::start().await;
    let auth = "[auth]\nmode = \"tokens\"\nadmins = [\"lead@example.com\"]\n\n\
                [[teams]]\nname = \"platform\"\nmembers = [\"a@example.com\"]\n\
                daily_cost_usd = 50.0\n\n[teams.total]\nmonthly_cost_usd = 900.0\n";
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", priced(auth)).await;
    let lead = issue_token(&server, "lead@example.com").await;
    let token_a = issue_token(&server, "a@example.com").await;
    let a = FakeCursor::with_headers(server.addr, &[("x-cursor-byok-token", &token_a)]);
    provider.push(Reply::sse(text_events(&["first"], (10, 2, 0))));
    let turn = cli_turn(&a, "req-a1", "conv-a").await;
    assert!(turn.is_success(), "{:?}", turn.error_message());

    let (status, people) = api_get(&server, "/api/people", &lead).await;
    assert_eq!(status, StatusCode::OK, "{people}");
    let person = people["people"]
        .as_array()
        .expect("people")
        .iter()
        .find(|p| p["email"] == "a@example.com")
        .expect("a is listed")
        .clone();
    assert_eq!(person["team"], "platform");
    assert_eq!(person["in_force"]["daily_cost_usd"], 50.0);
    assert_eq!(person["today"]["tokens"], 12);
    let team = &people["teams"][0];
    assert_eq!(team["name"], "platform");
    assert_eq!(team["total"]["monthly_cost_usd"], 900.0);
    assert_eq!(team["month"]["tokens"], 12);
    let (status, _) = api_get(&server, "/api/people", &token_a).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a member cannot list people");

    // The page holds the form's CSRF token; a POST without it is refused.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let url = format!("http://{}/console/people", server.addr);
    let page = client
        .get(&url)
        .bearer_auth(&lead)
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.expect("html");
    assert!(
        html.contains("a@example.com") && html.contains("platform"),
        "{html}"
    );
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form's CSRF token")
        .to_owned();
    let post = |token: &str, form: Vec<(&'static str, String)>| {
        let body: Vec<String> = form
            .iter()
            .map(|(k, v)| format!("{k}={}", form_encoded(v)))
            .collect();
        client
            .post(&url)
            .bearer_auth(token)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.join("&"))
            .send()
    };
    let set = |limits: &str| {
        vec![
            ("csrf", csrf.clone()),
            ("email", "a@example.com".to_owned()),
            ("action", "set-budget".to_owned()),
            ("limits", limits.to_owned()),
        ]
    };
    let forged = post(
        &lead,
        vec![
            ("csrf", "stale".to_owned()),
            ("email", "a@example.com".to_owned()),
            ("action", "disable".to_owned()),
        ],
    );
    assert_eq!(forged.await.expect("post").status(), StatusCode::FORBIDDEN);
    let by_member = post(&token_a, set("{}")).await.expect("post");
    assert_eq!(by_member.status(), StatusCode::FORBIDDEN);
    let bad = post(&lead, set(r#"{"daily_cost_usd": -1}"#))
        .await
        .expect("post");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert!(bad.text().await.expect("body").contains("daily_cost_usd"));

    // $0.001 a day for A: the next call is refused.
    let done = post(&lead, set(r#"{"daily_cost_usd": 0.001}"#))
        .await
        .expect("post");
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let sent = provider.requests().len();
    let turn = cli_turn(&a, "req-a2", "conv-a").await;
    assert_eq!(turn.error_code(), Some("resource_exhausted"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("daily_cost_usd")
    );
    assert_eq!(provider.requests().len(), sent);

    // Disabled, A is refused whatever they send.
    let disable = vec![
        ("csrf", csrf.clone()),
        ("email", "a@example.com".to_owned()),
        ("action", "disable".to_owned()),
    ];
    let done = post(&lead, disable).await.expect("post");
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let turn = cli_turn(&a, "req-a3", "conv-a").await;
    assert_eq!(turn.error_code(), Some("permission_denied"));
    assert!(
        turn.error_message()
            .unwrap_or_default()
            .contains("disabled")
    );

    // Both actions are in the audit log under the admin's name.
    let (_, log) = api_get(&server, "/api/audit", &lead).await;
    let by_lead: Vec<&str> = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["actor"] == "lead@example.com")
        .map(|e| e["action"].as_str().expect("action"))
        .collect();
    assert!(
        by_lead.contains(&"users set-budget") && by_lead.contains(&"users disable"),
        "{log}"
    );
    server.stop().await;
}

/// `text` as an HTML form sends it (application/x-www-form-urlencoded).
fn form_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                (b as char).to_string()
            }
            b' ' => "+".to_owned(),
            other => format!("%{other:02X}"),
        })
        .collect()
}
