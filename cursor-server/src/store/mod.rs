//! SQLite persistence. `messages` is the only source of truth for history; everything else is
//! bookkeeping around it.

pub mod blobs;
pub mod conversations;
pub mod messages;
pub mod nodes;
pub mod outbox;
pub mod runs;
pub mod sqlite;

pub use sqlite::Store;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening database {url}: {source}")]
    Open { url: String, source: sqlx::Error },
    #[error("running migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{context}: {source}")]
    Query {
        context: &'static str,
        source: sqlx::Error,
    },
    #[error("message {seq} of conversation {conversation_id} is not valid JSON: {source}")]
    CorruptMessage {
        conversation_id: String,
        seq: i64,
        source: serde_json::Error,
    },
    #[error("encoding message: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("{0}")]
    BlobHash(#[from] blobs::HashMismatch),
    #[error("run {request_id} has an unknown status {status:?}")]
    CorruptRun { request_id: String, status: String },
    #[error("stored blob {id} does not decode: {message}")]
    CorruptBlob { id: String, message: String },
    #[error("blob {0} is named by the store but not stored")]
    MissingBlob(crate::model::conversation::BlobId),
    #[error(
        "run {request_id} no longer owns conversation {conversation_id} (a newer run took it over); its messages were not stored"
    )]
    NotOwner {
        conversation_id: String,
        request_id: String,
    },
}

/// The text of the trigger that refuses appends from a run that does not own the conversation
/// (migrations/0006_conversation_owner.sql).
pub(crate) const NOT_OWNER: &str = "cursor-server: the run does not own this conversation";

/// Attaches a short description of the failed operation to a sqlx error.
pub(crate) trait QueryContext<T> {
    fn context(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn context(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Query { context, source })
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
