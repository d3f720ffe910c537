//! request_id → RunHandle. Registers a run on first sight of a request id (RunSSE or BidiAppend,
//! whichever comes first; `run/actor.rs` starts its actor) and remembers recently finished ids so
//! late traffic for them gets a clear error instead of a new, orphaned session.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::command::RunCommand;

/// Commands that may queue for one run before senders wait.
const COMMAND_BUFFER: usize = 256;
/// How many finished request ids are remembered.
const FINISHED_MEMORY: usize = 4096;

#[derive(Debug, Clone)]
pub struct RunHandle {
    commands: mpsc::Sender<RunCommand>,
    /// Fires when the run has ended (its end-of-stream frame is about to go out): from then on
    /// client input is refused, while a reconnecting RunSSE can still fetch undelivered frames.
    ended: CancellationToken,
    done: CancellationToken,
}

impl RunHandle {
    /// Delivers a command; `Err` means the run has ended meanwhile.
    pub async fn send(&self, command: RunCommand) -> Result<(), RunGone> {
        self.commands.send(command).await.map_err(|_| RunGone)
    }

    /// Fires when the run has ended, before its actor exits.
    pub fn ended(&self) -> &CancellationToken {
        &self.ended
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

/// What a lookup found: the run already there, or a new one whose actor the caller starts with
/// the receiving end of its command channel.
pub enum Lookup {
    Running(RunHandle),
    New(RunHandle, mpsc::Receiver<RunCommand>),
}

impl RunRegistry {
    /// The run for `request_id`: the active one, else (unless it finished) a new one, registered
    /// here before its actor starts so concurrent first messages meet the same run. `must_be_new`
    /// refuses an active run (a transport that owns its request id: HTTP/2 `Run`).
    pub fn lookup(&self, request_id: &str, must_be_new: bool) -> Result<Lookup, RegistryError> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.finished.contains(request_id) {
            return Err(RegistryError::Finished(request_id.to_owned()));
        }
        if let Some(handle) = inner.active.get(request_id) {
            if must_be_new {
                return Err(RegistryError::AlreadyRunning(request_id.to_owned()));
            }
            return Ok(Lookup::Running(handle.clone()));
        }
        let (tx, rx) = mpsc::channel(COMMAND_BUFFER);
        let handle = RunHandle {
            commands: tx,
            ended: CancellationToken::new(),
            done: CancellationToken::new(),
        };
        inner.active.insert(request_id.to_owned(), handle.clone());
        Ok(Lookup::New(handle, rx))
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

    /// The run's actor has exited: late traffic for it gets `Finished`.
    pub fn mark_finished(&self, request_id: &str) {
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
}
