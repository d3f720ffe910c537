//! The console's JSON API after a real tool turn through the fake provider: the run with its
//! provider calls, tokens and cost; the conversation with its title and stored history; usage per
//! day with cost (unknown, never zero, without a price); the providers without their keys; and the
//! token that guards it all when set.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use browser::Browser;
use fake_cursor::{FakeCursor, Session};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{TestServer, exec_result, read_success, run_request_with_env};
use serde_json::Value;

const PRICING: &str = "\n[providers.models.pricing]\ninput = 2.0\noutput = 8.0\ncache_read = 0.5\ncache_write = 0.0\nreasoning = 0.0\n";

async fn get(server: &TestServer, path: &str) -> Value {
    let response = reqwest::get(format!("http://{}{path}", server.addr))
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.expect("JSON")
}

/// A server (with prices for its model) that has completed and recorded one tool turn.
async fn after_a_tool_turn(pricing: &str) -> (FakeProvider, TestServer) {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(tool_call_events(
        None,
        &[("call_c1", "Read", r#"{"path":"src/lib.rs"}"#)],
        (1_000, 100, 0),
    )));
    provider.push(Reply::sse(text_events(
        &["It is empty."],
        (1_200, 50, 1_000),
    )));
    let pricing = pricing.to_owned();
    let server = TestServer::start_edited(&provider.base_url(), "openai-chat", move |text| {
        format!("{text}{pricing}")
    })
    .await;
    let cursor = FakeCursor::new(server.addr);
    let mut session = Session::start(
        &cursor,
        "req-console",
        &run_request_with_env("conv-console", "What is in src/lib.rs?\nLook closely."),
    )
    .await;
    let exec = session.next_exec().await;
    session
        .send(&exec_result(exec.id, read_success("src/lib.rs", "\n")))
        .await;
    assert!(session.finish().await.is_success());
    // The run's record is written as it ends, after its stream closed: wait for it (bounded).
    for _ in 0..1500 {
        if get(&server, "/api/runs").await["runs"][0]["status"] == "succeeded" {
            return (provider, server);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the run's record never said it succeeded");
}

#[tokio::test]
async fn a_tool_turn_shows_in_runs_conversations_usage_and_providers() {
    let (_provider, server) = after_a_tool_turn(PRICING).await;

    let runs = get(&server, "/api/runs").await;
    let run = &runs["runs"][0];
    assert_eq!(run["request_id"], "req-console", "{runs}");
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["conversation_id"], "conv-console");
    assert_eq!(run["provider_call_count"], 2);
    assert_eq!(run["usage"]["input"], 2_200);
    assert_eq!(run["usage"]["output"], 150);
    assert_eq!(run["usage"]["cache_read"], 1_000);
    // 2,200 × $2 + 150 × $8 + 1,000 × $0.5, per million.
    let cost = run["cost_usd"].as_f64().expect("a cost");
    assert!((cost - 0.0061).abs() < 1e-9, "{cost}");
    assert!(run["first_token_ms"].as_i64().is_some(), "{run}");

    let detail = get(&server, "/api/runs/req-console").await;
    let calls = detail["provider_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["finish_reason"], "tool_calls");
    assert_eq!(calls[1]["finish_reason"], "stop");
    assert_eq!(calls[0]["attempts"], 1);
    assert_eq!(detail["mode"], "agent");
    assert_eq!(detail["transport"], "run_sse");
    let tools = detail["tool_calls"].as_array().expect("tool calls");
    assert_eq!(tools.len(), 1, "{detail}");
    assert_eq!(tools[0]["tool"], "Read");
    assert_eq!(tools[0]["outcome"], "success");
    assert!(
        tools[0]["arguments"]
            .as_str()
            .is_some_and(|a| a.contains("src/lib.rs"))
    );
    assert!(tools[0]["duration_ms"].as_i64().is_some_and(|d| d >= 0));

    let filtered = get(&server, "/api/runs?status=failed").await;
    assert_eq!(filtered["runs"].as_array().map(Vec::len), Some(0));
    let by_conversation = get(&server, "/api/runs?conversation=conv-console").await;
    assert_eq!(by_conversation["runs"].as_array().map(Vec::len), Some(1));

    let conversations = get(&server, "/api/conversations").await;
    let listed = &conversations["conversations"][0];
    assert_eq!(listed["id"], "conv-console");
    assert_eq!(listed["title"], "What is in src/lib.rs?");
    assert_eq!(listed["runs"], 1);
    let conversation = get(&server, "/api/conversations/conv-console").await;
    let history = conversation["history"].as_array().expect("history");
    let roles: Vec<&str> = history.iter().filter_map(|m| m["role"].as_str()).collect();
    assert!(
        roles.contains(&"tool_call") && roles.contains(&"tool_result"),
        "{roles:?}"
    );
    assert!(conversation["head"]["revision"].as_i64().is_some());

    let usage = get(&server, "/api/usage").await;
    let row = &usage["rows"][0];
    assert_eq!(row["calls"], 2);
    assert_eq!(row["usage"]["input"], 2_200);
    let hit = row["cache_hit_rate"].as_f64().expect("a hit rate");
    assert!((hit - 1_000.0 / 3_200.0).abs() < 1e-9, "{hit}");

    let providers = get(&server, "/api/providers").await;
    let text = providers.to_string();
    assert!(!text.contains(fixtures::API_KEY), "the key is never shown");
    assert_eq!(providers["providers"][0]["api_key"], "***");
    let model = &providers["providers"][0]["models"][0];
    assert_eq!(model["last_call"]["ok"], true);
    assert_eq!(model["priced"], true);
}

#[tokio::test]
async fn without_a_price_the_cost_is_unknown_not_zero() {
    let (_provider, server) = after_a_tool_turn("").await;
    let usage = get(&server, "/api/usage").await;
    assert_eq!(usage["rows"][0]["cost_usd"], Value::Null, "{usage}");
    let missing = reqwest::get(format!("http://{}/api/runs/req-nothing", server.addr))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let bad = reqwest::get(format!("http://{}/api/runs?status=sideways", server.addr))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// The console token of `server_with_token`.
const TOKEN: &str = "let-me-in";

/// A server whose console asks for `TOKEN`.
async fn server_with_token() -> (FakeProvider, TestServer) {
    let provider = FakeProvider::start().await;
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        &format!("console_token = \"{TOKEN}\""),
    )
    .await;
    (provider, server)
}

#[tokio::test]
async fn with_a_console_token_the_api_needs_it() {
    let (_provider, server) = server_with_token().await;
    let url = format!("http://{}/api/runs", server.addr);
    let client = reqwest::Client::new();
    assert_eq!(client.get(&url).send().await.unwrap().status(), 401);
    let wrong = client.get(&url).bearer_auth("guess").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let bearer = client
        .get(&url)
        .bearer_auth("let-me-in")
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    let cookie = client
        .get(&url)
        .header("cookie", "other=1; cursor_byok_console=let-me-in")
        .send()
        .await
        .unwrap();
    assert_eq!(cookie.status(), 200);
}

async fn page(server: &TestServer, path: &str) -> String {
    let response = reqwest::get(format!("http://{}{path}", server.addr))
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "{path}");
    assert!(
        response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/html")),
        "{path}"
    );
    response.text().await.expect("HTML")
}

#[tokio::test]
async fn the_pages_show_the_run_its_calls_the_conversation_and_usage() {
    let (_provider, server) = after_a_tool_turn(PRICING).await;
    let overview = page(&server, "/console").await;
    assert!(
        overview.contains("test-model") && overview.contains("ok "),
        "{overview}"
    );
    assert!(
        overview.contains("ready — database: writable"),
        "{overview}"
    );

    let runs = page(&server, "/console/runs").await;
    assert!(runs.contains("/console/runs/req-console"), "{runs}");
    assert!(
        runs.contains("succeeded") && runs.contains("$0.0061"),
        "{runs}"
    );
    let failed = page(&server, "/console/runs?status=failed").await;
    assert!(
        !failed.contains("/console/runs/req-console"),
        "the filter applies"
    );
    let any_time = page(&server, "/console/runs?status=&since=&model=&conversation=").await;
    assert!(
        any_time.contains("/console/runs/req-console"),
        "a blank form is no filter"
    );
    let future = page(&server, "/console/runs?since=99999999999999").await;
    assert!(
        !future.contains("/console/runs/req-console"),
        "the time filter applies"
    );

    let run = page(&server, "/console/runs/req-console").await;
    assert_eq!(run.matches("<tr class=\"call\">").count(), 2, "{run}");
    assert_eq!(run.matches("<tr class=\"tool\">").count(), 1, "{run}");
    assert!(
        run.contains("src/lib.rs") && run.contains("tool_calls"),
        "{run}"
    );

    let conversations = page(&server, "/console/conversations").await;
    assert!(
        conversations.contains("What is in src/lib.rs?"),
        "{conversations}"
    );
    let conversation = page(&server, "/console/conversations/conv-console").await;
    assert!(
        conversation.contains("Read({&quot;path&quot;:&quot;src/lib.rs&quot;})"),
        "{conversation}"
    );
    assert!(conversation.contains("It is empty."), "{conversation}");
    assert!(
        conversation.contains("system prompt (agent)") && conversation.contains("runtime"),
        "the system prompt and the runtime messages the model is shown: {conversation}"
    );

    let usage = page(&server, "/console/usage").await;
    assert!(
        usage.contains("<svg") && usage.contains("<tr class=\"usage\">"),
        "{usage}"
    );
}

#[tokio::test]
async fn in_a_real_browser_every_page_loads_clean_shows_the_turn_and_filters_work() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (provider, server) = after_a_tool_turn(PRICING).await;
    let base = format!("http://{}", server.addr);

    browser.open(&format!("{base}/console"), "overview").await;
    assert!(
        browser
            .client
            .source()
            .await
            .unwrap()
            .contains("test-model")
    );

    browser.open(&format!("{base}/console/runs"), "runs").await;
    assert_eq!(browser.count("tr.run").await, 1);
    // The status filter, through the page's own form.
    let form = browser
        .client
        .form(fantoccini::Locator::Css("form"))
        .await
        .expect("the filter form");
    form.set_by_name("status", "failed").await.expect("status");
    form.submit().await.expect("submitted");
    let filtered = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !browser
            .client
            .current_url()
            .await
            .is_ok_and(|url| url.as_str().contains("status=failed"))
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(filtered.is_ok(), "the form navigates to the filtered list");
    assert_eq!(browser.count("tr.run").await, 0, "no failed runs");
    assert!(browser.console_errors().await.is_empty());

    browser
        .open(&format!("{base}/console/runs/req-console"), "run")
        .await;
    assert_eq!(browser.count("tr.call").await, 2);
    assert_eq!(browser.count("tr.tool").await, 1);

    browser
        .open(&format!("{base}/console/conversations"), "conversations")
        .await;
    assert_eq!(browser.count("tr.conversation").await, 1);
    browser
        .open(
            &format!("{base}/console/conversations/conv-console"),
            "conversation",
        )
        .await;
    assert!(browser.count("div.message").await >= 4);

    browser
        .open(&format!("{base}/console/usage"), "usage")
        .await;
    assert_eq!(browser.count("svg.chart").await, 1);
    assert_eq!(browser.count("tr.usage").await, 1);
    browser.open(&format!("{base}/console/logs"), "logs").await;
    assert!(
        browser
            .client
            .source()
            .await
            .unwrap()
            .contains("warnings and errors")
    );

    // Live: a run in progress shows on the overview without a reload.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    provider.push(Reply::Held {
        before: vec![],
        after: text_events(&["late"], (1, 1, 0)),
        release: std::sync::Arc::clone(&release),
    });
    browser.open(&format!("{base}/console"), "overview").await;
    let cursor = FakeCursor::new(server.addr);
    let session = Session::start(
        &cursor,
        "req-live",
        &run_request_with_env("conv-live", "slow one"),
    )
    .await;
    let shown = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let active = browser.text_of(fantoccini::Locator::Id("active")).await;
            let running = browser.text_of(fantoccini::Locator::Id("running")).await;
            if active == "1" && running.contains("req-live") {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        shown.is_ok(),
        "the running run appears without a reload (pushed over SSE)"
    );
    release.notify_one();
    assert!(session.finish().await.is_success());
    browser.close().await;
}

/// An `application/x-www-form-urlencoded` body, as a browser submits a form.
fn form_body(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The value of the hidden `csrf` input on `html`.
fn csrf_of(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token on the page")
        .to_owned()
}

#[tokio::test]
async fn a_probe_needs_the_pages_csrf_token_and_shows_the_outcome_and_history_exports_as_markdown()
{
    let (provider, server) = after_a_tool_turn(PRICING).await;
    let overview = page(&server, "/console").await;
    let csrf = csrf_of(&overview);
    let client = reqwest::Client::new();
    let url = format!("http://{}/console/probe", server.addr);
    let forged = client
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("model", fixtures::MODEL),
            ("csrf", "guessed"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    provider.push(Reply::Status {
        status: 200,
        body: r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"OK"}}]}"#.into(),
    });
    let probed = client
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("model", fixtures::MODEL),
            ("csrf", csrf.as_str()),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(probed.status(), 200);
    let text = probed.text().await.unwrap();
    assert!(text.contains("ok: answered in"), "{text}");
    provider.push(Reply::Status {
        status: 401,
        body: r#"{"error":{"message":"Incorrect API key"}}"#.into(),
    });
    let refused = client
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("model", fixtures::MODEL),
            ("csrf", csrf.as_str()),
        ]))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(refused.contains("API key was refused"), "{refused}");

    let markdown = reqwest::get(format!(
        "http://{}/api/conversations/conv-console/markdown",
        server.addr
    ))
    .await
    .unwrap();
    assert_eq!(markdown.status(), 200);
    let markdown = markdown.text().await.unwrap();
    for part in [
        "# Conversation conv-console",
        "## User",
        "What is in src/lib.rs?",
        "## Tool call",
        "`Read`",
        "## Assistant",
        "It is empty.",
    ] {
        assert!(markdown.contains(part), "{part} missing: {markdown}");
    }
}

#[tokio::test]
async fn logging_in_with_the_token_sets_the_cookie_the_pages_accept() {
    let (_provider, server) = server_with_token().await;
    let base = format!("http://{}", server.addr);
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    assert_eq!(
        client
            .get(format!("{base}/console"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let form = client
        .get(format!("{base}/console/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&form);
    let log_in = |token: &'static str| {
        client
            .post(format!("{base}/console/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(&[("token", token), ("csrf", csrf.as_str())]))
            .send()
    };
    let wrong = log_in("guess").await.unwrap();
    assert_eq!(wrong.status(), 401);
    let right = log_in(TOKEN).await.unwrap();
    assert_eq!(right.status(), 303);
    let cookie = right
        .headers()
        .get("set-cookie")
        .expect("a cookie")
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let overview = client
        .get(format!("{base}/console"))
        .header("cookie", pair)
        .send()
        .await
        .unwrap();
    assert_eq!(overview.status(), 200);
}

#[tokio::test]
async fn pages_link_their_assets_from_the_binary_and_a_bad_filter_is_a_page_for_people() {
    let (_provider, server) = after_a_tool_turn(PRICING).await;
    let base = format!("http://{}", server.addr);
    let overview = reqwest::get(format!("{base}/console")).await.unwrap();
    let csp = overview.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    let overview = overview.text().await.unwrap();
    assert!(
        !overview.contains("<style") && !overview.contains("<script>"),
        "nothing inline: {overview}"
    );
    for (name, content_type) in [("console.css", "text/css"), ("live.js", "text/javascript")] {
        let link = overview
            .split(&format!("/console/static/{name}?v="))
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("the overview links {name}: {overview}"));
        let asset = reqwest::get(format!("{base}/console/static/{name}?v={link}"))
            .await
            .unwrap();
        assert_eq!(asset.status(), 200, "{name}");
        assert!(
            asset.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(content_type),
            "{name}"
        );
        assert!(
            asset.headers()["cache-control"]
                .to_str()
                .unwrap()
                .contains("immutable"),
            "{name}"
        );
    }
    let missing = reqwest::get(format!("{base}/console/static/other.js"))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let bad = reqwest::get(format!("{base}/console/runs?status=sideways"))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let bad = bad.text().await.unwrap();
    assert!(
        bad.contains("expected running, succeeded, failed or canceled") && bad.contains("<nav>"),
        "{bad}"
    );
    let unknown = reqwest::get(format!("{base}/console/runs/req-nothing"))
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    assert!(
        unknown
            .text()
            .await
            .unwrap()
            .contains("no run &quot;req-nothing&quot;")
    );
}
