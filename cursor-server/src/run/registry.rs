//! request_id → RunHandle. Registers a run on first sight of a request id (RunSSE or BidiAppend,
//! whichever comes first; `run/actor.rs` starts its actor) and remembers recently finished ids so
//! late traffic for them gets a clear error instead of a new, orphaned session. A BidiAppend that
//! would open a run past `max_unattached` waits (bounded) for a place or for its own RunSSE.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::command::RunCommand;
use crate::ops::metrics::{self, Transport};

/// Commands that may queue for one run before senders wait.
const COMMAND_BUFFER: usize = 256;
/// How many finished request ids are remembered.
const FINISHED_MEMORY: usize = 4096;

#[derive(Debug, Clone)]
pub struct RunHandle {
    commands: mpsc::Sender<RunCommand>,
    control: Arc<RunControl>,
    done: CancellationToken,
}

/// What others may do to a run without waiting on its queue: close its input, stop it.
#[derive(Debug)]
pub struct RunControl {
    /// Open while the run takes client input. Closed (under this lock) once the run's end is
    /// decided, before its last frame leaves, and an input is queued only under it: a client that
    /// has seen the end of stream never gets a 200 for a late input.
    input_open: Mutex<bool>,
    /// Fires when the run must stop at once: the server shuts down (a child of its token) or a new
    /// run took the conversation over. Every wait of the run — sends to a client that does not
    /// read included — gives way to it.
    stop: CancellationToken,
    /// The run that took the conversation over.
    superseded_by: OnceLock<String>,
    /// Why the run was stopped, when neither a new run nor the shutdown stopped it (`[cluster]`:
    /// another node took this one as stopped).
    stopped_because: OnceLock<String>,
}

impl RunControl {
    /// Refuses client input from now on; returns once no input can be queued any more.
    pub fn close_input(&self) {
        *self
            .input_open
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = false;
    }

    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// The run that took the conversation over, if that is why the run stops.
    pub fn superseded_by(&self) -> Option<&str> {
        self.superseded_by.get().map(String::as_str)
    }

    /// Why the run was stopped, if it was for another reason than a new run or the shutdown.
    pub fn stopped_because(&self) -> Option<&str> {
        self.stopped_because.get().map(String::as_str)
    }
}

impl RunHandle {
    /// Delivers a transport command (a downlink to attach, a broken uplink); `Err` means the run
    /// has ended meanwhile.
    pub async fn send(&self, command: RunCommand) -> Result<(), RunGone> {
        self.commands.send(command).await.map_err(|_| RunGone)
    }

    /// Queues a client input, unless the run no longer takes input (it has ended, or is about to
    /// send its end-of-stream frame): then `Err`, and the client hears `not_found`.
    pub async fn send_input(&self, command: RunCommand) -> Result<(), RunGone> {
        let permit = self.commands.reserve().await.map_err(|_| RunGone)?;
        let open = self
            .control
            .input_open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !*open {
            return Err(RunGone);
        }
        permit.send(command);
        Ok(())
    }

    /// Whether the run still takes client input.
    pub fn takes_input(&self) -> bool {
        *self
            .control
            .input_open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the run at once because run `by` took its conversation over.
    pub fn supersede(&self, by: &str) {
        let _ = self.control.superseded_by.set(by.to_owned());
        self.control.stop.cancel();
    }

    pub fn control(&self) -> &Arc<RunControl> {
        &self.control
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
    #[error("too many runs are open ({limit} = {max}); try again when some have finished")]
    Full { limit: &'static str, max: usize },
}

pub struct RunRegistry {
    inner: Mutex<Inner>,
    /// Runs open at once, and runs opened by BidiAppend that no RunSSE has attached to yet (a
    /// client, or anyone, appending to made-up request ids would otherwise open runs without end).
    max_runs: usize,
    max_unattached: usize,
    /// Counts every run that started or ended, so a watcher (the console's live list) wakes on
    /// each change instead of polling.
    changes: watch::Sender<u64>,
    /// Counts every change that may let a waiting BidiAppend in (`open_waiting`): a run opened
    /// (perhaps its own, by its RunSSE), an unattached run joined by its RunSSE, a run ended.
    places: watch::Sender<u64>,
    /// Every run actor's task, so a shutdown waits until each run has recorded its ending.
    tasks: tokio_util::task::TaskTracker,
}

impl Default for RunRegistry {
    fn default() -> Self {
        RunRegistry::new(usize::MAX, usize::MAX)
    }
}

/// Which request opened (or found) a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opener {
    /// A RunSSE request: the run's downlink.
    RunSse,
    /// A BidiAppend: a client message, possibly before its RunSSE.
    BidiAppend,
    /// An HTTP/2 `Run` stream, which owns its request id: an active run under it is refused.
    Http2Run,
}

impl Opener {
    /// The transport the run is served over.
    pub fn transport(self) -> Transport {
        match self {
            Opener::Http2Run => Transport::Http2Run,
            Opener::RunSse | Opener::BidiAppend => Transport::RunSse,
        }
    }
}

/// A new run refused at `limit`: said in the log and counted.
fn refuse(request_id: &str, limit: &'static str, max: usize) -> RegistryError {
    tracing::warn!(
        request_id,
        limit,
        max,
        "a new run was refused: too many runs are open"
    );
    metrics::run_refused(limit);
    RegistryError::Full { limit, max }
}

/// Why `try_lookup` opened no run, before it is said (`Refusal::refused`).
enum Refusal {
    Runs(usize),
    Unattached(usize),
    Other(RegistryError),
}

impl Refusal {
    /// The error for the caller; a limit's refusal is logged and counted here, once per request.
    fn refused(self, request_id: &str) -> RegistryError {
        match self {
            Refusal::Runs(max) => refuse(request_id, "max_runs", max),
            Refusal::Unattached(max) => refuse(request_id, "max_unattached_runs", max),
            Refusal::Other(error) => error,
        }
    }
}

/// One BidiAppend counted in the metrics' gauge of waiting new runs while it waits.
struct Waiter;

impl Waiter {
    fn new() -> Self {
        metrics::run_waiting(1.0);
        Waiter
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        metrics::run_waiting(-1.0);
    }
}

#[derive(Default)]
struct Inner {
    active: HashMap<String, RunHandle>,
    /// The run that owns each conversation now (conversation id → request id).
    conversation_owner: HashMap<String, String>,
    finished: HashSet<String>,
    finished_order: VecDeque<String>,
    finished_total: u64,
    /// Runs a BidiAppend opened that no RunSSE has found yet.
    unattached: HashSet<String>,
}

/// What a lookup found: the run already there, or a new one whose actor the caller starts with
/// the receiving end of its command channel.
pub enum Lookup {
    Running(RunHandle),
    New(RunHandle, mpsc::Receiver<RunCommand>),
}

impl RunRegistry {
    pub fn new(max_runs: usize, max_unattached: usize) -> Self {
        RunRegistry {
            inner: Mutex::default(),
            max_runs,
            max_unattached,
            changes: watch::Sender::new(0),
            places: watch::Sender::new(0),
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Where run actors are spawned (tracked, so `wind_down` can wait for them).
    pub fn tasks(&self) -> tokio_util::task::TaskTracker {
        self.tasks.clone()
    }

    /// Waits, up to `grace`, until every run's task has ended: a run that sent its end-of-stream
    /// frame still records its ending in the store, which must not close before that. Returns
    /// whether they all ended.
    pub async fn wind_down(&self, grace: std::time::Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(grace, self.tasks.wait()).await.is_ok()
    }

    /// The run for `request_id`: the active one, else (unless it finished) a new one, registered
    /// here before its actor starts so concurrent first messages meet the same run. An HTTP/2
    /// `Run` refuses an active run; a new run past a limit is refused `Full`.
    /// `stop` is the new run's stop token (a child of the server's shutdown token).
    pub fn lookup(
        &self,
        request_id: &str,
        opener: Opener,
        stop: CancellationToken,
    ) -> Result<Lookup, RegistryError> {
        self.try_lookup(request_id, opener, stop)
            .map_err(|refusal| refusal.refused(request_id))
    }

    /// `lookup`, except that a BidiAppend's new run past `max_unattached` is not refused at once:
    /// it waits, up to `wait` (and never past `shutdown`), until there is a place — its own run
    /// opened meanwhile by its RunSSE (on a cluster, a RunSSE that reached another node and was
    /// forwarded here), an unattached run joined by its RunSSE, or a run ended. A client's first
    /// BidiAppend routinely overtakes its RunSSE (two connections; on a cluster the RunSSE takes
    /// a detour through the node it reached), so a burst of starts must not be refused for that
    /// order; appends to made-up request ids still open no more than `max_unattached` runs, and
    /// past it are refused `resource_exhausted` once the wait is over. Each new run's stop token
    /// is a child of `shutdown`.
    pub async fn open_waiting(
        &self,
        request_id: &str,
        opener: Opener,
        shutdown: &CancellationToken,
        wait: std::time::Duration,
    ) -> Result<Lookup, RegistryError> {
        let deadline = Instant::now() + wait;
        let mut places = self.places.subscribe();
        let mut waiter: Option<Waiter> = None;
        loop {
            places.borrow_and_update();
            let refusal = match self.try_lookup(request_id, opener, shutdown.child_token()) {
                Ok(found) => return Ok(found),
                Err(refusal @ Refusal::Unattached(_)) if !wait.is_zero() => refusal,
                Err(refusal) => return Err(refusal.refused(request_id)),
            };
            if waiter.is_none() {
                tracing::info!(
                    "run {request_id} waits for a place: {} runs are open without their RunSSE (max_unattached_runs)",
                    self.max_unattached
                );
                waiter = Some(Waiter::new());
            }
            tokio::select! {
                changed = places.changed() => {
                    if changed.is_err() {
                        return Err(refusal.refused(request_id));
                    }
                }
                () = tokio::time::sleep_until(deadline) => return Err(refusal.refused(request_id)),
                () = shutdown.cancelled() => return Err(refusal.refused(request_id)),
            }
        }
    }

    /// `lookup` without saying a refusal (a waiting caller tries again).
    fn try_lookup(
        &self,
        request_id: &str,
        opener: Opener,
        stop: CancellationToken,
    ) -> Result<Lookup, Refusal> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.finished.contains(request_id) {
            return Err(Refusal::Other(RegistryError::Finished(
                request_id.to_owned(),
            )));
        }
        if let Some(handle) = inner.active.get(request_id) {
            let handle = handle.clone();
            match opener {
                Opener::Http2Run => {
                    return Err(Refusal::Other(RegistryError::AlreadyRunning(
                        request_id.to_owned(),
                    )));
                }
                Opener::RunSse => {
                    if inner.unattached.remove(request_id) {
                        self.places.send_modify(|n| *n += 1);
                    }
                }
                Opener::BidiAppend => {}
            }
            return Ok(Lookup::Running(handle));
        }
        if inner.active.len() >= self.max_runs {
            return Err(Refusal::Runs(self.max_runs));
        }
        if opener == Opener::BidiAppend {
            if inner.unattached.len() >= self.max_unattached {
                return Err(Refusal::Unattached(self.max_unattached));
            }
            inner.unattached.insert(request_id.to_owned());
        }
        let (tx, rx) = mpsc::channel(COMMAND_BUFFER);
        let handle = RunHandle {
            commands: tx,
            control: Arc::new(RunControl {
                input_open: Mutex::new(true),
                stop,
                superseded_by: OnceLock::new(),
                stopped_because: OnceLock::new(),
            }),
            done: CancellationToken::new(),
        };
        inner.active.insert(request_id.to_owned(), handle.clone());
        self.changes.send_modify(|n| *n += 1);
        self.places.send_modify(|n| *n += 1);
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

    /// The run that owns `conversation_id` now, if it is still active (nothing is claimed).
    pub fn conversation_run(&self, conversation_id: &str) -> Option<(String, RunHandle)> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let owner = inner.conversation_owner.get(conversation_id)?;
        inner
            .active
            .get(owner)
            .cloned()
            .map(|handle| (owner.clone(), handle))
    }

    /// Stops the run working on `conversation_id` (a subagent the user canceled) for `by`;
    /// whether one was running.
    pub fn stop_conversation(&self, conversation_id: &str, by: &str) -> bool {
        match self.conversation_run(conversation_id) {
            Some((_, handle)) => {
                handle.supersede(by);
                true
            }
            None => false,
        }
    }

    /// Whether `request_id` is a run of this registry: active, or finished recently.
    pub fn knows(&self, request_id: &str) -> bool {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.active.contains_key(request_id) || inner.finished.contains(request_id)
    }

    /// The active run `request_id`, if there is one.
    pub fn running(&self, request_id: &str) -> Option<RunHandle> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.active.get(request_id).cloned()
    }

    /// Stops every active run at once for `reason`; how many there were.
    pub fn stop_every(&self, reason: &str) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for handle in inner.active.values() {
            let _ = handle.control.stopped_because.set(reason.to_owned());
            handle.control.stop.cancel();
        }
        inner.active.len()
    }

    /// How many runs are active, and how many have finished since the registry started.
    /// Wakes on every run that starts or ends.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The request ids of the runs active now.
    pub fn active_ids(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.active.keys().cloned().collect()
    }

    pub fn counts(&self) -> (usize, u64) {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (inner.active.len(), inner.finished_total)
    }

    /// The run's actor has exited: late traffic for it gets `Finished`.
    pub fn mark_finished(&self, request_id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.active.remove(request_id);
        inner.unattached.remove(request_id);
        self.changes.send_modify(|n| *n += 1);
        self.places.send_modify(|n| *n += 1);
        // A finished run owns nothing (a run that took its conversation over already replaced it).
        inner
            .conversation_owner
            .retain(|_, owner| owner != request_id);
        inner.finished_total += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn once_input_is_closed_no_client_input_is_queued_though_the_queue_is_open() {
        let registry = RunRegistry::default();
        let Ok(Lookup::New(handle, mut commands)) =
            registry.lookup("r1", Opener::BidiAppend, CancellationToken::new())
        else {
            panic!("a new run");
        };
        handle
            .send_input(RunCommand::ClientGone)
            .await
            .expect("open: queued");
        assert!(matches!(
            commands.recv().await,
            Some(RunCommand::ClientGone)
        ));
        // The run decided to end (its end-of-stream frame is next): a late input is refused, not
        // queued to be dropped unseen, while transport commands (a RunSSE fetching the ending)
        // still get through.
        handle.control().close_input();
        assert!(!handle.takes_input());
        assert_eq!(
            handle.send_input(RunCommand::ClientGone).await,
            Err(RunGone)
        );
        assert!(commands.try_recv().is_err(), "nothing was queued");
        handle
            .send(RunCommand::ClientGone)
            .await
            .expect("transport command");
    }

    /// Opens `request_id` by BidiAppend, waiting (up to a minute) for a place.
    fn append_opens(
        registry: &Arc<RunRegistry>,
        request_id: &'static str,
    ) -> tokio::task::JoinHandle<Result<bool, RegistryError>> {
        let registry = Arc::clone(registry);
        tokio::spawn(async move {
            let shutdown = CancellationToken::new();
            let wait = std::time::Duration::from_secs(60);
            registry
                .open_waiting(request_id, Opener::BidiAppend, &shutdown, wait)
                .await
                .map(|found| matches!(found, Lookup::New(..)))
        })
    }

    #[tokio::test]
    async fn an_append_past_the_unattached_limit_waits_for_its_run_sse_or_a_place() {
        let registry = Arc::new(RunRegistry::new(usize::MAX, 1));
        let opened = append_opens(&registry, "r1").await.expect("task");
        assert_eq!(opened, Ok(true), "the one place");
        // Past the limit: both wait (a refusal would end their tasks at once).
        let r2 = append_opens(&registry, "r2");
        let r3 = append_opens(&registry, "r3");
        // Each waiter holds a subscription to `places` (and a refused one would have ended).
        while registry.places.receiver_count() < 2 {
            assert!(!r2.is_finished() && !r3.is_finished(), "refused at once");
            tokio::task::yield_now().await;
        }
        // r3's RunSSE opens its run: its append joins it (no place needed).
        let _sse = registry.lookup("r3", Opener::RunSse, CancellationToken::new());
        assert_eq!(
            r3.await.expect("task"),
            Ok(false),
            "joined the RunSSE's run"
        );
        // r1's RunSSE joins r1: its place goes to r2.
        let _sse = registry.lookup("r1", Opener::RunSse, CancellationToken::new());
        assert_eq!(
            r2.await.expect("task"),
            Ok(true),
            "opened in the freed place"
        );
        // With no wait, past the limit is refused at once.
        let shutdown = CancellationToken::new();
        let refused = registry
            .open_waiting(
                "r4",
                Opener::BidiAppend,
                &shutdown,
                std::time::Duration::ZERO,
            )
            .await;
        assert!(
            matches!(
                refused,
                Err(RegistryError::Full {
                    limit: "max_unattached_runs",
                    max: 1
                })
            ),
            "refused at once"
        );
        // A wait the server's shutdown cuts short is refused too.
        shutdown.cancel();
        let refused = registry
            .open_waiting(
                "r5",
                Opener::BidiAppend,
                &shutdown,
                std::time::Duration::from_secs(60),
            )
            .await;
        assert!(matches!(refused, Err(RegistryError::Full { .. })));
    }

    #[tokio::test]
    async fn superseding_a_run_fires_its_stop_and_names_who_took_over() {
        let registry = RunRegistry::default();
        let shutdown = CancellationToken::new();
        let Ok(Lookup::New(old, _commands)) =
            registry.lookup("old", Opener::BidiAppend, shutdown.child_token())
        else {
            panic!("a new run");
        };
        assert_eq!(
            registry.claim_conversation("c", "old").map(|(p, _)| p),
            None
        );
        let (previous, handle) = registry.claim_conversation("c", "new").expect("old owns c");
        assert_eq!(previous, "old");
        handle.supersede("new");
        assert!(old.control().stop().is_cancelled());
        assert_eq!(old.control().superseded_by(), Some("new"));
        assert!(!shutdown.is_cancelled(), "only that run stops");
    }
}
