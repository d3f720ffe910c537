//! request_id → RunHandle. Creates the run's actor on first sight of a request id (RunSSE or
//! BidiAppend, whichever comes first) and remembers recently finished ids so late traffic for them
//! gets a clear error instead of a new, orphaned session.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::actor::RunActor;
use super::command::RunCommand;
use crate::app::AppState;

/// Commands that may queue for one run before senders wait.
const COMMAND_BUFFER: usize = 256;
/// How many finished request ids are remembered.
const FINISHED_MEMORY: usize = 4096;

#[derive(Debug, Clone)]
pub struct RunHandle {
    commands: mpsc::Sender<RunCommand>,
    done: CancellationToken,
}

impl RunHandle {
    /// Delivers a command; `Err` means the run has ended meanwhile.
    pub async fn send(&self, command: RunCommand) -> Result<(), RunGone> {
        self.commands.send(command).await.map_err(|_| RunGone)
    }

    /// Fires when the run's actor has exited.
    pub fn done(&self) -> &CancellationToken {
        &self.done
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the run has already finished")]
pub struct RunGone;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("request {0} has already finished")]
    Finished(String),
    #[error("request {0} is already running")]
    AlreadyRunning(String),
}

#[derive(Default)]
pub struct RunRegistry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    active: HashMap<String, RunHandle>,
    /// The run that owns each conversation now (conversation id → request id).
    conversation_owner: HashMap<String, String>,
    finished: HashSet<String>,
    finished_order: VecDeque<String>,
}

impl RunRegistry {
    /// The run for `request_id`, started if this is the first message for it.
    pub fn get_or_start(app: &Arc<AppState>, request_id: &str) -> Result<RunHandle, RegistryError> {
        Self::lookup(app, request_id, false)
    }

    /// Starts a new run for a transport that owns its request id (HTTP/2 `Run`).
    pub fn start_new(app: &Arc<AppState>, request_id: &str) -> Result<RunHandle, RegistryError> {
        Self::lookup(app, request_id, true)
    }

    fn lookup(
        app: &Arc<AppState>,
        request_id: &str,
        must_be_new: bool,
    ) -> Result<RunHandle, RegistryError> {
        let mut inner = app
            .runs
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if inner.finished.contains(request_id) {
            return Err(RegistryError::Finished(request_id.to_owned()));
        }
        if let Some(handle) = inner.active.get(request_id) {
            if must_be_new {
                return Err(RegistryError::AlreadyRunning(request_id.to_owned()));
            }
            return Ok(handle.clone());
        }
        let (tx, rx) = mpsc::channel(COMMAND_BUFFER);
        let handle = RunHandle {
            commands: tx,
            done: CancellationToken::new(),
        };
        inner.active.insert(request_id.to_owned(), handle.clone());
        drop(inner);
        let actor = RunActor::new(Arc::clone(app), request_id.to_owned(), rx);
        let done = handle.done.clone();
        let app = Arc::clone(app);
        let request_id = request_id.to_owned();
        tokio::spawn(async move {
            // The actor runs on its own task so that even a panic marks the run finished.
            // Every log line of the run carries its ids (conversation and model call are filled
            // in as they become known).
            let span = tracing::info_span!(
                "run",
                request_id = %request_id,
                conversation_id = tracing::field::Empty,
                model_call_id = tracing::field::Empty,
            );
            if let Err(panic) =
                tokio::spawn(tracing::Instrument::instrument(actor.run(), span)).await
            {
                tracing::error!(request_id = %request_id, "run actor panicked: {panic}");
            }
            app.runs.mark_finished(&request_id);
            done.cancel();
        });
        Ok(handle)
    }

    /// Makes `request_id` the run of `conversation_id` and returns the run it takes over from, if
    /// one is still active (it must be stopped before the new run touches the conversation).
    pub fn claim_conversation(
        &self,
        conversation_id: &str,
        request_id: &str,
    ) -> Option<(String, RunHandle)> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = inner
            .conversation_owner
            .insert(conversation_id.to_owned(), request_id.to_owned())
            .filter(|p| p != request_id)?;
        inner
            .active
            .get(&previous)
            .cloned()
            .map(|handle| (previous, handle))
    }

    fn mark_finished(&self, request_id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.active.remove(request_id);
        // A finished run owns nothing (a run that took its conversation over already replaced it).
        inner
            .conversation_owner
            .retain(|_, owner| owner != request_id);
        if inner.finished.insert(request_id.to_owned()) {
            inner.finished_order.push_back(request_id.to_owned());
        }
        while inner.finished_order.len() > FINISHED_MEMORY {
            if let Some(old) = inner.finished_order.pop_front() {
                inner.finished.remove(&old);
            }
        }
    }

    /// Number of runs currently alive (for tests and diagnostics).
    pub fn active_count(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .active
            .len()
    }
}
