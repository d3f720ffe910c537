//! Tools the user decides (`interaction_query` ↔ `interaction_response`): AskQuestion answered and
//! declined, CreatePlan accepted in Plan mode, SwitchMode approved (the run continues in the new
//! mode) and rejected, WebFetch approved (then fetched by the client and read as Markdown),
//! rejected and switched off by the client, WebSearch approved (run by the server's search
//! backend), rejected, failing, and not offered without a backend, and a response of the wrong
//! kind.
//!
//! A file of its own (not `tool_loop.rs`) because these tools travel on the interaction transport,
//! not as client execs: their cards, ids and failure modes differ.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use cursor_server::cursor::proto::agent::{
    self as pb, AgentClientMessage, AgentMode, agent_client_message, interaction_query,
    interaction_response, tool_call,
};
use fake_cursor::{FakeCursor, Session, Transcript};
use fake_provider::{FakeProvider, Reply, text_events, tool_call_events};
use fixtures::{TestServer, exec_result, offered_tools, run_request_in_mode, tool_result_text};

fn respond(id: u32, result: interaction_response::Result) -> AgentClientMessage {
    AgentClientMessage {
        message: Some(agent_client_message::Message::InteractionResponse(
            pb::InteractionResponse {
                id,
                result: Some(result),
            },
        )),
    }
}

/// The final card of the transcript's only tool call.
fn completed_card(transcript: &Transcript) -> tool_call::Tool {
    transcript
        .completed_cards()
        .first()
        .and_then(|done| done.tool_call.clone())
        .and_then(|c| c.tool)
        .expect("a completed tool card")
}

struct Harness {
    provider: FakeProvider,
    _server: TestServer,
    cursor: FakeCursor,
}

impl Harness {
    async fn new(tool: (&str, &str), then: &str) -> Harness {
        let provider = FakeProvider::start().await;
        provider.push(Reply::sse(tool_call_events(
            None,
            &[("call_1", tool.0, tool.1)],
            (10, 1, 0),
        )));
        provider.push(Reply::sse(text_events(&[then], (20, 2, 0))));
        let server = TestServer::start(&provider.base_url()).await;
        let cursor = FakeCursor::new(server.addr);
        Harness {
            provider,
            _server: server,
            cursor,
        }
    }
}

const QUESTION: &str = r#"{"title":"Setup","questions":[{"id":"db","prompt":"Which database?","options":[{"id":"pg","label":"Postgres"},{"id":"lite","label":"SQLite"}]}]}"#;

#[tokio::test]
async fn a_question_is_asked_and_the_answer_reaches_the_model() {
    let h = Harness::new(("AskQuestion", QUESTION), "Postgres it is.").await;
    let mut turn = Session::start(
        &h.cursor,
        "req-q1",
        &run_request_in_mode("conv-q1", "set up a db", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    let Some(interaction_query::Query::AskQuestionInteractionQuery(ask)) = &query.query else {
        panic!("expected a question, got {query:?}");
    };
    assert!(
        ask.tool_call_id.starts_with("tool_"),
        "{}",
        ask.tool_call_id
    );
    let args = ask.args.as_ref().unwrap();
    assert_eq!(args.questions[0].options[1].label, "SQLite");
    turn.send(&respond(
        query.id,
        interaction_response::Result::AskQuestionInteractionResponse(
            pb::AskQuestionInteractionResponse {
                result: Some(pb::AskQuestionResult {
                    result: Some(pb::ask_question_result::Result::Success(
                        pb::AskQuestionSuccess {
                            answers: vec![pb::ask_question_success::Answer {
                                question_id: "db".into(),
                                selected_option_ids: vec!["pg".into()],
                                freeform_text: "behind pgbouncer".into(),
                            }],
                        },
                    )),
                }),
            },
        ),
    ))
    .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let tool_call::Tool::AskQuestionToolCall(card) = completed_card(&transcript) else {
        panic!("an AskQuestion card");
    };
    assert!(matches!(
        card.result.and_then(|r| r.result),
        Some(pb::ask_question_result::Result::Success(_))
    ));
    let requests = h.provider.requests();
    assert_eq!(
        tool_result_text(&requests[1]),
        "The user answered:\n- Which database?: Postgres; behind pgbouncer"
    );
}

#[tokio::test]
async fn a_declined_question_is_an_error_result_the_model_sees() {
    let h = Harness::new(("AskQuestion", QUESTION), "Fine, I'll pick.").await;
    let mut turn = Session::start(
        &h.cursor,
        "req-q2",
        &run_request_in_mode("conv-q2", "set up a db", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    turn.send(&respond(
        query.id,
        interaction_response::Result::AskQuestionInteractionResponse(
            pb::AskQuestionInteractionResponse {
                result: Some(pb::AskQuestionResult {
                    result: Some(pb::ask_question_result::Result::Rejected(
                        pb::AskQuestionRejected {
                            reason: "not now".into(),
                        },
                    )),
                }),
            },
        ),
    ))
    .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success());
    let tool_call::Tool::AskQuestionToolCall(card) = completed_card(&transcript) else {
        panic!("an AskQuestion card");
    };
    assert!(matches!(
        card.result.and_then(|r| r.result),
        Some(pb::ask_question_result::Result::Rejected(_))
    ));
    assert_eq!(
        tool_result_text(&h.provider.requests()[1]),
        "The user declined to answer (not now)."
    );
}

#[tokio::test]
async fn a_plan_created_in_plan_mode_is_accepted() {
    let plan = r##"{"name":"Refactor","overview":"Split the module.","plan":"# Steps\n1. Split","todos":[{"id":"1","content":"Split"}]}"##;
    let h = Harness::new(("CreatePlan", plan), "Plan ready.").await;
    let mut turn = Session::start(
        &h.cursor,
        "req-plan",
        &run_request_in_mode("conv-plan", "plan the refactor", AgentMode::Plan),
    )
    .await;
    let query = turn.next_query().await;
    let Some(interaction_query::Query::CreatePlanRequestQuery(request)) = &query.query else {
        panic!("expected a plan, got {query:?}");
    };
    let args = request.args.as_ref().unwrap();
    assert_eq!((args.name.as_str(), args.todos.len()), ("Refactor", 1));
    turn.send(&respond(
        query.id,
        interaction_response::Result::CreatePlanRequestResponse(pb::CreatePlanRequestResponse {
            result: Some(pb::CreatePlanResult {
                plan_uri: "file:///plans/refactor.md".into(),
                result: Some(pb::create_plan_result::Result::Success(
                    pb::CreatePlanSuccess {},
                )),
            }),
        }),
    ))
    .await;
    while turn.next().await.is_some() {}
    let transcript = &turn.transcript;
    assert!(transcript.is_success());
    assert!(matches!(
        completed_card(transcript),
        tool_call::Tool::CreatePlanToolCall(_)
    ));
    // The accepted plan is folded from history into the checkpoint, as Cursor keeps it.
    let state = transcript
        .checkpoints()
        .last()
        .copied()
        .expect("a checkpoint");
    let plan_id = state.plan.as_ref().expect("the checkpoint names the plan");
    let plan = <pb::ConversationPlan as prost::Message>::decode(turn.blobs[plan_id].as_slice())
        .expect("a plan blob");
    assert_eq!(plan.plan, "# Steps\n1. Split");
    let requests = h.provider.requests();
    assert!(offered_tools(&requests[0]).contains(&"CreatePlan".to_owned()));
    assert_eq!(
        tool_result_text(&requests[1]),
        "The plan was created and shown to the user (file:///plans/refactor.md)."
    );

    // "Build": the plan runs in Agent mode, with the agent's tools.
    h.provider
        .push(Reply::sse(text_events(&["Building."], (30, 1, 0))));
    let mut build = fixtures::run_request("conv-plan", "unused");
    if let Some(pb::agent_client_message::Message::RunRequest(request)) = &mut build.message {
        request.action = Some(pb::ConversationAction {
            action: Some(pb::conversation_action::Action::ExecutePlanAction(
                pb::ExecutePlanAction {
                    plan: Some(plan.clone()),
                    plan_file_uri: Some("file:///plans/refactor.md".into()),
                    execution_mode: AgentMode::Agent as i32,
                    request_context: Some(Default::default()),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }
    let built = Session::start(&h.cursor, "req-build", &build)
        .await
        .finish()
        .await;
    assert!(built.is_success(), "{:?}", built.end);
    let requests = h.provider.requests();
    let tools = offered_tools(&requests[2]);
    assert!(
        tools.contains(&"StrReplace".to_owned()) && !tools.contains(&"CreatePlan".to_owned()),
        "{tools:?}"
    );
    let messages = requests[2]["messages"].to_string();
    assert!(
        messages.contains("<plan>\\n# Steps\\n1. Split\\n</plan>"),
        "{messages}"
    );
    assert!(
        messages.contains("from Plan mode to Agent mode"),
        "the model is told the mode changed"
    );
}

fn switch_response(approved: bool) -> interaction_response::Result {
    use pb::switch_mode_request_response::{Approved, Rejected, Result as S};
    interaction_response::Result::SwitchModeRequestResponse(pb::SwitchModeRequestResponse {
        result: Some(if approved {
            S::Approved(Approved {})
        } else {
            S::Rejected(Rejected {
                reason: "keep going".into(),
            })
        }),
    })
}

#[tokio::test]
async fn an_approved_mode_switch_continues_the_run_in_the_new_mode() {
    let h = Harness::new(
        (
            "SwitchMode",
            r#"{"target_mode_id":"plan","explanation":"big change"}"#,
        ),
        "Planning now.",
    )
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-sw",
        &run_request_in_mode("conv-sw", "rewrite everything", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    let Some(interaction_query::Query::SwitchModeRequestQuery(request)) = &query.query else {
        panic!("expected a mode switch, got {query:?}");
    };
    assert_eq!(request.args.as_ref().unwrap().target_mode_id, "plan");
    turn.send(&respond(query.id, switch_response(true))).await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success());
    let tool_call::Tool::SwitchModeToolCall(card) = completed_card(&transcript) else {
        panic!("a SwitchMode card");
    };
    let Some(pb::switch_mode_result::Result::Success(success)) = card.result.and_then(|r| r.result)
    else {
        panic!("a successful switch");
    };
    assert_eq!(
        (success.from_mode_id.as_str(), success.to_mode_id.as_str()),
        ("agent", "plan")
    );
    let requests = h.provider.requests();
    let (before, after) = (&requests[0], &requests[1]);
    assert!(offered_tools(before).contains(&"Write".to_owned()));
    assert!(
        !offered_tools(after).contains(&"Write".to_owned()),
        "Plan tools now"
    );
    assert!(offered_tools(after).contains(&"CreatePlan".to_owned()));
    assert!(
        after["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("# Mode: Plan")
    );
    assert_eq!(
        after["messages"]
            .to_string()
            .matches("from Agent mode to Plan mode")
            .count(),
        1
    );
    // The checkpoint states the new mode.
    let last = transcript
        .checkpoints()
        .last()
        .copied()
        .expect("a checkpoint");
    assert_eq!(last.mode, Some(AgentMode::Plan as i32));

    // The next message, sent in Plan mode, brings no second notice.
    h.provider
        .push(Reply::sse(text_events(&["ok"], (30, 3, 0))));
    let next = Session::start(
        &h.cursor,
        "req-sw2",
        &run_request_in_mode("conv-sw", "go on", AgentMode::Plan),
    )
    .await;
    assert!(next.finish().await.is_success());
    let third = &h.provider.requests()[2];
    assert_eq!(
        third["messages"]
            .to_string()
            .matches("from Agent mode to Plan mode")
            .count(),
        1
    );
}

#[tokio::test]
async fn a_rejected_mode_switch_keeps_the_mode_and_tells_the_model() {
    let h = Harness::new(("SwitchMode", r#"{"target_mode_id":"ask"}"#), "Staying.").await;
    let mut turn = Session::start(
        &h.cursor,
        "req-sw-no",
        &run_request_in_mode("conv-sw-no", "fix it", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    turn.send(&respond(query.id, switch_response(false))).await;
    assert!(turn.finish().await.is_success());
    let requests = h.provider.requests();
    assert_eq!(offered_tools(&requests[0]), offered_tools(&requests[1]));
    assert_eq!(
        tool_result_text(&requests[1]),
        "The user rejected the mode switch (keep going); stay in the current mode."
    );
}

/// Issue 29 (7): a response of the wrong kind (a mode-switch answer to a question) fails the
/// question's call with a message the model reads, and the turn goes on.
#[tokio::test]
async fn a_response_of_the_wrong_kind_fails_its_call_and_the_turn_goes_on() {
    let h = Harness::new(("AskQuestion", QUESTION), "I will ask again.").await;
    let mut turn = Session::start(
        &h.cursor,
        "req-wrong",
        &run_request_in_mode("conv-wrong", "ask me", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    turn.send(&respond(query.id, switch_response(true))).await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert_eq!(transcript.text(), "I will ask again.");
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 2, "the model was called again");
    let result = tool_result_text(&requests[1]);
    assert!(
        result.starts_with("Error:") && result.contains("ask_question_interaction_response"),
        "{result}"
    );
}

fn web_fetch_response(approved: bool) -> interaction_response::Result {
    use pb::web_fetch_request_response::{Approved, Rejected, Result as W};
    interaction_response::Result::WebFetchRequestResponse(pb::WebFetchRequestResponse {
        result: Some(if approved {
            W::Approved(Approved {})
        } else {
            W::Rejected(Rejected {
                reason: "not that site".into(),
            })
        }),
    })
}

const PAGE: &str = "<!doctype html><html><head><title>t</title><script>alert(1)</script></head>\
<body><nav>menu</nav><h1>Install</h1><p>Run <code>cargo run</code> with a <a href=\"https://example.com/cfg\">config</a>.</p></body></html>";

#[tokio::test]
async fn an_approved_web_fetch_is_fetched_by_the_client_and_read_as_markdown() {
    let h = Harness::new(
        ("WebFetch", r#"{"url":"https://example.com/docs"}"#),
        "Got it.",
    )
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-wf",
        &run_request_in_mode("conv-wf", "read the docs", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    let Some(interaction_query::Query::WebFetchRequestQuery(ask)) = &query.query else {
        panic!("expected a fetch approval, got {query:?}");
    };
    assert_eq!(ask.args.as_ref().unwrap().url, "https://example.com/docs");
    turn.send(&respond(query.id, web_fetch_response(true)))
        .await;
    // Approved: the same call becomes a fetch exec with the next id.
    let exec = turn.next_exec().await;
    let Some(pb::exec_server_message::Message::FetchArgs(fetch)) = &exec.message else {
        panic!("expected fetch_args, got {exec:?}");
    };
    assert_eq!(fetch.url, "https://example.com/docs");
    assert!(exec.id > query.id);
    turn.send(&exec_result(
        exec.id,
        pb::exec_client_message::Message::FetchResult(pb::FetchResult {
            result: Some(pb::fetch_result::Result::Success(pb::FetchSuccess {
                url: "https://example.com/docs".into(),
                content: PAGE.into(),
                status_code: 200,
                content_type: "text/html; charset=utf-8".into(),
            })),
        }),
    ))
    .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let tool_call::Tool::WebFetchToolCall(card) = completed_card(&transcript) else {
        panic!("a WebFetch card");
    };
    let Some(pb::web_fetch_result::Result::Success(success)) = card.result.and_then(|r| r.result)
    else {
        panic!("a successful fetch");
    };
    assert!(
        success.markdown.contains("# Install"),
        "{}",
        success.markdown
    );
    assert!(
        success
            .markdown
            .contains("[config](https://example.com/cfg)"),
        "{}",
        success.markdown
    );
    let seen = tool_result_text(&h.provider.requests()[1]);
    assert!(
        seen.starts_with("Contents of https://example.com/docs:"),
        "{seen}"
    );
    assert!(seen.contains("`cargo run`"), "{seen}");
    assert!(
        !seen.contains("alert(1)") && !seen.contains("menu"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_rejected_web_fetch_fetches_nothing_and_the_model_is_told() {
    let h = Harness::new(
        ("WebFetch", r#"{"url":"https://example.com/secret"}"#),
        "Understood.",
    )
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-wf-no",
        &run_request_in_mode("conv-wf-no", "read it", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    turn.send(&respond(query.id, web_fetch_response(false)))
        .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert!(
        !transcript.kinds().contains(&"exec_server_message"),
        "no fetch was sent: {:?}",
        transcript.kinds()
    );
    let tool_call::Tool::WebFetchToolCall(card) = completed_card(&transcript) else {
        panic!("a WebFetch card");
    };
    assert!(matches!(
        card.result.and_then(|r| r.result),
        Some(pb::web_fetch_result::Result::Rejected(r)) if r.reason == "not that site"
    ));
    assert_eq!(
        tool_result_text(&h.provider.requests()[1]),
        "The user rejected fetching https://example.com/secret (not that site)."
    );
}

#[tokio::test]
async fn web_fetch_is_not_offered_when_the_client_switched_it_off() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["a"], (10, 1, 0))));
    provider.push(Reply::sse(text_events(&["b"], (10, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let on = run_request_in_mode("conv-wf-off", "hi", AgentMode::Agent);
    assert!(
        Session::start(&cursor, "req-wf-on", &on)
            .await
            .finish()
            .await
            .is_success()
    );
    let mut off = run_request_in_mode("conv-wf-off", "again", AgentMode::Agent);
    if let Some(agent_client_message::Message::RunRequest(request)) = &mut off.message
        && let Some(pb::conversation_action::Action::UserMessageAction(action)) =
            request.action.as_mut().and_then(|a| a.action.as_mut())
    {
        action
            .request_context
            .get_or_insert_default()
            .web_fetch_enabled = Some(false);
    }
    assert!(
        Session::start(&cursor, "req-wf-off", &off)
            .await
            .finish()
            .await
            .is_success()
    );
    let requests = provider.requests();
    assert!(offered_tools(&requests[0]).contains(&"WebFetch".to_owned()));
    let without = offered_tools(&requests[1]);
    assert!(!without.contains(&"WebFetch".to_owned()), "{without:?}");
    assert!(
        !offered_tools(&requests[0]).contains(&"WebSearch".to_owned()),
        "no search backend is configured"
    );
    assert!(without.contains(&"Read".to_owned()));
}

/// A model asking for one WebSearch, a server whose search backend is a second fake endpoint.
struct SearchHarness {
    provider: FakeProvider,
    search: FakeProvider,
    _server: TestServer,
    cursor: FakeCursor,
}

impl SearchHarness {
    async fn new(backend_reply: Option<Reply>) -> SearchHarness {
        let provider = FakeProvider::start().await;
        provider.push(Reply::sse(tool_call_events(
            None,
            &[(
                "call_s",
                "WebSearch",
                r#"{"search_term":"rust 1.95 release notes"}"#,
            )],
            (10, 1, 0),
        )));
        provider.push(Reply::sse(text_events(&["Done."], (20, 2, 0))));
        let search = FakeProvider::start().await;
        if let Some(reply) = backend_reply {
            search.push(reply);
        }
        let server = TestServer::start_in(
            &provider.base_url(),
            tempfile::tempdir().unwrap(),
            &format!(
                "[web_search]\nkind = \"tavily\"\nbase_url = \"{}\"\napi_key = \"search-key\"\nmax_results = 2",
                search.base_url()
            ),
        )
        .await;
        let cursor = FakeCursor::new(server.addr);
        SearchHarness {
            provider,
            search,
            _server: server,
            cursor,
        }
    }
}

fn web_search_response(approved: bool) -> interaction_response::Result {
    use pb::web_search_request_response::{Approved, Rejected, Result as W};
    interaction_response::Result::WebSearchRequestResponse(pb::WebSearchRequestResponse {
        result: Some(if approved {
            W::Approved(Approved {})
        } else {
            W::Rejected(Rejected {
                reason: String::new(),
            })
        }),
    })
}

#[tokio::test]
async fn an_approved_web_search_runs_on_the_server_backend_and_the_model_reads_the_hits() {
    let h = SearchHarness::new(Some(Reply::Status {
        status: 200,
        body: serde_json::json!({"results": [
            {"title": "Announcing Rust 1.95", "url": "https://blog.rust-lang.org/1.95", "content": "Rust 1.95 stabilizes if-let chains."},
            {"title": "Release notes", "url": "https://doc.rust-lang.org/releases.html", "content": "Version 1.95.0"},
            {"title": "Third", "url": "https://example.com/3", "content": "cut by max_results"}
        ]})
        .to_string(),
    }))
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-ws",
        &run_request_in_mode("conv-ws", "what is new in rust?", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    let Some(interaction_query::Query::WebSearchRequestQuery(ask)) = &query.query else {
        panic!("expected a search approval, got {query:?}");
    };
    assert_eq!(
        ask.args.as_ref().unwrap().search_term,
        "rust 1.95 release notes"
    );
    turn.send(&respond(query.id, web_search_response(true)))
        .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    assert!(
        !transcript.kinds().contains(&"exec_server_message"),
        "the server searched itself"
    );
    let backend = h.search.requests();
    assert_eq!(backend.len(), 1);
    assert_eq!(backend[0]["query"], "rust 1.95 release notes");
    assert_eq!(backend[0]["max_results"], 2);
    assert_eq!(h.search.authorizations()[0], "Bearer search-key");
    let tool_call::Tool::WebSearchToolCall(card) = completed_card(&transcript) else {
        panic!("a WebSearch card");
    };
    let Some(pb::web_search_result::Result::Success(success)) = card.result.and_then(|r| r.result)
    else {
        panic!("a successful search");
    };
    assert_eq!(success.references.len(), 2);
    assert_eq!(success.references[0].url, "https://blog.rust-lang.org/1.95");
    let requests = h.provider.requests();
    assert!(offered_tools(&requests[0]).contains(&"WebSearch".to_owned()));
    assert_eq!(
        tool_result_text(&requests[1]),
        "Web results for \"rust 1.95 release notes\":\n\n1. Announcing Rust 1.95\nhttps://blog.rust-lang.org/1.95\nRust 1.95 stabilizes if-let chains.\n\n2. Release notes\nhttps://doc.rust-lang.org/releases.html\nVersion 1.95.0"
    );
}

#[tokio::test]
async fn a_rejected_web_search_searches_nothing() {
    let h = SearchHarness::new(None).await;
    let mut turn = Session::start(
        &h.cursor,
        "req-ws-no",
        &run_request_in_mode("conv-ws-no", "search it", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    turn.send(&respond(query.id, web_search_response(false)))
        .await;
    assert!(turn.finish().await.is_success());
    assert!(h.search.requests().is_empty());
    assert_eq!(
        tool_result_text(&h.provider.requests()[1]),
        "The user rejected searching the web for \"rust 1.95 release notes\"."
    );
}

#[tokio::test]
async fn a_failing_search_backend_is_an_error_result_not_a_failed_run() {
    let h = SearchHarness::new(Some(Reply::Status {
        status: 401,
        body: r#"{"detail":"invalid api key"}"#.into(),
    }))
    .await;
    let mut turn = Session::start(
        &h.cursor,
        "req-ws-err",
        &run_request_in_mode("conv-ws-err", "search it", AgentMode::Agent),
    )
    .await;
    let query = turn.next_query().await;
    turn.send(&respond(query.id, web_search_response(true)))
        .await;
    let transcript = turn.finish().await;
    assert!(transcript.is_success(), "{:?}", transcript.end);
    let tool_call::Tool::WebSearchToolCall(card) = completed_card(&transcript) else {
        panic!("a WebSearch card");
    };
    assert!(matches!(
        card.result.and_then(|r| r.result),
        Some(pb::web_search_result::Result::Error(_))
    ));
    let seen = tool_result_text(&h.provider.requests()[1]);
    assert!(
        seen.contains("HTTP 401") && seen.contains("invalid api key"),
        "{seen}"
    );
}

#[tokio::test]
async fn an_answer_that_comes_after_the_questions_run_ended_reaches_the_model_once() {
    let provider = FakeProvider::start().await;
    provider.push(Reply::sse(text_events(&["Noted: Postgres."], (10, 1, 0))));
    let server = TestServer::start(&provider.base_url()).await;
    let cursor = FakeCursor::new(server.addr);
    let answered = || {
        let mut message = fixtures::run_request("conv-late", "unused");
        if let Some(pb::agent_client_message::Message::RunRequest(request)) = &mut message.message {
            request.action = Some(pb::ConversationAction {
                action: Some(
                    pb::conversation_action::Action::AsyncAskQuestionCompletionAction(
                        pb::AsyncAskQuestionCompletionAction {
                            original_tool_call_id: "tool_ask_1".into(),
                            original_args: Some(pb::AskQuestionArgs {
                                questions: vec![pb::ask_question_args::Question {
                                    id: "db".into(),
                                    prompt: "Which database?".into(),
                                    options: vec![pb::ask_question_args::Option {
                                        id: "pg".into(),
                                        label: "Postgres".into(),
                                    }],
                                    allow_multiple: false,
                                }],
                                ..Default::default()
                            }),
                            result: Some(pb::AskQuestionResult {
                                result: Some(pb::ask_question_result::Result::Success(
                                    pb::AskQuestionSuccess {
                                        answers: vec![pb::ask_question_success::Answer {
                                            question_id: "db".into(),
                                            selected_option_ids: vec!["pg".into()],
                                            freeform_text: String::new(),
                                        }],
                                    },
                                )),
                            }),
                        },
                    ),
                ),
                ..Default::default()
            });
        }
        message
    };
    let first = Session::start(&cursor, "req-late-1", &answered())
        .await
        .finish()
        .await;
    assert!(first.is_success(), "{:?}", first.end);
    assert_eq!(first.text(), "Noted: Postgres.");
    let request = provider.requests()[0]["messages"].to_string();
    assert!(
        request.contains("<late_answer>") && request.contains("Which database?: Postgres"),
        "{request}"
    );
    // The same answer sent again is not told twice, and no model call is made for it.
    let again = Session::start(&cursor, "req-late-2", &answered())
        .await
        .finish()
        .await;
    assert!(again.is_success(), "{:?}", again.end);
    assert_eq!(provider.requests().len(), 1);
}
