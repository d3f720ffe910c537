//! The conversation's immutable blob graph in Cursor's own model (protocol.md §7), built
//! incrementally: each addition returns only the new blobs, so a checkpoint costs O(new blobs).
//!
//! `root_prompt_messages_json[]` → model-message JSON blobs (Vercel AI SDK shape); `turns[]` →
//! `ConversationTurnStructure` blobs → `UserMessage` + `ConversationStep` blobs. The
//! `ConversationStateStructure` that names them all is the checkpoint.

use bytes::Bytes;
use prost::Message;
use serde_json::{Value, json};

use crate::cursor::proto::agent::{
    self as pb, AgentConversationTurnStructure, ConversationStateStructure, ConversationStep,
    ConversationTurnStructure, conversation_step, conversation_turn_structure,
};
use crate::model::conversation::BlobId;
use crate::model::conversation::{ContextUse, Mode};
use crate::model::conversation::{SubagentRunState, SubagentStatus, Todo, TodoStatus};
use crate::model::tool::ToolCall;
use crate::store::StoreError;

/// A conversation state (a checkpoint): one the client sent with its run request, or one this
/// server built from the graph. `run/` holds and hands these back without seeing the protobuf.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConversationState(ConversationStateStructure);

impl From<ConversationStateStructure> for ConversationState {
    fn from(state: ConversationStateStructure) -> ConversationState {
        ConversationState(state)
    }
}

impl ConversationState {
    /// A state blob of our own store; one that does not decode means the store is corrupt.
    pub fn decode_stored(data: &[u8], id: BlobId) -> Result<ConversationState, StoreError> {
        crate::cursor::connect::decode_message::<ConversationStateStructure>(
            data,
            "agent.v1.ConversationStateStructure",
        )
        .map(ConversationState)
        .map_err(|e| StoreError::CorruptBlob {
            id: id.to_hex(),
            message: e.to_string(),
        })
    }

    /// The model-message roots it names, in order.
    pub fn roots(&self) -> Vec<BlobId> {
        ids_of(&self.0.root_prompt_messages_json)
    }

    /// The finished turns it names, in order.
    pub fn turns(&self) -> Vec<BlobId> {
        ids_of(&self.0.turns)
    }

    /// Its roots, then its turns: every blob the client holds for it (the turns name the rest).
    pub fn roots_and_turns(&self) -> Vec<BlobId> {
        let mut ids = self.roots();
        ids.extend(self.turns());
        ids
    }

    pub fn root_count(&self) -> usize {
        self.0.root_prompt_messages_json.len()
    }

    /// The finished turns' timings (a projection continues them).
    pub fn timings(&self) -> Vec<pb::StepTiming> {
        self.0.turn_timings.clone()
    }

    /// The mode it was left in (`None` when unset or not one this server runs).
    pub fn mode(&self) -> Option<Mode> {
        self.0.mode.and_then(|m| mode_of(m).ok())
    }

    /// Every blob it names (`named_blobs`).
    pub fn named_blobs(&self) -> Vec<BlobId> {
        named_blobs(&self.0)
    }

    /// The `conversation_checkpoint_update` publishing it.
    pub fn update_message(&self) -> pb::AgentServerMessage {
        update_message(self.0.clone())
    }
}

fn ids_of(list: &[Vec<u8>]) -> Vec<BlobId> {
    list.iter()
        .filter_map(|id| BlobId::from_slice(id))
        .collect()
}

/// A step blob's bytes for a message about to be committed (a tool's finished card, the user's
/// message as its turn shows it): stored before the message that names it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBlob(Vec<u8>);

impl StepBlob {
    /// A tool's finished card as a `ConversationStep`.
    pub fn tool_card(card: pb::ToolCall) -> StepBlob {
        let step = ConversationStep {
            message: Some(conversation_step::Message::ToolCall(card)),
        };
        StepBlob(step.encode_to_vec())
    }

    /// Any message of the graph, encoded.
    pub fn encoded(message: &impl Message) -> StepBlob {
        StepBlob(message.encode_to_vec())
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A blob to store (on our side and the client's), with the edges it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Blob {
    pub id: BlobId,
    pub data: Bytes,
    pub edges: Vec<(&'static str, u32, BlobId)>,
}

impl Blob {
    pub fn new(data: Vec<u8>, edges: Vec<(&'static str, u32, BlobId)>) -> Blob {
        Blob {
            id: BlobId::of(&data),
            data: Bytes::from(data),
            edges,
        }
    }
}

fn ids(list: &[BlobId]) -> Vec<Vec<u8>> {
    list.iter().map(|id| id.0.to_vec()).collect()
}

fn edges_of(kind: &'static str, list: &[BlobId]) -> Vec<(&'static str, u32, BlobId)> {
    list.iter()
        .enumerate()
        .map(|(i, id)| (kind, u32::try_from(i).unwrap_or(u32::MAX), *id))
        .collect()
}

#[derive(Debug, Clone, Default)]
struct TurnDraft {
    request_id: String,
    user_message: Option<BlobId>,
    steps: Vec<BlobId>,
    /// Wall-clock start of the turn (ms since the epoch), for its `turn_timings` entry.
    started_at_ms: u64,
}

/// The graph of one conversation as far as this server has built it.
#[derive(Debug, Clone, Default)]
pub struct ConversationGraph {
    roots: Vec<BlobId>,
    turns: Vec<BlobId>,
    /// One entry per finished turn, in `turns` order.
    turn_timings: Vec<pb::StepTiming>,
    current: Option<TurnDraft>,
}

impl ConversationGraph {
    /// Continues from a published state (its roots and finished turns).
    pub fn from_state(state: &ConversationState) -> ConversationGraph {
        let state = &state.0;
        // A turn that never finished (canceled) has no timing: "unknown" keeps the lists aligned.
        let mut turn_timings = state.turn_timings.clone();
        turn_timings.resize(state.turns.len(), pb::StepTiming::default());
        ConversationGraph {
            turn_timings,
            roots: state
                .root_prompt_messages_json
                .iter()
                .filter_map(|b| BlobId::from_slice(b))
                .collect(),
            turns: state
                .turns
                .iter()
                .filter_map(|b| BlobId::from_slice(b))
                .collect(),
            current: None,
        }
    }

    /// Appends a model-message root (AI SDK JSON).
    pub fn push_root(&mut self, message: &Value) -> Blob {
        let blob = Blob::new(message.to_string().into_bytes(), Vec::new());
        self.roots.push(blob.id);
        blob
    }

    /// Starts the run's turn with the user's message.
    pub fn begin_turn(
        &mut self,
        request_id: &str,
        user_message: &pb::UserMessage,
        started_at_ms: u64,
    ) -> Blob {
        let blob = Blob::new(user_message.encode_to_vec(), Vec::new());
        self.current = Some(TurnDraft {
            request_id: request_id.to_owned(),
            user_message: Some(blob.id),
            steps: Vec::new(),
            started_at_ms,
        });
        blob
    }

    /// Starts the run's turn with a user-message blob stored earlier (one that carries the
    /// attachments' chips).
    pub fn begin_turn_with(&mut self, request_id: &str, user_message: BlobId, started_at_ms: u64) {
        self.current = Some(TurnDraft {
            request_id: request_id.to_owned(),
            user_message: Some(user_message),
            steps: Vec::new(),
            started_at_ms,
        });
    }

    /// Appends a step to the current turn (none open = a step without a turn, which is a bug in the
    /// caller; the step is still returned so it can be stored).
    pub fn push_step(&mut self, step: conversation_step::Message) -> Blob {
        let blob = Blob::new(
            ConversationStep {
                message: Some(step),
            }
            .encode_to_vec(),
            Vec::new(),
        );
        if let Some(turn) = &mut self.current {
            turn.steps.push(blob.id);
        }
        blob
    }

    /// The current turn's structure blob (re-made as steps are added; older versions become garbage).
    pub fn turn_blob(&self) -> Option<Blob> {
        let turn = self.current.as_ref()?;
        let user_message = turn.user_message?;
        let structure = ConversationTurnStructure {
            turn: Some(conversation_turn_structure::Turn::AgentConversationTurn(
                AgentConversationTurnStructure {
                    user_message: user_message.0.to_vec(),
                    steps: ids(&turn.steps),
                    request_id: Some(turn.request_id.clone()),
                    encrypted_model: None,
                },
            )),
        };
        let mut edges = vec![("user_message", 0, user_message)];
        edges.extend(edges_of("steps", &turn.steps));
        Some(Blob::new(structure.encode_to_vec(), edges))
    }

    /// The checkpoint naming every root and turn (including the current one, as `turn`), with
    /// `details`; returns it, its blob, and the todo and plan blobs it names (which must be stored
    /// too).
    pub fn state(
        &self,
        turn: Option<&Blob>,
        details: &StateDetails,
    ) -> (ConversationState, Blob, Vec<Blob>) {
        let mut turns = self.turns.clone();
        turns.extend(turn.map(|t| t.id));
        let mut turn_timings = self.turn_timings.clone();
        if let (Some(ended_at_ms), Some(current)) = (details.turn_ended_at_ms, &self.current) {
            turn_timings.push(pb::StepTiming {
                duration_ms: ended_at_ms.saturating_sub(current.started_at_ms),
                timestamp_ms: current.started_at_ms,
            });
        }
        let todo_blobs: Vec<Blob> = details
            .todos
            .iter()
            .map(|todo| Blob::new(todo_item(todo).encode_to_vec(), Vec::new()))
            .collect();
        let todo_ids: Vec<BlobId> = todo_blobs.iter().map(|b| b.id).collect();
        let plan_blob = details.plan.as_ref().map(|plan| {
            Blob::new(
                pb::ConversationPlan { plan: plan.clone() }.encode_to_vec(),
                Vec::new(),
            )
        });
        let state = ConversationStateStructure {
            plan: plan_blob.as_ref().map(|b| b.id.0.to_vec()),
            root_prompt_messages_json: ids(&self.roots),
            turns: ids(&turns),
            todos: ids(&todo_ids),
            pending_tool_calls: details
                .pending_tool_calls
                .iter()
                .map(|call| {
                    roots::tool_call_part(&call.call_id, &call.name, &call.arguments).to_string()
                })
                .collect(),
            token_details: details.context.map(|context| pb::ConversationTokenDetails {
                used_tokens: u32::try_from(context.used_tokens).unwrap_or(u32::MAX),
                max_tokens: u32::try_from(context.max_tokens).unwrap_or(u32::MAX),
                breakdown: None,
            }),
            mode: details.mode.map(agent_mode),
            turn_timings,
            self_summary_count: details.summaries,
            subagent_runs_by_parent_tool_call_id: details
                .subagent_runs
                .iter()
                .map(|run| (run.parent_tool_call_id.clone(), subagent_run(run)))
                .collect(),
            ..ConversationStateStructure::default()
        };
        let mut new_blobs = todo_blobs;
        new_blobs.extend(plan_blob);
        // No edge rows: a state names every root and turn, so its edges would grow with history
        // at every checkpoint; garbage collection reads what a state names (`named_blobs`).
        let blob = Blob::new(state.encode_to_vec(), Vec::new());
        (ConversationState(state), blob, new_blobs)
    }

    /// Closes the current turn (if any) with its timing; returns its final structure blob.
    pub fn close_turn(&mut self, timing: pb::StepTiming) -> Option<Blob> {
        let turn = self.turn_blob();
        if let Some(blob) = &turn {
            self.turns.push(blob.id);
            self.turn_timings.push(timing);
        }
        self.current = None;
        turn
    }

    /// Appends a step already stored by id (a tool's card) to the current turn.
    pub fn push_step_id(&mut self, id: BlobId) {
        if let Some(turn) = &mut self.current {
            turn.steps.push(id);
        }
    }

    /// The run adding to the current turn (a resumed run continues the turn it interrupted).
    pub fn set_turn_request(&mut self, request_id: &str) {
        if let Some(turn) = &mut self.current
            && turn.request_id != request_id
        {
            request_id.clone_into(&mut turn.request_id);
        }
    }

    /// When the current turn started (ms since the epoch), for its timing entry.
    pub fn set_turn_started(&mut self, started_at_ms: u64) {
        if let Some(turn) = &mut self.current {
            turn.started_at_ms = started_at_ms;
        }
    }

    /// The finished turns' timings, in `turns` order.
    pub fn timings(&self) -> &[pb::StepTiming] {
        &self.turn_timings
    }

    pub fn turns(&self) -> &[BlobId] {
        &self.turns
    }

    /// How many turns are finished (the next one to begin is at this position).
    pub fn finished_turns(&self) -> usize {
        self.turns.len()
    }

    pub fn root_count(&self) -> usize {
        self.roots.len()
    }

    pub fn roots(&self) -> &[BlobId] {
        &self.roots
    }

    /// Drops roots the client listed but does not have: a checkpoint must not name them.
    pub fn drop_roots(&mut self, missing: &[BlobId]) {
        self.roots.retain(|id| !missing.contains(id));
    }
}

/// Every blob a state names: its roots, turns, todos and plan (the turns name their own children
/// through edges).
pub fn named_blobs(state: &ConversationStateStructure) -> Vec<BlobId> {
    state
        .root_prompt_messages_json
        .iter()
        .chain(&state.turns)
        .chain(&state.todos)
        .chain(&state.plan)
        .filter_map(|id| BlobId::from_slice(id))
        .collect()
}

/// What a checkpoint states besides the graph, in domain terms (folded from history by the loop).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateDetails {
    /// Calls of the current batch still running: listed as AI SDK tool-call parts (JSON text).
    pub pending_tool_calls: Vec<ToolCall>,
    /// The todo list folded from history; each item is a `TodoItem` blob.
    pub todos: Vec<Todo>,
    pub mode: Option<Mode>,
    pub context: Option<ContextUse>,
    /// Set on the turn's final checkpoint: the turn's timing entry is added.
    pub turn_ended_at_ms: Option<u64>,
    /// Subagents started by Task calls: Cursor draws each Task card's state from this list.
    pub subagent_runs: Vec<SubagentRunState>,
    /// How many times the conversation's history was compacted into a summary.
    pub summaries: u32,
    /// The plan folded from history (the last CreatePlan the user accepted): a `ConversationPlan`
    /// blob.
    pub plan: Option<String>,
}

fn subagent_run(run: &SubagentRunState) -> pb::SubagentRun {
    pb::SubagentRun {
        parent_tool_call_id: run.parent_tool_call_id.clone(),
        subagent_id: run.agent_id.clone(),
        environment: pb::SubagentExecutionEnvironment::Local as i32,
        status: match run.status {
            SubagentStatus::Running => pb::SubagentRunStatus::Running,
            SubagentStatus::Backgrounded => pb::SubagentRunStatus::Backgrounded,
            SubagentStatus::Succeeded => pb::SubagentRunStatus::Success,
            SubagentStatus::Failed => pb::SubagentRunStatus::Error,
        } as i32,
        title: Some(run.title.clone()).filter(|t| !t.is_empty()),
        ..pb::SubagentRun::default()
    }
}

fn todo_item(todo: &Todo) -> pb::TodoItem {
    pb::TodoItem {
        id: todo.id.clone(),
        content: todo.content.clone(),
        status: match todo.status {
            TodoStatus::Pending => pb::TodoStatus::Pending,
            TodoStatus::InProgress => pb::TodoStatus::InProgress,
            TodoStatus::Completed => pb::TodoStatus::Completed,
            TodoStatus::Cancelled => pb::TodoStatus::Cancelled,
        } as i32,
        ..pb::TodoItem::default()
    }
}

/// Cursor's `AgentMode` for a mode.
pub fn agent_mode(mode: Mode) -> i32 {
    (match mode {
        Mode::Agent => pb::AgentMode::Agent,
        Mode::Ask => pb::AgentMode::Ask,
        Mode::Plan => pb::AgentMode::Plan,
        Mode::Debug => pb::AgentMode::Debug,
        Mode::Multitask => pb::AgentMode::Multitask,
    }) as i32
}

/// The mode for Cursor's `AgentMode` value (unspecified = Agent); modes this server does not run
/// are an error naming them.
pub fn mode_of(value: i32) -> Result<Mode, String> {
    match pb::AgentMode::try_from(value) {
        Ok(pb::AgentMode::Unspecified | pb::AgentMode::Agent) => Ok(Mode::Agent),
        Ok(pb::AgentMode::Ask) => Ok(Mode::Ask),
        Ok(pb::AgentMode::Plan) => Ok(Mode::Plan),
        Ok(pb::AgentMode::Debug) => Ok(Mode::Debug),
        Ok(pb::AgentMode::Multitask) => Ok(Mode::Multitask),
        Ok(other) => Err(format!(
            "agent mode {} is not supported by this server",
            other.as_str_name()
        )),
        Err(_) => Err(format!("unknown agent mode {value}")),
    }
}

/// The `conversation_checkpoint_update` carrying `state`.
fn update_message(state: ConversationStateStructure) -> pb::AgentServerMessage {
    pb::AgentServerMessage {
        message: Some(pb::agent_server_message::Message::ConversationCheckpointUpdate(state)),
    }
}

/// The `providerOptions` key under which this server marks its own roots (AI SDK providers
/// ignore options that are not theirs).
pub const OWN_SYSTEM_PROMPT: &str = "cursorByok";

/// AI SDK model-message JSON for the roots.
pub mod roots {
    use super::*;

    /// This server's own system prompt, marked as such: a client that takes the conversation to a
    /// server without it (another node, a lost database) brings the root back, and the import
    /// must not tell the model the prompt a second time, whatever the prompt's version.
    pub fn system(text: &str) -> Value {
        json!({
            "role": "system",
            "content": text,
            "providerOptions": { OWN_SYSTEM_PROMPT: { "systemPrompt": true } },
        })
    }

    pub fn user(text: &str) -> Value {
        json!({ "role": "user", "content": [{ "type": "text", "text": text }] })
    }

    pub fn assistant(text: &str, reasoning: &str) -> Value {
        let mut content = Vec::new();
        if !reasoning.is_empty() {
            content.push(json!({ "type": "reasoning", "text": reasoning }));
        }
        if !text.is_empty() {
            content.push(json!({ "type": "text", "text": text }));
        }
        json!({ "role": "assistant", "content": content })
    }

    /// The AI SDK tool-call part (arguments that are not JSON become `{}`: the model's raw text
    /// stays in our history, the client's view only needs a valid object).
    pub fn tool_call_part(call_id: &str, name: &str, arguments: &str) -> Value {
        let args: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
        json!({ "type": "tool-call", "toolCallId": call_id, "toolName": name, "args": args })
    }

    pub fn tool_call(call_id: &str, name: &str, arguments: &str) -> Value {
        json!({ "role": "assistant", "content": [tool_call_part(call_id, name, arguments)] })
    }

    pub fn tool_result(call_id: &str, name: &str, result: &str, is_error: bool) -> Value {
        let mut part = json!({ "type": "tool-result", "toolCallId": call_id, "toolName": name, "result": result });
        if is_error {
            part["isError"] = true.into();
        }
        json!({ "role": "tool", "content": [part] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A graph with two roots and one turn holding one assistant step, the blobs that built it, the
    /// turn and its state.
    fn one_turn_graph() -> (
        ConversationGraph,
        Vec<Blob>,
        Blob,
        ConversationStateStructure,
        Blob,
    ) {
        let mut graph = ConversationGraph::default();
        let mut blobs = vec![
            graph.push_root(&roots::system("sys")),
            graph.push_root(&roots::user("hi")),
        ];
        blobs.push(graph.begin_turn(
            "req-1",
            &pb::UserMessage {
                text: "hi".into(),
                ..Default::default()
            },
            1_000,
        ));
        blobs.push(
            graph.push_step(conversation_step::Message::AssistantMessage(
                pb::AssistantMessage {
                    text: "hello".into(),
                },
            )),
        );
        let turn = graph.turn_blob().expect("turn");
        let (ConversationState(state), state_blob, _) =
            graph.state(Some(&turn), &StateDetails::default());
        (graph, blobs, turn, state, state_blob)
    }

    /// State details with one of everything a checkpoint states besides history.
    fn sample_details() -> StateDetails {
        StateDetails {
            pending_tool_calls: vec![ToolCall {
                call_id: "call-1".into(),
                provider_call_id: "p1".into(),
                name: "Shell".into(),
                arguments: r#"{"command":"ls"}"#.into(),
            }],
            todos: vec![Todo {
                id: "t".into(),
                content: "ship".into(),
                status: TodoStatus::InProgress,
            }],
            mode: Some(Mode::Plan),
            context: Some(ContextUse {
                used_tokens: 1200,
                max_tokens: 200_000,
            }),
            turn_ended_at_ms: None,
            summaries: 0,
            plan: None,
            subagent_runs: vec![SubagentRunState {
                parent_tool_call_id: "call-task".into(),
                title: "Find the parser".into(),
                agent_id: Some("agent-7".into()),
                status: SubagentStatus::Backgrounded,
            }],
        }
    }

    #[test]
    fn the_graph_grows_by_new_blobs_only_and_is_a_pure_projection() {
        let (mut graph, blobs, turn, state, state_blob) = one_turn_graph();
        let again = one_turn_graph();
        assert_eq!(
            state_blob.id, again.4.id,
            "the same history projects to the same blob ids"
        );
        assert_eq!(state.root_prompt_messages_json.len(), 2);
        assert_eq!(state.turns, vec![turn.id.0.to_vec()]);
        assert!(
            state_blob.edges.is_empty(),
            "a state's edges would grow with history"
        );
        assert_eq!(named_blobs(&state).len(), 3, "two roots and the turn");
        assert!(blobs.iter().all(|b| b.id == BlobId::of(&b.data)));

        assert_eq!(
            graph.close_turn(pb::StepTiming {
                duration_ms: 500,
                timestamp_ms: 1_000
            }),
            Some(turn.clone())
        );
        let details = sample_details();
        let (ConversationState(next_state), next_blob, todo_blobs) = graph.state(None, &details);
        assert!(named_blobs(&next_state).contains(&todo_blobs[0].id));
        let run = &next_state.subagent_runs_by_parent_tool_call_id["call-task"];
        assert_eq!(
            (run.status, run.subagent_id.as_deref(), run.title.as_deref()),
            (
                pb::SubagentRunStatus::Backgrounded as i32,
                Some("agent-7"),
                Some("Find the parser")
            )
        );
        assert_eq!(next_state.turns.len(), 1);
        assert_eq!(
            next_state.turn_timings,
            [pb::StepTiming {
                duration_ms: 500,
                timestamp_ms: 1_000
            }]
        );
        assert_eq!(
            next_state.pending_tool_calls,
            [
                r#"{"args":{"command":"ls"},"toolCallId":"call-1","toolName":"Shell","type":"tool-call"}"#
            ]
        );
        assert_eq!(todo_blobs.len(), 1);
        assert_eq!(next_state.todos, vec![todo_blobs[0].id.0.to_vec()]);
        let item = pb::TodoItem::decode(todo_blobs[0].data.as_ref()).unwrap();
        assert_eq!(
            (item.content.as_str(), item.status),
            ("ship", pb::TodoStatus::InProgress as i32)
        );
        assert_eq!(next_state.mode, Some(pb::AgentMode::Plan as i32));
        assert_eq!(
            next_state
                .token_details
                .map(|t| (t.used_tokens, t.max_tokens)),
            Some((1200, 200_000))
        );
        assert!(next_blob.edges.is_empty());
        let decoded = ConversationStateStructure::decode(state_blob.data.as_ref()).unwrap();
        assert_eq!(
            ConversationGraph::from_state(&decoded.into()).root_count(),
            2
        );
    }
}
