//! Bench binary for the console: every page and API answer's time with 10,000 runs (each with a
//! provider call and a tool call) over 1,000 conversations in the database, measured over a
//! loopback socket against the real server (so it includes HTTP; the server's own time is less).
//!
//! `cargo bench --bench console` prints the median and p99 of 50 requests per page. Under
//! `cargo test` it runs once over 100 runs as a smoke test.

#[path = "../tests/support/fixtures.rs"]
mod fixtures;

use std::time::{Duration, Instant};

use fixtures::TestServer;

const MODEL: &str = fixtures::MODEL;

/// Fills the server's database with `runs` finished runs over `conversations` conversations.
async fn fill(server: &TestServer, runs: usize, conversations: usize) {
    let url = format!(
        "sqlite://{}",
        server.db_dir.path().join("test.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.expect("database");
    let mut tx = pool.begin().await.expect("transaction");
    let now = 1_764_892_800_000_i64;
    for c in 0..conversations {
        let id = format!("conv-{c}");
        let owner = format!("req-{c}");
        sqlx::query(
            "INSERT INTO conversations (id, created_at_ms, owner_request_id) VALUES (?, ?, ?)",
        )
        .bind(&id)
        .bind(now)
        .bind(&owner)
        .execute(&mut *tx)
        .await
        .expect("conversation");
        let body = serde_json::json!({"role": "user", "origin": "user",
            "text": format!("Question number {c}: why is the build slow?")});
        sqlx::query(
            "INSERT INTO messages (conversation_id, seq, role, origin, body, request_id, created_at_ms)
             VALUES (?, 0, 'user', 'user', ?, ?, ?)",
        )
        .bind(&id)
        .bind(body.to_string())
        .bind(&owner)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("message");
    }
    for r in 0..runs {
        let request = format!("req-{r}");
        let conversation = format!("conv-{}", r % conversations);
        let started = now + r as i64 * 60_000;
        let status = if r % 17 == 0 { "failed" } else { "succeeded" };
        sqlx::query(
            "INSERT INTO runs (request_id, conversation_id, status, model_id, provider_calls,
                 input_tokens, output_tokens, cache_read_tokens, started_at_ms, finished_at_ms,
                 mode, transport)
             VALUES (?, ?, ?, ?, 1, 1200, 80, 900, ?, ?, 'agent', 'run_sse')",
        )
        .bind(&request)
        .bind(&conversation)
        .bind(status)
        .bind(MODEL)
        .bind(started)
        .bind(started + 4_000)
        .execute(&mut *tx)
        .await
        .expect("run");
        sqlx::query(
            "INSERT INTO provider_calls (model_call_id, request_id, conversation_id, provider,
                 model_id, purpose, request_bytes, started_at_ms, first_event_ms, total_ms,
                 input_tokens, output_tokens, cache_read_tokens, finish_reason)
             VALUES (?, ?, ?, 'fake', ?, 'turn', 20000, ?, 300, 3900, 1200, 80, 900, 'stop')",
        )
        .bind(format!("call-{r}"))
        .bind(&request)
        .bind(&conversation)
        .bind(MODEL)
        .bind(started + 10)
        .execute(&mut *tx)
        .await
        .expect("provider call");
        sqlx::query(
            "INSERT INTO tool_executions (request_id, call_id, tool, summary, started_at_ms,
                 duration_ms, outcome) VALUES (?, 'call_1', 'Read', '{\"path\":\"src/main.rs\"}', ?, 12, 'success')",
        )
        .bind(&request)
        .bind(started + 400)
        .execute(&mut *tx)
        .await
        .expect("tool call");
    }
    tx.commit().await.expect("commit");
    pool.close().await;
}

async fn time(client: &reqwest::Client, url: &str, repeats: usize) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let started = Instant::now();
        let response = client.get(url).send().await.expect("request");
        assert_eq!(response.status(), 200, "{url}");
        let _ = response.bytes().await.expect("body");
        times.push(started.elapsed());
    }
    times.sort();
    (
        times[times.len() / 2],
        times[(times.len() * 99 / 100).min(times.len() - 1)],
    )
}

#[tokio::main]
async fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let (runs, conversations, repeats) = if benching {
        (10_000, 1_000, 50)
    } else {
        (100, 10, 1)
    };
    let server = TestServer::start("http://127.0.0.1:9/v1").await;
    let started = Instant::now();
    fill(&server, runs, conversations).await;
    println!(
        "console with {runs} runs over {conversations} conversations (filled in {:.1} s):",
        started.elapsed().as_secs_f64()
    );
    let base = format!("http://{}", server.addr);
    let newest = format!("req-{}", runs - 1);
    let client = reqwest::Client::new();
    for path in [
        "/console".to_owned(),
        "/console/runs".to_owned(),
        "/console/runs?status=failed".to_owned(),
        format!("/console/runs?conversation=conv-{}", conversations / 2),
        format!("/console/runs/{newest}"),
        "/console/conversations".to_owned(),
        "/console/conversations/conv-7".to_owned(),
        "/console/usage?days=3650".to_owned(),
        "/api/runs".to_owned(),
        "/api/usage?days=3650".to_owned(),
    ] {
        let (median, p99) = time(&client, &format!("{base}{path}"), repeats).await;
        println!(
            "  {path:<40} median {:>7.2} ms   p99 {:>7.2} ms",
            median.as_secs_f64() * 1000.0,
            p99.as_secs_f64() * 1000.0
        );
    }
    server.stop().await;
}
