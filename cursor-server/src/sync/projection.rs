//! The blob graph as a function of committed history: a fold over the conversation's stored
//! messages, in store order, from the graph's base (the system prompt root, or the roots and turns
//! of a conversation imported from the client). The same history gives the same blob ids; the
//! fold never changes history; the run's hot path applies each commit to the same fold, so what a
//! run publishes is what a later run re-projects, and a message committed but never added to the
//! graph (a crash between the two) is in the next run's graph.
//!
//! Two projections of one history: the UI turns (`turns`: the user's message, thinking, text and
//! each tool's card — every step shown) and the model replay (`root_prompt_messages_json`: what the
//! model reads, with the provider projector's filtering and order: a model call's answered tool
//! calls in call order right after it, notices after the whole batch, unanswered calls left out).
//!
//! Its own file because `sync/checkpoint.rs` holds the graph's building blocks and the state
//! within 800 lines; the fold over history is the one place that decides what the graph contains.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use prost::Message as _;

use crate::cursor::proto::agent::{self as pb, conversation_step};
use crate::model::conversation::BlobId;
use crate::model::message::{AssistantMessage, CanonicalMessage, Origin, UserMessage};
use crate::model::tool::{ToolCall, ToolResult};
use crate::store::{Store, StoreError, blobs, conversations};
use crate::sync::checkpoint::{Blob, ConversationGraph, StepBlob, roots};

/// Where a conversation's graph starts, and how many of its first stored messages that already
/// covers (an imported conversation's messages are the client's roots read back).
#[derive(Debug, Clone, Default)]
pub struct Base {
    pub graph: ConversationGraph,
    pub covers: usize,
}

/// Blobs the fold added: built here, or stored earlier by id (tool cards, put in the CAS before
/// their result was committed).
#[derive(Debug, Default)]
pub struct NewBlobs {
    pub built: Vec<Blob>,
    pub stored: Vec<BlobId>,
}

impl NewBlobs {
    pub fn is_empty(&self) -> bool {
        self.built.is_empty() && self.stored.is_empty()
    }
}

/// A finished call waiting for the calls before it (the graph adds a batch in call order).
#[derive(Debug, Clone)]
struct Answered {
    call: ToolCall,
    result: ToolResult,
    card: Option<BlobId>,
}

/// The tool batch of the latest model call with calls, while some are not in the graph yet.
#[derive(Debug, Clone)]
struct OpenBatch {
    model_call_id: String,
    planned: Vec<ToolCall>,
    /// Calls `planned[..next]` are in the graph (or were never answered and were skipped).
    next: u32,
    answered: BTreeMap<u32, Answered>,
    /// Runtime messages committed while the batch was open: roots after the batch.
    notices: Vec<String>,
}

/// The fold's state: the graph so far and what is waiting to enter it.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    graph: ConversationGraph,
    /// How many of the graph's first roots are the base's.
    base_roots: usize,
    /// How many of the graph's first turns are the base's (their timings are the base's).
    base_turns: usize,
    /// Timings of turns, by position, known from the published state (they are wall-clock facts,
    /// not history): a turn closed by the fold takes its entry from here.
    timings: Vec<pb::StepTiming>,
    batch: Option<OpenBatch>,
    /// Calls committed whose result is not (the pair is one transaction: at most a batch's worth).
    calls: HashMap<(String, u32), ToolCall>,
}

impl Projection {
    pub fn new(base: Base, timings: Vec<pb::StepTiming>) -> Projection {
        Projection {
            base_roots: base.graph.root_count(),
            base_turns: base.graph.finished_turns(),
            graph: base.graph,
            timings,
            batch: None,
            calls: HashMap::new(),
        }
    }

    /// Continues this fold with the timings known now (the newest checkpoint's), as if it had
    /// been folded with them from the start; false when that would have closed one of its turns
    /// with another timing.
    pub fn continue_with(&mut self, timings: Vec<pb::StepTiming>) -> bool {
        let closed = self.graph.timings();
        let agree = (self.base_turns..closed.len())
            .all(|i| timings.get(i).copied().unwrap_or_default() == closed[i]);
        if !agree {
            return false;
        }
        // The open turn (begun by the fold: a base has none) starts when the timings say.
        let started_at_ms = timings
            .get(self.graph.finished_turns())
            .map_or(0, |timing| timing.timestamp_ms);
        self.graph.set_turn_started(started_at_ms);
        self.timings = timings;
        true
    }

    /// The roots the base holds (before the conversation's own messages).
    pub fn base_roots(&self) -> Vec<BlobId> {
        self.graph.roots()[..self.base_roots.min(self.graph.root_count())].to_vec()
    }

    pub fn graph(&self) -> &ConversationGraph {
        &self.graph
    }

    pub fn graph_mut(&mut self) -> &mut ConversationGraph {
        &mut self.graph
    }

    /// Calls of the open batch not in the graph yet — running, waiting for an earlier call, or
    /// not started — in call order (the checkpoint's `pending_tool_calls`).
    pub fn pending_calls(&self) -> Vec<ToolCall> {
        self.batch.as_ref().map_or_else(Vec::new, |batch| {
            batch.planned[batch.next as usize..].to_vec()
        })
    }

    /// Adds one committed message (appended by run `request_id`) to the graph.
    pub fn apply(&mut self, request_id: &str, message: &CanonicalMessage, out: &mut NewBlobs) {
        match message {
            CanonicalMessage::User(user) if user.origin == Origin::User => {
                self.flush(out);
                self.begin_turn(request_id, user, out);
            }
            CanonicalMessage::User(notice) => match &mut self.batch {
                Some(batch) => batch.notices.push(notice.text.clone()),
                None => out
                    .built
                    .push(self.graph.push_root(&roots::user(&notice.text))),
            },
            CanonicalMessage::Assistant(assistant) => {
                self.flush(out);
                self.graph.set_turn_request(request_id);
                self.assistant(assistant, out);
            }
            CanonicalMessage::ToolCall(record) => {
                self.calls.insert(
                    (record.model_call_id.clone(), record.index),
                    record.call.clone(),
                );
            }
            CanonicalMessage::ToolResult(record) => {
                let key = (record.model_call_id.clone(), record.index);
                let Some(call) = self.calls.remove(&key) else {
                    tracing::warn!(call_id = %record.result.call_id, "a stored tool result has no stored call; left out of the graph");
                    return;
                };
                self.graph.set_turn_request(request_id);
                let answered = Answered {
                    call,
                    result: record.result.clone(),
                    card: record.card,
                };
                match &mut self.batch {
                    Some(batch) if batch.model_call_id == record.model_call_id => {
                        batch.answered.insert(record.index, answered);
                        self.advance(out);
                    }
                    // A call of an earlier model call, answered late: it enters where it is.
                    _ => self.add_pair(&answered, out),
                }
            }
        }
    }

    fn begin_turn(&mut self, request_id: &str, user: &UserMessage, out: &mut NewBlobs) {
        let position = self.graph.finished_turns();
        if let Some(done) = self
            .graph
            .close_turn(self.timings.get(position).copied().unwrap_or_default())
        {
            out.built.push(done);
        }
        let started_at_ms = self
            .timings
            .get(self.graph.finished_turns())
            .map_or(0, |timing| timing.timestamp_ms);
        out.built
            .push(self.graph.push_root(&roots::user(&user.text)));
        match user.shown_as {
            Some(id) => {
                self.graph.begin_turn_with(request_id, id, started_at_ms);
                out.stored.push(id);
            }
            None => out.built.push(self.graph.begin_turn(
                request_id,
                &shown_user_message(user, None),
                started_at_ms,
            )),
        }
    }

    fn assistant(&mut self, assistant: &AssistantMessage, out: &mut NewBlobs) {
        for (text, ms) in assistant.thinking_segments() {
            out.built.push(
                self.graph
                    .push_step(conversation_step::Message::ThinkingMessage(
                        pb::ThinkingMessage {
                            text: text.to_owned(),
                            duration_ms: ms,
                        },
                    )),
            );
        }
        if !assistant.text.is_empty() {
            out.built.push(
                self.graph
                    .push_step(conversation_step::Message::AssistantMessage(
                        pb::AssistantMessage {
                            text: assistant.text.clone(),
                        },
                    )),
            );
        }
        if !assistant.text.is_empty() || !assistant.thinking.is_empty() {
            out.built.push(
                self.graph
                    .push_root(&roots::assistant(&assistant.text, &assistant.thinking)),
            );
        }
        if !assistant.planned_calls.is_empty() {
            self.batch = Some(OpenBatch {
                model_call_id: assistant.model_call_id.clone(),
                planned: assistant.planned_calls.clone(),
                next: 0,
                answered: BTreeMap::new(),
                notices: Vec::new(),
            });
        }
    }

    /// Adds the open batch's answered calls that are next in call order; closes it when every
    /// call is in.
    fn advance(&mut self, out: &mut NewBlobs) {
        let Some(mut batch) = self.batch.take() else {
            return;
        };
        while let Some(answered) = batch.answered.remove(&batch.next) {
            self.add_pair(&answered, out);
            batch.next += 1;
        }
        if batch.next as usize >= batch.planned.len() {
            self.add_notices(&batch.notices, out);
        } else {
            self.batch = Some(batch);
        }
    }

    /// The next model call or user message: calls never answered are left out; the rest enter
    /// in call order, then the batch's notices.
    fn flush(&mut self, out: &mut NewBlobs) {
        if let Some(batch) = self.batch.take() {
            for answered in batch.answered.values() {
                self.add_pair(answered, out);
            }
            self.add_notices(&batch.notices, out);
        }
        self.calls.clear();
    }

    fn add_pair(&mut self, answered: &Answered, out: &mut NewBlobs) {
        if let Some(card) = answered.card {
            self.graph.push_step_id(card);
            out.stored.push(card);
        }
        let Answered { call, result, .. } = answered;
        out.built.push(self.graph.push_root(&roots::tool_call(
            &call.call_id,
            &call.name,
            &call.arguments,
        )));
        out.built.push(self.graph.push_root(&roots::tool_result(
            &call.call_id,
            &call.name,
            &result.content,
            result.is_error,
        )));
    }

    fn add_notices(&mut self, notices: &[String], out: &mut NewBlobs) {
        for text in notices {
            out.built.push(self.graph.push_root(&roots::user(text)));
        }
    }
}

/// What the user attached to a message as Cursor sent it (`SelectedContext`): the chips its turn
/// shows, carried through the run untouched.
#[derive(Debug, Clone, PartialEq)]
pub struct Chips(pb::SelectedContext);

impl From<pb::SelectedContext> for Chips {
    fn from(context: pb::SelectedContext) -> Chips {
        Chips(context)
    }
}

/// The step blob a turn shows for the user's message with its attachments' chips, stored before
/// the message (which names it) is committed.
pub fn shown_user_step(user: &UserMessage, chips: Chips) -> StepBlob {
    StepBlob::encoded(&shown_user_message(user, Some(chips.0)))
}

/// The `UserMessage` a turn shows for the user's message; `selected_context` (the attachments'
/// chips) is kept in a blob stored before the message (`UserMessage::shown_as`).
pub fn shown_user_message(
    user: &UserMessage,
    selected_context: Option<pb::SelectedContext>,
) -> pb::UserMessage {
    pb::UserMessage {
        text: user.text.clone(),
        message_id: user.client_message_id.clone(),
        conversation_state_blob_id: user
            .state_before
            .map(|id| id.0.to_vec())
            .unwrap_or_default(),
        mode: crate::sync::checkpoint::agent_mode(user.mode.unwrap_or_default()),
        selected_context,
        ..pb::UserMessage::default()
    }
}

/// Projects `history` (each message with the run that appended it) from `base`: the graph, and
/// every blob it built or names.
pub fn project<'a>(
    base: Base,
    timings: Vec<pb::StepTiming>,
    history: impl IntoIterator<Item = (&'a str, &'a CanonicalMessage)>,
) -> (Projection, NewBlobs) {
    let covers = base.covers;
    let mut projection = Projection::new(base, timings);
    let mut out = NewBlobs::default();
    for (request_id, message) in history.into_iter().skip(covers) {
        projection.apply(request_id, message, &mut out);
    }
    (projection, out)
}

/// Deletes the blobs no conversation's graph reaches (sparing those younger than `grace`): what
/// the heads, bases and unpublished checkpoints name, and their turns' children. Returns how many
/// were deleted.
pub async fn collect_garbage(store: &Store, grace: Duration) -> Result<u64, StoreError> {
    let mut live = Vec::new();
    for top in conversations::graph_tops(store).await? {
        let Some(data) = blobs::get(store, top).await? else {
            continue;
        };
        match pb::ConversationStateStructure::decode(data.as_slice()) {
            Ok(state) => live.extend(crate::sync::checkpoint::named_blobs(&state)),
            Err(e) => {
                return Err(StoreError::CorruptBlob {
                    id: top.to_hex(),
                    message: e.to_string(),
                });
            }
        }
    }
    blobs::collect_garbage(store, &live, grace).await
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use serde_json::Value;

    use super::*;
    use crate::model::message::{ThinkingSpan, ToolCallRecord, ToolResultRecord};
    use crate::sync::checkpoint::StateDetails;

    fn user(origin: Origin, text: &str) -> CanonicalMessage {
        CanonicalMessage::User(UserMessage {
            images: Vec::new(),
            shown_as: None,
            origin,
            text: text.into(),
            client_message_id: format!("m-{text}"),
            mode: None,
            runtime: None,
            state_before: None,
        })
    }

    fn call(index: u32, path: &str) -> ToolCall {
        ToolCall {
            call_id: format!("c{index}"),
            provider_call_id: format!("p{index}"),
            name: "Read".into(),
            arguments: format!(r#"{{"path":"{path}"}}"#),
        }
    }

    fn assistant(
        model_call: &str,
        text: &str,
        thinking: &[(&str, u32)],
        calls: Vec<ToolCall>,
    ) -> CanonicalMessage {
        CanonicalMessage::Assistant(AssistantMessage {
            text: text.into(),
            thinking: thinking.iter().map(|(t, _)| *t).collect(),
            thinking_spans: thinking
                .iter()
                .map(|(t, ms)| ThinkingSpan {
                    bytes: t.len() as u32,
                    ms: *ms,
                })
                .collect(),
            model_id: "m".into(),
            replay: None,
            model_call_id: model_call.into(),
            planned_calls: calls,
        })
    }

    fn pair(
        model_call: &str,
        index: u32,
        path: &str,
        card: Option<BlobId>,
    ) -> [CanonicalMessage; 2] {
        [
            CanonicalMessage::ToolCall(ToolCallRecord {
                model_call_id: model_call.into(),
                index,
                call: call(index, path),
            }),
            CanonicalMessage::ToolResult(ToolResultRecord {
                model_call_id: model_call.into(),
                index,
                result: ToolResult {
                    images: Vec::new(),
                    call_id: format!("c{index}"),
                    content: format!("content of {path}"),
                    is_error: false,
                    meta: None,
                },
                card,
            }),
        ]
    }

    fn card_id(path: &str) -> BlobId {
        BlobId::of(format!("card {path}").as_bytes())
    }

    /// Two turns: parallel reads finishing in reverse order with a notice between, then a call the
    /// run never answered (stopped) under thinking only.
    fn history() -> Vec<(String, CanonicalMessage)> {
        let mut rows = vec![
            ("r1", user(Origin::User, "read a and b")),
            (
                "r1",
                assistant(
                    "mc1",
                    "Reading.",
                    &[("pl", 5), ("an", 7)],
                    vec![call(0, "a"), call(1, "b")],
                ),
            ),
        ];
        let [c1, r1] = pair("mc1", 1, "b", Some(card_id("b")));
        let [c0, r0] = pair("mc1", 0, "a", Some(card_id("a")));
        rows.extend([
            ("r1", c1),
            ("r1", r1),
            ("r1", user(Origin::Runtime, "notice")),
        ]);
        rows.extend([("r1", c0), ("r1", r0)]);
        rows.extend([
            ("r1", assistant("mc2", "Done.", &[], Vec::new())),
            ("r2", user(Origin::User, "run it")),
            (
                "r2",
                assistant("mc3", "", &[("hmm", 3)], vec![call(2, "never")]),
            ),
        ]);
        rows.into_iter().map(|(r, m)| (r.to_owned(), m)).collect()
    }

    fn base() -> Base {
        let mut graph = ConversationGraph::default();
        graph.push_root(&roots::system("sys"));
        Base { graph, covers: 0 }
    }

    fn run(rows: &[(String, CanonicalMessage)]) -> (Projection, NewBlobs) {
        project(
            base(),
            Vec::new(),
            rows.iter().map(|(r, m)| (r.as_str(), m)),
        )
    }

    fn decode_root(blobs: &NewBlobs, id: &BlobId) -> Value {
        let blob = blobs
            .built
            .iter()
            .find(|b| b.id == *id)
            .expect("root blob built");
        serde_json::from_slice(&blob.data).expect("JSON root")
    }

    #[test]
    fn projecting_twice_gives_the_same_ids_and_leaves_history_as_it_was() {
        let rows = history();
        let before = rows.clone();
        let (first, _) = run(&rows);
        let (second, _) = run(&rows);
        assert_eq!(rows, before, "projection does not change history");
        assert_eq!(first.graph().roots(), second.graph().roots());
        assert_eq!(first.graph().turns(), second.graph().turns());
        assert_eq!(first.graph().turn_blob(), second.graph().turn_blob());
        let details = StateDetails::default();
        assert_eq!(
            first.graph().state(None, &details).1.id,
            second.graph().state(None, &details).1.id
        );
    }

    #[test]
    fn roots_follow_call_order_with_notices_after_the_batch_and_leave_unanswered_calls_out() {
        let rows = history();
        let (projection, blobs) = run(&rows);
        let roots: Vec<Value> = projection.graph().roots()[1..]
            .iter()
            .map(|id| decode_root(&blobs, id))
            .collect();
        let shape: Vec<String> = roots
            .iter()
            .map(|root| {
                let part = &root["content"][0];
                match part["type"].as_str() {
                    Some("tool-call") | Some("tool-result") => {
                        format!(
                            "{} {}",
                            part["type"].as_str().unwrap(),
                            part["toolCallId"].as_str().unwrap()
                        )
                    }
                    _ => format!(
                        "{} {}",
                        root["role"].as_str().unwrap(),
                        part["text"].as_str().unwrap_or("")
                    ),
                }
            })
            .collect();
        assert_eq!(
            shape,
            [
                "user read a and b",
                "assistant plan", // reasoning first, then the text in the same root
                "tool-call c0",
                "tool-result c0",
                "tool-call c1",
                "tool-result c1",
                "user notice",
                "assistant Done.",
                "user run it",
                "assistant hmm",
            ]
            .map(str::to_owned)
            .map(|s| if s == "assistant pl" {
                "assistant planan".to_owned()
            } else {
                s
            })
        );
        assert_eq!(roots[1]["content"][1]["text"], "Reading.");
        assert!(
            projection
                .pending_calls()
                .iter()
                .map(|c| &c.call_id)
                .eq(["c2"].iter()),
            "the unanswered call is pending, not a root"
        );
    }

    #[test]
    fn ui_turns_keep_every_thinking_segment_text_and_card_in_call_order() {
        let rows = history();
        let (projection, blobs) = run(&rows);
        let first_turn = projection.graph().turns()[0];
        let turn = blobs
            .built
            .iter()
            .find(|b| b.id == first_turn)
            .expect("turn blob");
        let turn = pb::ConversationTurnStructure::decode(turn.data.as_ref()).unwrap();
        let Some(pb::conversation_turn_structure::Turn::AgentConversationTurn(turn)) = turn.turn
        else {
            panic!("an agent turn")
        };
        let steps: Vec<String> = turn
            .steps
            .iter()
            .map(|id| {
                let id = BlobId::from_slice(id).unwrap();
                if id == card_id("a") {
                    return "card a".to_owned();
                }
                if id == card_id("b") {
                    return "card b".to_owned();
                }
                let blob = blobs.built.iter().find(|b| b.id == id).expect("step blob");
                match pb::ConversationStep::decode(blob.data.as_ref())
                    .unwrap()
                    .message
                {
                    Some(conversation_step::Message::ThinkingMessage(t)) => {
                        format!("thinking {} {}ms", t.text, t.duration_ms)
                    }
                    Some(conversation_step::Message::AssistantMessage(a)) => {
                        format!("text {}", a.text)
                    }
                    other => format!("{other:?}"),
                }
            })
            .collect();
        assert_eq!(
            steps,
            [
                "thinking pl 5ms",
                "thinking an 7ms",
                "text Reading.",
                "card a",
                "card b",
                "text Done."
            ]
        );
        assert_eq!(blobs.stored, [card_id("a"), card_id("b")]);
        // The second turn is still open: its thinking shows though its call never got a result.
        let open = projection.graph().turn_blob().expect("open turn");
        let open = pb::ConversationTurnStructure::decode(open.data.as_ref()).unwrap();
        let Some(pb::conversation_turn_structure::Turn::AgentConversationTurn(open)) = open.turn
        else {
            panic!("an agent turn")
        };
        assert_eq!(open.steps.len(), 1);
        assert_eq!(open.request_id.as_deref(), Some("r2"));
    }

    #[test]
    fn applying_commits_one_by_one_gives_the_projection_of_the_whole_history() {
        let rows = history();
        let (whole, _) = run(&rows);
        for split in 0..=rows.len() {
            let (mut live, _) = run(&rows[..split]);
            let mut out = NewBlobs::default();
            for (request_id, message) in &rows[split..] {
                live.apply(request_id, message, &mut out);
            }
            assert_eq!(
                live.graph().roots(),
                whole.graph().roots(),
                "split at {split}"
            );
            assert_eq!(
                live.graph().turns(),
                whole.graph().turns(),
                "split at {split}"
            );
            assert_eq!(
                live.graph().turn_blob(),
                whole.graph().turn_blob(),
                "split at {split}"
            );
        }
    }

    #[test]
    fn a_fold_continued_with_the_timings_known_later_is_the_fold_of_the_whole_history() {
        let rows = history();
        let timings = vec![
            pb::StepTiming {
                duration_ms: 500,
                timestamp_ms: 1_000,
            },
            pb::StepTiming {
                duration_ms: 0,
                timestamp_ms: 2_000,
            },
        ];
        let fold = |rows: &[(String, CanonicalMessage)], timings: &[pb::StepTiming]| {
            project(
                base(),
                timings.to_vec(),
                rows.iter().map(|(r, m)| (r.as_str(), m)),
            )
            .0
        };
        let ended = StateDetails {
            turn_ended_at_ms: Some(5_000),
            ..StateDetails::default()
        };
        let whole = fold(&rows, &timings);
        let state_of = |p: &Projection| {
            let turn = p.graph().turn_blob();
            p.graph().state(turn.as_ref(), &ended).1.id
        };
        // The second turn begins at row 8: a fold of fewer rows closed no turn.
        for split in 0..=rows.len() {
            for earlier in [&timings[..0], &timings[..]] {
                let mut continued = fold(&rows[..split], earlier);
                if !continued.continue_with(timings.clone()) {
                    assert!(
                        split > 8 && earlier.is_empty(),
                        "refused at {split} with {} timings",
                        earlier.len()
                    );
                    continue;
                }
                let mut out = NewBlobs::default();
                for (request_id, message) in &rows[split..] {
                    continued.apply(request_id, message, &mut out);
                }
                assert_eq!(continued.graph().roots(), whole.graph().roots());
                assert_eq!(continued.graph().turns(), whole.graph().turns());
                assert_eq!(continued.graph().timings(), whole.graph().timings());
                assert_eq!(continued.graph().turn_blob(), whole.graph().turn_blob());
                assert_eq!(state_of(&continued), state_of(&whole), "split at {split}");
                assert_eq!(continued.pending_calls(), whole.pending_calls());
            }
        }
    }

    #[test]
    fn a_resumed_run_completes_the_interrupted_batch_in_call_order_under_its_own_request() {
        let mut rows = history();
        rows.truncate(4); // user, assistant with two calls, then only call 1's pair
        let [c0, r0] = pair("mc1", 0, "a", None);
        rows.extend([("resume".to_owned(), c0), ("resume".to_owned(), r0)]);
        let (projection, blobs) = run(&rows);
        let ids: Vec<String> = projection.graph().roots()[3..]
            .iter()
            .map(|id| decode_root(&blobs, id)["content"][0]["toolCallId"].to_string())
            .collect();
        assert_eq!(ids, [r#""c0""#, r#""c0""#, r#""c1""#, r#""c1""#]);
        assert!(projection.pending_calls().is_empty());
        let open = projection.graph().turn_blob().expect("open turn");
        let open = pb::ConversationTurnStructure::decode(open.data.as_ref()).unwrap();
        let Some(pb::conversation_turn_structure::Turn::AgentConversationTurn(open)) = open.turn
        else {
            panic!("an agent turn")
        };
        assert_eq!(open.request_id.as_deref(), Some("resume"));
    }
}
